//! The one training loop. An [`Objective`] says how its inputs become a
//! loss and how a model is scored; the [`Trainer`] does the rest, once for
//! every objective: the data order of each epoch, seeded dropout, gradient
//! accumulation, the gradient hook, clipping and AdamW, the schedule, the
//! non-finite-loss stop, evaluation and checkpoint cadence,
//! `metrics.jsonl`, atomic checkpoints with pruning, `best/` with early
//! stopping, exact resume and the loss / metric pictures.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;

use super::checkpoint::{
    self, write_atomic, Checkpoint, CheckpointParts, TrainerState, MODEL_FILE,
};
use super::distributed::{
    self, shard, Compression, GradientReducer, Hash64, ProcessGroup, RunIdentity, SingleProcess,
    DEFAULT_BUCKET_BYTES,
};
use super::log::{rewind_metrics, write_json, EvalMetrics, Event, MetricsFile, StepMetrics};
use super::optim::{AdamW, GradAccumulator};
use super::params::ParamStore;
use super::plan::{EpochOrder, TrainPlan};
use super::run_dir;
use super::schedule::LrSchedule;
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::model::seed_dropout;
use crate::rng::seed_for;

mod persist;

use super::loop_options::validate;
pub use super::loop_options::{Engine, LoopOptions};
pub use super::objective::{
    target_shares, Chart, GradientHook, Gradients, LossPart, MainMetric, MeanLoss, MicroStep,
    Objective, Scores, Slice, Streams, Tally, MAX_LOSS_PARTS,
};

/// The dev scores of the model in a folder (the best one with early stopping).
pub const EVAL_RESULTS_FILE: &str = "eval_results.json";

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
    /// The run's processes (one unless data-parallel).
    group: Rc<dyn ProcessGroup>,
    /// Whether the processes have checked they run the same job and
    /// taken process 0's weights.
    synced: bool,
    reducer: GradientReducer,
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
            group: Rc::new(SingleProcess),
            synced: false,
            reducer: GradientReducer::new(DEFAULT_BUCKET_BYTES),
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

    /// Trains data-parallel over `group`'s processes: each runs its slice
    /// of every micro-batch, the gradients are summed over all of them
    /// (weighted so they equal one process's on the whole batch), and
    /// process 0 alone writes metrics, checkpoints and pictures. Every
    /// process must make this call with the same command and files.
    pub fn set_process_group(&mut self, group: Rc<dyn ProcessGroup>) -> Result<()> {
        self.group = group;
        self.synced = false;
        Ok(())
    }

    /// How gradient buckets travel between processes (fp32 unless set).
    pub fn set_gradient_compression(&mut self, compression: Compression) {
        self.reducer = GradientReducer::new(DEFAULT_BUCKET_BYTES).with_compression(compression);
    }

    /// The processes this run trains over.
    pub fn group(&self) -> &dyn ProcessGroup {
        self.group.as_ref()
    }

    /// This process's rank (0 writes the run's files).
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    fn is_writer(&self) -> bool {
        self.group.rank() == 0
    }

    /// What every process must agree on: model config, tokenizer, data,
    /// options, the step it starts from, and the program.
    fn identity(&self) -> Result<RunIdentity> {
        let hash_str = |s: &str| {
            let mut h = Hash64::default();
            h.bytes(s.as_bytes());
            h.finish()
        };
        let options = serde_json::json!({
            "objective": self.objective.options_json(),
            "loop": &self.opts,
        });
        let tokenizer = crate::data::prepared::tokenizer_hash(&self.tokenizer_source)?;
        let mut data = Hash64::default();
        data.bytes(self.objective.data_fingerprint().hex().as_bytes());
        Ok(RunIdentity {
            parts: vec![
                ("program", hash_str(env!("CARGO_PKG_VERSION"))),
                ("model config", hash_str(&self.config.to_json().to_string())),
                ("tokenizer", tokenizer),
                ("training data", data.finish()),
                ("options", hash_str(&options.to_string())),
                ("resumed step", self.step),
                (
                    "gradient compression",
                    hash_str(&format!("{:?}", self.reducer.compression())),
                ),
            ],
        })
    }

    /// Before the first step of a data-parallel run: refuse processes
    /// that differ, then start every process from process 0's weights.
    fn sync_processes(&mut self) -> Result<()> {
        if self.synced || self.group.size() == 1 {
            self.synced = true;
            return Ok(());
        }
        distributed::check_same_run(self.group.as_ref(), &self.identity()?)?;
        distributed::broadcast_params(self.group.as_ref(), &self.params)?;
        self.synced = true;
        Ok(())
    }

    /// The loss of training inputs `rows` as one micro-batch on this one
    /// process (dropout as the config says) and its gradients by parameter
    /// name: what the micro-batch adds to a step, before the update.
    pub fn loss_and_gradients(
        &self,
        rows: &[usize],
    ) -> Result<(f64, std::collections::HashMap<String, Tensor>)> {
        self.slice_loss_and_gradients(rows, 0..rows.len(), &SingleProcess)
    }

    /// [`Self::loss_and_gradients`] of the slice `part` of micro-batch
    /// `rows` on this process of `group` (every process of which calls it
    /// with its own part): the loss as the objective reports it for the
    /// slice, and the gradients it adds, which the processes' sum (loss
    /// terms are weighted by their targets over `group`, as a step does).
    pub fn slice_loss_and_gradients(
        &self,
        rows: &[usize],
        part: std::ops::Range<usize>,
        group: &dyn ProcessGroup,
    ) -> Result<(f64, std::collections::HashMap<String, Tensor>)> {
        if part.start > part.end || part.end > rows.len() {
            return Err(Error::Input(format!(
                "slice {}..{} of a micro-batch of {} rows",
                part.start,
                part.end,
                rows.len()
            )));
        }
        let slice = Slice {
            micro: 0,
            first: part.start,
            micro_batch: rows,
            group,
        };
        let out = self.objective.train_batch(&rows[part], &slice)?;
        let grads = match out.gradients {
            Gradients::Computed(g) => g,
            Gradients::Loss(parts) => match self.weighted_loss(parts, group)?.0 {
                Some(loss) => loss.backward()?,
                None => GradStore::default(),
            },
            Gradients::None => GradStore::default(),
        };
        let named = self
            .params
            .vars()
            .filter_map(|(n, v)| Some((n.to_string(), grads.get(v.as_tensor())?.clone())))
            .collect();
        Ok((out.loss, named))
    }

    /// The current model on the held-out data, as a metrics line.
    pub fn evaluate_metrics(&self) -> Result<Option<EvalMetrics>> {
        let main = self.objective.main_metric();
        Ok(self
            .objective
            .evaluate(self.group.as_ref())?
            .map(|s| EvalMetrics {
                step: self.step,
                epoch: self.plan.epoch_after(self.step),
                eval_loss: s.loss,
                metric: main.name.to_string(),
                greater_is_better: main.greater_is_better,
                scores: s.scores,
            }))
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
        let writer = self.is_writer();
        if writer && !self.metrics_owned {
            run_dir::claim(&out, self.opts.overwrite)?;
        }
        let mut metrics = if writer {
            std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
            Some(MetricsFile::open(
                &out.join("metrics.jsonl"),
                self.metrics_owned,
            )?)
        } else {
            None
        };
        self.metrics_owned = true;
        self.sync_processes()?;
        let started = Instant::now();
        let mut stopped_early = self.patience_out();
        // The fast engine's large step buffers stay mapped from one step to
        // the next (freed before evaluations and when the loop ends).
        let _kept = crate::fast::buffers::KeptBetweenSteps::begin();
        while self.step < stop && !stopped_early {
            let m = self.train_step(&started)?;
            if let Some(f) = metrics.as_mut() {
                f.append(&m)?;
            }
            on_event(&Event::Step(m.clone()));
            self.history.push(m);

            let last = self.step == self.plan.total_steps;
            let epoch_end = self.opts.at_epoch_end && self.plan.ends_epoch(self.step);
            if last || epoch_end || every(self.opts.eval_every, self.step) {
                crate::fast::buffers::release_kept();
                if let Some(e) = self.evaluate_metrics()? {
                    if let Some(f) = metrics.as_mut() {
                        f.append(&e)?;
                    }
                    on_event(&Event::Eval(e.clone()));
                    let improved = self.track_best(&e);
                    self.evals.push(e.clone());
                    if improved && self.opts.early_stop.is_some() {
                        let dir = out.join("best");
                        if writer {
                            self.save_model(&dir, true)?;
                            write_json(&dir.join(EVAL_RESULTS_FILE), &e)?;
                        }
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
                distributed::check_same_weights(self.group.as_ref(), &self.params, self.step)?;
                let dir = out.join(format!("checkpoint-{}", self.step));
                if writer {
                    self.save_checkpoint(&dir)?;
                    if let Some(keep) = self.opts.save_total_limit {
                        run_dir::prune_checkpoints(&out, self.step, keep)?;
                    }
                    self.plot(&out)?;
                }
                on_event(&Event::Saved(dir));
            }
        }
        if writer && (self.step == self.plan.total_steps || stopped_early) {
            self.finish(&out)?;
        }
        Ok(())
    }

    /// One optimiser step: its micro-batches forward and backward (this
    /// process's slice of each), the gradients summed over the processes,
    /// the gradient hook, the update; returns the step's metrics.
    fn train_step(&mut self, started: &Instant) -> Result<StepMetrics> {
        let t0 = Instant::now();
        let ga = self.opts.grad_accum;
        let (rank, size) = (self.group.rank(), self.group.size());
        let mut acc = GradAccumulator::new(&self.params);
        let mut tallies = Vec::with_capacity(ga);
        let mut tokens = 0;
        // Micro-batches with targets on some process: the update's average.
        let mut learned = 0;
        for k in 0..ga {
            let micro = self.step * ga as u64 + k as u64;
            let batch = self.order.micro_batch(&self.plan, micro, self.opts.seed);
            let rows = shard(batch.len(), rank, size);
            let first = rows.start;
            seed_dropout(
                seed_for(self.opts.seed, O::STREAMS.dropout, micro),
                first as u64,
            );
            let slice = Slice {
                micro,
                first,
                micro_batch: &batch,
                group: self.group.as_ref(),
            };
            // Called with an empty slice too: the objective may exchange
            // data with the other processes.
            let out = self.objective.train_batch(&batch[rows], &slice)?;
            tokens += out.tokens;
            if let Gradients::Computed(_) = out.gradients {
                self.check_finite(out.loss)?;
            }
            let gradients = out.gradients;
            tallies.push(out.tally);
            match gradients {
                Gradients::Loss(parts) => {
                    let (loss, targets) = self.weighted_loss(parts, self.group.as_ref())?;
                    if let Some(loss) = loss {
                        acc.add(&self.params, &loss.backward()?)?;
                    }
                    learned += usize::from(targets);
                }
                Gradients::Computed(grads) => {
                    acc.add(&self.params, &grads)?;
                    learned += 1;
                }
                // A process without targets still takes part in the sums.
                Gradients::None if size > 1 => {
                    learned += usize::from(self.weighted_loss(Vec::new(), self.group.as_ref())?.1);
                }
                Gradients::None => {}
            }
        }
        acc.set_micro_batches(learned);
        if size > 1 {
            // The step's figures over every process's rows.
            let mut sums: Vec<f64> = tallies.iter().flat_map(Tally::sums).collect();
            sums.push(tokens as f64);
            self.group.sum_f64(&mut sums)?;
            tokens = sums.pop().unwrap_or(0.0) as usize;
            let width = sums.len() / ga.max(1);
            tallies = sums.chunks(width.max(1)).map(O::Tally::from_sums).collect();
            self.reducer
                .all_reduce(self.group.as_ref(), &self.params, &mut acc)?;
        }
        if let Some(hook) = self.hook.as_mut() {
            hook.on_gradients(self.step, &mut acc)?;
        }
        let lr = self.schedule.lr(self.step);
        let grad_norm = if acc.is_empty() {
            0.0
        } else {
            self.optim
                .step_with(&self.params, acc, lr, self.objective.update_sink())
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

    /// The micro-batch's loss terms, each weighted by this process's share
    /// of the whole micro-batch's targets (summed over the processes; 1 in
    /// a one-process run): `None` when this process has no targets; with
    /// whether any process has. Stops on a non-finite loss.
    fn weighted_loss(
        &self,
        parts: Vec<LossPart>,
        group: &dyn ProcessGroup,
    ) -> Result<(Option<Tensor>, bool)> {
        if parts.len() > MAX_LOSS_PARTS {
            return Err(Error::Input(format!(
                "internal: {} loss terms, at most {MAX_LOSS_PARTS}",
                parts.len()
            )));
        }
        // Targets per term, then the terms' sums (mean × targets).
        let mut shared = [0f64; 2 * MAX_LOSS_PARTS];
        for (i, p) in parts.iter().enumerate() {
            if p.count > 0 {
                let mean = f64::from(p.mean.to_scalar::<f32>()?);
                shared[i] = p.count as f64;
                shared[MAX_LOSS_PARTS + i] = mean * p.count as f64;
            }
        }
        group.sum_f64(&mut shared)?;
        let (counts, sums) = shared.split_at(MAX_LOSS_PARTS);
        let loss: f64 = counts
            .iter()
            .zip(sums)
            .filter(|(c, _)| **c > 0.0)
            .map(|(c, s)| s / c)
            .sum();
        self.check_finite(loss)?;
        let mut total: Option<Tensor> = None;
        for (p, &all) in parts.into_iter().zip(counts) {
            if p.count == 0 {
                continue;
            }
            let w = p.count as f64 / all;
            let term = if w == 1.0 {
                p.mean
            } else {
                p.mean.affine(w, 0.0)?
            };
            total = Some(match total {
                Some(t) => (t + term)?,
                None => term,
            });
        }
        Ok((total, counts.iter().any(|&c| c > 0.0)))
    }

    /// Stops the run on a non-finite loss, naming the last checkpoint.
    fn check_finite(&self, loss: f64) -> Result<()> {
        if loss.is_finite() {
            return Ok(());
        }
        Err(Error::Diverged {
            what: "loss",
            value: loss,
            step: self.step + 1,
            last_good: newest_checkpoint(&self.opts.out, self.step),
        })
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
