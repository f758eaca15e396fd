//! What an objective gives the one training loop ([`super::trainer::Trainer`]):
//! its micro-batch passes ([`MicroStep`]), the loss tallies it reduces
//! across processes, its scores and pictures, and the gradient hook.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::Tensor;

use super::distributed::ProcessGroup;
use super::optim::{GradAccumulator, UpdateSink};
use super::run_dir::Fingerprint;
use crate::error::Result;

/// What one micro-batch's forward (and backward) pass gives the loop.
pub struct MicroStep<T> {
    /// The micro-batch's loss, checked for divergence before the update
    /// (with [`Gradients::Loss`], the loop takes it from the parts).
    pub loss: f64,
    pub gradients: Gradients,
    /// Real (unpadded) tokens, for the throughput figure.
    pub tokens: usize,
    /// What the objective sums into the step's figures.
    pub tally: T,
}

impl<T: Default> MicroStep<T> {
    /// A process's empty slice of a micro-batch: no loss, nothing to learn.
    pub fn empty() -> Self {
        Self {
            loss: 0.0,
            gradients: Gradients::None,
            tokens: 0,
            tally: T::default(),
        }
    }
}

/// This process's share of each loss term's targets (its count over every
/// process's), for an objective computing its own gradients
/// ([`Gradients::Computed`]): every process takes part in the count, even
/// one without rows. `Err` with the micro-step to return when the
/// micro-batch ends there: no process has a target (nothing learned), or
/// this process has no row (an empty gradient store: it adds nothing).
pub fn target_shares<T: Default>(
    counts: &[usize],
    rows: usize,
    tokens: usize,
    group: &dyn ProcessGroup,
) -> Result<std::result::Result<Vec<f64>, MicroStep<T>>> {
    let mut all: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
    if group.size() > 1 {
        group.sum_f64(&mut all)?;
    }
    if all.iter().all(|&a| a == 0.0) {
        return Ok(Err(MicroStep {
            tokens,
            ..MicroStep::empty()
        }));
    }
    if rows == 0 {
        return Ok(Err(MicroStep {
            gradients: Gradients::Computed(GradStore::default()),
            ..MicroStep::empty()
        }));
    }
    Ok(Ok(counts
        .iter()
        .zip(&all)
        .map(|(&c, &a)| if a > 0.0 { c as f64 / a } else { 0.0 })
        .collect()))
}

/// Where a process's rows sit in their micro-batch: draws per row count
/// rows from the micro-batch's start, so they do not depend on the number
/// of processes.
pub struct Slice<'a> {
    /// The micro-batch's number, counted over the run.
    pub micro: u64,
    /// The micro-batch row the slice starts at.
    pub first: usize,
    /// The whole micro-batch's inputs (e.g. to pad a slice as one process
    /// running all of it pads).
    pub micro_batch: &'a [usize],
    /// The processes that share the micro-batch.
    pub group: &'a dyn ProcessGroup,
}

/// One term of a micro-batch's loss: a mean over `count` targets (masked
/// tokens, labelled examples). The loop weights it by `count` over the
/// targets of the whole micro-batch, on every data-parallel process, so the
/// summed gradients are the whole batch's mean's.
pub struct LossPart {
    pub mean: Tensor,
    pub count: usize,
}

impl LossPart {
    pub fn new(mean: Tensor, count: usize) -> Self {
        Self { mean, count }
    }
}

/// The most loss terms an objective may have (MLM + NSP: two).
pub const MAX_LOSS_PARTS: usize = 4;

/// The gradients of a micro-batch.
pub enum Gradients {
    /// The loss's terms (summed), which the loop runs `backward()` on.
    Loss(Vec<LossPart>),
    /// Gradients the objective computed itself (e.g. a contrastive loss
    /// over the whole batch, gathered from every process): this process's
    /// part, which summed over the processes is the micro-batch's gradient.
    /// Every process returns this variant for the micro-batch, even one
    /// without rows (an empty store).
    Computed(GradStore),
    /// Nothing to learn from (no labelled target in the batch).
    None,
}

/// Held-out scores of the current model.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    pub loss: f64,
    pub scores: BTreeMap<String, f64>,
}

/// The score that picks the best model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MainMetric {
    pub name: &'static str,
    pub greater_is_better: bool,
}

/// Titles of the loss picture.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub train_label: String,
    pub eval_label: String,
    /// The step figure plotted as training loss (`None`: `loss`).
    pub train_figure: Option<&'static str>,
    /// Title of `metric.png`, the evaluation scores (`None`: not drawn).
    pub scores_title: Option<String>,
}

/// Random streams of an objective: the purpose of its dropout generator.
/// (The data order is transformers' Trainer's, from the seed alone:
/// [`crate::rng::torch_randperm`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    pub dropout: u64,
}

impl Streams {
    pub const fn new(dropout: u64) -> Self {
        Self { dropout }
    }
}

/// What a micro-batch adds to its step's figures, as sums: the tallies of
/// data-parallel processes add up to the tally of one process running the
/// whole micro-batch.
pub trait Tally: Default {
    /// The sums, in a fixed order and number.
    fn sums(&self) -> Vec<f64>;

    fn from_sums(sums: &[f64]) -> Self;
}

/// A mean loss kept as its sum and count: the tally of objectives whose
/// one figure is their loss.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct MeanLoss {
    pub sum: f64,
    pub count: f64,
}

impl MeanLoss {
    /// The tally of a loss `mean` over `count` targets (nothing without any).
    pub fn of(mean: f64, count: usize) -> Self {
        if count == 0 {
            return Self::default();
        }
        Self {
            sum: mean * count as f64,
            count: count as f64,
        }
    }

    /// The mean (0 without targets).
    pub fn mean(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count
        } else {
            0.0
        }
    }

    /// The step's loss: the mean of its micro-batches' means.
    pub fn step_mean(tallies: &[MeanLoss]) -> f64 {
        tallies.iter().map(MeanLoss::mean).sum::<f64>() / tallies.len().max(1) as f64
    }
}

impl Tally for MeanLoss {
    fn sums(&self) -> Vec<f64> {
        vec![self.sum, self.count]
    }

    fn from_sums(s: &[f64]) -> Self {
        Self {
            sum: s[0],
            count: s[1],
        }
    }
}

/// One training objective: its model (built from the trainer's
/// parameters), its inputs, its loss and its evaluation.
pub trait Objective {
    /// What a micro-batch adds to its step's figures.
    type Tally: Tally;

    /// The purposes of the objective's data-order and dropout generators.
    const STREAMS: Streams;

    /// The tokens of each training input (their count is the number of
    /// inputs batches are drawn from; the lengths group batches by length).
    fn input_lengths(&self) -> Vec<usize>;

    fn main_metric(&self) -> MainMetric;

    fn chart(&self) -> Chart;

    /// Forward (and with [`Gradients::Computed`] backward) on the inputs
    /// `batch`, this process's slice of a micro-batch (possibly empty),
    /// dropout on.
    fn train_batch(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<Self::Tally>>;

    /// The step's loss and named figures from its micro-batches.
    fn step_figures(&self, tallies: &[Self::Tally]) -> (f64, BTreeMap<String, f64>);

    /// Scores on the held-out data, dropout off (`None` without any),
    /// the work shared by `group`'s processes (every one gets the scores).
    fn evaluate(&self, group: &dyn ProcessGroup) -> Result<Option<Scores>>;

    /// The objective's options, recorded in `trainer_state.json`; a
    /// resumed run must have the same (see [`super::LoopOptions::allow_changes`]).
    fn options_json(&self) -> serde_json::Value;

    /// A fingerprint of the training inputs (a resumed run must read the
    /// same data).
    fn data_fingerprint(&self) -> Fingerprint;

    /// Per training input, keys (e.g. hashes of its texts) that no two
    /// inputs of one batch may share (`None`: any inputs may meet).
    fn batch_keys(&self) -> Option<Vec<Vec<u64>>> {
        None
    }

    /// Files written beside every saved model (e.g. `training_args.json`).
    fn write_extras(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }

    /// What the optimizer also writes the updated weights into (the fast
    /// path's packed bf16 weights), if anything.
    fn update_sink(&self) -> Option<&dyn UpdateSink> {
        None
    }
}

/// The one place between backward and the optimiser step where gradients
/// may be transformed; it sees them after the data-parallel sum (which the
/// loop does at this same point: [`super::Trainer::set_process_group`]).
pub trait GradientHook {
    fn on_gradients(&mut self, step: u64, grads: &mut GradAccumulator) -> Result<()>;
}
