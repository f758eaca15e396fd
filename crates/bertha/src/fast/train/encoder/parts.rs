//! The encoder's parameterised parts: a linear layer (with the bf16
//! panels of its weight when the optimizer made them) and a LayerNorm,
//! each with its forward and its backward into the parameters' gradients.

use std::sync::RwLockReadGuard;

use super::super::products::{Compute, Weight};
use super::super::Param;
use crate::error::Result;
use crate::fast::kernels;
use crate::fast::matmul::WeightPanels;
use crate::model::ops::{column_sums, layer_norm_backward};
use crate::model::{Dense, LayerNorm};

/// A linear layer: weight `[out, in]` (as `nn.Linear`) and bias (zeros
/// that are no parameter when the checkpoint has none).
pub(crate) struct Linear<'a> {
    pub w: Param<'a>,
    pub b: Param<'a>,
    /// The number format of its products.
    pub compute: Compute,
    /// The weight's bf16 panels, when the optimizer made them from its
    /// current values (held for the step: [`WeightPacks`]).
    pub(super) panels: Option<RwLockReadGuard<'a, WeightPanels>>,
}

impl<'a> Linear<'a> {
    /// An fp32 linear layer.
    pub fn new(w: Param<'a>, b: Param<'a>) -> Self {
        Self {
            w,
            b,
            compute: Compute::F32,
            panels: None,
        }
    }

    /// The weight as its bf16 products read it (its panels when packed).
    pub fn weight(&self) -> Weight<'_> {
        Weight {
            data: &self.w.data,
            panels: self.panels.as_deref(),
        }
    }

    pub(super) fn of(dense: &'a Dense) -> Result<Option<Self>> {
        let Some(bias) = dense.bias() else {
            return Ok(None);
        };
        Ok(Some(Self::new(
            Param::of(dense.weight())?,
            Param::of(bias)?,
        )))
    }

    /// `dense` with its bias, or with an absent one (zeros) when it has
    /// none (ModernBERT's layers and heads).
    pub(crate) fn with_any_bias(dense: &'a Dense) -> Result<Self> {
        let w = Param::of(dense.weight())?;
        let b = match dense.bias() {
            Some(b) => Param::of(b)?,
            None => Param::absent(dense.weight().dims().first().copied().unwrap_or(0)),
        };
        Ok(Self::new(w, b))
    }

    pub fn out_dim(&self) -> usize {
        self.b.data.len()
    }

    /// `y = x · Wᵀ + b` on `m` rows.
    pub fn forward(&self, x: &[f32], y: &mut [f32], m: usize) {
        self.compute
            .forward(x, &self.w.data, Some(&self.b.data), y, m);
    }

    /// [`Linear::forward`] into a new buffer (not zeroed first in bf16).
    pub fn forward_new(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.compute.forward_new(x, &self.w.data, &self.b.data, m)
    }

    /// Adds the weight and bias gradients of `dy`, the gradient of the
    /// output over input `x`; writes (or adds, with `accumulate`) the
    /// input gradient into `dx` when given.
    pub fn backward(
        &mut self,
        x: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        m: usize,
        accumulate: bool,
    ) {
        let compute = self.compute;
        self.w
            .grad_product(|dw| compute.weight_grad_into(dy, x, dw, m));
        column_sums(dy, self.b.grad_mut());
        if let Some(dx) = dx {
            compute.input_grad(dy, &self.w.data, dx, m, accumulate);
        }
    }
}

/// A LayerNorm's parameters.
pub(crate) struct Norm<'a> {
    pub gamma: Param<'a>,
    pub beta: Param<'a>,
    pub eps: f32,
}

impl<'a> Norm<'a> {
    pub(crate) fn of(ln: &'a LayerNorm) -> Result<Self> {
        Ok(Self {
            gamma: Param::of(&ln.weight)?,
            beta: Param::of(&ln.bias)?,
            eps: ln.eps as f32,
        })
    }

    pub fn forward(&self, x: &[f32], y: &mut [f32]) {
        kernels::layer_norm_into(x, y, &self.gamma.data, &self.beta.data, self.eps);
    }

    /// `(gamma, beta, eps)`, as the fused norm passes take them.
    pub(super) fn params(&self) -> (&[f32], &[f32], f32) {
        (&self.gamma.data, &self.beta.data, self.eps)
    }

    /// `dx` from the input `x` and the output gradient `dy`; adds the
    /// parameter gradients.
    pub fn backward(&mut self, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (gamma, dgamma) = self.gamma.data_and_grad();
        let grads = (dgamma, self.beta.grad_mut());
        layer_norm_backward(x, gamma, dy, dx, grads, self.eps);
    }
}
