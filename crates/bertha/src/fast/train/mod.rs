//! The training fast path: BERT's forward and backward on packed tokens
//! (no padding; each sequence attends over its own tokens only), on
//! plain buffers with fused row passes and strided matrix products, for
//! the models the inference fast path covers (BERT post-LN and pre-LN on
//! the CPU).
//!
//! A step reads the current weights in the trainer's variables (their
//! storage read-locked while the step's parameters live), runs forward and
//! backward, and hands the gradients back keyed by those variables
//! ([`GradStore`]), so accumulation, the data-parallel sum,
//! clipping, AdamW, checkpoints and resume are the one training loop's.
//! Dropout draws the masks the candle modules draw (same stream, same
//! element coordinates), so in fp32 both paths compute the same step.

mod attention;
mod encoder;
mod heads;
mod losses;
mod mlm;
mod packs;
mod products;
mod rows;

use candle_core::backprop::GradStore;
use candle_core::Tensor;

use crate::error::Result;
use crate::fast::buffers;

pub use heads::{FinetuneHead, HeadBatch, HeadOutcome, HeadTargets};
pub use mlm::{MlmBatch, MlmBuffers, MlmHead, MlmOutcome};
pub(crate) use packs::WeightPacks;
pub use products::Compute;

/// One parameter: its variable, its values this step and its gradient.
///
/// The values are read in place, the variable's storage read-locked while
/// the parameter lives (no copy of the weights per step; an update of the
/// variable waits until the step's parameters are dropped).
pub(crate) struct Param<'a> {
    tensor: &'a Tensor,
    pub data: buffers::TensorValues<'a>,
    pub grad: Vec<f32>,
}

impl<'a> Param<'a> {
    pub fn of(t: &'a Tensor) -> Result<Self> {
        let data = buffers::values_of(t)?;
        Ok(Self {
            tensor: t,
            grad: buffers::zeros(data.len()),
            data,
        })
    }

    /// Its variable.
    pub fn tensor(&self) -> &'a Tensor {
        self.tensor
    }

    /// Whether `t` is this parameter's variable (a tied weight).
    pub fn is(&self, t: &Tensor) -> bool {
        self.tensor.id() == t.id()
    }
}

/// The gradients of `params`, keyed by their variables; each gradient
/// buffer moves into its tensor (no copy) and the parameter keeps none.
pub(crate) fn grad_store<'a, 'p: 'a>(
    params: impl IntoIterator<Item = &'a mut Param<'p>>,
) -> Result<GradStore> {
    let mut store = GradStore::default();
    for p in params {
        let grad = std::mem::take(&mut p.grad);
        let g = Tensor::from_vec(grad, p.tensor.shape(), p.tensor.device())?;
        store.insert(p.tensor, g);
    }
    Ok(store)
}
