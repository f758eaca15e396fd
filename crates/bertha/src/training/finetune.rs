//! Fine-tuning: sequence classification (single texts or pairs), NER and
//! extractive QA on top of a pre-trained encoder, with the pre-training
//! engine's optimiser, schedule, metrics, checkpoints and exact resume.
//!
//! One loop serves the three tasks; what differs is how examples become
//! model inputs (a class id, a tag per first word piece, an answer span per
//! SQuAD window) and how the dev set is scored (accuracy and macro-F1,
//! seqeval's entity P/R/F1, SQuAD EM/F1). Every random draw (the fresh
//! head, the data order of each epoch, dropout) comes from `(seed, step)`,
//! so a resumed run repeats the losses of an uninterrupted one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use rand::seq::SliceRandom;
use rayon::prelude::*;

use super::checkpoint::{
    rewind_metrics, write_atomic, Checkpoint, CheckpointParts, TrainerState, MODEL_FILE,
};
use super::optim::{AdamW, AdamWConfig, GradAccumulator};
use super::params::ParamStore;
use super::rng_for;
use super::schedule::{LrSchedule, ScheduleKind};
use crate::config::{BertConfig, Family, ProblemType};
use crate::error::{Error, Result};
use crate::finetune::metrics::{accuracy, entity_scores, macro_f1};
use crate::finetune::{
    postprocess, AlignedSentence, ClassificationData, ConllOptions, FeatureOptions, LabelSet,
    NerAligner, NerData, PostprocessOptions, ReadOptions, SquadData, SquadFeature, SquadFeaturizer,
    SquadPrediction, IGNORE_INDEX,
};
use crate::io::tokenizer::Tokenizer;
use crate::io::weights::Weights;
use crate::model::{
    seed_dropout, BertForQuestionAnswering, BertForSequenceClassification,
    BertForTokenClassification, BertHead, BertInput, ForwardOptions, HeadInit, HeadKind,
};

/// Purposes of the per-step generators.
const SHUFFLE: u64 = 11;
const DROPOUT: u64 = 12;
const SUBSAMPLE: u64 = 13;

/// The run's options, saved next to every model it writes so that
/// `evaluate` and `predict` tokenize as training did.
pub const TRAINING_ARGS_FILE: &str = "training_args.json";
/// The dev scores of the model in a folder (the best one with early stopping).
pub const EVAL_RESULTS_FILE: &str = "eval_results.json";

/// The fine-tuning tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Texts or text pairs → one class (GLUE-style TSV / CSV / JSONL).
    Classification,
    /// Words → IOB2 tags (CoNLL files).
    Ner,
    /// Question + context → answer span (SQuAD JSON).
    Qa,
}

impl FromStr for Task {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "classification" => Ok(Self::Classification),
            "ner" => Ok(Self::Ner),
            "qa" => Ok(Self::Qa),
            other => Err(Error::Input(format!(
                "unknown task `{other}` (expected classification, ner or qa)"
            ))),
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Classification => "classification",
            Self::Ner => "ner",
            Self::Qa => "qa",
        })
    }
}

impl Task {
    /// The transformers head class the task trains.
    pub fn head(self) -> HeadKind {
        match self {
            Self::Classification => HeadKind::SequenceClassification,
            Self::Ner => HeadKind::TokenClassification,
            Self::Qa => HeadKind::QuestionAnswering,
        }
    }

    /// The score that picks the best checkpoint: accuracy, entity F1 or
    /// SQuAD F1 (a key of [`Evaluation::scores`]).
    pub fn main_metric(self) -> &'static str {
        match self {
            Self::Classification => "accuracy",
            Self::Ner | Self::Qa => "f1",
        }
    }

    /// transformers' example scripts' defaults: 128 tokens for
    /// `run_glue.py` / `run_ner.py`, 384 for `run_qa.py`.
    pub fn default_max_length(self) -> usize {
        match self {
            Self::Classification | Self::Ner => 128,
            Self::Qa => 384,
        }
    }

    /// Tensor name prefixes of the task's head.
    fn head_prefix(self) -> &'static str {
        match self {
            Self::Classification | Self::Ner => "classifier.",
            Self::Qa => "qa_outputs.",
        }
    }
}

/// How data files are read (columns are found by name unless given).
#[derive(Debug, Clone, Default)]
pub struct DataOptions {
    pub text_column: Option<String>,
    pub pair_column: Option<String>,
    pub label_column: Option<String>,
    /// Skip and count malformed rows / sentences instead of failing.
    pub skip_bad_rows: bool,
}

/// A task's data set, as read from its file.
#[derive(Debug, Clone)]
pub enum TaskData {
    Classification(ClassificationData),
    Ner(NerData),
    Qa(SquadData),
}

impl TaskData {
    /// Reads `path` for `task`. `labels` fixes the class / tag ids (an
    /// unknown label is an error naming its line); `None` infers them from
    /// the file. `unlabelled` accepts a classification file without a label
    /// column (for prediction).
    pub fn read(
        task: Task,
        path: &Path,
        labels: Option<&LabelSet>,
        unlabelled: bool,
        opts: &DataOptions,
    ) -> Result<Self> {
        Ok(match task {
            Task::Classification => {
                let d = ClassificationData::read(
                    path,
                    &ReadOptions {
                        text_column: opts.text_column.clone(),
                        pair_column: opts.pair_column.clone(),
                        label_column: opts.label_column.clone(),
                        labels: labels.cloned(),
                        skip_bad_rows: opts.skip_bad_rows,
                        allow_unlabelled: unlabelled,
                        ..ReadOptions::default()
                    },
                )?;
                if d.skipped > 0 {
                    tracing::warn!("{}: skipped {} malformed rows", path.display(), d.skipped);
                }
                Self::Classification(d)
            }
            Task::Ner => {
                let d = NerData::read(
                    path,
                    &ConllOptions {
                        labels: labels.cloned(),
                        skip_bad_rows: opts.skip_bad_rows,
                    },
                )?;
                if d.skipped > 0 {
                    tracing::warn!(
                        "{}: skipped {} malformed sentences",
                        path.display(),
                        d.skipped
                    );
                }
                Self::Ner(d)
            }
            Task::Qa => Self::Qa(SquadData::read(path)?),
        })
    }

    pub fn task(&self) -> Task {
        match self {
            Self::Classification(_) => Task::Classification,
            Self::Ner(_) => Task::Ner,
            Self::Qa(_) => Task::Qa,
        }
    }

    /// Examples (texts, sentences or questions).
    pub fn len(&self) -> usize {
        match self {
            Self::Classification(d) => d.len(),
            Self::Ner(d) => d.len(),
            Self::Qa(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class or tag ids (`None` for QA).
    pub fn labels(&self) -> Option<&LabelSet> {
        match self {
            Self::Classification(d) => Some(&d.labels),
            Self::Ner(d) => Some(&d.labels),
            Self::Qa(_) => None,
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Classification(d) => &d.path,
            Self::Ner(d) => &d.path,
            Self::Qa(d) => &d.path,
        }
    }

    /// Keeps `n` examples drawn with the seed (in file order), for quick
    /// runs on a slice of a large training set.
    pub fn subsample(&mut self, n: usize, seed: u64) {
        if n >= self.len() {
            return;
        }
        let mut idx: Vec<usize> = (0..self.len()).collect();
        idx.shuffle(&mut rng_for(seed, SUBSAMPLE, 0));
        let mut keep = vec![false; self.len()];
        for &i in &idx[..n] {
            keep[i] = true;
        }
        fn retain<T>(v: &mut Vec<T>, keep: &[bool]) {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        match self {
            Self::Classification(d) => retain(&mut d.examples, &keep),
            Self::Ner(d) => retain(&mut d.sentences, &keep),
            Self::Qa(d) => retain(&mut d.examples, &keep),
        }
    }
}

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
    /// Clip the global gradient norm to this (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
    pub seed: u64,
    /// Evaluate on dev every N steps, besides every epoch's end.
    pub eval_every: Option<u64>,
    /// Write a resumable `checkpoint-N` every N steps, besides every
    /// epoch's end and the last step.
    pub save_every: Option<u64>,
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
}

impl Default for FinetuneOptions {
    fn default() -> Self {
        Self {
            epochs: 3.0,
            lr: 5e-5,
            batch_size: 32,
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
            early_stop: None,
            max_train: None,
            group_by_length: false,
            out: PathBuf::from("finetuned"),
        }
    }
}

/// One optimiser step's figures (a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    /// Epochs done after this step (fractional).
    pub epoch: f64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

/// A dev evaluation (also a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalMetrics {
    pub step: u64,
    pub epoch: f64,
    pub eval_loss: f64,
    /// The key of `scores` that picks the best model.
    pub metric: String,
    /// accuracy, macro_f1 / precision, recall, f1, token_accuracy /
    /// exact_match, f1 (SQuAD's, in percent).
    #[serde(flatten)]
    pub scores: BTreeMap<String, f64>,
}

impl EvalMetrics {
    pub fn main(&self) -> f64 {
        self.scores.get(&self.metric).copied().unwrap_or(f64::NAN)
    }
}

/// What the loop reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    Step(StepMetrics),
    Eval(EvalMetrics),
    /// A new best model was written to `out/best` (early stopping only).
    Best(EvalMetrics),
    Saved(PathBuf),
    /// Patience ran out at `step`; the best model is from `best_step`.
    EarlyStop {
        step: u64,
        best_step: u64,
    },
}

/// A classification prediction: the best label and its softmax score.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClassPrediction {
    pub label: String,
    #[serde(skip)]
    pub id: usize,
    pub score: f32,
}

/// Per-example predictions, in file order.
#[derive(Debug, Clone, PartialEq)]
pub enum Predictions {
    Classification(Vec<ClassPrediction>),
    /// One tag per word of each sentence.
    Ner(Vec<Vec<String>>),
    /// One answer per question.
    Qa(Vec<SquadPrediction>),
}

/// Scores and predictions of a model on a data set.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub task: Task,
    pub examples: usize,
    /// Mean loss over the labelled targets (`None` without labels).
    pub loss: Option<f64>,
    /// Empty when the data has no labels.
    pub scores: BTreeMap<String, f64>,
    pub predictions: Predictions,
}

impl Evaluation {
    /// The task's main metric, when the data had labels.
    pub fn main_score(&self) -> Option<f64> {
        self.scores.get(self.task.main_metric()).copied()
    }
}

// ---------------------------------------------------------------- model inputs

/// What an input is trained towards.
#[derive(Debug, Clone)]
enum Target {
    /// A class id (`IGNORE_INDEX` when unlabelled).
    Class(i64),
    /// A tag id per token, `IGNORE_INDEX` off first pieces.
    Tokens(Vec<i64>),
    /// Start and end token of the answer.
    Span(i64, i64),
}

#[derive(Debug, Clone)]
struct Item {
    input_ids: Vec<u32>,
    token_type_ids: Vec<u32>,
    target: Target,
}

/// The model inputs of a data set, with what scoring them needs.
struct Prepared {
    items: Vec<Item>,
    aligned: Vec<AlignedSentence>,
    features: Vec<SquadFeature>,
}

/// How inputs are cut: the tokenizer (truncating at `max_length`) and the
/// QA window stride.
struct Encoder {
    tokenizer: Tokenizer,
    max_length: usize,
    doc_stride: usize,
}

impl Encoder {
    fn new(tokenizer: &Tokenizer, max_length: usize, doc_stride: usize) -> Result<Self> {
        let mut tokenizer = tokenizer.clone();
        tokenizer.set_max_length(max_length)?;
        Ok(Self {
            tokenizer,
            max_length,
            doc_stride,
        })
    }

    /// The model inputs of `data`; without `targets` every label is
    /// ignored (prediction: the file's label ids need not be the model's).
    fn prepare(&self, data: &TaskData, targets: bool) -> Result<Prepared> {
        let mut p = Prepared {
            items: Vec::new(),
            aligned: Vec::new(),
            features: Vec::new(),
        };
        match data {
            TaskData::Classification(d) => {
                let encoded: Vec<(Item, bool)> = d
                    .examples
                    .par_iter()
                    .map(|e| {
                        let enc = match &e.text_b {
                            Some(b) => self.tokenizer.encode_pair(&e.text_a, b),
                            None => self.tokenizer.encode(&e.text_a),
                        }
                        .map_err(|err| {
                            Error::Input(format!("{}: line {}: {err}", d.path.display(), e.line))
                        })?;
                        let y = match e.label.class() {
                            Some(c) if targets => c as i64,
                            _ => IGNORE_INDEX,
                        };
                        Ok((
                            Item {
                                input_ids: enc.input_ids,
                                token_type_ids: enc.token_type_ids,
                                target: Target::Class(y),
                            },
                            enc.truncated,
                        ))
                    })
                    .collect::<Result<_>>()?;
                let truncated = encoded.iter().filter(|(_, t)| *t).count();
                if truncated > 0 {
                    tracing::warn!(
                        "{}: {truncated} of {} examples truncated to {} tokens",
                        d.path.display(),
                        d.len(),
                        self.max_length
                    );
                }
                p.items = encoded.into_iter().map(|(i, _)| i).collect();
            }
            TaskData::Ner(d) => {
                let aligner = NerAligner::new(&self.tokenizer, self.max_length)?;
                p.aligned = aligner
                    .align_all(&d.sentences)
                    .map_err(|e| Error::Input(format!("{}: {e}", d.path.display())))?;
                let cut: usize = p.aligned.iter().map(|a| a.words_truncated).sum();
                if cut > 0 {
                    tracing::warn!(
                        "{}: {cut} words past {} tokens are predicted `O`",
                        d.path.display(),
                        self.max_length
                    );
                }
                p.items = p
                    .aligned
                    .iter()
                    .map(|a| Item {
                        input_ids: a.input_ids.clone(),
                        token_type_ids: a.token_type_ids.clone(),
                        target: Target::Tokens(if targets {
                            a.labels.clone()
                        } else {
                            vec![IGNORE_INDEX; a.labels.len()]
                        }),
                    })
                    .collect();
            }
            TaskData::Qa(d) => {
                let featurizer = SquadFeaturizer::new(
                    &self.tokenizer,
                    FeatureOptions {
                        max_length: self.max_length,
                        doc_stride: self.doc_stride,
                    },
                )?;
                p.features = featurizer
                    .features_all(&d.examples)
                    .map_err(|e| Error::Input(format!("{}: {e}", d.path.display())))?;
                p.items = p
                    .features
                    .iter()
                    .map(|f| Item {
                        input_ids: f.input_ids.clone(),
                        token_type_ids: f.token_type_ids.clone(),
                        target: Target::Span(f.start_position as i64, f.end_position as i64),
                    })
                    .collect();
            }
        }
        Ok(p)
    }
}

// ---------------------------------------------------------------- the heads

/// The model of one task.
enum Head {
    Classification(BertForSequenceClassification),
    Ner(BertForTokenClassification),
    Qa(BertForQuestionAnswering),
}

/// What one forward pass gives, per input.
enum Outputs {
    /// Logits [C] per input.
    Class(Vec<Vec<f32>>),
    /// The arg-max tag per token.
    Tokens(Vec<Vec<usize>>),
    /// Start and end logits over each input's own tokens.
    Spans(Vec<(Vec<f32>, Vec<f32>)>),
}

struct BatchOut {
    loss: Tensor,
    /// Targets the loss averages over (its weight in a data-set mean).
    targets: usize,
    tokens: usize,
    outputs: Option<Outputs>,
}

impl Head {
    fn load(task: Task, vb: VarBuilder, config: BertConfig) -> candle_core::Result<Self> {
        Ok(match task {
            Task::Classification => Self::Classification(BertHead::load(vb, config)?),
            Task::Ner => Self::Ner(BertHead::load(vb, config)?),
            Task::Qa => Self::Qa(BertHead::load(vb, config)?),
        })
    }

    fn from_dir(task: Task, dir: &Path, device: &Device) -> Result<Self> {
        let init = HeadInit::FromCheckpoint;
        Ok(match task {
            Task::Classification => Self::Classification(BertHead::from_dir(dir, init, device)?),
            Task::Ner => Self::Ner(BertHead::from_dir(dir, init, device)?),
            Task::Qa => Self::Qa(BertHead::from_dir(dir, init, device)?),
        })
    }

    fn config(&self) -> &BertConfig {
        match self {
            Self::Classification(m) => m.config(),
            Self::Ner(m) => m.config(),
            Self::Qa(m) => m.bert().config(),
        }
    }

    /// Runs a batch padded to its longest input, with the loss against the
    /// targets, and (with `outputs`) the per-input predictions.
    fn forward(
        &self,
        batch: &[&Item],
        pad_id: u32,
        device: &Device,
        train: bool,
        outputs: bool,
    ) -> Result<BatchOut> {
        let b = batch.len();
        let ids: Vec<Vec<u32>> = batch.iter().map(|i| i.input_ids.clone()).collect();
        let types: Vec<Vec<u32>> = batch.iter().map(|i| i.token_type_ids.clone()).collect();
        let t = ids.iter().map(Vec::len).max().unwrap_or(0);
        let tokens = ids.iter().map(Vec::len).sum();
        let input = BertInput::from_ids(&ids, &types, pad_id, device)?;
        let opts = ForwardOptions {
            train,
            ..ForwardOptions::default()
        };
        let missing = || Error::Input("the head returned no loss for labelled inputs".into());
        match self {
            Self::Classification(m) => {
                let labels: Vec<i64> = batch
                    .iter()
                    .map(|i| match i.target {
                        Target::Class(y) => y,
                        _ => IGNORE_INDEX,
                    })
                    .collect();
                let targets = labels.iter().filter(|&&y| y != IGNORE_INDEX).count();
                let labels = Tensor::from_vec(labels, b, device)?;
                let out = m.forward(&input, Some(&labels), opts)?;
                let outputs = if outputs {
                    Some(Outputs::Class(out.logits.to_vec2::<f32>()?))
                } else {
                    None
                };
                Ok(BatchOut {
                    loss: out.loss.ok_or_else(missing)?,
                    targets,
                    tokens,
                    outputs,
                })
            }
            Self::Ner(m) => {
                let mut labels = vec![IGNORE_INDEX; b * t];
                for (r, item) in batch.iter().enumerate() {
                    if let Target::Tokens(l) = &item.target {
                        let n = l.len().min(t);
                        labels[r * t..r * t + n].copy_from_slice(&l[..n]);
                    }
                }
                let targets = labels.iter().filter(|&&y| y != IGNORE_INDEX).count();
                let labels = Tensor::from_vec(labels, (b, t), device)?;
                let out = m.forward(&input, Some(&labels), opts)?;
                let outputs = if outputs {
                    let best = out.logits.argmax(D::Minus1)?.to_vec2::<u32>()?;
                    Some(Outputs::Tokens(
                        best.into_iter()
                            .map(|row| row.into_iter().map(|x| x as usize).collect())
                            .collect(),
                    ))
                } else {
                    None
                };
                Ok(BatchOut {
                    loss: out.loss.ok_or_else(missing)?,
                    targets,
                    tokens,
                    outputs,
                })
            }
            Self::Qa(m) => {
                let (starts, ends): (Vec<i64>, Vec<i64>) = batch
                    .iter()
                    .map(|i| match i.target {
                        Target::Span(s, e) => (s, e),
                        _ => (0, 0),
                    })
                    .unzip();
                let s = Tensor::from_vec(starts, b, device)?;
                let e = Tensor::from_vec(ends, b, device)?;
                let out = m.forward(&input, Some(&s), Some(&e), opts)?;
                let outputs = if outputs {
                    let starts = out.start_logits.to_vec2::<f32>()?;
                    let ends = out.end_logits.to_vec2::<f32>()?;
                    // Only the input's own tokens: padding is no candidate.
                    Some(Outputs::Spans(
                        starts
                            .into_iter()
                            .zip(ends)
                            .zip(batch)
                            .map(|((mut s, mut e), item)| {
                                s.truncate(item.input_ids.len());
                                e.truncate(item.input_ids.len());
                                (s, e)
                            })
                            .collect(),
                    ))
                } else {
                    None
                };
                Ok(BatchOut {
                    loss: out.loss.ok_or_else(missing)?,
                    targets: b,
                    tokens,
                    outputs,
                })
            }
        }
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

/// Per-input predictions of a whole data set, in input order (batched by
/// length, so that little is padding), and the mean loss over targets.
fn infer(
    head: &Head,
    items: &[Item],
    batch_size: usize,
    pad_id: u32,
    device: &Device,
) -> Result<(Outputs, Option<f64>)> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].input_ids.len());
    let (mut loss_sum, mut weight) = (0.0f64, 0usize);
    let mut class = vec![Vec::new(); items.len()];
    let mut tokens = vec![Vec::new(); items.len()];
    let mut spans = vec![(Vec::new(), Vec::new()); items.len()];
    for chunk in order.chunks(batch_size.max(1)) {
        let batch: Vec<&Item> = chunk.iter().map(|&i| &items[i]).collect();
        let out = head.forward(&batch, pad_id, device, false, true)?;
        if out.targets > 0 {
            loss_sum += out.loss.to_scalar::<f32>()? as f64 * out.targets as f64;
            weight += out.targets;
        }
        match out.outputs {
            Some(Outputs::Class(rows)) => {
                for (&i, r) in chunk.iter().zip(rows) {
                    class[i] = r;
                }
            }
            Some(Outputs::Tokens(rows)) => {
                for (&i, r) in chunk.iter().zip(rows) {
                    tokens[i] = r;
                }
            }
            Some(Outputs::Spans(rows)) => {
                for (&i, r) in chunk.iter().zip(rows) {
                    spans[i] = r;
                }
            }
            None => {}
        }
    }
    let outputs = match head {
        Head::Classification(_) => Outputs::Class(class),
        Head::Ner(_) => Outputs::Tokens(tokens),
        Head::Qa(_) => Outputs::Spans(spans),
    };
    Ok((outputs, (weight > 0).then(|| loss_sum / weight as f64)))
}

/// Softmax of one row, in f64.
fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = row.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// The first index of the largest value (numpy's argmax).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Everything evaluation needs besides the model.
struct Scorer<'a> {
    labels: &'a LabelSet,
    /// Class names when `labels` is empty (`LABEL_i`).
    config: &'a BertConfig,
    post: PostprocessOptions,
}

impl Scorer<'_> {
    /// Turns model outputs into per-example predictions.
    fn predictions(
        &self,
        data: &TaskData,
        prepared: &Prepared,
        outputs: Outputs,
    ) -> Result<Predictions> {
        Ok(match (data, outputs) {
            (TaskData::Classification(_), Outputs::Class(rows)) => Predictions::Classification(
                rows.iter()
                    .map(|r| {
                        let id = argmax(r);
                        let label = match self.labels.name(id) {
                            Some(n) => n.to_string(),
                            None => self.config.label_name(id),
                        };
                        ClassPrediction {
                            label,
                            id,
                            score: softmax(r).get(id).copied().unwrap_or(0.0) as f32,
                        }
                    })
                    .collect(),
            ),
            (TaskData::Ner(_), Outputs::Tokens(rows)) => Predictions::Ner(
                prepared
                    .aligned
                    .iter()
                    .zip(&rows)
                    .map(|(a, r)| a.word_tags(r, self.labels))
                    .collect::<Result<_>>()?,
            ),
            (TaskData::Qa(d), Outputs::Spans(rows)) => {
                let (starts, ends): (Vec<Vec<f32>>, Vec<Vec<f32>>) = rows.into_iter().unzip();
                Predictions::Qa(postprocess(
                    &d.examples,
                    &prepared.features,
                    &starts,
                    &ends,
                    &self.post,
                )?)
            }
            _ => {
                return Err(Error::Input(
                    "internal: the model's outputs do not match the task".into(),
                ))
            }
        })
    }

    /// Predictions and, where the data has labels, the task's metrics.
    fn score(
        &self,
        data: &TaskData,
        prepared: &Prepared,
        outputs: Outputs,
        loss: Option<f64>,
    ) -> Result<Evaluation> {
        let predictions = self.predictions(data, prepared, outputs)?;
        let mut scores = BTreeMap::new();
        match (data, &predictions) {
            (TaskData::Classification(d), Predictions::Classification(preds))
                if d.examples.iter().all(|e| e.label.class().is_some()) =>
            {
                let gold = d.class_ids()?;
                let ids: Vec<usize> = preds.iter().map(|p| p.id).collect();
                scores.insert("accuracy".into(), accuracy(&ids, &gold)?);
                scores.insert("macro_f1".into(), macro_f1(&ids, &gold)?);
            }
            (TaskData::Ner(d), Predictions::Ner(tags)) => {
                let s = entity_scores(&d.tags(), tags)?;
                scores.insert("precision".into(), s.overall.precision);
                scores.insert("recall".into(), s.overall.recall);
                scores.insert("f1".into(), s.overall.f1);
                scores.insert("token_accuracy".into(), s.token_accuracy);
            }
            (TaskData::Qa(d), Predictions::Qa(preds)) => {
                let s = d.evaluate(preds);
                scores.insert("exact_match".into(), s.exact_match);
                scores.insert("f1".into(), s.f1);
            }
            _ => {}
        }
        Ok(Evaluation {
            task: data.task(),
            examples: data.len(),
            loss,
            scores,
            predictions,
        })
    }
}

// ---------------------------------------------------------------- set-up

/// Checks that `config` is a BERT the task heads fit.
fn check_family(config: &BertConfig, origin: &Path) -> Result<()> {
    if !matches!(config.family, Family::Bert) {
        return Err(Error::config(
            origin,
            "model_type",
            format!(
                "fine-tuning supports BERT checkpoints (model_type `bert`), not `{}`",
                config.model_type
            ),
        ));
    }
    Ok(())
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
fn without_head(weights: Weights, prefix: &str) -> Result<Weights> {
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

/// Reads a folder's `training_args.json` (written by [`Finetuner`]).
pub fn read_training_args(dir: &Path) -> Result<Option<FinetuneOptions>> {
    let p = dir.join(TRAINING_ARGS_FILE);
    if !p.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| Error::Json { path: p, source })
}

fn validate(opts: &FinetuneOptions, config: &BertConfig, origin: &Path) -> Result<()> {
    let bad = |what: String| Err(Error::Input(what));
    if !(opts.epochs.is_finite() && opts.epochs > 0.0) {
        return bad(format!("--epochs {}: must be above 0", opts.epochs));
    }
    if opts.batch_size == 0 || opts.eval_batch_size == 0 {
        return bad("--batch-size must be at least 1".into());
    }
    if !(opts.lr.is_finite() && opts.lr >= 0.0) {
        return bad(format!("--lr {}: must be a non-negative number", opts.lr));
    }
    if !(0.0..=1.0).contains(&opts.warmup_ratio) {
        return bad(format!(
            "--warmup-ratio {}: must be between 0 and 1",
            opts.warmup_ratio
        ));
    }
    if !(opts.weight_decay.is_finite() && opts.weight_decay >= 0.0) {
        return bad(format!(
            "--weight-decay {}: must be a non-negative number",
            opts.weight_decay
        ));
    }
    if opts.max_length > config.max_sequence_length() {
        return bad(format!(
            "--max-length {} is longer than the model's limit of {} tokens (max_position_embeddings in {})",
            opts.max_length,
            config.max_sequence_length(),
            origin.display()
        ));
    }
    if opts.eval_every == Some(0) || opts.save_every == Some(0) {
        return bad("--eval-every and --save-every must be at least 1".into());
    }
    if opts.early_stop == Some(0) {
        return bad("--early-stop must be at least 1 (evaluations without improvement)".into());
    }
    if opts.max_train == Some(0) {
        return bad("--max-train must be at least 1".into());
    }
    Ok(())
}

// ---------------------------------------------------------------- the loop

/// A fine-tuning run: the model with its task head, the optimiser and the
/// prepared training and dev sets.
pub struct Finetuner {
    task: Task,
    config: BertConfig,
    head: Head,
    params: ParamStore,
    optim: AdamW,
    schedule: LrSchedule,
    encoder: Encoder,
    labels: LabelSet,
    train: Prepared,
    train_examples: usize,
    dev: Option<(TaskData, Prepared)>,
    opts: FinetuneOptions,
    tokenizer_source: PathBuf,
    device: Device,
    steps_per_epoch: u64,
    total_steps: u64,
    step: u64,
    history: Vec<StepMetrics>,
    evals: Vec<EvalMetrics>,
    /// (step, main metric) of the best evaluation so far.
    best: Option<(u64, f64)>,
    /// Evaluations since the best one.
    patience_used: usize,
    /// Whether metrics.jsonl belongs to this run (else it is started anew).
    metrics_owned: bool,
    /// The current epoch's reading order.
    order: (u64, Vec<usize>),
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
        let config_path = model_dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::ModelDir {
                path: model_dir.to_path_buf(),
                reason: "config.json is missing".into(),
            });
        }
        let config = BertConfig::from_file(&config_path)?;
        check_family(&config, &config_path)?;
        validate(&opts, &config, &config_path)?;
        let tokenizer = Tokenizer::from_dir(model_dir, opts.max_length)?;
        let weights = Weights::from_model_dir(model_dir)?;

        let mut train_data = TaskData::read(task, train, None, false, data)?;
        let ck_labels = match task {
            Task::Qa => None,
            _ => LabelSet::from_config(&config)
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
            .map(|p| TaskData::read(task, p, (task != Task::Qa).then_some(&labels), false, data))
            .transpose()?;

        // Keep the checkpoint's head only when it was trained for this
        // task with these labels and has the shape we need.
        let prefix = task.head_prefix();
        let head_weight = format!("{prefix}weight");
        let out_dim = match task {
            Task::Qa => 2,
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
        let labels_fit = task == Task::Qa || from_checkpoint || ck_labels.is_none();
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
        config.architectures = vec![task.head().architecture().to_string()];
        match task {
            Task::Classification => {
                config.problem_type = Some(ProblemType::SingleLabelClassification);
                labels.apply_to(&mut config);
            }
            Task::Ner => {
                config.problem_type = None;
                labels.apply_to(&mut config);
            }
            Task::Qa => {
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
        check_family(&config, origin)?;
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
            return Err(Error::Input(
                "--early-stop needs a dev set (--dev) to watch".into(),
            ));
        }
        let labels = train.labels().cloned().unwrap_or_default();
        if task != Task::Qa {
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
        let encoder = Encoder::new(tokenizer, opts.max_length, opts.doc_stride)?;
        let train_examples = train.len();
        let prepared = encoder.prepare(&train, true)?;
        if prepared.items.is_empty() {
            return Err(Error::Input(format!(
                "{}: no training inputs",
                train.path().display()
            )));
        }
        let dev = dev
            .map(|d| encoder.prepare(&d, true).map(|p| (d, p)))
            .transpose()?;

        flush_denormals();
        let device = Device::Cpu;
        let prefix = format!("{}.", config.family.prefix());
        let (mut params, vb) = ParamStore::builder(init, &prefix, opts.seed, &device);
        let head = Head::load(task, vb, config.clone()).map_err(|e| Error::Weights {
            path: tokenizer_source.to_path_buf(),
            reason: crate::io::weights::strip_backtrace(&e),
        })?;
        params.freeze()?;

        let steps_per_epoch = prepared.items.len().div_ceil(opts.batch_size) as u64;
        let total_steps = ((opts.epochs * steps_per_epoch as f64).ceil() as u64).max(1);
        let schedule = LrSchedule {
            peak: opts.lr,
            // transformers' Trainer: ceil(warmup_ratio × steps).
            warmup: (opts.warmup_ratio * total_steps as f64).ceil() as u64,
            total: total_steps,
            kind: ScheduleKind::Linear,
        };
        let optim = AdamW::new(AdamWConfig {
            weight_decay: opts.weight_decay,
            max_grad_norm: opts.max_grad_norm,
            ..AdamWConfig::default()
        });
        Ok(Self {
            task,
            config,
            head,
            params,
            optim,
            schedule,
            encoder,
            labels,
            train: prepared,
            train_examples,
            dev,
            opts,
            tokenizer_source: tokenizer_source.to_path_buf(),
            device,
            steps_per_epoch,
            total_steps,
            step: 0,
            history: Vec::new(),
            evals: Vec::new(),
            best: None,
            patience_used: 0,
            metrics_owned: false,
            order: (u64::MAX, Vec::new()),
        })
    }

    pub fn task(&self) -> Task {
        self.task
    }

    /// The config the checkpoints are written with (architectures, labels).
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Class / tag ids (empty for QA).
    pub fn labels(&self) -> &LabelSet {
        &self.labels
    }

    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    pub fn options(&self) -> &FinetuneOptions {
        &self.opts
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// Training examples, and the model inputs made from them (QA: one per
    /// context window).
    pub fn train_size(&self) -> (usize, usize) {
        (self.train_examples, self.train.items.len())
    }

    pub fn dev_size(&self) -> Option<usize> {
        self.dev.as_ref().map(|(d, _)| d.len())
    }

    /// Every evaluation so far.
    pub fn evals(&self) -> &[EvalMetrics] {
        &self.evals
    }

    /// Reads a file with this run's label ids (e.g. to score the training set).
    pub fn read_data(&self, path: &Path, data: &DataOptions) -> Result<TaskData> {
        let labels = (self.task != Task::Qa).then_some(&self.labels);
        TaskData::read(self.task, path, labels, false, data)
    }

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

    /// The current model's predictions and scores on `data` (dropout off).
    pub fn evaluate_on(&self, data: &TaskData) -> Result<Evaluation> {
        let prepared = self.encoder.prepare(data, true)?;
        self.evaluate_prepared(data, &prepared)
    }

    fn evaluate_prepared(&self, data: &TaskData, prepared: &Prepared) -> Result<Evaluation> {
        let (outputs, loss) = infer(
            &self.head,
            &prepared.items,
            self.opts.eval_batch_size,
            self.encoder.tokenizer.pad_id(),
            &self.device,
        )?;
        self.scorer().score(data, prepared, outputs, loss)
    }

    /// The current model on the dev set (`None` without one).
    pub fn evaluate(&self) -> Result<Option<Evaluation>> {
        self.dev
            .as_ref()
            .map(|(d, p)| self.evaluate_prepared(d, p))
            .transpose()
    }

    /// Continues from a checkpoint written by this loop: weights,
    /// optimiser moments and step; the metrics after it are dropped and
    /// the early-stopping state is rebuilt from those before it.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let ck = Checkpoint::load(dir)?;
        self.params.load(&ck.model, &ck.dir.join(MODEL_FILE))?;
        self.optim.load_state(ck.state.step, &ck.optimizer)?;
        if ck.state.seed != self.opts.seed {
            tracing::warn!(
                "resuming a run seeded {} with --seed {}: the data order and dropout will differ",
                ck.state.seed,
                self.opts.seed
            );
        }
        if ck.state.total_steps != self.total_steps {
            tracing::warn!(
                "the checkpoint's run had {} steps, this one has {}: the schedule differs",
                ck.state.total_steps,
                self.total_steps
            );
        }
        self.step = ck.state.step;
        let metrics = self.opts.out.join("metrics.jsonl");
        (self.history, self.evals) = rewind_metrics(&metrics, self.step)?;
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

    /// Updates the best evaluation and the patience counter; returns
    /// whether `e` is a new best.
    fn track_best(&mut self, e: &EvalMetrics) -> bool {
        let v = e.main();
        if self.best.is_none_or(|(_, b)| v > b) {
            self.best = Some((e.step, v));
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

    /// The training inputs of step `step` (0-based): each epoch reads the
    /// set in its own seeded order; the last batch of an epoch may be short.
    fn batch_indices(&mut self, step: u64) -> Vec<usize> {
        let n = self.train.items.len();
        let bs = self.opts.batch_size;
        let epoch = step / self.steps_per_epoch;
        let within = (step % self.steps_per_epoch) as usize;
        if self.order.0 != epoch {
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(&mut rng_for(self.opts.seed, SHUFFLE, epoch));
            if self.opts.group_by_length {
                let items = &self.train.items;
                group_by_length(&mut order, bs, |i| items[i].input_ids.len());
            }
            self.order = (epoch, order);
        }
        self.order.1[within * bs..((within + 1) * bs).min(n)].to_vec()
    }

    /// Trains to the end (or until early stopping), reporting every step,
    /// evaluation and checkpoint to `on_event`; writes `metrics.jsonl`,
    /// `loss.png`, `metric.png`, `checkpoint-N/` (the newest only),
    /// `best/` (with early stopping) and the final model into `out`.
    pub fn run(&mut self, on_event: impl FnMut(&Event)) -> Result<()> {
        self.run_until(self.total_steps, on_event)
    }

    /// [`Finetuner::run`], stopping after step `stop` (the final model is
    /// written only when the run ends).
    pub fn run_until(&mut self, stop: u64, mut on_event: impl FnMut(&Event)) -> Result<()> {
        let stop = stop.min(self.total_steps);
        let out = self.opts.out.clone();
        std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
        let metrics_path = out.join("metrics.jsonl");
        let mut metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(self.metrics_owned)
            .write(true)
            .truncate(!self.metrics_owned)
            .open(&metrics_path)
            .map_err(|e| Error::io(&metrics_path, e))?;
        self.metrics_owned = true;
        let started = Instant::now();
        let mut stopped_early = self.patience_out();
        while self.step < stop && !stopped_early {
            let t0 = Instant::now();
            let idx = self.batch_indices(self.step);
            let batch: Vec<&Item> = idx.iter().map(|&i| &self.train.items[i]).collect();
            seed_dropout(rng_seed(self.opts.seed, DROPOUT, self.step));
            let out_b = self.head.forward(
                &batch,
                self.encoder.tokenizer.pad_id(),
                &self.device,
                true,
                false,
            )?;
            let loss = out_b.loss.to_scalar::<f32>()? as f64;
            if !loss.is_finite() {
                return Err(Error::Input(format!(
                    "the loss is {loss} at step {}: stopping; the last good checkpoint is the newest checkpoint-N in {}",
                    self.step + 1,
                    out.display()
                )));
            }
            let mut acc = GradAccumulator::default();
            acc.add(&self.params, &out_b.loss.backward()?)?;
            let lr = self.schedule.lr(self.step);
            let grad_norm = self.optim.step(&self.params, acc, lr)?;
            self.step += 1;
            let m = StepMetrics {
                step: self.step,
                epoch: self.step as f64 / self.steps_per_epoch as f64,
                loss,
                lr,
                grad_norm,
                tokens_per_s: out_b.tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
                elapsed_s: started.elapsed().as_secs_f64(),
            };
            append_line(&mut metrics, &metrics_path, &m)?;
            on_event(&Event::Step(m.clone()));
            self.history.push(m);

            let last = self.step == self.total_steps;
            let epoch_end = self.step.is_multiple_of(self.steps_per_epoch);
            let eval_due = last
                || epoch_end
                || self
                    .opts
                    .eval_every
                    .is_some_and(|e| self.step.is_multiple_of(e));
            if eval_due {
                if let Some(ev) = self.evaluate()? {
                    let e = EvalMetrics {
                        step: self.step,
                        epoch: self.step as f64 / self.steps_per_epoch as f64,
                        eval_loss: ev.loss.unwrap_or(f64::NAN),
                        metric: self.task.main_metric().to_string(),
                        scores: ev.scores,
                    };
                    append_line(&mut metrics, &metrics_path, &e)?;
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
            let save_due = last
                || epoch_end
                || stopped_early
                || self
                    .opts
                    .save_every
                    .is_some_and(|s| self.step.is_multiple_of(s));
            if save_due {
                let dir = out.join(format!("checkpoint-{}", self.step));
                self.save_checkpoint(&dir)?;
                remove_older_checkpoints(&out, self.step)?;
                self.plot(&out)?;
                on_event(&Event::Saved(dir));
            }
        }
        if self.step == self.total_steps || stopped_early {
            self.finish(&out)?;
        }
        Ok(())
    }

    /// The final model in `out`: the best one with early stopping, else
    /// the last; its dev scores in `eval_results.json`.
    fn finish(&self, out: &Path) -> Result<()> {
        let best_dir = out.join("best");
        let best_eval = self
            .best
            .and_then(|(s, _)| self.evals.iter().find(|e| e.step == s));
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
            if let Some(e) = best_eval {
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

    /// Writes the model files (config, weights, tokenizer, training args)
    /// into `dir`: as a new folder renamed into place (`whole`), or file by
    /// file into an existing one.
    fn save_model(&self, dir: &Path, whole: bool) -> Result<()> {
        if whole {
            Checkpoint::save(dir, &self.parts(None))?;
        } else {
            Checkpoint::save_model_files(dir, &self.parts(None))?;
        }
        write_json(&dir.join(TRAINING_ARGS_FILE), &self.opts)
    }

    /// Writes a resumable checkpoint of the current state.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let state = TrainerState {
            step: self.step,
            total_steps: self.total_steps,
            seed: self.opts.seed,
            options: serde_json::to_value(&self.opts).unwrap_or_default(),
            last_loss: self.history.last().map(|m| m.loss),
        };
        Checkpoint::save(dir, &self.parts(Some(&state)))?;
        write_json(&dir.join(TRAINING_ARGS_FILE), &self.opts)
    }

    /// `loss.png` (training loss per step, dev loss) and `metric.png`
    /// (the dev scores).
    #[cfg(feature = "show")]
    fn plot(&self, out: &Path) -> Result<()> {
        let train: Vec<(f64, f64)> = self
            .history
            .iter()
            .map(|m| (m.step as f64, m.loss))
            .collect();
        let dev: Vec<(f64, f64)> = self
            .evals
            .iter()
            .map(|e| (e.step as f64, e.eval_loss))
            .collect();
        crate::show::curve::plot_loss(
            &out.join("loss.png"),
            &format!("{} loss", self.task),
            "train loss",
            train,
            "dev loss",
            dev,
        )?;
        if !self.evals.is_empty() {
            let names: Vec<String> = self.evals[0].scores.keys().cloned().collect();
            let series: Vec<(&str, Vec<(f64, f64)>)> = names
                .iter()
                .map(|n| {
                    let points = self
                        .evals
                        .iter()
                        .filter_map(|e| Some((e.step as f64, *e.scores.get(n)?)))
                        .collect();
                    (n.as_str(), points)
                })
                .collect();
            crate::show::curve::plot_curves(
                &out.join("metric.png"),
                &format!("{} dev scores", self.task),
                "step",
                &series,
            )?;
        }
        Ok(())
    }

    #[cfg(not(feature = "show"))]
    fn plot(&self, _: &Path) -> Result<()> {
        Ok(())
    }
}

/// Sets flush-to-zero and denormals-are-zero (x86-64 MXCSR) on this
/// thread and on rayon's worker threads, where the matrix multiplies run.
/// The backward pass of a pre-trained encoder yields subnormal gradients
/// (GELU's derivative far from 0, products of small factors), and every
/// AVX FMA touching one takes a microcode assist: a MiniLM training step
/// ran 10× slower (backward 21.5 s → 2.2 s on a 32-sentence batch). Only
/// values below 1.2e-38 change, to 0. Elsewhere a no-op.
pub fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(deprecated)]
        fn set() {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            // SAFETY: only the FTZ (bit 15) and DAZ (bit 6) modes change;
            // every x86-64 CPU has both.
            unsafe { _mm_setcsr(_mm_getcsr() | 0x8040) }
        }
        set();
        rayon::broadcast(|_| set());
    }
}

fn rng_seed(seed: u64, purpose: u64, step: u64) -> u64 {
    use rand::Rng;
    rng_for(seed, purpose, step).random()
}

fn append_line(file: &mut std::fs::File, path: &Path, value: &impl serde::Serialize) -> Result<()> {
    use std::io::Write;
    let line = serde_json::to_string(value)
        .map_err(|e| Error::Input(format!("serialising metrics: {e}")))?;
    writeln!(file, "{line}").map_err(|e| Error::io(path, e))
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::Input(format!("serialising {}: {e}", path.display())))?;
    write_atomic(path, text.as_bytes())
}

/// Keeps only the newest resumable checkpoint (transformers'
/// `save_total_limit=1`): each holds the optimiser's moments, twice the
/// model's size.
fn remove_older_checkpoints(out: &Path, keep: u64) -> Result<()> {
    for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix("checkpoint-"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        if step != keep && entry.path().is_dir() {
            let p = entry.path();
            std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- checkpoints in use

/// Options for scoring a saved model; `None` takes the value the model was
/// trained with (its `training_args.json`), else the task's default.
#[derive(Debug, Clone, Default)]
pub struct InferenceOptions {
    pub max_length: Option<usize>,
    pub doc_stride: Option<usize>,
    pub max_answer_length: Option<usize>,
    pub batch_size: Option<usize>,
}

/// A fine-tuned checkpoint, for `evaluate` and `predict`.
pub struct FinetunedModel {
    task: Task,
    head: Head,
    encoder: Encoder,
    /// The checkpoint's own label names (`None`: transformers'
    /// placeholders, so the data's sorted labels give the ids).
    labels: Option<LabelSet>,
    post: PostprocessOptions,
    batch_size: usize,
    device: Device,
}

impl FinetunedModel {
    /// Loads a folder written by a fine-tuning run (or transformers'
    /// `save_pretrained` of the task's head class): the head's tensors
    /// must be there.
    pub fn from_dir(
        task: Task,
        dir: &Path,
        opts: &InferenceOptions,
        device: &Device,
    ) -> Result<Self> {
        // As in training: the same arithmetic, so the scores match.
        flush_denormals();
        let head = Head::from_dir(task, dir, device)?;
        let config = head.config().clone();
        let origin = dir.join("config.json");
        check_family(&config, &origin)?;
        let trained = read_training_args(dir)?;
        let max_length = opts
            .max_length
            .or(trained.as_ref().map(|t| t.max_length))
            .unwrap_or_else(|| task.default_max_length())
            .min(config.max_sequence_length());
        let doc_stride = opts
            .doc_stride
            .or(trained.as_ref().map(|t| t.doc_stride))
            .unwrap_or(128)
            .min(max_length / 2);
        let max_answer_length = opts
            .max_answer_length
            .or(trained.as_ref().map(|t| t.max_answer_length))
            .unwrap_or(30);
        let tokenizer = Tokenizer::from_dir(dir, max_length)?;
        let labels = match task {
            Task::Qa => None,
            _ => LabelSet::from_config(&config)
                .map_err(|e| Error::config(&origin, "id2label", e.to_string()))?,
        };
        if task != Task::Qa && config.num_labels() < 2 {
            return Err(Error::config(
                &origin,
                "id2label",
                format!(
                    "{} label(s): `{task}` needs a classifier over at least two",
                    config.num_labels()
                ),
            ));
        }
        Ok(Self {
            task,
            head,
            encoder: Encoder::new(&tokenizer, max_length, doc_stride)?,
            labels,
            post: PostprocessOptions {
                max_answer_length,
                ..PostprocessOptions::default()
            },
            batch_size: opts.batch_size.unwrap_or(64).max(1),
            device: device.clone(),
        })
    }

    pub fn task(&self) -> Task {
        self.task
    }

    pub fn config(&self) -> &BertConfig {
        self.head.config()
    }

    /// The token budget inputs are cut to.
    pub fn max_length(&self) -> usize {
        self.encoder.max_length
    }

    /// Reads a labelled data file for [`FinetunedModel::evaluate`], with the
    /// checkpoint's label ids (an unknown label is an error naming its
    /// line). A checkpoint with transformers' placeholder names
    /// (`LABEL_0`, ...) takes the file's sorted labels as ids, as
    /// `run_glue.py` does.
    pub fn read_labelled(&self, path: &Path, data: &DataOptions) -> Result<TaskData> {
        let labels = match self.task {
            Task::Qa => None,
            _ => self.labels.as_ref(),
        };
        let d = TaskData::read(self.task, path, labels, false, data)?;
        if let (Some(l), None) = (d.labels(), &self.labels) {
            let n = self.config().num_labels();
            if l.len() > n {
                return Err(Error::Input(format!(
                    "{}: {} labels ({}), but the model has {n} classes",
                    path.display(),
                    l.len(),
                    l.listed()
                )));
            }
        }
        Ok(d)
    }

    /// Reads a data file for [`FinetunedModel::predict`]: a classification
    /// file may lack its label column, and labels are not checked.
    pub fn read_unlabelled(&self, path: &Path, data: &DataOptions) -> Result<TaskData> {
        TaskData::read(self.task, path, None, true, data)
    }

    fn check_task(&self, data: &TaskData) -> Result<()> {
        if data.task() != self.task {
            return Err(Error::Input(format!(
                "{}: read as {} data, but the model is for {}",
                data.path().display(),
                data.task(),
                self.task
            )));
        }
        Ok(())
    }

    /// The label names predictions are given by.
    fn label_names(&self, data: Option<&LabelSet>) -> Result<LabelSet> {
        Ok(match (&self.labels, data) {
            (Some(l), _) => l.clone(),
            (None, Some(l)) if !l.is_empty() => l.clone(),
            _ => {
                let c = self.config();
                LabelSet::from_names((0..c.num_labels()).map(|i| c.label_name(i)).collect())?
            }
        })
    }

    /// Scores on a file read by [`FinetunedModel::read_labelled`], with the
    /// predictions they were computed from.
    pub fn evaluate(&self, data: &TaskData) -> Result<Evaluation> {
        self.check_task(data)?;
        let prepared = self.encoder.prepare(data, true)?;
        let (outputs, loss) = infer(
            &self.head,
            &prepared.items,
            self.batch_size,
            self.encoder.tokenizer.pad_id(),
            &self.device,
        )?;
        let labels = self.label_names(data.labels())?;
        Scorer {
            labels: &labels,
            config: self.config(),
            post: self.post,
        }
        .score(data, &prepared, outputs, loss)
    }

    /// Predictions for every example of `data`, in file order (labels, if
    /// the file has them, are ignored).
    pub fn predict(&self, data: &TaskData) -> Result<Predictions> {
        self.check_task(data)?;
        let prepared = self.encoder.prepare(data, false)?;
        let (outputs, _) = infer(
            &self.head,
            &prepared.items,
            self.batch_size,
            self.encoder.tokenizer.pad_id(),
            &self.device,
        )?;
        let labels = self.label_names(None)?;
        let scorer = Scorer {
            labels: &labels,
            config: self.config(),
            post: self.post,
        };
        scorer.predictions(data, &prepared, outputs)
    }
}
