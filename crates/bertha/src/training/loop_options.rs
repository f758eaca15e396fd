//! The options of the one training loop, and the engine that runs its passes.

use std::path::PathBuf;

use super::optim::AdamWConfig;
use super::plan::{RunLength, Warmup};
use super::schedule::ScheduleKind;
use crate::error::{Error, Result};

/// What runs a step's forward and backward passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Engine {
    /// The fast path ([`crate::fast::train`]) where it covers the model
    /// and objective, the candle modules elsewhere.
    #[default]
    Auto,
    /// The fast path, or an error naming what it does not cover.
    Fast,
    /// The candle modules (any family, any device).
    Candle,
}

impl std::str::FromStr for Engine {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "fast" => Ok(Self::Fast),
            "candle" => Ok(Self::Candle),
            _ => Err(Error::option(
                "engine",
                format!("`{s}` is unknown (expected auto, fast or candle)"),
            )),
        }
    }
}

impl Engine {
    /// Whether to try the fast path.
    pub fn tries_fast(self) -> bool {
        self != Self::Candle
    }

    /// What to do when the fast path does not cover `what`: the candle
    /// path (`Ok`), or with [`Engine::Fast`] an error.
    pub fn fallback(self, what: &str) -> Result<()> {
        if self == Self::Fast {
            return Err(Error::option(
                "engine",
                format!("fast: the training fast path does not cover {what}; use auto or candle"),
            ));
        }
        Ok(())
    }
}

/// Options of the loop, shared by every objective.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoopOptions {
    pub batch_size: usize,
    pub grad_accum: usize,
    pub length: RunLength,
    pub warmup: Warmup,
    pub schedule: ScheduleKind,
    pub lr: f64,
    /// Weight decay and clipping included.
    pub adamw: AdamWConfig,
    pub seed: u64,
    /// Drop an epoch's short last batch (pre-training) or keep it.
    pub drop_last: bool,
    pub group_by_length: bool,
    /// Evaluate every N steps (and at the end).
    pub eval_every: Option<u64>,
    /// Write `checkpoint-N` every N steps (and at the end).
    pub save_every: Option<u64>,
    /// Also evaluate and save at every epoch's end.
    pub at_epoch_end: bool,
    /// Keep only the newest N checkpoints (`None`: all).
    pub save_total_limit: Option<usize>,
    /// Stop after this many evaluations without a better main metric; the
    /// best model is kept in `out/best` and becomes the run's final model.
    pub early_stop: Option<usize>,
    pub out: PathBuf,
    /// Replace the metrics, checkpoints and `best/` of another run in
    /// `out` (else a fresh run refuses such a folder).
    pub overwrite: bool,
    /// Options (or `data`, `config`) a resumed run may change; any other
    /// change is refused.
    pub allow_changes: Vec<String>,
    /// Not part of a run's identity: both engines compute the same steps
    /// (to fp32 rounding), so a run may resume on the other.
    #[serde(skip)]
    pub engine: Engine,
    /// The number format of the fast path's matrix products (bf16 needs
    /// the fast path).
    pub precision: crate::fast::train::Compute,
}

impl LoopOptions {
    /// transformers' `TrainingArguments` defaults (batch 8, lr 5e-5, one
    /// epoch, no warmup, linear decay, AdamW with weight decay 0.01 and
    /// clipping at 1.0), writing into `out`.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        Self {
            batch_size: 8,
            grad_accum: 1,
            length: RunLength::Epochs(1.0),
            warmup: Warmup::Steps(0),
            schedule: ScheduleKind::Linear,
            lr: 5e-5,
            adamw: AdamWConfig::default(),
            seed: 0,
            drop_last: false,
            group_by_length: false,
            eval_every: None,
            save_every: None,
            at_epoch_end: false,
            save_total_limit: None,
            early_stop: None,
            out: out.into(),
            overwrite: false,
            allow_changes: Vec::new(),
            engine: Engine::Auto,
            precision: Default::default(),
        }
    }
}

/// Refuses options the loop cannot run, naming the option.
pub(super) fn validate(opts: &LoopOptions) -> Result<()> {
    if !(opts.lr.is_finite() && opts.lr >= 0.0) {
        return Err(Error::option(
            "lr",
            format!("{}: must be a non-negative number", opts.lr),
        ));
    }
    let wd = opts.adamw.weight_decay;
    if !(wd.is_finite() && wd >= 0.0) {
        return Err(Error::option(
            "weight_decay",
            format!("{wd}: must be a non-negative number"),
        ));
    }
    if opts.eval_every == Some(0) {
        return Err(Error::option("eval_every", "must be at least 1"));
    }
    if opts.save_every == Some(0) {
        return Err(Error::option("save_every", "must be at least 1"));
    }
    if opts.early_stop == Some(0) {
        return Err(Error::option(
            "early_stop",
            "must be at least 1 (evaluations without improvement)",
        ));
    }
    if let Some(max) = opts.adamw.max_grad_norm {
        if !(max.is_finite() && max > 0.0) {
            return Err(Error::option(
                "max_grad_norm",
                format!("{max}: must be above 0 (no clipping: none)"),
            ));
        }
    }
    if opts.save_total_limit == Some(0) {
        return Err(Error::option("save_total_limit", "must be at least 1"));
    }
    Ok(())
}
