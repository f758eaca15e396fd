//! Sentence-embedding training on the fast engine: every column of a
//! micro-batch (anchors, positives, negatives…) packed end to end as one
//! set of sequences, one forward and one backward pass for them all. The
//! last hidden states come back to this side, are laid out as the candle
//! path's padded `[n, L, D]` column batches (padding rows zero: pooling
//! masks them out), pooled by the same `pooling::pool` and compared by
//! the same [`super::EmbeddingLoss`] on candle tensors (small: `[n, D]`
//! per column); the gradient with respect to the token rows goes back
//! into the engine. Data-parallel, each process packs its slice of every
//! column, and the pooled embeddings are gathered across the processes
//! before the loss, as on candle: the loss is the whole micro-batch's,
//! its gradient flows back through this process's rows. Dropout: column
//! `j`'s row `i` of the micro-batch draws the masks the candle path draws
//! for that row, whichever process packs it (see
//! [`EmbeddingTraining::seed_packed_columns`]).

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use super::{EmbeddingTraining, LossKind};
use crate::error::{Error, Result};
use crate::fast::train::{EncoderStates, HiddenLoss};
use crate::model::BertModel;
use crate::pooling;
use crate::training::distributed::ProcessGroup;
use crate::training::trainer::{Engine, Slice};

/// What the fast engine does not cover for this run, if anything (the
/// encoder's family / layout: every loss runs on it).
pub(super) fn not_covered(model: &BertModel) -> Result<Option<String>> {
    if EncoderStates::of(model)?.is_none() {
        let cfg = model.config();
        return Ok(Some(format!(
            "embedding training on `{}` models as configured",
            cfg.model_type
        )));
    }
    Ok(None)
}

impl EmbeddingTraining {
    /// Whether this slice trains on the fast engine: it covers the run
    /// and this process has rows of the micro-batch. A process without
    /// any (a last micro-batch smaller than the process count) runs the
    /// candle path, which only takes part in the gathers then.
    pub(super) fn fast_slice(&self, rows: &[usize]) -> bool {
        self.fast && !rows.is_empty()
    }

    /// This process's slice `rows` of the micro-batch: the whole
    /// micro-batch's loss (embeddings gathered across the processes) and
    /// its gradients through these rows, on the fast engine.
    pub(super) fn fast_loss(&self, rows: &[usize], slice: &Slice) -> Result<(f64, GradStore)> {
        if self.opts.loss.kind == LossKind::CachedMnrl {
            return self.fast_cached_loss(rows, slice);
        }
        let types = self.zero_types(rows);
        let sequences: Vec<(&[u32], &[u32])> = (0..self.train.columns())
            .flat_map(|j| self.sequences(j, rows, &types))
            .collect();
        let loss = |hidden: &[f32], offsets: &[usize]| {
            self.pooled_loss(rows, hidden, offsets, slice.group)
        };
        let hidden_loss: &HiddenLoss = &loss;
        self.seed_packed_columns(slice, rows.len());
        let out = self.states()?.step(&sequences, hidden_loss, 1.0, true)?;
        Ok((out.loss, out.gradients))
    }

    /// GradCache on the fast engine, as [`EmbeddingTraining::cached_loss`]
    /// on candle: each column's rows in mini-batches of
    /// `--mini-batch-size`, embedded by a forward pass whose activations
    /// are dropped; the loss and its gradient with respect to the
    /// embeddings; then each mini-batch again (the same dropout masks:
    /// they are keyed by the row's place in the micro-batch) with that
    /// gradient pushed back through pooling and the encoder. Memory is one
    /// mini-batch's activations; loss and gradients equal the uncached
    /// loss's.
    fn fast_cached_loss(&self, rows: &[usize], slice: &Slice) -> Result<(f64, GradStore)> {
        let (micro, first, group) = (slice.micro, slice.first, slice.group);
        let (n, mini) = (slice.micro_batch.len(), self.opts.mini_batch_size);
        let types = self.zero_types(rows);
        // 1. Embeddings, without activations kept (no backward pass).
        let mut reps = Vec::with_capacity(self.train.columns());
        for j in 0..self.train.columns() {
            let mut parts = Vec::new();
            for (k, chunk) in rows.chunks(mini).enumerate() {
                let sequences: Vec<_> = self.sequences(j, chunk, &types).collect();
                self.seed_column(micro, j, first + k * mini, n);
                let rep = self
                    .states()?
                    .forward(&sequences, true, |hidden, offsets| {
                        Ok(self.pooled_column(hidden, offsets)?.2.detach())
                    })?;
                parts.push(rep);
            }
            let local = Tensor::cat(&parts, 0)?;
            reps.push(Var::from_tensor(&self.gather_rows(Some(local), group)?)?);
        }
        // 2. The loss (the whole micro-batch's) and d loss / d embedding.
        let tensors: Vec<Tensor> = reps.iter().map(|v| v.as_tensor().clone()).collect();
        let scores = self.train.gathered_scores(rows, group, &self.device)?;
        let loss = self.opts.loss.compute(&tensors, scores.as_ref())?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        let rep_grads = loss.backward()?;
        // 3. Each mini-batch again, its embeddings' gradient pushed through.
        let mut total = GradStore::default();
        for (j, rep) in tensors.iter().enumerate() {
            let Some(grad) = rep_grads.get(rep) else {
                continue;
            };
            for (k, chunk) in rows.chunks(mini).enumerate() {
                let sequences: Vec<_> = self.sequences(j, chunk, &types).collect();
                let g = grad.narrow(0, first + k * mini, chunk.len())?;
                let push = |hidden: &[f32], offsets: &[usize]| {
                    let (states, len, rep) = self.pooled_column(hidden, offsets)?;
                    let grads = (rep * &g)?.sum_all()?.backward()?;
                    let mut dhidden = vec![0f32; hidden.len()];
                    if let Some(gs) = grads.get(states.as_tensor()) {
                        scatter_padded(gs, offsets, len, &mut dhidden)?;
                    }
                    Ok((0.0, chunk.len(), dhidden))
                };
                self.seed_column(micro, j, first + k * mini, n);
                let out = self.states()?.step(&sequences, &push, 1.0, true)?;
                total.extend(out.gradients)?;
            }
        }
        Ok((value, total))
    }

    /// The encoder on the fast engine, in this run's precision.
    fn states(&self) -> Result<EncoderStates<'_>> {
        Ok(EncoderStates::of(&self.model)?
            .ok_or_else(|| {
                Error::Input("internal: the fast path no longer covers the model".into())
            })?
            .with_compute(self.compute))
    }

    /// Token types (all 0) as long as the longest of `rows`' texts.
    fn zero_types(&self, rows: &[usize]) -> Vec<u32> {
        let longest = self
            .train
            .ids
            .iter()
            .flat_map(|col| rows.iter().map(|&i| col[i].len()))
            .max()
            .unwrap_or(0);
        vec![0u32; longest]
    }

    /// Column `j`'s texts of `rows` as the engine takes them.
    fn sequences<'s>(
        &'s self,
        j: usize,
        rows: &'s [usize],
        types: &'s [u32],
    ) -> impl Iterator<Item = (&'s [u32], &'s [u32])> + 's {
        rows.iter().map(move |&i| {
            let ids = &self.train.ids[j][i][..];
            (ids, &types[..ids.len()])
        })
    }

    /// The whole micro-batch's loss from this process's last hidden
    /// states `hidden` (`[T, D]`, sequences at `offsets`: column by column,
    /// `rows.len()` each) and the other processes' embeddings (gathered in
    /// `group`), and its gradient with respect to `hidden`.
    fn pooled_loss(
        &self,
        rows: &[usize],
        hidden: &[f32],
        offsets: &[usize],
        group: &dyn ProcessGroup,
    ) -> Result<(f64, usize, Vec<f32>)> {
        let n = rows.len();
        let columns = self.train.columns();
        let mut padded = Vec::with_capacity(columns);
        let mut reps = Vec::with_capacity(columns);
        for j in 0..columns {
            let (states, len, rep) = self.pooled_column(hidden, &offsets[j * n..=(j + 1) * n])?;
            reps.push(self.gather_rows(Some(rep), group)?);
            padded.push((states, len));
        }
        let scores = self.train.gathered_scores(rows, group, &self.device)?;
        let loss = self.opts.loss.compute(&reps, scores.as_ref())?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        let grads = loss.backward()?;
        let mut dhidden = vec![0f32; hidden.len()];
        for (j, (states, len)) in padded.iter().enumerate() {
            if let Some(g) = grads.get(states.as_tensor()) {
                scatter_padded(g, &offsets[j * n..=(j + 1) * n], *len, &mut dhidden)?;
            }
        }
        Ok((value, n, dhidden))
    }

    /// The sequences at `span` (row offsets into `hidden`, `[T, D]`) laid
    /// out as the candle path's padded `[n, len, D]` batch (padding rows
    /// zero), that batch, its `len`, and the pooled (and, for this model,
    /// normalised) embeddings `[n, D]`.
    fn pooled_column(&self, hidden: &[f32], span: &[usize]) -> Result<(Var, usize, Tensor)> {
        let d = self.model.config().hidden_size;
        let n = span.len() - 1;
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
        let rep = if self.normalize {
            pooling::normalize(&pooled)?
        } else {
            pooled
        };
        Ok((states, len, rep))
    }
}

/// The gradient `g` of a padded `[n, len, D]` batch (see
/// [`EmbeddingTraining::pooled_column`]) written back to the packed rows
/// of the sequences at `span` in `dhidden` (`[T, D]`).
fn scatter_padded(g: &Tensor, span: &[usize], len: usize, dhidden: &mut [f32]) -> Result<()> {
    let g = g.flatten_all()?.to_vec1::<f32>()?;
    let n = span.len() - 1;
    let d = g.len() / (n * len).max(1);
    for i in 0..n {
        let (a, b) = (span[i], span[i + 1]);
        dhidden[a * d..b * d].copy_from_slice(&g[i * len * d..(i * len + b - a) * d]);
    }
    Ok(())
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
