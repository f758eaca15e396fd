//! ELECTRA's discriminator (`ElectraForPreTraining`) on the fast path:
//! dense → `hidden_act` → `dense_prediction` on every packed token, and the
//! mean binary cross-entropy over them all (packed tokens are exactly the
//! attended ones a padded batch scores).

use candle_core::backprop::GradStore;
use candle_core::Tensor;

use super::encoder::{Encoder, Linear};
use super::grad_store;
use super::losses::bce_with_logit;
use super::mlm::linear;
use super::packs::WeightPacks;
use super::products::{Compute, GradSink};
use crate::error::{Error, Result};
use crate::fast::buffers::{recycle, scratch, zeros, StepBuffers};
use crate::fast::kernels::Act;
use crate::model::ops::{bias_act_backward, bias_act_forward};
use crate::model::{BertHead, ElectraForPreTraining};

/// One micro-batch: packed sequences `(ids, token types)` and, per token,
/// whether it was replaced.
pub struct ReplacedTokenBatch<'a> {
    pub sequences: Vec<(&'a [u32], &'a [u32])>,
    pub replaced: Vec<&'a [bool]>,
}

/// A step's mean loss over its tokens, the tokens the discriminator got
/// right (logit > 0 means "replaced"), and the gradients of `weight ·`
/// the loss.
pub struct ReplacedTokenOutcome {
    pub loss: f64,
    pub tokens: usize,
    pub correct: usize,
    pub gradients: GradStore,
}

/// `ElectraForPreTraining` on the fast path.
pub struct ReplacedTokenHead<'a> {
    encoder: Encoder<'a>,
    dense: Linear<'a>,
    act: Act,
    prediction: Linear<'a>,
}

impl<'a> ReplacedTokenHead<'a> {
    /// The current weights of `model`, when the fast path covers its
    /// encoder.
    pub fn of(model: &'a ElectraForPreTraining) -> Result<Option<Self>> {
        let Some(encoder) = Encoder::of(model.bert())? else {
            return Ok(None);
        };
        let (dense, act, prediction) = model.parts();
        if dense.bias().is_none() || prediction.bias().is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            encoder,
            dense: linear(dense, "discriminator_predictions.dense")?,
            act: act.into(),
            prediction: linear(prediction, "discriminator_predictions.dense_prediction")?,
        }))
    }

    /// Runs the encoder's and the head's dense products in `compute` (the
    /// one-logit prediction stays fp32).
    pub fn with_compute(mut self, compute: Compute) -> Self {
        self.encoder.set_compute(compute);
        self.dense.compute = compute;
        self
    }

    /// The weights whose bf16 panels the optimizer can keep
    /// ([`WeightPacks`]): the encoder's.
    pub fn packed_weights(&self) -> Vec<&'a Tensor> {
        self.encoder.packed_weights()
    }

    /// Reads the weights' panels from `packs` where they are current.
    pub fn with_packs(mut self, packs: &'a WeightPacks) -> Self {
        self.encoder.use_packs(packs);
        self
    }

    /// Forward and backward on `batch` (dropout on with `train`).
    pub fn step(
        mut self,
        batch: &ReplacedTokenBatch,
        weight: f64,
        train: bool,
    ) -> Result<ReplacedTokenOutcome> {
        let _buffers = StepBuffers::begin();
        if batch.replaced.len() != batch.sequences.len() {
            return Err(Error::Input(format!(
                "{} label rows for {} sequences",
                batch.replaced.len(),
                batch.sequences.len()
            )));
        }
        for (s, (labels, (ids, _))) in batch.replaced.iter().zip(&batch.sequences).enumerate() {
            if labels.len() != ids.len() {
                return Err(Error::Input(format!(
                    "sequence {s}: {} labels for {} tokens",
                    labels.len(),
                    ids.len()
                )));
            }
        }
        let labels: Vec<bool> = batch.replaced.concat();
        let t = labels.len();
        if t == 0 {
            return Err(Error::Input(
                "the batch has no token for the discriminator to score".into(),
            ));
        }
        let (hidden, tape) = self.encoder.forward(&batch.sequences, 0, None, train)?;
        let d = self.encoder.hidden();
        let mut pre = scratch(t * d);
        let compute = self.dense.compute;
        compute.forward(&hidden, &self.dense.w.data, None, &mut pre, t);
        let mut h = scratch(t * d);
        bias_act_forward(&pre, &self.dense.b.data, &mut h, self.act);
        let mut logits = zeros(t);
        self.prediction.forward(&h, &mut logits, t);
        // BCEWithLogits, mean over the tokens; the logits become the
        // gradient of the weighted mean.
        let (mut sum, mut correct) = (0f64, 0);
        let scale = (weight / t as f64) as f32;
        for (x, &replaced) in logits.iter_mut().zip(&labels) {
            if (*x > 0.0) == replaced {
                correct += 1;
            }
            let (loss, grad) = bce_with_logit(*x, if replaced { 1.0 } else { 0.0 });
            sum += loss;
            *x = scale * grad;
        }
        let mut dh = scratch(t * d);
        self.prediction
            .backward(&h, &logits, Some(&mut dh), t, false);
        recycle(h);
        let mut dpre = scratch(t * d);
        let (bias, dbias) = self.dense.b.data_and_grad();
        bias_act_backward(&pre, bias, &dh, &mut dpre, dbias, self.act);
        recycle(dh);
        recycle(pre);
        let weight_grad = |dw: GradSink| compute.weight_grad_into(&dpre, &hidden, dw, t);
        self.dense.w.grad_product(weight_grad);
        let mut dhidden = scratch(t * d);
        compute.input_grad(&dpre, &self.dense.w.data, &mut dhidden, t, false);
        recycle(dpre);
        recycle(hidden);
        self.encoder.backward(tape, dhidden);
        let mut params = self.encoder.params_mut();
        params.extend([
            &mut self.dense.w,
            &mut self.dense.b,
            &mut self.prediction.w,
            &mut self.prediction.b,
        ]);
        Ok(ReplacedTokenOutcome {
            loss: sum / t as f64,
            tokens: t,
            correct,
            gradients: grad_store(params)?,
        })
    }
}
