//! Small building blocks shared by the BERT modules.

use std::cell::RefCell;

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::Activation;

/// `y = x Wᵀ + b` over the last dimension, for inputs of any rank.
///
/// Inputs are flattened to 2-D so the product is a single GEMM rather
/// than a batched one over broadcast weights.
#[derive(Debug, Clone)]
pub struct Dense {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
}

impl Dense {
    /// Loads `{vb}.weight` [out, in] and `{vb}.bias` [out], initialised
    /// like transformers (normal(0, std), zero bias) when fresh.
    pub fn load(vb: VarBuilder, in_dim: usize, out_dim: usize, std: f64) -> Result<Self> {
        let weight = vb.get_with_hints(
            (out_dim, in_dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        let bias = vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?;
        Ok(Self {
            weight,
            bias: Some(bias),
        })
    }

    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let in_dim = dims[dims.len() - 1];
        let rows = x.elem_count() / in_dim.max(1);
        let x2 = x.reshape((rows, in_dim))?;
        let mut y = x2.matmul(&self.weight.t()?)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank ≥ 1") = self.weight.dim(0)?;
        y.reshape(out_dims)
    }
}

/// LayerNorm over the last dimension with an affine transform.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub(crate) weight: Tensor,
    pub(crate) bias: Tensor,
    pub(crate) eps: f64,
}

impl LayerNorm {
    pub fn load(vb: VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let bias = vb.get_with_hints(dim, "bias", Init::Const(0.0))?;
        Ok(Self { weight, bias, eps })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Computed in the composite form: statistics in f32, and every op
        // records its backward (candle's fused layer_norm has none).
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        normed
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

/// Inverted dropout; the identity unless `train` is set.
#[derive(Debug, Clone, Copy)]
pub struct Dropout {
    p: f64,
}

impl Dropout {
    pub fn new(p: f64) -> Self {
        Self { p }
    }

    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if !train || self.p == 0.0 {
            return Ok(x.clone());
        }
        if self.p >= 1.0 {
            return x.zeros_like();
        }
        let keep = 1.0 - self.p;
        let scale = (1.0 / keep) as f32;
        let n = x.elem_count();
        let mask: Vec<f32> = DROPOUT_RNG.with(|cell| {
            let mut slot = cell.borrow_mut();
            let rng = slot.get_or_insert_with(StdRng::from_os_rng);
            (0..n)
                .map(|_| {
                    if rng.random::<f64>() < keep {
                        scale
                    } else {
                        0.0
                    }
                })
                .collect()
        });
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * mask
    }
}

thread_local! {
    /// Dropout draws from this generator (candle's own is unseeded), so a
    /// training step is reproducible: the trainer reseeds it every step.
    static DROPOUT_RNG: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Seeds the dropout masks of this thread's next forward passes.
pub fn seed_dropout(seed: u64) {
    DROPOUT_RNG.with(|cell| *cell.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

pub fn activate(x: &Tensor, act: Activation) -> Result<Tensor> {
    match act {
        Activation::Gelu => x.gelu_erf(),
        Activation::GeluTanh => x.gelu(),
        Activation::Relu => x.relu(),
    }
}
