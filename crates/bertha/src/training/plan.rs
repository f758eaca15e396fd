//! How long a run is and in what order it reads its data: total steps and
//! warmup by one rule for every objective, and each epoch's batches.

use crate::error::{Error, Result};
use crate::rng::torch_randperm;

/// How long to train.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunLength {
    /// Optimiser steps.
    Steps(u64),
    /// Passes over the training inputs (a fraction stops part-way).
    Epochs(f64),
}

/// How long the learning rate warms up from 0.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Warmup {
    Steps(u64),
    /// A fraction of all steps, rounded up (transformers' Trainer:
    /// `ceil(warmup_ratio × steps)`).
    Ratio(f64),
}

/// The step arithmetic of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainPlan {
    /// Training inputs batches are drawn from.
    pub inputs: usize,
    /// Inputs per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimiser step.
    pub grad_accum: usize,
    /// Micro-batches per epoch: an epoch's short last batch is dropped
    /// (pre-training) or kept (fine-tuning).
    pub micro_batches_per_epoch: u64,
    pub total_steps: u64,
    pub warmup_steps: u64,
}

impl TrainPlan {
    /// Total steps: `ceil(epochs × micro-batches per epoch / grad_accum)`
    /// (at least 1), or the steps given; warmup as given or
    /// `ceil(ratio × total)`.
    pub fn new(
        inputs: usize,
        batch_size: usize,
        grad_accum: usize,
        drop_last: bool,
        length: RunLength,
        warmup: Warmup,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::option("batch_size", "must be at least 1"));
        }
        if grad_accum == 0 {
            return Err(Error::option("grad_accum", "must be at least 1"));
        }
        if inputs == 0 {
            return Err(Error::Input("no training inputs".into()));
        }
        if drop_last && batch_size * grad_accum > inputs {
            return Err(Error::Input(format!(
                "a step needs {} sequences (batch_size × grad_accum) but the corpus gave {inputs}",
                batch_size * grad_accum
            )));
        }
        let micro_batches_per_epoch = if drop_last {
            inputs / batch_size
        } else {
            inputs.div_ceil(batch_size)
        } as u64;
        let total_steps = match length {
            RunLength::Steps(s) => s,
            RunLength::Epochs(e) => {
                if !(e.is_finite() && e > 0.0) {
                    return Err(Error::option("epochs", format!("{e}: must be above 0")));
                }
                ((e * micro_batches_per_epoch as f64 / grad_accum as f64).ceil() as u64).max(1)
            }
        };
        if total_steps == 0 {
            return Err(Error::option("steps", "must be at least 1"));
        }
        let warmup_steps = match warmup {
            Warmup::Steps(s) => s,
            Warmup::Ratio(r) => {
                if !(0.0..=1.0).contains(&r) {
                    return Err(Error::option(
                        "warmup_ratio",
                        format!("{r}: must be between 0 and 1"),
                    ));
                }
                (r * total_steps as f64).ceil() as u64
            }
        };
        Ok(Self {
            inputs,
            batch_size,
            grad_accum,
            micro_batches_per_epoch,
            total_steps,
            warmup_steps,
        })
    }

    /// Optimiser steps per epoch (fractional with accumulation).
    pub fn steps_per_epoch(&self) -> f64 {
        self.micro_batches_per_epoch as f64 / self.grad_accum as f64
    }

    /// Epochs done after `step` steps.
    pub fn epoch_after(&self, step: u64) -> f64 {
        (step * self.grad_accum as u64) as f64 / self.micro_batches_per_epoch as f64
    }

    /// Whether step `step` (1-based) finished an epoch.
    pub fn ends_epoch(&self, step: u64) -> bool {
        let micro = |s: u64| s * self.grad_accum as u64 / self.micro_batches_per_epoch;
        step > 0 && micro(step) > micro(step - 1)
    }

    /// The epoch and position within it of micro-batch `micro` (counted
    /// over the whole run).
    pub fn locate(&self, micro: u64) -> (u64, usize) {
        (
            micro / self.micro_batches_per_epoch,
            (micro % self.micro_batches_per_epoch) as usize,
        )
    }
}

/// Each epoch's reading order: the inputs permuted as transformers' Trainer
/// and sentence-transformers permute them (`torch.randperm` seeded with
/// `seed + epoch`, [`torch_randperm`]: the same seed reads the same
/// batches), grouped by length when their lengths are given, cut into
/// batches (without duplicate texts when keys are given); drawn once per
/// epoch.
pub(crate) struct EpochOrder {
    lengths: Option<Vec<usize>>,
    /// Per input, keys (hashes of its texts) no two inputs of a batch may
    /// share.
    keys: Option<Vec<Vec<u64>>>,
    epoch: u64,
    batches: Vec<Vec<usize>>,
}

impl EpochOrder {
    pub(crate) fn new(lengths: Option<Vec<usize>>, keys: Option<Vec<Vec<u64>>>) -> Self {
        Self {
            lengths,
            keys,
            epoch: u64::MAX,
            batches: Vec::new(),
        }
    }

    /// The inputs of micro-batch `micro`.
    pub(crate) fn micro_batch(&mut self, plan: &TrainPlan, micro: u64, seed: u64) -> Vec<usize> {
        let (epoch, within) = plan.locate(micro);
        if self.epoch != epoch {
            let mut order = torch_randperm(plan.inputs, seed.wrapping_add(epoch));
            if let Some(lengths) = &self.lengths {
                group_by_length(&mut order, plan.batch_size, |i| lengths[i]);
            }
            self.batches = match &self.keys {
                Some(keys) => no_duplicates(&order, plan.batch_size, |i| &keys[i]),
                None => order
                    .chunks(plan.batch_size)
                    .map(<[usize]>::to_vec)
                    .collect(),
            };
            self.epoch = epoch;
        }
        self.batches.get(within).cloned().unwrap_or_default()
    }
}

/// Cuts `order` into batches in which no two inputs share a key, as
/// sentence-transformers' `NoDuplicatesBatchSampler`: each batch takes the
/// first remaining inputs that clash with none already in it; an input
/// that clashes waits for a later batch. A pass that cannot fill a batch
/// yields it short. (The plan counts `ceil(inputs / batch_size)` batches an
/// epoch: inputs pushed past that by clashes sit the epoch out.)
pub fn no_duplicates<'k>(
    order: &[usize],
    batch_size: usize,
    keys: impl Fn(usize) -> &'k [u64],
) -> Vec<Vec<usize>> {
    let batch_size = batch_size.max(1);
    let mut remaining: Vec<usize> = order.to_vec();
    let mut batches = Vec::new();
    while !remaining.is_empty() {
        let mut seen = std::collections::HashSet::new();
        let mut batch = Vec::with_capacity(batch_size);
        let mut rest = Vec::with_capacity(remaining.len());
        for (pos, &i) in remaining.iter().enumerate() {
            if batch.len() == batch_size {
                rest.extend_from_slice(&remaining[pos..]);
                break;
            }
            let k = keys(i);
            if k.iter().all(|key| !seen.contains(key)) {
                seen.extend(k.iter().copied());
                batch.push(i);
            } else {
                rest.push(i);
            }
        }
        batches.push(batch);
        remaining = rest;
    }
    batches
}

/// Reorders a shuffled `order` as transformers' `LengthGroupedSampler`:
/// mega-batches of up to 50 batches (fewer on small sets, so that there are
/// at least 4), each sorted longest first, then cut into batches. Batches
/// hold similar lengths, and which lengths meet stays random. (transformers
/// also swaps the longest batch to the front, to fail early on memory; not
/// needed here.)
pub fn group_by_length(order: &mut [usize], batch_size: usize, len: impl Fn(usize) -> usize) {
    let batch_size = batch_size.max(1);
    let mult = (order.len() / (batch_size * 4)).clamp(1, 50);
    for mega in order.chunks_mut(mult * batch_size) {
        // Stable: ties keep their shuffled order.
        mega.sort_by_key(|&i| std::cmp::Reverse(len(i)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows sharing a key never meet; the order is kept otherwise, and a
    /// row that clashes waits for the next batch.
    #[test]
    fn no_duplicates_keeps_shared_texts_apart() {
        // Rows 0, 2 and 3 share key 7; row 4 shares key 9 with row 1.
        let keys: Vec<Vec<u64>> = vec![
            vec![7, 1],
            vec![9, 2],
            vec![7, 3],
            vec![7, 4],
            vec![9, 5],
            vec![6, 8],
        ];
        let batches = no_duplicates(&[0, 1, 2, 3, 4, 5], 3, |i| &keys[i]);
        assert_eq!(batches, vec![vec![0, 1, 5], vec![2, 4], vec![3]]);
        for b in &batches {
            let mut seen = std::collections::HashSet::new();
            for &i in b {
                assert!(keys[i].iter().all(|k| seen.insert(*k)), "{b:?}");
            }
        }
        // Without clashes: plain consecutive batches.
        let free: Vec<Vec<u64>> = (0..7).map(|i| vec![i]).collect();
        assert_eq!(
            no_duplicates(&[6, 5, 4, 3, 2, 1, 0], 3, |i| &free[i]),
            vec![vec![6, 5, 4], vec![3, 2, 1], vec![0]]
        );
    }
}
