//! How long a run is and in what order it reads its data: total steps and
//! warmup by one rule for every objective, and each epoch's batches.

use rand::seq::SliceRandom;

use crate::error::{Error, Result};
use crate::rng::rng_for;

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

/// Each epoch's reading order: the inputs shuffled by `(seed, purpose,
/// epoch)`, grouped by length when their lengths are given; drawn once per
/// epoch.
pub(crate) struct EpochOrder {
    lengths: Option<Vec<usize>>,
    epoch: u64,
    order: Vec<usize>,
}

impl EpochOrder {
    pub(crate) fn new(lengths: Option<Vec<usize>>) -> Self {
        Self {
            lengths,
            epoch: u64::MAX,
            order: Vec::new(),
        }
    }

    /// The inputs of micro-batch `micro`.
    pub(crate) fn micro_batch(
        &mut self,
        plan: &TrainPlan,
        micro: u64,
        shuffle: (u64, u64),
    ) -> Vec<usize> {
        let (epoch, within) = plan.locate(micro);
        if self.epoch != epoch {
            let mut order: Vec<usize> = (0..plan.inputs).collect();
            order.shuffle(&mut rng_for(shuffle.0, shuffle.1, epoch));
            if let Some(lengths) = &self.lengths {
                group_by_length(&mut order, plan.batch_size, |i| lengths[i]);
            }
            self.epoch = epoch;
            self.order = order;
        }
        let bs = plan.batch_size;
        self.order[within * bs..((within + 1) * bs).min(plan.inputs)].to_vec()
    }
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
