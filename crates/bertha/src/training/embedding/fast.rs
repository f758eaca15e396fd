//! Sentence-embedding training on the fast engine: every column of a
//! micro-batch (anchors, positives, negatives…) packed end to end as one
//! set of sequences, one forward and one backward pass for them all. The
//! last hidden states come back to this side, are laid out as the candle
//! path's padded `[n, L, D]` column batches (padding rows zero: pooling
//! masks them out), pooled by the same `pooling::pool` and compared by
//! the same [`super::EmbeddingLoss`] on candle tensors (small: `[n, D]`
//! per column); the gradient with respect to the token rows goes back
//! into the engine. Dropout: sequence `j·B + i` (column `j`, row `i`) of
//! the packed set draws the masks the candle path draws for that row
//! (see [`EmbeddingTraining::seed_column`]).

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use super::{EmbeddingTraining, LossKind};
use crate::error::{Error, Result};
use crate::fast::train::{Compute, EncoderStates, HiddenLoss};
use crate::model::BertModel;
use crate::pooling;
use crate::training::trainer::{Engine, Slice};

/// What the fast engine does not cover for this run, if anything (the
/// encoder's family / layout, or the loss).
pub(super) fn not_covered(model: &BertModel, kind: LossKind) -> Result<Option<String>> {
    if EncoderStates::of(model)?.is_none() {
        let cfg = model.config();
        return Ok(Some(format!(
            "embedding training on `{}` models as configured",
            cfg.model_type
        )));
    }
    if kind == LossKind::CachedMnrl {
        // GradCache bounds memory by re-encoding mini-batches; the packed
        // engine encodes the micro-batch whole.
        return Ok(Some("the cached-mnrl loss (GradCache)".into()));
    }
    Ok(None)
}

impl EmbeddingTraining {
    /// Whether this slice trains on the fast engine: it covers the run
    /// and the micro-batch is on one process (data-parallel runs gather
    /// embeddings across processes, which the packed pass does not do yet:
    /// `auto` runs them on candle, `fast` refuses).
    pub(super) fn fast_slice(&self, rows: &[usize], slice: &Slice) -> Result<bool> {
        if !self.fast {
            return Ok(false);
        }
        if slice.group.size() == 1 && slice.first == 0 && rows.len() == slice.micro_batch.len() {
            return Ok(true);
        }
        let what = "embedding training across processes (MPI: embeddings gathered across ranks)";
        self.opts.train.engine.fallback(what)?;
        if self.opts.train.precision != Compute::F32 {
            return Err(Error::option(
                "precision",
                format!(
                    "{:?} trains on the fast engine only, which does not cover {what}",
                    self.opts.train.precision
                ),
            ));
        }
        Ok(false)
    }

    /// The micro-batch `rows`' loss and its gradients on the fast engine
    /// (one process holds the whole micro-batch).
    pub(super) fn fast_loss(&self, rows: &[usize], micro: u64) -> Result<(f64, GradStore)> {
        let columns = self.train.columns();
        let longest = self
            .train
            .ids
            .iter()
            .flat_map(|col| rows.iter().map(|&i| col[i].len()))
            .max()
            .unwrap_or(0);
        let types = vec![0u32; longest];
        let sequences: Vec<(&[u32], &[u32])> = (0..columns)
            .flat_map(|j| {
                let types = &types;
                rows.iter().map(move |&i| {
                    let ids = &self.train.ids[j][i][..];
                    (ids, &types[..ids.len()])
                })
            })
            .collect();
        let loss = |hidden: &[f32], offsets: &[usize]| self.pooled_loss(rows, hidden, offsets);
        let hidden_loss: &HiddenLoss = &loss;
        let states = EncoderStates::of(&self.model)?
            .ok_or_else(|| {
                Error::Input("internal: the fast path no longer covers the model".into())
            })?
            .with_compute(self.compute);
        // Column j's row i is sequence j·n + i; the candle path keys it as
        // row i of column j's pass seeded at j·n (see `seed_column`).
        self.seed_column(micro, 0, 0, rows.len());
        let out = states.step(&sequences, hidden_loss, 1.0, true)?;
        Ok((out.loss, out.gradients))
    }

    /// The loss on the last hidden states `hidden` (`[T, D]`, sequences
    /// at `offsets`: column by column, `rows.len()` each), and its
    /// gradient with respect to them.
    fn pooled_loss(
        &self,
        rows: &[usize],
        hidden: &[f32],
        offsets: &[usize],
    ) -> Result<(f64, usize, Vec<f32>)> {
        let d = self.model.config().hidden_size;
        let n = rows.len();
        let columns = self.train.columns();
        let mut padded = Vec::with_capacity(columns);
        let mut reps = Vec::with_capacity(columns);
        for j in 0..columns {
            let span = &offsets[j * n..=(j + 1) * n];
            let len = (0..n).map(|i| span[i + 1] - span[i]).max().unwrap_or(0);
            let mut values = vec![0f32; n * len * d];
            let mut mask = vec![0u32; n * len];
            for i in 0..n {
                let (a, b) = (span[i], span[i + 1]);
                values[i * len * d..(i * len + b - a) * d].copy_from_slice(&hidden[a * d..b * d]);
                mask[i * len..i * len + b - a].fill(1);
            }
            let states = Var::from_vec(values, (n, len, d), &self.device)?;
            let mask = Tensor::from_vec(mask, (n, len), &self.device)?;
            let pooled = pooling::pool(states.as_tensor(), &mask, self.pooling, None)?;
            reps.push(if self.normalize {
                pooling::normalize(&pooled)?
            } else {
                pooled
            });
            padded.push((states, len));
        }
        let scores = self.train.scores(rows, &self.device)?;
        let loss = self.opts.loss.compute(&reps, scores.as_ref())?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        let grads = loss.backward()?;
        let mut dhidden = vec![0f32; hidden.len()];
        for (j, (states, len)) in padded.iter().enumerate() {
            let Some(g) = grads.get(states.as_tensor()) else {
                continue;
            };
            let g = g.flatten_all()?.to_vec1::<f32>()?;
            let span = &offsets[j * n..=(j + 1) * n];
            for i in 0..n {
                let (a, b) = (span[i], span[i + 1]);
                dhidden[a * d..b * d].copy_from_slice(&g[i * len * d..(i * len + b - a) * d]);
            }
        }
        Ok((value, n, dhidden))
    }
}

/// Whether `engine` tries the fast engine for a run that `reason` (if
/// any) keeps off it; with `--engine fast`, an error naming `reason`.
pub(super) fn decide(engine: Engine, reason: Option<String>) -> Result<bool> {
    if !engine.tries_fast() {
        return Ok(false);
    }
    match reason {
        None => Ok(true),
        Some(what) => engine.fallback(&what).map(|()| false),
    }
}
