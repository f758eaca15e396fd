//! Small building blocks shared by the BERT modules.

use std::cell::RefCell;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::ops;
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
    /// Loads `{vb}.weight` `[out, in]` and `{vb}.bias` `[out]`, initialised
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

impl Dense {
    /// `act(x Wᵀ + b)`: the bias and the non-linearity fused into one pass
    /// (and one backward op) after the matrix multiply.
    pub fn forward_act(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        self.project(x, |y| match &self.bias {
            Some(b) => ops::bias_act(&y, b, act),
            None => activate(&y, act),
        })
    }

    /// `x Wᵀ` on `x` flattened to 2-D, then `then`, then reshaped back.
    fn project(&self, x: &Tensor, then: impl FnOnce(Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let mut out_dims = x.dims().to_vec();
        let Some(last) = out_dims.last_mut() else {
            candle_core::bail!(
                "Dense: the input is a scalar, not [.., {}]",
                self.weight.dim(1)?
            )
        };
        let in_dim = *last;
        *last = self.weight.dim(0)?;
        let rows = x.elem_count() / in_dim.max(1);
        let y = x.reshape((rows, in_dim))?.matmul(&self.weight.t()?)?;
        then(y)?.reshape(out_dims)
    }
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.project(x, |y| match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        })
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

    /// `{vb}.LayerNorm` over `dim`, when the model has one (`present`).
    pub fn load_optional(
        present: bool,
        vb: &VarBuilder,
        dim: usize,
        eps: f64,
    ) -> Result<Option<Self>> {
        present
            .then(|| Self::load(vb.pp("LayerNorm"), dim, eps))
            .transpose()
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // With a backward pass (candle's fused layer_norm has none): one
        // fused op on the CPU, the composite form elsewhere.
        ops::layer_norm(x, &self.weight, &self.bias, self.eps)
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

/// The composite non-linearity (see [`Dense::forward_act`] for the fused
/// bias + activation).
pub fn activate(x: &Tensor, act: Activation) -> Result<Tensor> {
    match act {
        Activation::Gelu => x.gelu_erf(),
        Activation::GeluTanh => x.gelu(),
        Activation::Relu => x.relu(),
    }
}
