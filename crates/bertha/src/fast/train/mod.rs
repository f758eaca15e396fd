//! The training fast path: BERT's forward and backward on packed tokens
//! (no padding; each sequence attends over its own tokens only), on
//! plain buffers with fused row passes and strided matrix products, for
//! the models the inference fast path covers on the CPU: BERT post-LN and
//! pre-LN, RoBERTa, DistilBERT, ALBERT, ELECTRA and ModernBERT
//! (`encoder::build` says what each needs).
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
mod hidden;
mod losses;
mod mlm;
mod packs;
mod prediction_head;
mod products;
mod replaced_token;
mod rows;

use candle_core::backprop::GradStore;
use candle_core::Tensor;

use crate::error::Result;
use crate::fast::buffers;

pub use heads::{CustomLoss, FinetuneHead, HeadBatch, HeadOutcome, HeadTargets};
pub use hidden::{EncoderStates, HiddenLoss, HiddenOutcome};
pub use mlm::{MlmBatch, MlmBuffers, MlmHead, MlmOutcome};
pub(crate) use packs::WeightPacks;
pub use products::Compute;
use products::GradSink;
pub use replaced_token::{ReplacedTokenBatch, ReplacedTokenHead, ReplacedTokenOutcome};

/// One parameter: its variable, its values this step and its gradient.
///
/// The values are read in place, the variable's storage read-locked while
/// the parameter lives (no copy of the weights per step; an update of the
/// variable waits until the step's parameters are dropped).
///
/// The gradient is made by what first writes it: a weight's first product
/// writes a buffer whole that nothing zeroed ([`Param::grad_product`]), so a
/// step does not write every weight gradient twice (zeroing the ~116 MB of
/// a `small` model's took ~1 % of its bf16 step).
pub(crate) struct Param<'a> {
    /// `None`: a bias the checkpoint does not have (ModernBERT's), zeros
    /// that take part in the arithmetic and whose gradient goes nowhere.
    tensor: Option<&'a Tensor>,
    pub data: buffers::TensorValues<'a>,
    /// Empty until something writes it this step.
    grad: Vec<f32>,
}

impl<'a> Param<'a> {
    pub fn of(t: &'a Tensor) -> Result<Self> {
        let data = buffers::values_of(t)?;
        Ok(Self {
            tensor: Some(t),
            grad: Vec::new(),
            data,
        })
    }

    /// `len` zeros standing for a parameter the model does not have.
    pub fn absent(len: usize) -> Self {
        Self {
            tensor: None,
            grad: Vec::new(),
            data: buffers::TensorValues::Copied(vec![0.0; len]),
        }
    }

    /// Its gradient, to add into (zeros when nothing wrote it yet).
    pub fn grad_mut(&mut self) -> &mut [f32] {
        if self.grad.len() != self.data.len() {
            self.grad = buffers::zeros(self.data.len());
        }
        &mut self.grad
    }

    /// Its values and its gradient to add into (as [`Param::grad_mut`]).
    pub fn data_and_grad(&mut self) -> (&[f32], &mut [f32]) {
        self.grad_mut();
        (&self.data, &mut self.grad)
    }

    /// Runs a weight gradient's `product` into its gradient: the step's
    /// first writes a new buffer whole (not zeroed first), later ones add.
    /// `product` must pass the sink it is given to one of the weight
    /// gradients' products (`products::weight_grad*`, which write a
    /// [`GradSink::New`] whole, also with no rows to sum).
    pub fn grad_product(&mut self, product: impl FnOnce(GradSink)) {
        if self.grad.len() == self.data.len() {
            return product(GradSink::Add(&mut self.grad));
        }
        let mut new = buffers::Unwritten::new(self.data.len());
        product(GradSink::New(&mut new));
        // SAFETY: every product taking a GradSink writes a New one whole.
        self.grad = unsafe { new.assume_written() };
    }

    /// Adds `g` into its gradient (copies it when nothing wrote it yet).
    pub fn add_grad(&mut self, g: &[f32]) {
        debug_assert_eq!(g.len(), self.data.len());
        if self.grad.len() == self.data.len() {
            buffers::add(&mut self.grad, g);
        } else {
            self.grad = buffers::copied(g);
        }
    }

    /// Its variable (`None` for an [absent](Param::absent) one).
    pub fn tensor(&self) -> Option<&'a Tensor> {
        self.tensor
    }

    /// Whether `t` is this parameter's variable (a tied weight).
    pub fn is(&self, t: &Tensor) -> bool {
        self.tensor.is_some_and(|own| own.id() == t.id())
    }
}

/// Where a weight gradient's product goes: a parameter's gradient
/// ([`Param::grad_product`]), or a sink the caller holds (the stacked Q,
/// K, V gradient, split into theirs after).
pub(crate) trait GradTarget {
    fn product(self, product: impl FnOnce(GradSink));
}

impl GradTarget for &mut Param<'_> {
    fn product(self, product: impl FnOnce(GradSink)) {
        self.grad_product(product)
    }
}

impl GradTarget for GradSink<'_> {
    fn product(self, product: impl FnOnce(GradSink)) {
        product(self)
    }
}

/// The gradients of `params`, keyed by their variables; each gradient
/// buffer moves into its tensor (no copy) and the parameter keeps none.
/// Absent parameters have no variable: their gradients are dropped.
pub(crate) fn grad_store<'a, 'p: 'a>(
    params: impl IntoIterator<Item = &'a mut Param<'p>>,
) -> Result<GradStore> {
    let mut store = GradStore::default();
    for p in params {
        let Some(tensor) = p.tensor else {
            continue;
        };
        p.grad_mut();
        let grad = std::mem::take(&mut p.grad);
        let g = Tensor::from_vec(grad, tensor.shape(), tensor.device())?;
        store.insert(tensor, g);
    }
    Ok(store)
}
