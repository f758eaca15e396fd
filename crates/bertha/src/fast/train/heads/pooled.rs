//! A sequence head's layers above the encoder on its `[CLS]` rows (or
//! ModernBERT's pooled vectors): the sentence module (BERT's pooler, a
//! family's first-token head, ModernBERT's `head`), dropout and the
//! classifier, forward and backward around the caller's loss.

use super::super::encoder::Linear;
use super::{outcome, HeadOutcome, Sentence};
use crate::error::Result;
use crate::fast::buffers::{recycle, zeros};
use crate::model::ops::{bias_act_backward, bias_act_forward};
use crate::model::DropoutMask;

/// The sentence head (the pooler, or a family's first-token head) on each
/// `[CLS]` row, and the classifier on it.
pub(super) struct Pooled<'a, 'p> {
    pub(super) sentence: &'a mut Sentence<'p>,
    pub(super) classifier: &'a mut Linear<'p>,
}

impl Pooled<'_, '_> {
    /// Forward from the `[CLS]` rows `cls` (`[N, D]`), the loss (`loss`
    /// turns the logits `[N, C]` into their gradient, giving the mean loss
    /// and its target count) and backward into `dcls`; dropout (`masks`,
    /// rows keyed by sequence) before a first-token head and before the
    /// classifier.
    pub(super) fn step(
        self,
        cls: &[f32],
        d: usize,
        [first_mask, mask]: [Option<&DropoutMask>; 2],
        dcls: &mut [f32],
        loss: impl FnOnce(&mut [f32], usize) -> Result<(f64, usize)>,
    ) -> Result<HeadOutcome> {
        let n = cls.len() / d.max(1);
        let mut pooled = zeros(n * d);
        // The first-token head's input (dropped) and pre-activation;
        // ModernBERT's head's tape.
        let (mut x0, mut pre, mut head_tape) = (Vec::new(), Vec::new(), None);
        match &*self.sentence {
            Sentence::ModernBert { head, .. } => {
                let (y, tape) = head.forward(cls);
                recycle(std::mem::replace(&mut pooled, y));
                head_tape = Some(tape);
            }
            Sentence::Pooler(pooler) => {
                pooler.forward(cls, &mut pooled, n);
                pooled.iter_mut().for_each(|v| *v = v.tanh());
            }
            Sentence::FirstToken { dense, act, .. } => {
                x0 = cls.to_vec();
                if let Some(m) = first_mask {
                    drop_sequences(m, &mut x0, d);
                }
                pre = zeros(n * d);
                dense.compute.forward(&x0, &dense.w.data, None, &mut pre, n);
                bias_act_forward(&pre, &dense.b.data, &mut pooled, *act);
            }
        }
        let mut x = pooled.clone();
        if let Some(m) = mask {
            drop_sequences(m, &mut x, d);
        }
        let c = self.classifier.out_dim();
        let mut logits = zeros(n * c);
        self.classifier.forward(&x, &mut logits, n);
        let out = logits.clone();
        let (mean, targets) = loss(&mut logits, c)?;
        if targets == 0 {
            return Ok(outcome(mean, targets, out));
        }
        let mut dx = zeros(n * d);
        self.classifier
            .backward(&x, &logits, Some(&mut dx), n, false);
        if let Some(m) = mask {
            drop_sequences(m, &mut dx, d);
        }
        match self.sentence {
            Sentence::ModernBert { head, .. } => {
                if let Some(tape) = head_tape {
                    let dpooled = head.backward(cls, tape, &dx);
                    dcls.copy_from_slice(&dpooled);
                    recycle(dpooled);
                }
            }
            Sentence::Pooler(pooler) => {
                for (g, p) in dx.iter_mut().zip(&pooled) {
                    *g *= 1.0 - p * p;
                }
                pooler.backward(cls, &dx, Some(dcls), n, false);
            }
            Sentence::FirstToken { dense, act, .. } => {
                let mut dpre = zeros(n * d);
                let (bias, dbias) = dense.b.data_and_grad();
                bias_act_backward(&pre, bias, &dx, &mut dpre, dbias, *act);
                let compute = dense.compute;
                dense
                    .w
                    .grad_product(|dw| compute.weight_grad_into(&dpre, &x0, dw, n));
                compute.input_grad(&dpre, &dense.w.data, dcls, n, false);
                if let Some(m) = first_mask {
                    drop_sequences(m, dcls, d);
                }
            }
        }
        Ok(outcome(mean, targets, out))
    }
}

/// Dropout on one row per sequence `[N, D]`, row `s` keyed as the candle
/// modules key batch row `s`.
fn drop_sequences(mask: &DropoutMask, x: &mut [f32], d: usize) {
    for (s, row) in x.chunks_exact_mut(d).enumerate() {
        mask.apply_row(mask.row_key(&[s]), row);
    }
}
