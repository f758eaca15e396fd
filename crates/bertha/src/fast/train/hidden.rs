//! The encoder alone on the fast path, under a loss the caller computes on
//! its last hidden states (sentence-embedding training: the caller pools
//! each sequence's rows and takes a contrastive loss). Every row of the
//! last layer is read by such a loss, so the last layer runs on every row
//! (no row skipping, unlike a `[CLS]` head).

use candle_core::backprop::GradStore;

use super::encoder::Encoder;
use super::grad_store;
use super::products::Compute;
use crate::error::{Error, Result};
use crate::fast::buffers::StepBuffers;
use crate::model::BertModel;

/// A caller's loss on the last hidden states: given the packed rows `[T,
/// D]` and the sequences' row offsets (`N + 1`, from 0), the mean loss,
/// its number of terms and the gradient of the mean with respect to each
/// row value (`[T, D]`).
pub type HiddenLoss<'a> = dyn Fn(&[f32], &[usize]) -> Result<(f64, usize, Vec<f32>)> + 'a;

/// A step's mean loss and the gradients of `weight · loss`.
pub struct HiddenOutcome {
    pub loss: f64,
    pub targets: usize,
    pub gradients: GradStore,
}

/// `BertModel` (embeddings and encoder, no pooler) on the fast path.
pub struct EncoderStates<'a> {
    encoder: Encoder<'a>,
}

impl<'a> EncoderStates<'a> {
    /// The current weights of `model`, when the fast path covers it (BERT
    /// on the CPU, as [`super::FinetuneHead::of`]).
    pub fn of(model: &'a BertModel) -> Result<Option<Self>> {
        Ok(Encoder::of(model)?.map(|encoder| Self { encoder }))
    }

    /// Runs the encoder's linear products in `compute`.
    pub fn with_compute(mut self, compute: Compute) -> Self {
        self.encoder.set_compute(compute);
        self
    }

    /// The forward pass of [`Self::step`] alone, no backward and no
    /// gradients: `read` sees the last hidden states and the sequences'
    /// row offsets (GradCache's first pass: embeddings whose activations
    /// are dropped).
    pub fn forward<T>(
        self,
        sequences: &[(&[u32], &[u32])],
        train: bool,
        read: impl FnOnce(&[f32], &[usize]) -> Result<T>,
    ) -> Result<T> {
        let _buffers = StepBuffers::begin();
        let (hidden, tape) = self.encoder.forward(sequences, 0, None, train)?;
        let out = read(&hidden, tape.offsets());
        crate::fast::buffers::recycle(hidden);
        out
    }

    /// Forward on `sequences` (`(ids, token types)`, packed end to end;
    /// dropout on with `train`, sequence `s` keyed as row `s` of a padded
    /// batch), the caller's `loss` on the last hidden states, and backward:
    /// the mean loss and the gradients of `weight` times it.
    pub fn step(
        mut self,
        sequences: &[(&[u32], &[u32])],
        loss: &HiddenLoss,
        weight: f64,
        train: bool,
    ) -> Result<HiddenOutcome> {
        let _buffers = StepBuffers::begin();
        let (hidden, tape) = self.encoder.forward(sequences, 0, None, train)?;
        let (mean, targets, grad) = loss(&hidden, tape.offsets())?;
        if grad.len() != hidden.len() {
            return Err(Error::Input(format!(
                "internal: a gradient of {} values for {} hidden-state values",
                grad.len(),
                hidden.len()
            )));
        }
        crate::fast::buffers::recycle(hidden);
        if targets > 0 {
            let mut dy = crate::fast::buffers::zeros(grad.len());
            let w = weight as f32;
            for (d, g) in dy.iter_mut().zip(&grad) {
                *d = w * g;
            }
            self.encoder.backward(tape, dy);
        }
        let gradients = grad_store(self.encoder.params_mut())?;
        Ok(HiddenOutcome {
            loss: mean,
            targets,
            gradients,
        })
    }
}
