//! Fine-tuning heads on the fast path: sequence classification (pooler →
//! dropout → classifier, with the loss its `problem_type` says; multiple
//! choice is the same layers with one output, its softmax over each
//! example's choices), token
//! classification (dropout → classifier on every token, -100 ignored) and
//! extractive QA (`qa_outputs` → start / end cross-entropy over every row,
//! padding rows included as transformers' loss has them), each with the
//! loss and the dropout masks of its candle head. ModernBERT's token and
//! span heads run its `head` on every token first.

mod pooled;
mod targets;

use candle_core::backprop::GradStore;

use self::pooled::Pooled;
use self::targets::{answer_step, sequence_loss, token_step};
use super::encoder::{Encoder, Linear};
use super::grad_store;
use super::mlm::linear;
use super::prediction_head::{mean_rows, spread_means, PredictionHead};
use super::products::Compute;
use crate::config::{Activation, ClassifierPooling, Family, ProblemType};
use crate::error::{Error, Result};
use crate::fast::buffers::{recycle, zeros, StepBuffers};
use crate::fast::kernels::Act;
use crate::model::family::PredictionHead as FamilyHead;
use crate::model::{BertForTask, Dense, Dropout};

/// What a head's loss is computed against.
pub enum HeadTargets<'a> {
    /// Sequence classification: a class id per sequence (-100: none).
    Classes(&'a [i64]),
    /// Sequence classification as regression or multi-label: `[N,
    /// num_labels]` values, row-major (0/1 for multi-label).
    Values(&'a [f32]),
    /// Token classification: a class id per token of each sequence
    /// (-100: none).
    Tokens(Vec<&'a [i64]>),
    /// Multiple choice: the right choice per example (-100: none); the
    /// sequences are the examples' choices, example after example, as
    /// many for each.
    Choices(&'a [i64]),
    /// Question answering: each sequence's answer `(start, end)` rows;
    /// rows outside the (padded) sequence are clamped to its row count and
    /// then ignored, as transformers does.
    Spans(&'a [(i64, i64)]),
    /// Sequence scores under a loss the caller computes (rankings): given
    /// the logits `[N, C]`, the mean loss, its number of terms and the
    /// gradient of the mean with respect to each logit.
    Custom(&'a CustomLoss<'a>),
}

/// A caller's loss on sequence-classification logits (see
/// [`HeadTargets::Custom`]).
pub type CustomLoss<'a> = dyn Fn(&[f32]) -> Result<(f64, usize, Vec<f64>)> + 'a;

/// One micro-batch: packed sequences `(ids, token types)` and the targets.
pub struct HeadBatch<'a> {
    pub sequences: Vec<(&'a [u32], &'a [u32])>,
    pub targets: HeadTargets<'a>,
    /// Run every sequence padded to `max(pad_to, longest)` rows, as a
    /// padded batch runs (0: unpadded). Only QA's loss reads padding rows
    /// (its softmax covers them), so only QA needs it to equal the candle
    /// path; the other heads give the same step either way.
    pub pad_to: usize,
}

/// A step's mean loss and the gradients of `weight · loss`.
pub struct HeadOutcome {
    /// The head's mean loss over `targets` (0 without any).
    pub loss: f64,
    /// Labelled sequences or tokens (regression, multi-label: sequences).
    pub targets: usize,
    /// `[N, C]` per sequence, or `[T, C]` per packed row (QA: `[T, 2]`,
    /// start and end), padding rows included.
    pub logits: Vec<f32>,
    pub gradients: GradStore,
}

/// What makes a sequence's vector from its first token's state (or, for
/// ModernBERT, from the mean of its tokens' states).
enum Sentence<'a> {
    /// BERT's pooler: dense + tanh.
    Pooler(Linear<'a>),
    /// A family's head on the first token (RoBERTa's and ELECTRA's
    /// `classifier.dense`, DistilBERT's `pre_classifier`, DeBERTa's
    /// `pooler.dense`, ELECTRA's `sequence_summary.summary`): dropout →
    /// dense → activation.
    FirstToken {
        dropout: Dropout,
        dense: Linear<'a>,
        act: Act,
    },
    /// ModernBERT's `head` on the pooled vector: the first token's state,
    /// or (`mean`) the mean of the sequence's.
    ModernBert {
        head: PredictionHead<'a>,
        mean: bool,
    },
}

impl<'a> Sentence<'a> {
    /// A sequence head's sentence module: ModernBERT's pooling and `head`,
    /// a family's `first_token` head, or BERT's pooler; `None` where the
    /// fast path does not run it (a layer without its bias, a dropout of
    /// 1).
    fn of(
        first_token: Option<(Dropout, &'a Dense, Activation)>,
        model: &'a BertForTask,
        heads: (Option<&'a FamilyHead>, Option<ClassifierPooling>),
    ) -> Result<Option<Self>> {
        Ok(Some(match (first_token, &model.bert().pooler, heads) {
            (_, _, (Some(head), Some(pooling))) => Sentence::ModernBert {
                head: PredictionHead::of(head)?,
                mean: pooling == ClassifierPooling::Mean,
            },
            (_, _, (Some(_), None)) => return Ok(None),
            (Some((dropout, dense, act)), _, _) if dense.bias().is_some() => {
                if dropout.rate() >= 1.0 {
                    return Ok(None);
                }
                Sentence::FirstToken {
                    dropout,
                    dense: linear(dense, "the classifier's dense layer")?,
                    act: act.into(),
                }
            }
            (None, Some(pooler), _) => Sentence::Pooler(linear(&pooler.dense, "the pooler")?),
            _ => return Ok(None),
        }))
    }
}

/// The layers above the encoder.
enum Top<'a> {
    Sequence {
        sentence: Sentence<'a>,
        classifier: Linear<'a>,
        dropout: Dropout,
        problem: Option<ProblemType>,
    },
    Token {
        /// ModernBERT's `head` on every token first.
        head: Option<PredictionHead<'a>>,
        classifier: Linear<'a>,
        dropout: Dropout,
    },
    Answer {
        /// ModernBERT's `head` on every token first.
        head: Option<PredictionHead<'a>>,
        /// Before `qa_outputs`: DistilBERT's `qa_dropout` (rate 0 but
        /// there), ModernBERT's `classifier_dropout`.
        dropout: Dropout,
        qa_outputs: Linear<'a>,
    },
}

impl<'a> Top<'a> {
    /// A sequence head (classification, multiple choice): `sentence`
    /// then the dropout and classifier; `None` where the fast path does
    /// not run it (no sentence module, a dropout of 1, a classifier
    /// without its bias).
    fn sequence(
        sentence: Option<Sentence<'a>>,
        (dense, dropout): (&'a Dense, Dropout),
        problem: Option<ProblemType>,
    ) -> Result<Option<Self>> {
        let Some(sentence) = sentence else {
            return Ok(None);
        };
        if dropout.rate() >= 1.0 || dense.bias().is_none() {
            return Ok(None);
        }
        Ok(Some(Top::Sequence {
            sentence,
            classifier: linear(dense, "the classifier")?,
            dropout,
            problem,
        }))
    }
}

/// `BertForSequenceClassification`, `BertForTokenClassification` and
/// `BertForQuestionAnswering` on the fast path.
pub struct FinetuneHead<'a> {
    encoder: Encoder<'a>,
    top: Top<'a>,
}

impl<'a> FinetuneHead<'a> {
    /// Runs the encoder's linear products in `compute` (the head's small
    /// products stay fp32).
    pub fn with_compute(mut self, compute: Compute) -> Self {
        self.encoder.set_compute(compute);
        self
    }

    /// The current weights of `model`, when the fast path covers it (a
    /// classification or QA head on an encoder it runs; sequence
    /// classification needs the pooler).
    pub fn of(model: &'a BertForTask) -> Result<Option<Self>> {
        let modernbert = match &model.config().family {
            Family::ModernBert(o) => Some(o.classifier_pooling),
            _ => None,
        };
        let top = match model {
            BertForTask::SequenceClassification(m) => {
                let heads = (m.classifier_head(), modernbert);
                let sentence = Sentence::of(m.first_token(), model, heads)?;
                match Top::sequence(sentence, m.classifier(), model.config().problem_type)? {
                    Some(top) => top,
                    None => return Ok(None),
                }
            }
            BertForTask::MultipleChoice(m) => {
                // ELECTRA's `sequence_summary` runs here as the first-token
                // head it is by default, and only as that.
                if m.has_summary() && m.first_token().is_none() {
                    return Ok(None);
                }
                let heads = (m.classifier_head(), modernbert);
                let sentence = Sentence::of(m.first_token(), model, heads)?;
                match Top::sequence(sentence, m.classifier(), None)? {
                    Some(top) => top,
                    None => return Ok(None),
                }
            }
            BertForTask::TokenClassification(m) => {
                let (dense, dropout) = m.classifier();
                if dropout.rate() >= 1.0 || dense.bias().is_none() {
                    return Ok(None);
                }
                Top::Token {
                    head: m.classifier_head().map(PredictionHead::of).transpose()?,
                    classifier: linear(dense, "the classifier")?,
                    dropout,
                }
            }
            BertForTask::QuestionAnswering(m) => {
                if m.qa_outputs().bias().is_none() || m.dropout().rate() >= 1.0 {
                    return Ok(None);
                }
                Top::Answer {
                    head: m.classifier_head().map(PredictionHead::of).transpose()?,
                    dropout: m.dropout(),
                    qa_outputs: linear(m.qa_outputs(), "qa_outputs")?,
                }
            }
            _ => return Ok(None),
        };
        let Some(encoder) = Encoder::of(model.bert())? else {
            return Ok(None);
        };
        Ok(Some(Self { encoder, top }))
    }

    /// Forward and backward on `batch` (dropout on with `train`): the mean
    /// loss, and the gradients of `weight` times it.
    pub fn step(mut self, batch: &HeadBatch, weight: f64, train: bool) -> Result<HeadOutcome> {
        // The step's buffers are reused within it and freed at its end.
        let _buffers = StepBuffers::begin();
        // A sequence classifier reads the [CLS] rows only: the last layer
        // runs there alone (a mean over the tokens reads every row).
        let mean = matches!(
            &self.top,
            Top::Sequence {
                sentence: Sentence::ModernBert { mean: true, .. },
                ..
            }
        );
        let outputs = match self.top {
            Top::Sequence { .. } => {
                if let Some(s) = batch.sequences.iter().position(|(ids, _)| ids.is_empty()) {
                    return Err(Error::Input(format!(
                        "sequence {s} is empty: the classifier reads its {}",
                        if mean { "tokens" } else { "first token" }
                    )));
                }
                (!mean).then(|| (0..batch.sequences.len()).map(|s| [s, 0]).collect())
            }
            _ => None,
        };
        let (hidden, tape) =
            self.encoder
                .forward(&batch.sequences, batch.pad_to, outputs, train)?;
        let d = self.encoder.hidden();
        let offsets = tape.offsets();
        let mut dhidden = zeros(hidden.len());
        let mask_of = |drop: &Dropout| if train { drop.next_mask(true) } else { None };
        let step = match &mut self.top {
            Top::Sequence {
                sentence,
                classifier,
                dropout,
                problem,
            } => {
                // The first token's head draws its mask before the
                // classifier's, as the candle modules run.
                let first_mask = match sentence {
                    Sentence::FirstToken { dropout, .. } => mask_of(dropout),
                    Sentence::Pooler(_) | Sentence::ModernBert { .. } => None,
                };
                let mask = mask_of(dropout);
                let (targets, problem) = (&batch.targets, *problem);
                let loss = |logits: &mut [f32], c: usize| {
                    sequence_loss(logits, c, targets, problem, weight)
                };
                let parts = Pooled {
                    sentence,
                    classifier,
                };
                let masks = [first_mask.as_ref(), mask.as_ref()];
                match mean {
                    true => {
                        let means = mean_rows(&hidden, offsets, d);
                        let mut dmeans = zeros(means.len());
                        let step = parts.step(&means, d, masks, &mut dmeans, loss)?;
                        spread_means(&dmeans, offsets, &mut dhidden, d);
                        step
                    }
                    false => parts.step(&hidden, d, masks, &mut dhidden, loss)?,
                }
            }
            Top::Token {
                head,
                classifier,
                dropout,
            } => {
                let HeadTargets::Tokens(labels) = &batch.targets else {
                    return Err(Error::Input(
                        "labels: token classification needs a class id per token".into(),
                    ));
                };
                let mask = mask_of(dropout);
                let targets = (batch, &labels[..]);
                through_head(head.as_mut(), &hidden, &mut dhidden, |x, dx| {
                    token_step(
                        classifier,
                        (x, offsets, d),
                        targets,
                        mask.as_ref(),
                        weight,
                        dx,
                    )
                })?
            }
            Top::Answer {
                head,
                dropout,
                qa_outputs,
            } => {
                let HeadTargets::Spans(spans) = &batch.targets else {
                    return Err(Error::Input(
                        "start_positions / end_positions: question answering needs an answer span per sequence".into(),
                    ));
                };
                let mask = mask_of(dropout);
                through_head(head.as_mut(), &hidden, &mut dhidden, |x, dx| {
                    answer_step(
                        qa_outputs,
                        (x, offsets, d),
                        spans,
                        (mask.as_ref(), weight),
                        dx,
                    )
                })?
            }
        };
        recycle(hidden);
        if step.targets > 0 {
            self.encoder.backward(tape, dhidden);
        }
        let mut params = self.encoder.params_mut();
        match &mut self.top {
            Top::Sequence {
                sentence,
                classifier,
                ..
            } => {
                match sentence {
                    Sentence::Pooler(l) | Sentence::FirstToken { dense: l, .. } => {
                        params.extend([&mut l.w, &mut l.b])
                    }
                    Sentence::ModernBert { head, .. } => params.extend(head.params_mut()),
                }
                params.extend([&mut classifier.w, &mut classifier.b])
            }
            Top::Token {
                head, classifier, ..
            } => {
                params.extend(head.iter_mut().flat_map(PredictionHead::params_mut));
                params.extend([&mut classifier.w, &mut classifier.b])
            }
            Top::Answer {
                head, qa_outputs, ..
            } => {
                params.extend(head.iter_mut().flat_map(PredictionHead::params_mut));
                params.extend([&mut qa_outputs.w, &mut qa_outputs.b])
            }
        }
        Ok(HeadOutcome {
            gradients: grad_store(params)?,
            ..step
        })
    }
}

/// A head's loss, logits and target count, before the gradients are
/// gathered.
fn outcome(loss: f64, targets: usize, logits: Vec<f32>) -> HeadOutcome {
    HeadOutcome {
        loss,
        targets,
        logits,
        gradients: GradStore::default(),
    }
}

/// `step` on the rows as the head's output layer reads them: `hidden`, or
/// ModernBERT's `head` on every row of it, with the gradient carried back
/// through the head into `dhidden`.
fn through_head(
    head: Option<&mut PredictionHead>,
    hidden: &[f32],
    dhidden: &mut Vec<f32>,
    step: impl FnOnce(&[f32], &mut [f32]) -> Result<HeadOutcome>,
) -> Result<HeadOutcome> {
    let Some(head) = head else {
        return step(hidden, dhidden);
    };
    let (states, tape) = head.forward(hidden);
    let mut dstates = zeros(states.len());
    let out = step(&states, &mut dstates)?;
    recycle(states);
    if out.targets > 0 {
        let dx = head.backward(hidden, tape, &dstates);
        recycle(std::mem::replace(dhidden, dx));
    }
    recycle(dstates);
    Ok(out)
}
