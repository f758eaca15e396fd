//! Pre-training on the fast path: the MLM head on the masked positions
//! only (+ next-sentence prediction on the pooled `[CLS]` rows).

use candle_core::backprop::GradStore;
use candle_core::Tensor;

use super::encoder::{Encoder, Linear, Norm};
use super::losses::{cross_entropy, cross_entropy_to_pairs};
use super::packs::WeightPacks;
use super::products::{input_grad_pairs_bf16, weight_grad_pairs_bf16, Compute, GradSink, Weight};
use super::{grad_store, Param};
use crate::error::{Error, Result};
use crate::fast::buffers::{add, recycle, scratch, zeros, StepBuffers};
use crate::fast::kernels::Act;
use crate::fast::matmul::as_words_mut;
use crate::model::ops::{bias_act_backward, bias_act_forward, column_sums};
use crate::model::{
    BertForMaskedLM, BertForTask, BertHead, BertLMPredictionHead, BertModel, Dense, IGNORE_INDEX,
};

/// One micro-batch: packed sequences with their MLM labels (one per
/// token, [`IGNORE_INDEX`] where nothing is predicted) and, with NSP,
/// one next-sentence label per sequence.
pub struct MlmBatch<'a> {
    pub sequences: Vec<(&'a [u32], &'a [u32])>,
    pub labels: Vec<&'a [i64]>,
    pub next_sentence: Option<Vec<i64>>,
}

/// A step's losses and the gradients of `weights[0] · mlm + weights[1] ·
/// nsp` (each loss a mean over its targets).
pub struct MlmOutcome {
    /// Mean MLM loss over `masked` targets.
    pub mlm_loss: f64,
    pub masked: usize,
    pub correct: usize,
    /// Mean NSP loss over `pairs` labelled sequences.
    pub nsp_loss: f64,
    pub pairs: usize,
    pub gradients: GradStore,
}

/// The MLM head's two largest buffers, kept from one step to the next by
/// a training run: the logits `[masked, vocab]` and their gradient as bf16
/// pairs (~110 MB at 614 masked rows of BERT's vocabulary). Made afresh
/// every step they came from new pages, and the kernel's fault and zeroing
/// of each 4 KiB page as the tiles first wrote it cost 8–11 % of a `mini`
/// bf16 step on the 2-core test machine (17,700 page faults a step; none
/// with these kept).
#[derive(Default)]
pub struct MlmBuffers {
    logits: Vec<f32>,
    pairs: Vec<f32>,
}

impl MlmBuffers {
    /// `len` values for a pass that writes all of them: the kept buffer
    /// when it holds that many, else a new one with room for a few more
    /// masked rows than this step's (their count varies from batch to
    /// batch).
    fn take(kept: &mut Vec<f32>, len: usize) -> Vec<f32> {
        let mut v = std::mem::take(kept);
        if v.capacity() < len {
            drop(v);
            v = Vec::with_capacity(len + len / 16);
        }
        // Within the capacity: no new allocation; values past the old
        // length are zeroed, the others kept.
        v.resize(len, 0.0);
        if cfg!(debug_assertions) {
            v.fill(f32::NAN);
        }
        v
    }
}

/// `BertForMaskedLM` / `BertForPreTraining` on the fast path.
pub struct MlmHead<'a> {
    encoder: Encoder<'a>,
    transform: Linear<'a>,
    act: Act,
    transform_norm: Norm<'a>,
    /// The decoder's own matrix; `None` when tied to the word embeddings.
    decoder: Option<Param<'a>>,
    decoder_bias: Param<'a>,
    /// Pooler and `seq_relationship` (with NSP).
    nsp: Option<(Linear<'a>, Linear<'a>)>,
    compute: Compute,
    /// The weights' bf16 panels the optimizer made (see [`WeightPacks`]).
    packs: Option<&'a WeightPacks>,
}

pub(super) fn linear<'a>(dense: &'a Dense, what: &str) -> Result<Linear<'a>> {
    let b = dense
        .bias()
        .ok_or_else(|| Error::Input(format!("internal: {what} has no bias")))?;
    Ok(Linear::new(Param::of(dense.weight())?, Param::of(b)?))
}

impl<'a> MlmHead<'a> {
    /// The current weights of `model`, when the fast path covers it (a
    /// BERT MLM or pre-training head on an encoder it runs).
    pub fn of(model: &'a BertForTask) -> Result<Option<Self>> {
        let (head, nsp): (&BertLMPredictionHead, _) = match model {
            BertForTask::MaskedLM(m) => (m.predictions(), None),
            BertForTask::PreTraining(m) => (m.predictions(), Some(m.seq_relationship())),
            _ => return Ok(None),
        };
        Self::of_parts(model.bert(), head, nsp)
    }

    /// [`MlmHead::of`] a masked LM (ELECTRA's generator).
    pub fn of_masked_lm(model: &'a BertForMaskedLM) -> Result<Option<Self>> {
        Self::of_parts(model.bert(), model.predictions(), None)
    }

    fn of_parts(
        bert: &'a BertModel,
        head: &'a BertLMPredictionHead,
        nsp: Option<&'a Dense>,
    ) -> Result<Option<Self>> {
        let Some(encoder) = Encoder::of(bert)? else {
            return Ok(None);
        };
        let nsp = match nsp {
            Some(classifier) => {
                let Some(pooler) = &bert.pooler else {
                    return Ok(None);
                };
                Some((
                    linear(&pooler.dense, "the pooler")?,
                    linear(classifier, "seq_relationship")?,
                ))
            }
            None => None,
        };
        let Some(bias) = head.decoder.bias() else {
            return Ok(None);
        };
        let tied = encoder.word.is(head.decoder.weight());
        Ok(Some(Self {
            // ModernBERT's `head.dense` may have no bias.
            transform: Linear::with_any_bias(&head.dense)?,
            act: head.act.into(),
            transform_norm: Norm {
                gamma: Param::of(&head.layer_norm.weight)?,
                beta: Param::of(&head.layer_norm.bias)?,
                eps: head.layer_norm.eps as f32,
            },
            decoder: if tied {
                None
            } else {
                Some(Param::of(head.decoder.weight())?)
            },
            decoder_bias: Param::of(bias)?,
            encoder,
            nsp,
            compute: Compute::F32,
            packs: None,
        }))
    }

    /// The weights whose bf16 panels the optimizer can keep for the steps
    /// ([`WeightPacks`]): the decoder's matrix (the word embeddings when
    /// tied, the largest) and the encoder's ([`Encoder::packed_weights`]).
    pub fn packed_weights(&self) -> Vec<&'a Tensor> {
        let decoder = self.decoder.as_ref().unwrap_or(&self.encoder.word);
        let mut weights: Vec<_> = decoder.tensor().into_iter().collect();
        weights.extend(self.encoder.packed_weights());
        weights
    }

    /// Reads the weights' panels from `packs` where they are current.
    pub fn with_packs(mut self, packs: &'a WeightPacks) -> Self {
        self.packs = Some(packs);
        self.encoder.use_packs(packs);
        self
    }

    /// Runs the encoder's and the MLM head's linear products in `compute`
    /// (the small pooler and NSP classifier stay fp32).
    pub fn with_compute(mut self, compute: Compute) -> Self {
        self.compute = compute;
        self.transform.compute = compute;
        self.encoder.set_compute(compute);
        self
    }

    /// Forward and backward on `batch` (dropout on with `train`).
    pub fn step(self, batch: &MlmBatch, weights: [f64; 2], train: bool) -> Result<MlmOutcome> {
        self.step_keeping(batch, weights, train, &mut MlmBuffers::default())
    }

    /// [`MlmHead::step`] with the logits and their gradient in `kept`'s
    /// buffers, which it leaves there for the next step.
    pub fn step_keeping(
        self,
        batch: &MlmBatch,
        weights: [f64; 2],
        train: bool,
        kept: &mut MlmBuffers,
    ) -> Result<MlmOutcome> {
        self.step_reading_logits(batch, weights, train, kept, &mut |_| Ok(()))
    }

    /// [`MlmHead::step_keeping`] that hands the logits of the masked rows
    /// (`[masked, vocab]`, in the order of the labels: sequence by
    /// sequence, positions ascending) to `read` before the backward pass
    /// turns them into their gradient (ELECTRA samples from them).
    pub fn step_reading_logits(
        mut self,
        batch: &MlmBatch,
        weights: [f64; 2],
        train: bool,
        kept: &mut MlmBuffers,
        read: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<MlmOutcome> {
        // The step's buffers are reused within it and freed at its end.
        let _buffers = StepBuffers::begin();
        if batch.labels.len() != batch.sequences.len() {
            return Err(Error::Input(format!(
                "{} label rows for {} sequences",
                batch.labels.len(),
                batch.sequences.len()
            )));
        }
        // MLM: the masked rows through transform, LayerNorm and decoder.
        let vocab = self.decoder_bias.data.len();
        let (mut outputs, mut targets) = (Vec::new(), Vec::new());
        for (s, (labels, (ids, _))) in batch.labels.iter().zip(&batch.sequences).enumerate() {
            if labels.len() != ids.len() {
                return Err(Error::Input(format!(
                    "sequence {s}: {} labels for {} tokens",
                    labels.len(),
                    ids.len()
                )));
            }
            for (p, &y) in labels.iter().enumerate() {
                if y == IGNORE_INDEX {
                    continue;
                }
                if !(0..vocab as i64).contains(&y) {
                    return Err(Error::Input(format!(
                        "labels: label {y} at sequence {s}, position {p} is not a token id in 0..{vocab}"
                    )));
                }
                outputs.push([s, p]);
                targets.push(y as u32);
            }
        }
        let masked_at = outputs.clone();
        // NSP reads each non-empty sequence's [CLS] row too.
        if self.nsp.is_some() && batch.next_sentence.is_some() {
            outputs.extend(
                batch
                    .sequences
                    .iter()
                    .enumerate()
                    .filter(|(_, (ids, _))| !ids.is_empty())
                    .map(|(s, _)| [s, 0]),
            );
            outputs.sort_unstable();
            outputs.dedup();
        }
        // The last layer runs at the rows the heads read only.
        let (hidden, tape) = self
            .encoder
            .forward(&batch.sequences, 0, Some(outputs), train)?;
        let d = self.encoder.hidden();
        let mut dhidden = zeros(hidden.len());
        let row_of = |s: usize, p: usize| {
            tape.output_row(s, p).ok_or_else(|| {
                Error::Input(format!(
                    "internal: row {p} of sequence {s} was not computed"
                ))
            })
        };
        let rows = masked_at
            .iter()
            .map(|&[s, p]| row_of(s, p))
            .collect::<Result<Vec<_>>>()?;
        let masked = rows.len();
        let (mut mlm_loss, mut correct) = (0.0, 0);
        if masked > 0 {
            let mut hm = scratch(masked * d);
            for (dst, &r) in hm.chunks_exact_mut(d).zip(&rows) {
                dst.copy_from_slice(&hidden[r * d..(r + 1) * d]);
            }
            let width = self.transform.out_dim();
            let mut t = scratch(masked * width);
            self.compute
                .forward(&hm, &self.transform.w.data, None, &mut t, masked);
            let mut u = scratch(masked * width);
            bias_act_forward(&t, &self.transform.b.data, &mut u, self.act);
            let mut z = scratch(masked * width);
            self.transform_norm.forward(&u, &mut z);
            let decoder = self.decoder.as_ref().unwrap_or(&self.encoder.word);
            // Packed by the optimizer (bf16 only): held for both products.
            let panels = match self.compute {
                Compute::Bf16 => self
                    .packs
                    .zip(decoder.tensor())
                    .and_then(|(p, w)| p.current(w)),
                Compute::F32 => None,
            };
            let decoder_weight = Weight {
                data: &decoder.data,
                panels: panels.as_deref(),
            };
            let mut logits = MlmBuffers::take(&mut kept.logits, masked * vocab);
            let bias = Some(&self.decoder_bias.data[..]);
            self.compute
                .forward_weight(&z, decoder_weight, bias, &mut logits, masked);
            read(&logits)?;
            let weight = (weights[0] / masked as f64) as f32;
            let mut dz = scratch(masked * width);
            // Backward: logits turn into their gradient in place (and, for
            // bf16 products, into the input gradient's rounded operand and
            // the bias gradient in the same pass).
            let ce = match self.compute {
                Compute::F32 => {
                    let ce = cross_entropy(&mut logits, vocab, &targets, weight);
                    let dlogits = &logits;
                    self.compute
                        .input_grad(dlogits, &decoder.data, &mut dz, masked, false);
                    column_sums(dlogits, self.decoder_bias.grad_mut());
                    let decoder = self.decoder.as_mut().unwrap_or(&mut self.encoder.word);
                    let compute = self.compute;
                    decoder.grad_product(|dw| compute.weight_grad_into(dlogits, &z, dw, masked));
                    ce
                }
                Compute::Bf16 => {
                    // The gradient exists only as both products' operand.
                    let mut words = MlmBuffers::take(&mut kept.pairs, masked * vocab.div_ceil(2));
                    let pairs = as_words_mut(&mut words);
                    let bias_grad = self.decoder_bias.grad_mut();
                    let ce =
                        cross_entropy_to_pairs(&logits, vocab, &targets, weight, pairs, bias_grad);
                    let w = decoder_weight;
                    input_grad_pairs_bf16((pairs, vocab), w, &mut dz, masked, false);
                    let decoder = self.decoder.as_mut().unwrap_or(&mut self.encoder.word);
                    decoder.grad_product(|dw| weight_grad_pairs_bf16(pairs, vocab, &z, dw, masked));
                    kept.pairs = words;
                    ce
                }
            };
            mlm_loss = ce.sum / masked as f64;
            correct = ce.correct;
            // Kept for the next step: nothing later in this one has its size.
            kept.logits = logits;
            recycle(z);
            let mut du = scratch(masked * width);
            self.transform_norm.backward(&u, &dz, &mut du);
            recycle(dz);
            recycle(u);
            let mut dt = scratch(masked * width);
            let (bias, dbias) = self.transform.b.data_and_grad();
            bias_act_backward(&t, bias, &du, &mut dt, dbias, self.act);
            let compute = self.compute;
            let weight_grad = |dw: GradSink| compute.weight_grad_into(&dt, &hm, dw, masked);
            self.transform.w.grad_product(weight_grad);
            recycle(du);
            recycle(t);
            recycle(hm);
            let mut dhm = scratch(masked * d);
            self.compute
                .input_grad(&dt, &self.transform.w.data, &mut dhm, masked, false);
            recycle(dt);
            for (src, &r) in dhm.chunks_exact(d).zip(&rows) {
                add(&mut dhidden[r * d..(r + 1) * d], src);
            }
            recycle(dhm);
        }

        // NSP: pooler (dense + tanh) on each [CLS] row, then the classifier.
        let (mut nsp_loss, mut pairs) = (0.0, 0);
        if let (Some((pooler, classifier)), Some(labels)) = (&mut self.nsp, &batch.next_sentence) {
            let n = batch.sequences.len();
            if labels.len() != n {
                return Err(Error::Input(format!(
                    "next_sentence_label: {} labels for {n} sequences",
                    labels.len()
                )));
            }
            let live: Vec<usize> = (0..n)
                .filter(|&s| !batch.sequences[s].0.is_empty())
                .collect();
            let cls_rows = live
                .iter()
                .map(|&s| row_of(s, 0))
                .collect::<Result<Vec<_>>>()?;
            let mut cls = zeros(live.len() * d);
            for (dst, &r) in cls.chunks_exact_mut(d).zip(&cls_rows) {
                dst.copy_from_slice(&hidden[r * d..(r + 1) * d]);
            }
            let m = live.len();
            let mut pooled = zeros(m * d);
            pooler.forward(&cls, &mut pooled, m);
            pooled.iter_mut().for_each(|v| *v = v.tanh());
            let classes = classifier.out_dim();
            let mut logits = zeros(m * classes);
            classifier.forward(&pooled, &mut logits, m);
            let (mut picked, mut nsp_targets) = (Vec::new(), Vec::new());
            for (i, &s) in live.iter().enumerate() {
                let y = labels[s];
                if y == IGNORE_INDEX {
                    continue;
                }
                if !(0..classes as i64).contains(&y) {
                    return Err(Error::Input(format!(
                        "next_sentence_label: label {y} of sequence {s} is not in 0..{classes}"
                    )));
                }
                picked.push(i);
                nsp_targets.push(y as u32);
            }
            pairs = picked.len();
            if pairs > 0 {
                let mut rows_logits: Vec<f32> = picked
                    .iter()
                    .flat_map(|&i| logits[i * classes..(i + 1) * classes].to_vec())
                    .collect();
                let weight = (weights[1] / pairs as f64) as f32;
                let ce = cross_entropy(&mut rows_logits, classes, &nsp_targets, weight);
                nsp_loss = ce.sum / pairs as f64;
                let mut dlogits = zeros(m * classes);
                for (k, &i) in picked.iter().enumerate() {
                    dlogits[i * classes..(i + 1) * classes]
                        .copy_from_slice(&rows_logits[k * classes..(k + 1) * classes]);
                }
                let mut dpooled = zeros(m * d);
                classifier.backward(&pooled, &dlogits, Some(&mut dpooled), m, false);
                for (g, p) in dpooled.iter_mut().zip(&pooled) {
                    *g *= 1.0 - p * p;
                }
                let mut dcls = zeros(m * d);
                pooler.backward(&cls, &dpooled, Some(&mut dcls), m, false);
                for (src, &r) in dcls.chunks_exact(d).zip(&cls_rows) {
                    add(&mut dhidden[r * d..(r + 1) * d], src);
                }
            }
        }

        recycle(hidden);
        if masked > 0 || pairs > 0 {
            self.encoder.backward(tape, dhidden);
        }
        let mut params = self.encoder.params_mut();
        params.extend([
            &mut self.transform.w,
            &mut self.transform.b,
            &mut self.transform_norm.gamma,
            &mut self.transform_norm.beta,
            &mut self.decoder_bias,
        ]);
        params.extend(&mut self.decoder);
        if let Some((p, c)) = &mut self.nsp {
            params.extend([&mut p.w, &mut p.b, &mut c.w, &mut c.b]);
        }
        Ok(MlmOutcome {
            mlm_loss,
            masked,
            correct,
            nsp_loss,
            pairs,
            gradients: grad_store(params)?,
        })
    }
}
