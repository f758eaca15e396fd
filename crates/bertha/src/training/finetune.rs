//! The fine-tuning objective: sequence classification (single texts or
//! pairs), NER, extractive QA and multiple choice on top of a pre-trained
//! encoder. What differs by task is how examples become model inputs (a
//! class id, a tag per first word piece, an answer span per SQuAD window,
//! an example's choices end to end with the right one's index) and how the
//! dev set is scored (accuracy and macro-F1, seqeval's entity P/R/F1,
//! SQuAD EM/F1, accuracy); the loop, checkpoints and resume are the
//! [`Trainer`]'s.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::var_builder::SimpleBackend;

use super::distributed::{deals, ProcessGroup};
use super::log::write_json;
use super::optim::AdamWConfig;
use super::plan::{RunLength, Warmup};
use super::run_dir::Fingerprint;
use super::trainer::{
    target_shares, Chart, Engine, Gradients, LoopOptions, LossPart, MainMetric, MeanLoss,
    MicroStep, ModelSetup, Objective, Scores, Slice, Streams, Trainer,
};
use super::ScheduleKind;
use crate::config::{BertConfig, ProblemType};
use crate::data::{
    DataOptions, LabelSet, PostprocessOptions, Target, Task, TaskData, TaskInput, TaskInputBuilder,
    TaskInputs,
};
use crate::error::{Error, Result};
use crate::fast::train::{Compute, FinetuneHead, HeadBatch, HeadTargets};
use crate::io::tokenizer::Tokenizer;
use crate::io::weights::Weights;
use crate::io::ModelDir;
use crate::model::{HeadKind, IGNORE_INDEX};
use crate::tasks::finetuned::{
    check_task_family, infer_batches, length_batches, Scorer, TaskHead, TRAINING_ARGS_FILE,
};
use crate::tasks::Evaluation;

/// A fine-tuning run.
pub type Finetuner = Trainer<Finetuning>;

/// Training options; [`FinetuneOptions::default`] gives transformers'
/// Trainer defaults where the issue names none.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FinetuneOptions {
    /// Passes over the training set (a fraction stops part-way).
    pub epochs: f64,
    pub lr: f64,
    pub batch_size: usize,
    /// Examples per forward pass when evaluating.
    pub eval_batch_size: usize,
    /// Tokens per input, special tokens included.
    pub max_length: usize,
    /// QA: context tokens shared by consecutive windows.
    pub doc_stride: usize,
    /// QA: the longest answer, in tokens.
    pub max_answer_length: usize,
    /// Fraction of all steps spent warming the rate up from 0.
    pub warmup_ratio: f64,
    pub weight_decay: f64,
    /// Micro-batches of `batch_size` per optimiser step.
    #[serde(default = "one")]
    pub grad_accum: usize,
    /// Clip the global gradient norm to this (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
    pub seed: u64,
    /// Evaluate on dev every N steps, besides every epoch's end.
    pub eval_every: Option<u64>,
    /// Write a resumable `checkpoint-N` every N steps, besides every
    /// epoch's end and the last step.
    pub save_every: Option<u64>,
    /// Keep only the newest N resumable checkpoints (`None`: all).
    #[serde(default = "one_checkpoint")]
    pub save_total_limit: Option<usize>,
    /// Stop after this many evaluations without a better main metric; the
    /// best model is kept in `out/best` and is the run's final model.
    pub early_stop: Option<usize>,
    /// Train on this many examples drawn with the seed.
    pub max_train: Option<usize>,
    /// Batch inputs of similar length (transformers' `group_by_length`),
    /// so that little of a batch is padding.
    #[serde(default)]
    pub group_by_length: bool,
    pub out: PathBuf,
    /// Replace another run's metrics and checkpoints in `out`.
    #[serde(default)]
    pub overwrite: bool,
    /// Options (or `data`, `config`) a resumed run may change.
    #[serde(default)]
    pub allow_changes: Vec<String>,
    /// What runs the training steps. Not part of a run's identity (both
    /// engines compute the same steps), so not written with the options:
    /// older `training_args.json` files read as `Auto`.
    #[serde(skip)]
    pub engine: Engine,
    /// The number format of the fast path's matrix products (bf16 needs
    /// the fast path); older `training_args.json` files read as f32.
    #[serde(default)]
    pub precision: Compute,
}

impl Default for FinetuneOptions {
    fn default() -> Self {
        Self {
            epochs: 3.0,
            lr: 5e-5,
            batch_size: 32,
            grad_accum: 1,
            eval_batch_size: 64,
            max_length: 128,
            doc_stride: 128,
            max_answer_length: 30,
            warmup_ratio: 0.1,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            seed: 0,
            eval_every: None,
            save_every: None,
            save_total_limit: Some(1),
            early_stop: None,
            max_train: None,
            group_by_length: false,
            out: PathBuf::from("finetuned"),
            overwrite: false,
            allow_changes: Vec::new(),
            engine: Engine::Auto,
            precision: Compute::F32,
        }
    }
}

impl FinetuneOptions {
    /// The rules for the lengths a run leaves unset, shared by `bertha
    /// finetune` and the Python `bertha.train`: `max_length` is the task's
    /// (128; 384 for QA) within the model's positions, `doc_stride`
    /// min(128, max_length / 2).
    pub fn with_lengths(
        mut self,
        task: Task,
        config: &BertConfig,
        max_length: Option<usize>,
        doc_stride: Option<usize>,
    ) -> Self {
        self.max_length = max_length
            .unwrap_or_else(|| task.default_max_length().min(config.max_sequence_length()));
        self.doc_stride = doc_stride.unwrap_or((self.max_length / 2).min(128));
        self
    }
}

fn one() -> usize {
    1
}

fn one_checkpoint() -> Option<usize> {
    Some(1)
}

impl FinetuneOptions {
    pub(crate) fn loop_options(&self) -> LoopOptions {
        LoopOptions {
            batch_size: self.batch_size,
            grad_accum: self.grad_accum,
            length: RunLength::Epochs(self.epochs),
            // transformers' Trainer: ceil(warmup_ratio × steps).
            warmup: Warmup::Ratio(self.warmup_ratio),
            schedule: ScheduleKind::Linear,
            lr: self.lr,
            adamw: AdamWConfig {
                weight_decay: self.weight_decay,
                max_grad_norm: self.max_grad_norm,
                ..AdamWConfig::default()
            },
            seed: self.seed,
            drop_last: false,
            group_by_length: self.group_by_length,
            eval_every: self.eval_every,
            save_every: self.save_every,
            at_epoch_end: true,
            save_total_limit: self.save_total_limit,
            early_stop: self.early_stop,
            out: self.out.clone(),
            overwrite: self.overwrite,
            allow_changes: self.allow_changes.clone(),
            engine: self.engine,
            precision: self.precision,
        }
    }
}

/// Fine-tuning one task head and the encoder under it.
pub struct Finetuning {
    task: Task,
    config: BertConfig,
    head: TaskHead,
    inputs: TaskInputBuilder,
    labels: LabelSet,
    train: TaskInputs,
    train_examples: usize,
    dev: Option<(TaskData, TaskInputs)>,
    opts: FinetuneOptions,
    device: Device,
    /// Whether training steps run on the fast path, and its products.
    fast: bool,
    compute: Compute,
}

impl Finetuner {
    /// Prepares a run from a model folder (config, weights, tokenizer) and
    /// training / dev files. Labels come from the checkpoint when it has
    /// names of its own covering the training labels (then its head, if
    /// any, is kept), else from the training file (a fresh head: normal(0,
    /// `initializer_range`) weights, zero bias, like transformers).
    pub fn new(
        task: Task,
        model_dir: &Path,
        train: &Path,
        dev: Option<&Path>,
        data: &DataOptions,
        opts: FinetuneOptions,
    ) -> Result<Self> {
        let dir = ModelDir::open(model_dir)?;
        let config_path = dir.config_path();
        let config = dir.config()?;
        validate(&opts, &config, &config_path)?;
        let tokenizer = dir.tokenizer(opts.max_length)?;
        let weights = dir.weights()?;

        let mut train_data = TaskData::read(task, train, None, false, data)?;
        let ck_labels = match task.has_label_names() {
            false => None,
            true => LabelSet::from_config(&config)
                .map_err(|e| Error::config(&config_path, "id2label", e.to_string()))?,
        };
        let (labels, from_checkpoint) = match train_data.labels() {
            Some(l) => choose_labels(ck_labels.clone(), l),
            None => (LabelSet::default(), false),
        };
        if from_checkpoint && train_data.labels() != Some(&labels) {
            // Re-read with the checkpoint's ids.
            train_data = TaskData::read(task, train, Some(&labels), false, data)?;
        }
        if let Some(n) = opts.max_train {
            train_data.subsample(n, opts.seed);
        }
        let dev_data = dev
            .map(|p| {
                TaskData::read(
                    task,
                    p,
                    task.has_label_names().then_some(&labels),
                    false,
                    data,
                )
            })
            .transpose()?;

        // Keep the checkpoint's head only when it was trained for this
        // task with these labels and has the shape we need.
        let prefix = &task.head_prefix(&config.family);
        let head_weight = format!("{prefix}weight");
        let out_dim = match task {
            Task::Qa => 2,
            Task::MultipleChoice => 1,
            _ => labels.len(),
        };
        let same_kind = config
            .architectures
            .iter()
            .any(|a| HeadKind::from_any_architecture(a) == Some(task.head()));
        let has_head = weights.names().any(|n| n.starts_with(prefix));
        let shape_fits = weights.contains(&head_weight)
            && weights
                .get_unchecked(&head_weight, DType::F32, &Device::Cpu)
                .is_ok_and(|t| t.dims() == [out_dim, config.hidden_size]);
        let labels_fit = !task.has_label_names() || from_checkpoint || ck_labels.is_none();
        let keep_head = has_head && same_kind && shape_fits && labels_fit;
        let weights = if has_head && !keep_head {
            tracing::warn!(
                "{}: its `{prefix}*` tensors do not fit a {} head for these labels: training a fresh one",
                model_dir.display(),
                task.head()
            );
            without_head(weights, prefix)?
        } else {
            weights
        };

        let mut config = config;
        config.architectures = vec![task.head().class_name(&config.family)];
        match task {
            Task::Classification => {
                config.problem_type = Some(ProblemType::SingleLabelClassification);
                labels.apply_to(&mut config);
            }
            Task::Ner => {
                config.problem_type = None;
                labels.apply_to(&mut config);
            }
            Task::Qa | Task::MultipleChoice => {
                config.problem_type = None;
                config.id2label.clear();
            }
        }
        Self::from_parts(
            task,
            config,
            Some(weights),
            &tokenizer,
            model_dir,
            train_data,
            dev_data,
            opts,
        )
    }

    /// A run from parts: `config` must already name the labels
    /// (`id2label`) and `train` / `dev` use their ids. `init` supplies
    /// initial values; tensors it lacks are drawn from the seed.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        task: Task,
        config: BertConfig,
        init: Option<Weights>,
        tokenizer: &Tokenizer,
        tokenizer_source: &Path,
        train: TaskData,
        dev: Option<TaskData>,
        opts: FinetuneOptions,
    ) -> Result<Self> {
        let origin = Path::new("config");
        check_task_family(task, &config, origin)?;
        validate(&opts, &config, origin)?;
        for d in std::iter::once(&train).chain(dev.as_ref()) {
            if d.task() != task {
                return Err(Error::Input(format!(
                    "{}: read as {} data, but the task is {task}",
                    d.path().display(),
                    d.task()
                )));
            }
        }
        if opts.early_stop.is_some() && dev.is_none() {
            return Err(Error::option("early_stop", "needs a dev set to watch"));
        }
        let labels = train.labels().cloned().unwrap_or_default();
        if task.has_label_names() {
            if labels.len() < 2 {
                return Err(Error::Input(format!(
                    "{}: {} label(s) ({}): {task} needs at least two",
                    train.path().display(),
                    labels.len(),
                    labels.listed()
                )));
            }
            if config.num_labels() != labels.len() {
                return Err(Error::Input(format!(
                    "the config has {} labels but the training data {}",
                    config.num_labels(),
                    labels.len()
                )));
            }
        }
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(Error::Input(format!(
                "the tokenizer has {} tokens but the model's vocab_size is {}",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        let inputs = TaskInputBuilder::new(tokenizer, opts.max_length, opts.doc_stride)?;
        let train_examples = train.len();
        let prepared = inputs.build(&train, true)?;
        if prepared.items.is_empty() {
            return Err(Error::Input(format!(
                "{}: no training inputs",
                train.path().display()
            )));
        }
        let dev = dev
            .map(|d| inputs.build(&d, true).map(|p| (d, p)))
            .transpose()?;

        let setup = ModelSetup {
            config: config.clone(),
            init,
            tokenizer_source: tokenizer_source.to_path_buf(),
        };
        let origin = tokenizer_source.to_path_buf();
        Trainer::build(setup, opts.loop_options(), |vb| {
            let head = TaskHead::load(task, vb, config.clone()).map_err(|e| match e {
                Error::Tensor(e) => Error::Weights {
                    path: origin,
                    reason: crate::io::weights::strip_backtrace(&e),
                },
                other => other,
            })?;
            let engine = opts.engine;
            let fast = engine.tries_fast() && FinetuneHead::of(head.model())?.is_some();
            if !fast && engine.tries_fast() {
                engine.fallback(&format!(
                    "{} heads on `{}` models as configured",
                    task.head(),
                    config.model_type,
                ))?;
            }
            if opts.precision != Compute::F32 && !fast {
                return Err(Error::option(
                    "precision",
                    format!(
                        "{:?} trains on the fast path only, which this run does not take (engine {engine:?})",
                        opts.precision
                    ),
                ));
            }
            let compute = opts.precision.on_this_cpu();
            Ok(Finetuning {
                task,
                config,
                head,
                inputs,
                labels,
                train: prepared,
                train_examples,
                dev,
                opts,
                device: Device::Cpu,
                fast,
                compute,
            })
        })
    }

    pub fn task(&self) -> Task {
        self.objective().task
    }

    /// Class / tag ids (empty for QA and multiple choice).
    pub fn labels(&self) -> &LabelSet {
        &self.objective().labels
    }

    pub fn options(&self) -> &FinetuneOptions {
        &self.objective().opts
    }

    /// Optimiser steps per epoch (the last may take a short batch).
    pub fn steps_per_epoch(&self) -> u64 {
        let plan = self.plan();
        plan.micro_batches_per_epoch
            .div_ceil(plan.grad_accum as u64)
    }

    /// Training examples, and the model inputs made from them (QA: one per
    /// context window).
    pub fn train_size(&self) -> (usize, usize) {
        let o = self.objective();
        (o.train_examples, o.train.items.len())
    }

    /// Whether training steps run on the fast path (see
    /// [`FinetuneOptions::engine`]).
    pub fn on_fast_path(&self) -> bool {
        self.objective().fast
    }

    pub fn dev_size(&self) -> Option<usize> {
        self.objective().dev.as_ref().map(|(d, _)| d.len())
    }

    /// Reads a file with this run's label ids (e.g. to score the training set).
    pub fn read_data(&self, path: &Path, data: &DataOptions) -> Result<TaskData> {
        let o = self.objective();
        let labels = o.task.has_label_names().then_some(&o.labels);
        TaskData::read(o.task, path, labels, false, data)
    }

    /// The current model's predictions and scores on `data` (dropout off).
    pub fn evaluate_on(&self, data: &TaskData) -> Result<Evaluation> {
        let o = self.objective();
        let prepared = o.inputs.build(data, true)?;
        o.evaluate_prepared(data, &prepared, self.group())
    }

    /// The current model on the dev set (`None` without one).
    pub fn evaluate(&self) -> Result<Option<Evaluation>> {
        self.objective().evaluate_dev(self.group())
    }
}

impl Finetuning {
    fn scorer(&self) -> Scorer<'_> {
        Scorer {
            labels: &self.labels,
            config: &self.config,
            post: PostprocessOptions {
                max_answer_length: self.opts.max_answer_length,
                ..PostprocessOptions::default()
            },
        }
    }

    /// Scores `data`: each process predicts its share of the batches,
    /// every process gets all predictions and scores them.
    fn evaluate_prepared(
        &self,
        data: &TaskData,
        prepared: &TaskInputs,
        group: &dyn ProcessGroup,
    ) -> Result<Evaluation> {
        let (rank, size) = (group.rank(), group.size());
        let batches = length_batches(&prepared.items, self.opts.eval_batch_size);
        let mut run = infer_batches(
            &self.head,
            &prepared.items,
            &batches,
            self.inputs.tokenizer.pad_id(),
            &self.device,
            |c| deals(c, rank, size),
        )?;
        if size > 1 {
            // The inputs process `r` predicted, in its order.
            let dealt = |r: usize| -> Vec<usize> {
                batches
                    .iter()
                    .enumerate()
                    .filter(|(c, _)| deals(*c, r, size))
                    .flat_map(|(_, b)| b.iter().copied())
                    .collect()
            };
            let mut sums = [run.loss_sum, run.targets as f64];
            group.sum_f64(&mut sums)?;
            (run.loss_sum, run.targets) = (sums[0], sums[1] as usize);
            let all = group.gather_f32(&run.outputs.pack(&dealt(rank)))?;
            for (r, packed) in all.iter().enumerate() {
                if r != rank {
                    run.outputs.unpack(&dealt(r), packed)?;
                }
            }
        }
        let loss = run.mean_loss();
        self.scorer().score(data, prepared, run.outputs, loss)
    }

    /// The rows a training slice is padded to. QA's loss takes its softmax
    /// over every position, padding included (as transformers'), so a
    /// process pads its slice as one process pads the whole micro-batch;
    /// the other heads ignore padding.
    fn pad_to(&self, slice: &Slice) -> usize {
        if self.task != Task::Qa {
            return 0;
        }
        let items = &self.train.items;
        slice
            .micro_batch
            .iter()
            .map(|&i| items[i].input_ids.len())
            .max()
            .unwrap_or(0)
    }

    /// A training micro-batch on the fast path. The loss's weight (this
    /// process's share of the micro-batch's targets) needs the counts of
    /// every process first, so every process takes part even with no rows.
    fn train_batch_fast(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<MeanLoss>> {
        let items: Vec<&TaskInput> = batch.iter().map(|&i| &self.train.items[i]).collect();
        let tokens = items.iter().map(|i| i.input_ids.len()).sum();
        // The targets as the candle path builds them.
        let (mut classes, mut tags, mut spans) = (Vec::new(), Vec::new(), Vec::new());
        for item in &items {
            match (self.task, &item.target) {
                (Task::Classification | Task::MultipleChoice, target) => {
                    classes.push(target.class_id())
                }
                (Task::Ner, target) => {
                    // A tag per token, cut to the input as the candle path cuts.
                    let mut row = vec![IGNORE_INDEX; item.input_ids.len()];
                    if let Target::Tokens(l) = target {
                        let n = l.len().min(row.len());
                        row[..n].copy_from_slice(&l[..n]);
                    }
                    tags.push(row);
                }
                (Task::Qa, &Target::Span(s, e)) => spans.push((s, e)),
                (Task::Qa, _) => spans.push((0, 0)),
            }
        }
        let targets = match self.task {
            Task::Qa => spans.len(),
            _ => classes
                .iter()
                .chain(tags.iter().flatten())
                .filter(|&&y| y != IGNORE_INDEX)
                .count(),
        };
        let share = match target_shares(&[targets], batch.len(), tokens, slice.group)? {
            Ok(shares) => shares[0],
            Err(done) => return Ok(done),
        };
        let head = FinetuneHead::of(self.head.model())?.ok_or_else(|| {
            Error::Input("internal: the fast path no longer covers the model".into())
        })?;
        let head = head.with_compute(self.compute);
        let batch = HeadBatch {
            // A multiple-choice input's choices are sequences of their own.
            sequences: items.iter().flat_map(|i| i.sequences()).collect(),
            targets: match self.task {
                Task::Classification => HeadTargets::Classes(&classes),
                Task::MultipleChoice => HeadTargets::Choices(&classes),
                Task::Ner => HeadTargets::Tokens(tags.iter().map(|t| &t[..]).collect()),
                Task::Qa => HeadTargets::Spans(&spans),
            },
            pad_to: self.pad_to(slice),
        };
        let out = head.step(&batch, share, true)?;
        Ok(MicroStep {
            loss: out.loss,
            gradients: Gradients::Computed(out.gradients),
            tokens,
            tally: MeanLoss::of(out.loss, out.targets),
        })
    }

    fn evaluate_dev(&self, group: &dyn ProcessGroup) -> Result<Option<Evaluation>> {
        self.dev
            .as_ref()
            .map(|(d, p)| self.evaluate_prepared(d, p, group))
            .transpose()
    }
}

impl Objective for Finetuning {
    /// The micro-batch's mean loss over its targets.
    type Tally = MeanLoss;
    const STREAMS: Streams = Streams::new(12);

    fn input_lengths(&self) -> Vec<usize> {
        self.train.items.iter().map(|e| e.input_ids.len()).collect()
    }

    fn main_metric(&self) -> MainMetric {
        MainMetric {
            name: self.task.main_metric(),
            greater_is_better: true,
        }
    }

    fn chart(&self) -> Chart {
        Chart {
            title: format!("{} loss", self.task),
            train_label: "train loss".into(),
            eval_label: "dev loss".into(),
            train_figure: None,
            scores_title: Some(format!("{} dev scores", self.task)),
        }
    }

    fn train_batch(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<MeanLoss>> {
        if self.fast {
            return self.train_batch_fast(batch, slice);
        }
        if batch.is_empty() {
            return Ok(MicroStep::empty());
        }
        let batch: Vec<&TaskInput> = batch.iter().map(|&i| &self.train.items[i]).collect();
        let out = self.head.forward(
            &batch,
            (self.inputs.tokenizer.pad_id(), self.pad_to(slice)),
            &self.device,
            true,
            false,
        )?;
        if out.targets == 0 {
            return Ok(MicroStep {
                loss: 0.0,
                gradients: Gradients::None,
                tokens: out.tokens,
                tally: MeanLoss::default(),
            });
        }
        let loss = f64::from(out.loss.to_scalar::<f32>()?);
        Ok(MicroStep {
            loss,
            gradients: Gradients::Loss(vec![LossPart::new(out.loss, out.targets)]),
            tokens: out.tokens,
            tally: MeanLoss::of(loss, out.targets),
        })
    }

    fn step_figures(&self, tallies: &[MeanLoss]) -> (f64, BTreeMap<String, f64>) {
        (MeanLoss::step_mean(tallies), BTreeMap::new())
    }

    fn evaluate(&self, group: &dyn ProcessGroup) -> Result<Option<Scores>> {
        Ok(self.evaluate_dev(group)?.map(|ev| Scores {
            loss: ev.loss.unwrap_or(f64::NAN),
            scores: ev.scores,
        }))
    }

    fn data_fingerprint(&self) -> Fingerprint {
        let mut f = Fingerprint::default();
        for item in &self.train.items {
            f.add(item.input_ids.iter().map(|&t| i64::from(t)));
            f.add(item.token_type_ids.iter().map(|&t| i64::from(t)));
            match &item.target {
                Target::Class(y) => f.add([*y]),
                Target::Tokens(tags) => f.add(tags.iter().copied()),
                Target::Span(s, e) => f.add([*s, *e]),
                Target::Choice { label, lengths } => {
                    f.add(std::iter::once(*label).chain(lengths.iter().map(|&n| n as i64)))
                }
            }
        }
        f
    }

    fn options_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.opts).unwrap_or_default()
    }

    fn write_extras(&self, dir: &Path) -> Result<()> {
        write_json(&dir.join(TRAINING_ARGS_FILE), &self.opts)
    }
}

/// The label ids to train with: the checkpoint's own when they cover the
/// training labels (so its head keeps its meaning), else the data's.
fn choose_labels(checkpoint: Option<LabelSet>, data: &LabelSet) -> (LabelSet, bool) {
    match checkpoint {
        Some(ck) if data.names().iter().all(|n| ck.id(n).is_some()) => (ck, true),
        _ => (data.clone(), false),
    }
}

/// The checkpoint's weights with the task head's tensors dropped, so that
/// the head is drawn fresh.
pub(crate) fn without_head(weights: Weights, prefix: &str) -> Result<Weights> {
    let origin = weights.origin().to_path_buf();
    let names: Vec<String> = weights
        .names()
        .filter(|n| !n.starts_with(prefix))
        .map(str::to_string)
        .collect();
    let mut tensors = HashMap::with_capacity(names.len());
    for n in names {
        let t = weights
            .get_unchecked(&n, DType::F32, &Device::Cpu)
            .map_err(|e| Error::Weights {
                path: origin.clone(),
                reason: crate::io::weights::strip_backtrace(&e),
            })?;
        tensors.insert(n, t);
    }
    Ok(Weights::from_tensors(tensors, origin))
}

/// The fine-tuning options the loop does not check itself (epochs, batch
/// sizes, lr, warmup and decay are the [`TrainPlan`](super::TrainPlan)'s
/// and the loop's).
pub(crate) fn validate(opts: &FinetuneOptions, config: &BertConfig, origin: &Path) -> Result<()> {
    if opts.eval_batch_size == 0 {
        return Err(Error::option("eval_batch_size", "must be at least 1"));
    }
    if opts.max_length > config.max_sequence_length() {
        return Err(Error::option(
            "max_length",
            format!(
                "{} is longer than the model's limit of {} tokens (max_position_embeddings in {})",
                opts.max_length,
                config.max_sequence_length(),
                origin.display()
            ),
        ));
    }
    if opts.max_train == Some(0) {
        return Err(Error::option("max_train", "must be at least 1"));
    }
    Ok(())
}
