//! The one training loop. An [`Objective`] says how its inputs become a
//! loss and how a model is scored; the [`Trainer`] does the rest, once for
//! every objective: the data order of each epoch, seeded dropout, gradient
//! accumulation, the gradient hook, clipping and AdamW, the schedule, the
//! non-finite-loss stop, evaluation and checkpoint cadence,
//! `metrics.jsonl`, atomic checkpoints with pruning, `best/` with early
//! stopping, exact resume and the loss / metric pictures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;

use super::checkpoint::{
    self, write_atomic, Checkpoint, CheckpointParts, TrainerState, MODEL_FILE,
};
use super::log::{rewind_metrics, write_json, EvalMetrics, Event, MetricsFile, StepMetrics};
use super::optim::{AdamW, AdamWConfig, GradAccumulator};
use super::params::ParamStore;
use super::plan::{EpochOrder, RunLength, TrainPlan, Warmup};
use super::run_dir::{self, Fingerprint};
use super::schedule::{LrSchedule, ScheduleKind};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::model::seed_dropout;
use crate::rng::seed_for;

/// The dev scores of the model in a folder (the best one with early stopping).
pub const EVAL_RESULTS_FILE: &str = "eval_results.json";

/// What one micro-batch's forward (and backward) pass gives the loop.
pub struct MicroStep<T> {
    /// The micro-batch's loss, checked for divergence before the update.
    pub loss: f64,
    pub gradients: Gradients,
    /// Real (unpadded) tokens, for the throughput figure.
    pub tokens: usize,
    /// What the objective sums into the step's figures.
    pub tally: T,
}

/// The gradients of a micro-batch.
pub enum Gradients {
    /// A scalar loss the loop runs `backward()` on.
    Loss(Tensor),
    /// Gradients the objective computed itself, e.g. over several forward
    /// passes (a contrastive objective encodes each column separately).
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

/// One training objective: its model (built from the trainer's
/// parameters), its inputs, its loss and its evaluation.
pub trait Objective {
    /// What a micro-batch adds to its step's figures.
    type Tally;

    /// The purposes of the objective's data-order and dropout generators.
    const STREAMS: Streams;

    /// The tokens of each training input (their count is the number of
    /// inputs batches are drawn from; the lengths group batches by length).
    fn input_lengths(&self) -> Vec<usize>;

    fn main_metric(&self) -> MainMetric;

    fn chart(&self) -> Chart;

    /// Forward (and with [`Gradients::Computed`] backward) on the inputs
    /// `batch` of micro-batch `micro` (counted over the run), dropout on.
    fn train_batch(&self, batch: &[usize], micro: u64) -> Result<MicroStep<Self::Tally>>;

    /// The step's loss and named figures from its micro-batches.
    fn step_figures(&self, tallies: &[Self::Tally]) -> (f64, BTreeMap<String, f64>);

    /// Scores on the held-out data, dropout off (`None` without any).
    fn evaluate(&self) -> Result<Option<Scores>>;

    /// The objective's options, recorded in `trainer_state.json`; a
    /// resumed run must have the same (see [`LoopOptions::allow_changes`]).
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
}

/// The one place between backward and the optimiser step where gradients
/// may be transformed (e.g. averaged across data-parallel processes).
pub trait GradientHook {
    fn on_gradients(&mut self, step: u64, grads: &mut GradAccumulator) -> Result<()>;
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
        }
    }
}

/// The model a run trains: its config, initial weights and tokenizer.
pub struct ModelSetup {
    pub config: BertConfig,
    /// Initial values; tensors it lacks are drawn from the seed.
    pub init: Option<Weights>,
    /// The folder (or vocab file) the tokenizer came from, copied into
    /// every saved model.
    pub tokenizer_source: PathBuf,
}

/// A training run of objective `O`.
pub struct Trainer<O> {
    objective: O,
    config: BertConfig,
    params: ParamStore,
    optim: AdamW,
    schedule: LrSchedule,
    plan: TrainPlan,
    opts: LoopOptions,
    tokenizer_source: PathBuf,
    step: u64,
    history: Vec<StepMetrics>,
    evals: Vec<EvalMetrics>,
    /// (step, main metric) of the best evaluation so far.
    best: Option<(u64, f64)>,
    /// Evaluations since the best one.
    patience_used: usize,
    /// Whether metrics.jsonl belongs to this run (else it is started anew).
    metrics_owned: bool,
    order: EpochOrder,
    hook: Option<Box<dyn GradientHook>>,
}

impl<O: Objective> Trainer<O> {
    /// Creates the parameters (from `model.init`, else seeded), builds the
    /// objective's model on them with `build`, and plans the run.
    pub fn build(
        model: ModelSetup,
        opts: LoopOptions,
        build: impl FnOnce(VarBuilder) -> Result<O>,
    ) -> Result<Self> {
        validate(&opts)?;
        let device = Device::Cpu;
        let prefix = format!("{}.", model.config.family.prefix());
        let (mut params, vb) = ParamStore::builder(model.init, &prefix, opts.seed, &device);
        let objective = build(vb)?;
        params.freeze()?;
        let lengths = objective.input_lengths();
        let objective_keys = objective.batch_keys();
        let group_by_length = opts.group_by_length;
        let plan = TrainPlan::new(
            lengths.len(),
            opts.batch_size,
            opts.grad_accum,
            opts.drop_last,
            opts.length,
            opts.warmup,
        )?;
        let schedule = LrSchedule {
            peak: opts.lr,
            warmup: plan.warmup_steps,
            total: plan.total_steps,
            kind: opts.schedule,
        };
        Ok(Self {
            objective,
            config: model.config,
            params,
            optim: AdamW::new(opts.adamw),
            schedule,
            plan,
            opts,
            tokenizer_source: model.tokenizer_source,
            step: 0,
            history: Vec::new(),
            evals: Vec::new(),
            best: None,
            patience_used: 0,
            metrics_owned: false,
            order: EpochOrder::new(group_by_length.then_some(lengths), objective_keys),
            hook: None,
        })
    }

    pub fn objective(&self) -> &O {
        &self.objective
    }

    pub(crate) fn objective_mut(&mut self) -> &mut O {
        &mut self.objective
    }

    /// The config the checkpoints are written with.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    pub fn plan(&self) -> &TrainPlan {
        &self.plan
    }

    pub fn loop_options(&self) -> &LoopOptions {
        &self.opts
    }

    /// Optimiser steps taken.
    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn total_steps(&self) -> u64 {
        self.plan.total_steps
    }

    /// Every step so far (of this run, resumed ones included).
    pub fn history(&self) -> &[StepMetrics] {
        &self.history
    }

    /// Every evaluation so far.
    pub fn evals(&self) -> &[EvalMetrics] {
        &self.evals
    }

    /// Installs the transform applied to every step's gradients.
    pub fn set_gradient_hook(&mut self, hook: Box<dyn GradientHook>) {
        self.hook = Some(hook);
    }

    /// The current model on the held-out data, as a metrics line.
    pub fn evaluate_metrics(&self) -> Result<Option<EvalMetrics>> {
        let main = self.objective.main_metric();
        Ok(self.objective.evaluate()?.map(|s| EvalMetrics {
            step: self.step,
            epoch: self.plan.epoch_after(self.step),
            eval_loss: s.loss,
            metric: main.name.to_string(),
            greater_is_better: main.greater_is_better,
            scores: s.scores,
        }))
    }

    /// Continues from a checkpoint written by this loop: weights,
    /// optimiser moments and step; the metrics after it are dropped and
    /// the early-stopping state is rebuilt from those before it.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let ck = Checkpoint::load(dir)?;
        self.check_same_run(&ck)?;
        run_dir::remove_stale_temporaries(&self.opts.out)?;
        self.params.load(&ck.model, &ck.dir.join(MODEL_FILE))?;
        self.optim.load_state(ck.state.step, &ck.optimizer)?;
        self.step = ck.state.step;
        (self.history, self.evals) =
            rewind_metrics(&self.opts.out.join("metrics.jsonl"), self.step)?;
        self.metrics_owned = true;
        self.best = None;
        self.patience_used = 0;
        for e in self.evals.clone() {
            self.track_best(&e);
        }
        // A best model saved by the abandoned steps is not this run's.
        let best_dir = self.opts.out.join("best");
        if let Ok(text) = std::fs::read_to_string(best_dir.join(EVAL_RESULTS_FILE)) {
            let step = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("step")?.as_u64());
            if step.is_some_and(|s| s > self.step) {
                tracing::warn!(
                    "{}: written after step {}, by the steps this resume repeats; removing it",
                    best_dir.display(),
                    self.step
                );
                std::fs::remove_dir_all(&best_dir).map_err(|e| Error::io(&best_dir, e))?;
            }
        }
        Ok(())
    }

    /// Refuses a checkpoint whose run had other options, data or model
    /// config than this one, but for the changes `allow_changes` accepts.
    fn check_same_run(&self, ck: &Checkpoint) -> Result<()> {
        let mut was = run_dir::fields(&ck.state.options);
        let mut now = run_dir::fields(&self.objective.options_json());
        if let Some(data) = &ck.state.data {
            was.insert("data".into(), data.clone().into());
            now.insert(
                "data".into(),
                self.objective.data_fingerprint().hex().into(),
            );
        }
        let config_path = ck.dir.join("config.json");
        if config_path.is_file() {
            let config = |c: &BertConfig| serde_json::json!({ "config": c.to_json() });
            was.extend(run_dir::fields(&config(&BertConfig::from_file(
                &config_path,
            )?)));
            now.extend(run_dir::fields(&config(&self.config)));
        }
        run_dir::check_unchanged(&ck.dir, &was, &now, &self.opts.allow_changes)
    }

    /// Updates the best evaluation and the patience counter; returns
    /// whether `e` is a new best.
    fn track_best(&mut self, e: &EvalMetrics) -> bool {
        if self.best.is_none_or(|(_, b)| e.beats(b)) {
            self.best = Some((e.step, e.main()));
            self.patience_used = 0;
            true
        } else {
            self.patience_used += 1;
            false
        }
    }

    fn patience_out(&self) -> bool {
        self.opts
            .early_stop
            .is_some_and(|p| self.patience_used >= p)
    }

    /// Trains to the end (or until early stopping), reporting every step,
    /// evaluation and checkpoint to `on_event`; writes `metrics.jsonl`,
    /// `loss.png` (`metric.png`), `checkpoint-N/`, `best/` (with early
    /// stopping) and the final model into the output folder.
    pub fn run(&mut self, on_event: impl FnMut(&Event)) -> Result<()> {
        self.run_until(self.plan.total_steps, on_event)
    }

    /// [`Trainer::run`], stopping after step `stop` (the final model is
    /// written only when the run ends).
    pub fn run_until(&mut self, stop: u64, mut on_event: impl FnMut(&Event)) -> Result<()> {
        let stop = stop.min(self.plan.total_steps);
        let out = self.opts.out.clone();
        if !self.metrics_owned {
            run_dir::claim(&out, self.opts.overwrite)?;
        }
        std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
        let mut metrics = MetricsFile::open(&out.join("metrics.jsonl"), self.metrics_owned)?;
        self.metrics_owned = true;
        let started = Instant::now();
        let mut stopped_early = self.patience_out();
        while self.step < stop && !stopped_early {
            let m = self.train_step(&started)?;
            metrics.append(&m)?;
            on_event(&Event::Step(m.clone()));
            self.history.push(m);

            let last = self.step == self.plan.total_steps;
            let epoch_end = self.opts.at_epoch_end && self.plan.ends_epoch(self.step);
            if last || epoch_end || every(self.opts.eval_every, self.step) {
                if let Some(e) = self.evaluate_metrics()? {
                    metrics.append(&e)?;
                    on_event(&Event::Eval(e.clone()));
                    let improved = self.track_best(&e);
                    self.evals.push(e.clone());
                    if improved && self.opts.early_stop.is_some() {
                        let dir = out.join("best");
                        self.save_model(&dir, true)?;
                        write_json(&dir.join(EVAL_RESULTS_FILE), &e)?;
                        on_event(&Event::Best(e));
                    }
                    if self.patience_out() {
                        stopped_early = true;
                        on_event(&Event::EarlyStop {
                            step: self.step,
                            best_step: self.best.map_or(0, |b| b.0),
                        });
                    }
                }
            }
            if last || epoch_end || stopped_early || every(self.opts.save_every, self.step) {
                let dir = out.join(format!("checkpoint-{}", self.step));
                self.save_checkpoint(&dir)?;
                if let Some(keep) = self.opts.save_total_limit {
                    run_dir::prune_checkpoints(&out, self.step, keep)?;
                }
                self.plot(&out)?;
                on_event(&Event::Saved(dir));
            }
        }
        if self.step == self.plan.total_steps || stopped_early {
            self.finish(&out)?;
        }
        Ok(())
    }

    /// One optimiser step: its micro-batches forward and backward, the
    /// gradient hook, the update; returns the step's metrics.
    fn train_step(&mut self, started: &Instant) -> Result<StepMetrics> {
        let t0 = Instant::now();
        let streams = O::STREAMS;
        let ga = self.opts.grad_accum;
        let mut acc = GradAccumulator::default();
        let mut tallies = Vec::with_capacity(ga);
        let mut tokens = 0;
        for k in 0..ga {
            let micro = self.step * ga as u64 + k as u64;
            let batch = self.order.micro_batch(&self.plan, micro, self.opts.seed);
            seed_dropout(seed_for(self.opts.seed, streams.dropout, micro));
            let out = self.objective.train_batch(&batch, micro)?;
            if !out.loss.is_finite() {
                return Err(Error::Diverged {
                    what: "loss",
                    value: out.loss,
                    step: self.step + 1,
                    last_good: newest_checkpoint(&self.opts.out, self.step),
                });
            }
            match out.gradients {
                Gradients::Loss(loss) => acc.add(&self.params, &loss.backward()?)?,
                Gradients::Computed(grads) => acc.add(&self.params, &grads)?,
                Gradients::None => {}
            }
            tokens += out.tokens;
            tallies.push(out.tally);
        }
        if let Some(hook) = self.hook.as_mut() {
            hook.on_gradients(self.step, &mut acc)?;
        }
        let lr = self.schedule.lr(self.step);
        let grad_norm = if acc.is_empty() {
            0.0
        } else {
            self.optim
                .step(&self.params, acc, lr)
                .map_err(|e| match e {
                    // The optimiser knows the step, the loop the folder.
                    Error::Diverged {
                        what, value, step, ..
                    } => Error::Diverged {
                        what,
                        value,
                        step,
                        last_good: newest_checkpoint(&self.opts.out, self.step),
                    },
                    other => other,
                })?
        };
        self.step += 1;
        let (loss, figures) = self.objective.step_figures(&tallies);
        Ok(StepMetrics {
            step: self.step,
            epoch: self.plan.epoch_after(self.step),
            loss,
            figures,
            lr,
            grad_norm,
            tokens_per_s: tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
            elapsed_s: started.elapsed().as_secs_f64(),
        })
    }

    /// The final model in `out`: the best one with early stopping, else
    /// the last; its held-out scores in `eval_results.json`.
    fn finish(&self, out: &Path) -> Result<()> {
        let best_dir = out.join("best");
        if self.opts.early_stop.is_some() && best_dir.join(MODEL_FILE).is_file() {
            for entry in std::fs::read_dir(&best_dir).map_err(|e| Error::io(&best_dir, e))? {
                let p = entry.map_err(|e| Error::io(&best_dir, e))?.path();
                if p.is_file() {
                    let bytes = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
                    if let Some(name) = p.file_name() {
                        write_atomic(&out.join(name), &bytes)?;
                    }
                }
            }
        } else {
            self.save_model(out, false)?;
            if let Some(e) = self.evals.last() {
                write_json(&out.join(EVAL_RESULTS_FILE), e)?;
            }
        }
        if self.opts.early_stop.is_some() {
            let best = self
                .best
                .and_then(|(s, _)| self.evals.iter().find(|e| e.step == s));
            if let Some(e) = best {
                write_json(&out.join(EVAL_RESULTS_FILE), e)?;
            }
        }
        self.plot(out)
    }

    fn parts<'a>(&'a self, state: Option<&'a TrainerState>) -> CheckpointParts<'a> {
        CheckpointParts {
            config: &self.config,
            params: &self.params,
            optimizer: state.map(|_| &self.optim),
            state,
            tokenizer_source: &self.tokenizer_source,
        }
    }

    /// Writes the model files (config, weights, tokenizer, the objective's
    /// extras) into `dir`: as a new folder renamed into place (`whole`), or
    /// file by file into an existing one (the run's output folder).
    fn save_model(&self, dir: &Path, whole: bool) -> Result<()> {
        if whole {
            Checkpoint::save(dir, &self.parts(None))?;
        } else {
            Checkpoint::save_model_files(dir, &self.parts(None))?;
        }
        self.objective.write_extras(dir)
    }

    /// Writes a resumable checkpoint of the current state (refused when a
    /// weight is not finite: a checkpoint is always one to resume from).
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        if let Some(value) = self.params.first_non_finite()? {
            return Err(Error::Diverged {
                what: "a weight",
                value,
                step: self.step,
                last_good: newest_checkpoint(&self.opts.out, self.step.saturating_sub(1)),
            });
        }
        let state = TrainerState {
            step: self.step,
            total_steps: self.plan.total_steps,
            seed: self.opts.seed,
            options: self.objective.options_json(),
            last_loss: self.history.last().map(|m| m.loss),
            data: Some(self.objective.data_fingerprint().hex()),
        };
        Checkpoint::save(dir, &self.parts(Some(&state)))?;
        self.objective.write_extras(dir)
    }

    /// `loss.png` (training loss per step, held-out loss) and, where the
    /// objective names one, `metric.png` (the held-out scores).
    #[cfg(feature = "show")]
    fn plot(&self, out: &Path) -> Result<()> {
        let chart = self.objective.chart();
        let train: Vec<(f64, f64)> = self
            .history
            .iter()
            .map(|m| {
                let y = match chart.train_figure {
                    Some(k) => m.figures.get(k).copied().unwrap_or(f64::NAN),
                    None => m.loss,
                };
                (m.step as f64, y)
            })
            .collect();
        let eval: Vec<(f64, f64)> = self
            .evals
            .iter()
            .map(|e| (e.step as f64, e.eval_loss))
            .collect();
        crate::show::curve::plot_loss(
            &out.join("loss.png"),
            &chart.title,
            &chart.train_label,
            train,
            &chart.eval_label,
            eval,
        )?;
        if let (Some(title), Some(first)) = (&chart.scores_title, self.evals.first()) {
            let series: Vec<(&str, Vec<(f64, f64)>)> = first
                .scores
                .keys()
                .map(|n| {
                    let points = self
                        .evals
                        .iter()
                        .filter_map(|e| Some((e.step as f64, *e.scores.get(n)?)))
                        .collect();
                    (n.as_str(), points)
                })
                .collect();
            crate::show::curve::plot_curves(&out.join("metric.png"), title, "step", &series)?;
        }
        Ok(())
    }

    #[cfg(not(feature = "show"))]
    fn plot(&self, _: &Path) -> Result<()> {
        Ok(())
    }
}

/// The newest `checkpoint-N` in `out` of a step up to `step` (a later one
/// is an abandoned run's, which a resume repeats).
fn newest_checkpoint(out: &Path, step: u64) -> Option<PathBuf> {
    let found = checkpoint::list(out).ok()?;
    found.into_iter().rfind(|(s, _)| *s <= step).map(|(_, p)| p)
}

fn every(n: Option<u64>, step: u64) -> bool {
    n.is_some_and(|n| step.is_multiple_of(n))
}

fn validate(opts: &LoopOptions) -> Result<()> {
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
