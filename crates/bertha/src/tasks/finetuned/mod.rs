//! Fine-tuned checkpoints in use: a task head (classification, NER, QA,
//! multiple choice) run over a data set in length-sorted batches, its
//! outputs turned into per-example predictions (labels, word tags, answer
//! texts, the chosen ending) and, where the
//! data has labels, the task's scores. `bertha evaluate` / `predict` and
//! the fine-tuning loop's evaluation share this code.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor, D};
use candle_nn::VarBuilder;

mod saved;
pub use saved::{FinetunedModel, InferenceOptions};

use super::precision::HeadEncoder;
use crate::config::BertConfig;
use crate::data::{
    postprocess, LabelSet, PostprocessOptions, SquadPrediction, Target, Task, TaskData, TaskInput,
    TaskInputs,
};
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::metrics::{accuracy, entity_scores, macro_f1};
use crate::model::{
    BertForTask, BertInput, ForwardOptions, HeadInit, HeadLabels, TaskOutput, IGNORE_INDEX,
};

/// The run's options, saved next to every model it writes so that
/// `evaluate` and `predict` tokenize as training did.
pub const TRAINING_ARGS_FILE: &str = "training_args.json";

/// A classification prediction: the best label and its softmax score.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClassPrediction {
    pub label: String,
    #[serde(skip)]
    pub id: usize,
    pub score: f32,
}

/// A multiple-choice prediction: the best choice's index and its softmax
/// score over the example's choices.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChoicePrediction {
    pub choice: usize,
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
    MultipleChoice(Vec<ChoicePrediction>),
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

/// The model of one task: the task's head over the encoder, the encoder
/// at a precision (fp32 for training).
pub(crate) struct TaskHead {
    task: Task,
    model: BertForTask,
    encoder: HeadEncoder,
}

/// What one forward pass gives, per input.
pub(crate) enum Outputs {
    /// Logits [C] per input (multiple choice: a score per choice).
    Class(Vec<Vec<f32>>),
    /// The arg-max tag per token.
    Tokens(Vec<Vec<usize>>),
    /// Start and end logits over each input's own tokens.
    Spans(Vec<(Vec<f32>, Vec<f32>)>),
}

pub(crate) struct BatchOut {
    pub(crate) loss: Tensor,
    /// Targets the loss averages over (its weight in a data-set mean).
    pub(crate) targets: usize,
    pub(crate) tokens: usize,
    pub(crate) outputs: Option<Outputs>,
}

impl TaskHead {
    /// The task's head on parameters from `vb` (training).
    pub(crate) fn load(task: Task, vb: VarBuilder, config: BertConfig) -> Result<Self> {
        let model = BertForTask::load(vb, config, task.head())?;
        let encoder = HeadEncoder::f32();
        Ok(Self {
            task,
            model,
            encoder,
        })
    }

    /// A fine-tuned checkpoint: the head's tensors must be there.
    pub(crate) fn from_dir(task: Task, dir: &Path, device: &Device) -> Result<Self> {
        let init = HeadInit::FromCheckpoint;
        let model = BertForTask::from_dir(dir, Some(task.head()), init, device)?;
        let encoder = HeadEncoder::f32();
        Ok(Self {
            task,
            model,
            encoder,
        })
    }

    /// Runs the encoder at `precision` from now on (int8 calibrates with
    /// `tokenizer`), fp32 on the fast path too with `fast_f32`.
    pub(crate) fn set_precision(
        &mut self,
        tokenizer: &Tokenizer,
        precision: Precision,
        fast_f32: bool,
    ) -> Result<()> {
        // The packed encoder leaves padding rows at zero.
        let reads_padding =
            matches!(&self.model, BertForTask::MultipleChoice(m) if m.reads_padding_rows());
        if precision != Precision::F32 && reads_padding {
            return Err(Error::option(
                "precision",
                format!(
                    "{} runs the encoder without padding rows, which ELECTRA's \
                     `summary_type` `last` / `mean` reads: use f32",
                    precision.name()
                ),
            ));
        }
        // fp32 runs on the packed fast path too where it takes the model
        // (rounding apart, the candle modules' numbers), as the pipelines
        // do, unless the head reads the padding rows, or the loss does:
        // QA's (transformers') softmax runs over every position, padding
        // included, whose rows the packed encoder leaves at zero.
        let exact = reads_padding || self.task == Task::Qa;
        self.encoder = match fast_f32 && !exact {
            true => HeadEncoder::fast(self.model.bert(), tokenizer, precision)?,
            false => HeadEncoder::new(self.model.bert(), tokenizer, precision)?,
        };
        Ok(())
    }

    pub(crate) fn config(&self) -> &BertConfig {
        self.model.config()
    }

    /// The head and its encoder (training reads their current weights).
    pub(crate) fn model(&self) -> &BertForTask {
        &self.model
    }

    /// Runs a batch padded to its longest input (at least `pad_to` tokens),
    /// with the loss against the targets, and (with `outputs`) the
    /// per-input predictions.
    pub(crate) fn forward(
        &self,
        batch: &[&TaskInput],
        (pad_id, pad_to): (u32, usize),
        device: &Device,
        train: bool,
        outputs: bool,
    ) -> Result<BatchOut> {
        let b = batch.len();
        // A multiple-choice input's choices run as sequences of their own.
        let sequences: Vec<(&[u32], &[u32])> = batch.iter().flat_map(|i| i.sequences()).collect();
        let ids: Vec<Vec<u32>> = sequences.iter().map(|s| s.0.to_vec()).collect();
        let types: Vec<Vec<u32>> = sequences.iter().map(|s| s.1.to_vec()).collect();
        let tokens = ids.iter().map(Vec::len).sum();
        let opts = ForwardOptions {
            train,
            ..ForwardOptions::default()
        };
        // A classifier reads each input's first row alone (the pooler).
        let (input, encoded) = self.encoder.encode(
            self.model.bert(),
            (&ids, &types),
            (pad_id, pad_to),
            opts,
            matches!(self.task, Task::Classification | Task::MultipleChoice),
        )?;
        let t = input.input_ids.dim(1)?;
        // The multiple-choice head reads [B, C, T] (its encoder's outputs,
        // already computed, stay [B · C, T, H]).
        let input = match self.task {
            Task::MultipleChoice => choices_input(input, b)?,
            _ => input,
        };
        // The targets, as the head's labels, and how many the loss averages.
        let (first, second, targets) = match self.task {
            Task::Classification | Task::MultipleChoice => {
                let labels: Vec<i64> = batch.iter().map(|i| i.target.class_id()).collect();
                let n = labels.iter().filter(|&&y| y != IGNORE_INDEX).count();
                (Tensor::from_vec(labels, b, device)?, None, n)
            }
            Task::Ner => {
                let mut labels = vec![IGNORE_INDEX; b * t];
                for (r, item) in batch.iter().enumerate() {
                    if let Target::Tokens(l) = &item.target {
                        let n = l.len().min(t);
                        labels[r * t..r * t + n].copy_from_slice(&l[..n]);
                    }
                }
                let n = labels.iter().filter(|&&y| y != IGNORE_INDEX).count();
                (Tensor::from_vec(labels, (b, t), device)?, None, n)
            }
            Task::Qa => {
                let (starts, ends): (Vec<i64>, Vec<i64>) = batch
                    .iter()
                    .map(|i| match i.target {
                        Target::Span(s, e) => (s, e),
                        _ => (0, 0),
                    })
                    .unzip();
                let ends = Tensor::from_vec(ends, b, device)?;
                (Tensor::from_vec(starts, b, device)?, Some(ends), b)
            }
        };
        let labels = match self.task {
            Task::Qa => HeadLabels {
                start_positions: Some(&first),
                end_positions: second.as_ref(),
                ..HeadLabels::default()
            },
            _ => HeadLabels::labels(Some(&first)),
        };
        let out = self
            .model
            .forward_encoded(&input, &encoded, &labels, opts.into())?;
        let loss = out
            .loss()
            .cloned()
            .ok_or_else(|| Error::Input("the head returned no loss for labelled inputs".into()))?;
        let outputs = if outputs {
            Some(self.outputs(out, batch)?)
        } else {
            None
        };
        Ok(BatchOut {
            loss,
            targets,
            tokens,
            outputs,
        })
    }

    /// The per-input predictions of one forward pass.
    fn outputs(&self, out: TaskOutput, batch: &[&TaskInput]) -> Result<Outputs> {
        Ok(match (self.task, out) {
            (Task::Classification | Task::MultipleChoice, TaskOutput::Logits(o)) => {
                Outputs::Class(o.logits.to_vec2::<f32>()?)
            }
            (Task::Ner, TaskOutput::Logits(o)) => {
                let best = o.logits.argmax(D::Minus1)?.to_vec2::<u32>()?;
                Outputs::Tokens(
                    best.into_iter()
                        .map(|row| row.into_iter().map(|x| x as usize).collect())
                        .collect(),
                )
            }
            (Task::Qa, TaskOutput::QuestionAnswering(o)) => {
                let starts = o.start_logits.to_vec2::<f32>()?;
                let ends = o.end_logits.to_vec2::<f32>()?;
                // Only the input's own tokens: padding is no candidate.
                Outputs::Spans(
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
                )
            }
            _ => {
                return Err(Error::Input(
                    "internal: the head's outputs do not match the task".into(),
                ))
            }
        })
    }
}

/// A batch's `[B · C, T]` inputs as the multiple-choice head's `[B, C, T]`.
fn choices_input(input: BertInput, b: usize) -> Result<BertInput> {
    let (rows, t) = input.input_ids.dims2()?;
    let c = rows / b.max(1);
    if c * b != rows {
        return Err(Error::Input(format!(
            "multiple choice: {rows} sequences do not split into {b} examples of equal choices"
        )));
    }
    let shape = |x: &Tensor| x.reshape((b, c, t));
    Ok(BertInput {
        input_ids: shape(&input.input_ids)?,
        token_type_ids: input.token_type_ids.as_ref().map(shape).transpose()?,
        attention_mask: input.attention_mask.as_ref().map(shape).transpose()?,
    })
}

/// Per-input predictions of a whole data set, in input order (batched by
/// length, so that little is padding), and the mean loss over targets.
pub(crate) fn infer(
    head: &TaskHead,
    items: &[TaskInput],
    batch_size: usize,
    pad_id: u32,
    device: &Device,
) -> Result<(Outputs, Option<f64>)> {
    let batches = length_batches(items, batch_size);
    let run = infer_batches(head, items, &batches, pad_id, device, |_| true)?;
    let loss = run.mean_loss();
    Ok((run.outputs, loss))
}

/// Predictions of some batches of a data set, the other inputs' left
/// empty, with their summed loss.
pub(crate) struct Inferred {
    pub(crate) outputs: Outputs,
    /// Loss × targets, summed over the batches run.
    pub(crate) loss_sum: f64,
    pub(crate) targets: usize,
}

impl Inferred {
    pub(crate) fn mean_loss(&self) -> Option<f64> {
        (self.targets > 0).then(|| self.loss_sum / self.targets as f64)
    }
}

/// The inputs in batches of `batch_size` by length (little padding).
pub(crate) fn length_batches(items: &[TaskInput], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].input_ids.len());
    order
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// Runs the batches `runs` picks (by number; a data-parallel process runs
/// its share).
pub(crate) fn infer_batches(
    head: &TaskHead,
    items: &[TaskInput],
    batches: &[Vec<usize>],
    pad_id: u32,
    device: &Device,
    runs: impl Fn(usize) -> bool,
) -> Result<Inferred> {
    let (mut loss_sum, mut weight) = (0.0f64, 0usize);
    let mut outputs = Outputs::empty(head.task, items.len());
    for (c, chunk) in batches.iter().enumerate() {
        if !runs(c) {
            continue;
        }
        let batch: Vec<&TaskInput> = chunk.iter().map(|&i| &items[i]).collect();
        let out = head.forward(&batch, (pad_id, 0), device, false, true)?;
        if out.targets > 0 {
            loss_sum += out.loss.to_scalar::<f32>()? as f64 * out.targets as f64;
            weight += out.targets;
        }
        match (out.outputs, &mut outputs) {
            (Some(Outputs::Class(rows)), Outputs::Class(all)) => {
                for (&i, r) in chunk.iter().zip(rows) {
                    all[i] = r;
                }
            }
            (Some(Outputs::Tokens(rows)), Outputs::Tokens(all)) => {
                for (&i, r) in chunk.iter().zip(rows) {
                    all[i] = r;
                }
            }
            (Some(Outputs::Spans(rows)), Outputs::Spans(all)) => {
                for (&i, r) in chunk.iter().zip(rows) {
                    all[i] = r;
                }
            }
            _ => {}
        }
    }
    Ok(Inferred {
        outputs,
        loss_sum,
        targets: weight,
    })
}

impl Outputs {
    /// Empty predictions of `n` inputs of `task`.
    fn empty(task: Task, n: usize) -> Self {
        match task {
            Task::Classification | Task::MultipleChoice => Self::Class(vec![Vec::new(); n]),
            Task::Ner => Self::Tokens(vec![Vec::new(); n]),
            Task::Qa => Self::Spans(vec![(Vec::new(), Vec::new()); n]),
        }
    }

    /// The predictions of inputs `which` as one flat list (each input's
    /// length, then its numbers), to send to other processes.
    pub(crate) fn pack(&self, which: &[usize]) -> Vec<f32> {
        let mut out = Vec::new();
        for &i in which {
            match self {
                Self::Class(rows) => {
                    out.push(rows[i].len() as f32);
                    out.extend_from_slice(&rows[i]);
                }
                // Tag ids are small integers: exact in f32.
                Self::Tokens(rows) => {
                    out.push(rows[i].len() as f32);
                    out.extend(rows[i].iter().map(|&t| t as f32));
                }
                Self::Spans(rows) => {
                    out.push(rows[i].0.len() as f32);
                    out.extend_from_slice(&rows[i].0);
                    out.extend_from_slice(&rows[i].1);
                }
            }
        }
        out
    }

    /// Fills inputs `which` from what [`Outputs::pack`] made of them.
    pub(crate) fn unpack(&mut self, which: &[usize], packed: &[f32]) -> Result<()> {
        let bad =
            || Error::Input("internal: predictions from another process are cut short".into());
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[f32]> {
            let part = packed.get(at..at + n).ok_or_else(bad)?;
            at += n;
            Ok(part)
        };
        for &i in which {
            let n = take(1)?[0] as usize;
            match self {
                Self::Class(rows) => rows[i] = take(n)?.to_vec(),
                Self::Tokens(rows) => rows[i] = take(n)?.iter().map(|&t| t as usize).collect(),
                Self::Spans(rows) => {
                    let start = take(n)?.to_vec();
                    rows[i] = (start, take(n)?.to_vec());
                }
            }
        }
        Ok(())
    }
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
pub(crate) struct Scorer<'a> {
    pub(crate) labels: &'a LabelSet,
    /// Class names when `labels` is empty (`LABEL_i`).
    pub(crate) config: &'a BertConfig,
    pub(crate) post: PostprocessOptions,
}

impl Scorer<'_> {
    /// Turns model outputs into per-example predictions.
    pub(crate) fn predictions(
        &self,
        data: &TaskData,
        prepared: &TaskInputs,
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
            (TaskData::MultipleChoice(_), Outputs::Class(rows)) => Predictions::MultipleChoice(
                rows.iter()
                    .map(|r| {
                        let choice = argmax(r);
                        ChoicePrediction {
                            choice,
                            score: softmax(r).get(choice).copied().unwrap_or(0.0) as f32,
                        }
                    })
                    .collect(),
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
    pub(crate) fn score(
        &self,
        data: &TaskData,
        prepared: &TaskInputs,
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
            (TaskData::MultipleChoice(d), Predictions::MultipleChoice(preds))
                if d.is_labelled() =>
            {
                let gold: Vec<usize> = d.examples.iter().filter_map(|e| e.label).collect();
                let ids: Vec<usize> = preds.iter().map(|p| p.choice).collect();
                scores.insert("accuracy".into(), accuracy(&ids, &gold)?);
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

/// Checks that `task` fits `config`'s family. Every family has the
/// fine-tuning heads (BERT's pooler head or the family's own first-token
/// classifier, and the token and span heads over the last hidden states;
/// ModernBERT's span head is its `head` → `classifier` with two outputs).
/// Multiple choice runs every family's
/// `…ForMultipleChoice`; ELECTRA's `summary_*` keys must describe a
/// `sequence_summary` that transformers runs (not `summary_type` `attn`).
pub(crate) fn check_task_family(task: Task, config: &BertConfig, origin: &Path) -> Result<()> {
    if !task.head().supported_by(&config.family) {
        return Err(Error::config(
            origin,
            "model_type",
            format!("{task} is not supported for `{}`", config.model_type),
        ));
    }
    if task == Task::MultipleChoice {
        config.sequence_summary(origin)?;
    }
    Ok(())
}
