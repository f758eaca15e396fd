//! A fine-tuning task's data: which task, its file read into examples
//! ([`TaskData`]), and the model inputs made from them ([`TaskInputs`]):
//! token ids with a class, a tag per first word piece, a SQuAD answer span
//! per context window, or a multiple-choice example's choices end to end.

use std::path::Path;
use std::str::FromStr;

use rand::seq::SliceRandom;
use rayon::prelude::*;

use super::{
    AlignedSentence, ChoiceData, ClassificationData, ConllOptions, FeatureOptions, LabelSet,
    NerAligner, NerData, ReadOptions, SquadData, SquadFeature, SquadFeaturizer,
};
use crate::config::Family;
use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::model::family::layout;
use crate::model::{HeadKind, IGNORE_INDEX};
use crate::rng::rng_for;

/// Purpose of the generator that draws `--max-train` examples.
const SUBSAMPLE: u64 = 13;

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
    /// A context and its candidate endings → the right one (SWAG-style
    /// TSV / CSV / JSONL).
    #[serde(rename = "multiple-choice")]
    MultipleChoice,
}

impl FromStr for Task {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "classification" => Ok(Self::Classification),
            "ner" => Ok(Self::Ner),
            "qa" => Ok(Self::Qa),
            "multiple-choice" | "multiple_choice" => Ok(Self::MultipleChoice),
            other => Err(Error::Input(format!(
                "unknown task `{other}` (expected classification, ner, qa or multiple-choice)"
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
            Self::MultipleChoice => "multiple-choice",
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
            Self::MultipleChoice => HeadKind::MultipleChoice,
        }
    }

    /// The score that picks the best checkpoint: accuracy, entity F1 or
    /// SQuAD F1 (a key of [`Evaluation::scores`](crate::tasks::Evaluation::scores)).
    pub fn main_metric(self) -> &'static str {
        match self {
            Self::Classification | Self::MultipleChoice => "accuracy",
            Self::Ner | Self::Qa => "f1",
        }
    }

    /// transformers' example scripts' defaults: 128 tokens for
    /// `run_glue.py` / `run_ner.py` / `run_swag_no_trainer.py`, 384 for
    /// `run_qa.py`.
    pub fn default_max_length(self) -> usize {
        match self {
            Self::Classification | Self::Ner | Self::MultipleChoice => 128,
            Self::Qa => 384,
        }
    }

    /// The name prefix of the task's output layer in `family`'s
    /// checkpoints (QA's `qa_outputs.`, ModernBERT's `classifier.`).
    pub fn head_prefix(self, family: &Family) -> String {
        match self {
            Self::Classification | Self::Ner | Self::MultipleChoice => "classifier.".into(),
            Self::Qa => format!("{}.", layout(family).qa_outputs()),
        }
    }

    /// Whether the task's outputs are named classes or tags (a label set:
    /// classification, NER), rather than positions (QA's spans, multiple
    /// choice's choice index).
    pub fn has_label_names(self) -> bool {
        matches!(self, Self::Classification | Self::Ner)
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
    MultipleChoice(ChoiceData),
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
            Task::MultipleChoice => Self::MultipleChoice(ChoiceData::read(path, unlabelled)?),
        })
    }

    pub fn task(&self) -> Task {
        match self {
            Self::Classification(_) => Task::Classification,
            Self::Ner(_) => Task::Ner,
            Self::Qa(_) => Task::Qa,
            Self::MultipleChoice(_) => Task::MultipleChoice,
        }
    }

    /// Examples (texts, sentences or questions).
    pub fn len(&self) -> usize {
        match self {
            Self::Classification(d) => d.len(),
            Self::Ner(d) => d.len(),
            Self::Qa(d) => d.len(),
            Self::MultipleChoice(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class or tag ids (`None` for QA and multiple choice).
    pub fn labels(&self) -> Option<&LabelSet> {
        match self {
            Self::Classification(d) => Some(&d.labels),
            Self::Ner(d) => Some(&d.labels),
            Self::Qa(_) | Self::MultipleChoice(_) => None,
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Classification(d) => &d.path,
            Self::Ner(d) => &d.path,
            Self::Qa(d) => &d.path,
            Self::MultipleChoice(d) => &d.path,
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
            Self::MultipleChoice(d) => retain(&mut d.examples, &keep),
        }
    }
}

/// What an input is trained towards.
#[derive(Debug, Clone)]
pub enum Target {
    /// A class id (`IGNORE_INDEX` when unlabelled).
    Class(i64),
    /// A tag id per token, `IGNORE_INDEX` off first pieces.
    Tokens(Vec<i64>),
    /// Start and end token of the answer.
    Span(i64, i64),
    /// Multiple choice: the right choice's index (`IGNORE_INDEX` when
    /// unlabelled); the input holds every choice's sequence, end to end,
    /// each `lengths[i]` tokens long.
    Choice { label: i64, lengths: Vec<usize> },
}

/// One model input: token ids, token types and what it is trained towards.
#[derive(Debug, Clone)]
pub struct TaskInput {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub target: Target,
}

impl Target {
    /// The class a classification or multiple-choice input is trained
    /// towards (`IGNORE_INDEX` for none, and for other targets).
    pub fn class_id(&self) -> i64 {
        match *self {
            Self::Class(y) | Self::Choice { label: y, .. } => y,
            _ => IGNORE_INDEX,
        }
    }
}

impl TaskInput {
    /// The input's sequences `(ids, token types)`: a multiple-choice
    /// input's choices, any other input's one.
    pub fn sequences(&self) -> Vec<(&[u32], &[u32])> {
        let Target::Choice { lengths, .. } = &self.target else {
            return vec![(&self.input_ids, &self.token_type_ids)];
        };
        let mut at = 0;
        lengths
            .iter()
            .map(|&n| {
                let s = (
                    &self.input_ids[at..at + n],
                    &self.token_type_ids[at..at + n],
                );
                at += n;
                s
            })
            .collect()
    }

    fn of(input_ids: &[u32], token_type_ids: &[u32], target: Target) -> Self {
        Self {
            input_ids: input_ids.to_vec(),
            token_type_ids: token_type_ids.to_vec(),
            target,
        }
    }
}

/// The model inputs of a data set, with what scoring them needs.
pub struct TaskInputs {
    pub items: Vec<TaskInput>,
    /// NER: each sentence's word-piece alignment (to map tags back to words).
    pub aligned: Vec<AlignedSentence>,
    /// QA: each window's offsets (to map spans back to answer text).
    pub features: Vec<SquadFeature>,
}

/// How inputs are cut: the tokenizer (truncating at `max_length`) and the
/// QA window stride.
pub struct TaskInputBuilder {
    pub tokenizer: Tokenizer,
    pub max_length: usize,
    pub doc_stride: usize,
}

impl TaskInputBuilder {
    pub fn new(tokenizer: &Tokenizer, max_length: usize, doc_stride: usize) -> Result<Self> {
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
    pub fn build(&self, data: &TaskData, targets: bool) -> Result<TaskInputs> {
        let mut p = TaskInputs {
            items: Vec::new(),
            aligned: Vec::new(),
            features: Vec::new(),
        };
        match data {
            TaskData::Classification(d) => {
                let encoded: Vec<(TaskInput, bool)> = d
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
                            TaskInput {
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
                    .map(|a| {
                        let tags = if targets {
                            a.labels.clone()
                        } else {
                            vec![IGNORE_INDEX; a.labels.len()]
                        };
                        TaskInput::of(&a.input_ids, &a.token_type_ids, Target::Tokens(tags))
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
                    .map(|f| {
                        let span = Target::Span(f.start_position as i64, f.end_position as i64);
                        TaskInput::of(&f.input_ids, &f.token_type_ids, span)
                    })
                    .collect();
            }
            TaskData::MultipleChoice(d) => p.items = self.choice_inputs(d, targets)?,
        }
        Ok(p)
    }

    /// Each example's choices, encoded as the pairs (context, choice) and
    /// laid end to end in one input.
    fn choice_inputs(&self, d: &ChoiceData, targets: bool) -> Result<Vec<TaskInput>> {
        let encoded: Vec<(TaskInput, bool)> = d
            .examples
            .par_iter()
            .map(|e| {
                let mut input = TaskInput {
                    input_ids: Vec::new(),
                    token_type_ids: Vec::new(),
                    target: Target::Class(IGNORE_INDEX),
                };
                let (mut lengths, mut truncated) = (Vec::with_capacity(e.choices.len()), false);
                for choice in &e.choices {
                    let enc = self
                        .tokenizer
                        .encode_pair(&e.context, choice)
                        .map_err(|err| {
                            Error::Input(format!("{}: line {}: {err}", d.path.display(), e.line))
                        })?;
                    lengths.push(enc.input_ids.len());
                    truncated |= enc.truncated;
                    input.input_ids.extend(enc.input_ids);
                    input.token_type_ids.extend(enc.token_type_ids);
                }
                let label = match e.label {
                    Some(y) if targets => y as i64,
                    _ => IGNORE_INDEX,
                };
                input.target = Target::Choice { label, lengths };
                Ok((input, truncated))
            })
            .collect::<Result<_>>()?;
        let truncated = encoded.iter().filter(|(_, t)| *t).count();
        if truncated > 0 {
            tracing::warn!(
                "{}: {truncated} of {} examples have a choice truncated to {} tokens",
                d.path.display(),
                d.len(),
                self.max_length
            );
        }
        Ok(encoded.into_iter().map(|(i, _)| i).collect())
    }
}
