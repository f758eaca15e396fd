//! Fine-tuning heads on the fast path: sequence classification (pooler →
//! dropout → classifier, with the loss its `problem_type` says; multiple
//! choice is the same layers with one output, its softmax over each
//! example's choices), token
//! classification (dropout → classifier on every token, -100 ignored) and
//! extractive QA (`qa_outputs` → start / end cross-entropy over every row,
//! padding rows included as transformers' loss has them), each with the
//! loss and the dropout masks of its candle head.

use candle_core::backprop::GradStore;

use super::encoder::{drop_rows, Encoder, Linear};
use super::grad_store;
use super::losses::{bce_with_logit, cross_entropy};
use super::mlm::linear;
use super::prediction_head::{mean_rows, spread_means, PredictionHead};
use super::products::Compute;
use crate::config::{Activation, ClassifierPooling, Family, ProblemType};
use crate::error::{Error, Result};
use crate::fast::buffers::{recycle, zeros, StepBuffers};
use crate::fast::kernels::Act;
use crate::model::family::PredictionHead as FamilyHead;
use crate::model::ops::{bias_act_backward, bias_act_forward};
use crate::model::{BertForTask, Dense, Dropout, DropoutMask, IGNORE_INDEX};

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
        /// Before `qa_outputs`: DistilBERT's `qa_dropout` (rate 0 but
        /// there).
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
        // ModernBERT has no QA head of its own (refused before training).
        let modernbert = match &model.config().family {
            Family::ModernBert(o) => Some(o.classifier_pooling),
            _ => None,
        };
        if modernbert.is_some() && matches!(model, BertForTask::QuestionAnswering(_)) {
            return Ok(None);
        }
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
                match head {
                    None => token_step(
                        classifier,
                        (&hidden, offsets, d),
                        targets,
                        mask.as_ref(),
                        weight,
                        &mut dhidden,
                    )?,
                    Some(head) => {
                        // ModernBERT: its `head` on every token first.
                        let (states, tape) = head.forward(&hidden);
                        let mut dstates = zeros(states.len());
                        let step = token_step(
                            classifier,
                            (&states, offsets, d),
                            targets,
                            mask.as_ref(),
                            weight,
                            &mut dstates,
                        )?;
                        recycle(states);
                        if step.targets > 0 {
                            let dx = head.backward(&hidden, tape, &dstates);
                            recycle(std::mem::replace(&mut dhidden, dx));
                        }
                        recycle(dstates);
                        step
                    }
                }
            }
            Top::Answer {
                dropout,
                qa_outputs,
            } => {
                let HeadTargets::Spans(spans) = &batch.targets else {
                    return Err(Error::Input(
                        "start_positions / end_positions: question answering needs an answer span per sequence".into(),
                    ));
                };
                let mask = mask_of(dropout);
                answer_step(
                    qa_outputs,
                    (&hidden, offsets, d),
                    spans,
                    (mask.as_ref(), weight),
                    &mut dhidden,
                )?
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
            Top::Answer { qa_outputs, .. } => params.extend([&mut qa_outputs.w, &mut qa_outputs.b]),
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

/// The sentence head (the pooler, or a family's first-token head) on each
/// `[CLS]` row, and the classifier on it.
struct Pooled<'a, 'p> {
    sentence: &'a mut Sentence<'p>,
    classifier: &'a mut Linear<'p>,
}

impl Pooled<'_, '_> {
    /// Forward from the `[CLS]` rows `cls` (`[N, D]`), the loss (`loss`
    /// turns the logits `[N, C]` into their gradient, giving the mean loss
    /// and its target count) and backward into `dcls`; dropout (`masks`,
    /// rows keyed by sequence) before a first-token head and before the
    /// classifier.
    fn step(
        self,
        cls: &[f32],
        d: usize,
        [first_mask, mask]: [Option<&DropoutMask>; 2],
        dcls: &mut [f32],
        loss: impl FnOnce(&mut [f32], usize) -> Result<(f64, usize)>,
    ) -> Result<HeadOutcome> {
        let n = cls.len() / d.max(1);
        let mut pooled = zeros(n * d);
        // The first-token head's input (dropped) and pre-activation;
        // ModernBERT's head's tape.
        let (mut x0, mut pre, mut head_tape) = (Vec::new(), Vec::new(), None);
        match &*self.sentence {
            Sentence::ModernBert { head, .. } => {
                let (y, tape) = head.forward(cls);
                recycle(std::mem::replace(&mut pooled, y));
                head_tape = Some(tape);
            }
            Sentence::Pooler(pooler) => {
                pooler.forward(cls, &mut pooled, n);
                pooled.iter_mut().for_each(|v| *v = v.tanh());
            }
            Sentence::FirstToken { dense, act, .. } => {
                x0 = cls.to_vec();
                if let Some(m) = first_mask {
                    drop_sequences(m, &mut x0, d);
                }
                pre = zeros(n * d);
                dense.compute.forward(&x0, &dense.w.data, None, &mut pre, n);
                bias_act_forward(&pre, &dense.b.data, &mut pooled, *act);
            }
        }
        let mut x = pooled.clone();
        if let Some(m) = mask {
            drop_sequences(m, &mut x, d);
        }
        let c = self.classifier.out_dim();
        let mut logits = zeros(n * c);
        self.classifier.forward(&x, &mut logits, n);
        let out = logits.clone();
        let (mean, targets) = loss(&mut logits, c)?;
        if targets == 0 {
            return Ok(outcome(mean, targets, out));
        }
        let mut dx = zeros(n * d);
        self.classifier
            .backward(&x, &logits, Some(&mut dx), n, false);
        if let Some(m) = mask {
            drop_sequences(m, &mut dx, d);
        }
        match self.sentence {
            Sentence::ModernBert { head, .. } => {
                if let Some(tape) = head_tape {
                    let dpooled = head.backward(cls, tape, &dx);
                    dcls.copy_from_slice(&dpooled);
                    recycle(dpooled);
                }
            }
            Sentence::Pooler(pooler) => {
                for (g, p) in dx.iter_mut().zip(&pooled) {
                    *g *= 1.0 - p * p;
                }
                pooler.backward(cls, &dx, Some(dcls), n, false);
            }
            Sentence::FirstToken { dense, act, .. } => {
                let mut dpre = zeros(n * d);
                let (bias, dbias) = dense.b.data_and_grad();
                bias_act_backward(&pre, bias, &dx, &mut dpre, dbias, *act);
                let compute = dense.compute;
                dense
                    .w
                    .grad_product(|dw| compute.weight_grad_into(&dpre, &x0, dw, n));
                compute.input_grad(&dpre, &dense.w.data, dcls, n, false);
                if let Some(m) = first_mask {
                    drop_sequences(m, dcls, d);
                }
            }
        }
        Ok(outcome(mean, targets, out))
    }
}

/// Dropout on one row per sequence `[N, D]`, row `s` keyed as the candle
/// modules key batch row `s`.
fn drop_sequences(mask: &DropoutMask, x: &mut [f32], d: usize) {
    for (s, row) in x.chunks_exact_mut(d).enumerate() {
        mask.apply_row(mask.row_key(&[s]), row);
    }
}

/// Sequence classification's loss on `logits` `[N, C]`, as
/// `SequenceClassificationModule` picks it: the config's `problem_type`,
/// else regression for one label, single-label for class ids, multi-label
/// otherwise. Replaces the logits by the gradient of `weight · loss`.
fn sequence_loss(
    logits: &mut [f32],
    c: usize,
    targets: &HeadTargets,
    problem: Option<ProblemType>,
    weight: f64,
) -> Result<(f64, usize)> {
    let n = logits.len() / c.max(1);
    if let HeadTargets::Choices(y) = targets {
        // One score per sequence; each example's scores are one row.
        let choices = if y.is_empty() { 0 } else { n / y.len() };
        if c != 1 || choices * y.len() != n || (n > 0 && choices == 0) {
            return Err(Error::Input(format!(
                "labels: {n} sequences of {c} score(s) do not split into the choices of {} examples",
                y.len()
            )));
        }
        return class_loss(logits, choices, &labelled(y), weight, "labels");
    }
    if let HeadTargets::Custom(loss) = targets {
        let (mean, count, grad) = loss(logits)?;
        if grad.len() != logits.len() {
            return Err(Error::Input(format!(
                "internal: a gradient of {} values for {} logits",
                grad.len(),
                logits.len()
            )));
        }
        for (x, g) in logits.iter_mut().zip(&grad) {
            *x = (weight * g) as f32;
        }
        return Ok((mean, count));
    }
    let problem = problem.unwrap_or(match targets {
        _ if c == 1 => ProblemType::Regression,
        HeadTargets::Classes(_) => ProblemType::SingleLabelClassification,
        _ => ProblemType::MultiLabelClassification,
    });
    let values: Vec<f32> = match (problem, targets) {
        (ProblemType::SingleLabelClassification, HeadTargets::Classes(y)) => {
            if y.len() != n {
                return Err(Error::Input(format!(
                    "labels: expected {n} labels, got {}",
                    y.len()
                )));
            }
            return class_loss(logits, c, &labelled(y), weight, "labels");
        }
        (ProblemType::SingleLabelClassification, _) => {
            return Err(Error::Input(
                "labels: single-label classification needs a class id per sequence".into(),
            ))
        }
        (_, HeadTargets::Classes(y)) => y.iter().map(|&v| v as f32).collect(),
        (_, HeadTargets::Values(v)) => v.to_vec(),
        (
            _,
            HeadTargets::Tokens(_)
            | HeadTargets::Spans(_)
            | HeadTargets::Choices(_)
            | HeadTargets::Custom(_),
        ) => {
            return Err(Error::Input(
                "labels: sequence classification needs labels per sequence".into(),
            ))
        }
    };
    if values.len() != logits.len() {
        return Err(Error::Input(format!(
            "labels: expected [{n}, {c}] values, got {}",
            values.len()
        )));
    }
    let m = logits.len() as f64;
    let mut sum = 0f64;
    let scale = (weight / m) as f32;
    for (x, &y) in logits.iter_mut().zip(&values) {
        let v = *x;
        if problem == ProblemType::Regression {
            // mean((x - y)²)
            sum += f64::from(v - y).powi(2);
            *x = scale * 2.0 * (v - y);
        } else {
            let (loss, grad) = bce_with_logit(v, y);
            sum += loss;
            *x = scale * grad;
        }
    }
    Ok((sum / m, n))
}

/// The `(row, class id)` of every labelled row.
fn labelled(y: &[i64]) -> Vec<(usize, i64)> {
    y.iter()
        .copied()
        .enumerate()
        .filter(|&(_, y)| y != IGNORE_INDEX)
        .collect()
}

/// Mean cross-entropy of the `rows` `(row, class id)` of `logits` `[N,
/// C]`; `logits` become the gradient of `weight ·` it (0 on other rows).
fn class_loss(
    logits: &mut [f32],
    c: usize,
    rows: &[(usize, i64)],
    weight: f64,
    what: &str,
) -> Result<(f64, usize)> {
    let mut picked = Vec::with_capacity(rows.len() * c);
    let mut targets = Vec::with_capacity(rows.len());
    for &(r, y) in rows {
        if !(0..c as i64).contains(&y) {
            return Err(Error::Input(format!(
                "{what}: label {y} at position {r} is not a class id in 0..{c} (use {IGNORE_INDEX} to ignore a position)"
            )));
        }
        picked.extend_from_slice(&logits[r * c..(r + 1) * c]);
        targets.push(y as u32);
    }
    logits.fill(0.0);
    let count = rows.len();
    if count == 0 {
        return Ok((0.0, 0));
    }
    let ce = cross_entropy(&mut picked, c, &targets, (weight / count as f64) as f32);
    for (&(r, _), g) in rows.iter().zip(picked.chunks_exact(c)) {
        logits[r * c..(r + 1) * c].copy_from_slice(g);
    }
    Ok((ce.sum / count as f64, count))
}

/// Token classification: dropout on every hidden row, the classifier, the
/// cross-entropy of the labelled tokens; backward into `dhidden`.
fn token_step(
    classifier: &mut Linear,
    (hidden, offsets, d): (&[f32], &[usize], usize),
    (batch, labels): (&HeadBatch, &[&[i64]]),
    mask: Option<&DropoutMask>,
    weight: f64,
    dhidden: &mut [f32],
) -> Result<HeadOutcome> {
    let n_seq = offsets.len() - 1;
    if labels.len() != n_seq {
        return Err(Error::Input(format!(
            "labels: {} label rows for {n_seq} sequences",
            labels.len()
        )));
    }
    let mut rows = Vec::new();
    for (s, l) in labels.iter().enumerate() {
        let len = batch.sequences[s].0.len();
        if l.len() != len {
            return Err(Error::Input(format!(
                "labels: sequence {s} has {} labels for {len} tokens",
                l.len()
            )));
        }
        for (p, &y) in l.iter().enumerate() {
            if y == IGNORE_INDEX {
                continue;
            }
            if !(0..classifier.out_dim() as i64).contains(&y) {
                return Err(Error::Input(format!(
                    "labels: label {y} at sequence {s}, position {p} is not a class id in 0..{} (use {IGNORE_INDEX} to ignore a token)",
                    classifier.out_dim()
                )));
            }
            rows.push((offsets[s] + p, y));
        }
    }
    let t = hidden.len() / d;
    let mut x = hidden.to_vec();
    if let Some(m) = mask {
        drop_rows(m, &mut x, offsets, d);
    }
    let c = classifier.out_dim();
    let mut logits = zeros(t * c);
    classifier.forward(&x, &mut logits, t);
    let out = logits.clone();
    let (mean, targets) = class_loss(&mut logits, c, &rows, weight, "labels")?;
    if targets == 0 {
        return Ok(outcome(mean, targets, out));
    }
    classifier.backward(&x, &logits, Some(dhidden), t, false);
    if let Some(m) = mask {
        drop_rows(m, dhidden, offsets, d);
    }
    Ok(outcome(mean, targets, out))
}

/// QA: dropout (`mask`, DistilBERT's) and `qa_outputs` on every row, then
/// the mean of the start and the end cross-entropies, each over its
/// sequences' rows (padding rows included) and averaged over the sequences
/// whose position is inside them; backward into `dhidden`.
fn answer_step(
    qa_outputs: &mut Linear,
    (hidden, offsets, d): (&[f32], &[usize], usize),
    spans: &[(i64, i64)],
    (mask, weight): (Option<&DropoutMask>, f64),
    dhidden: &mut [f32],
) -> Result<HeadOutcome> {
    let n = offsets.len() - 1;
    if spans.len() != n {
        return Err(Error::Input(format!(
            "start_positions / end_positions: {} answers for {n} sequences",
            spans.len()
        )));
    }
    let t = hidden.len() / d;
    let dropped = mask.map(|m| {
        let mut x = hidden.to_vec();
        drop_rows(m, &mut x, offsets, d);
        x
    });
    let x = dropped.as_deref().unwrap_or(hidden);
    let mut logits = zeros(t * 2);
    qa_outputs.forward(x, &mut logits, t);
    let out = logits.clone();
    let mut dlogits = zeros(t * 2);
    let mut loss = 0.0;
    // Column 0: start, 1: end; positions clamped to 0..=rows, rows ignored.
    for column in 0..2 {
        let kept: Vec<(usize, usize)> = spans
            .iter()
            .enumerate()
            .filter_map(|(s, &(start, end))| {
                let rows = offsets[s + 1] - offsets[s];
                let y = if column == 0 { start } else { end };
                let y = y.clamp(0, rows as i64) as usize;
                (y < rows).then_some((s, y))
            })
            .collect();
        if kept.is_empty() {
            continue;
        }
        let w = (weight / 2.0 / kept.len() as f64) as f32;
        let mut sum = 0.0;
        for &(s, y) in &kept {
            let rows = offsets[s]..offsets[s + 1];
            let mut row: Vec<f32> = rows.clone().map(|r| logits[r * 2 + column]).collect();
            let c = row.len();
            sum += cross_entropy(&mut row, c, &[y as u32], w).sum;
            for (r, g) in rows.zip(row) {
                dlogits[r * 2 + column] = g;
            }
        }
        loss += sum / kept.len() as f64 / 2.0;
    }
    qa_outputs.backward(x, &dlogits, Some(dhidden), t, false);
    if let Some(m) = mask {
        drop_rows(m, dhidden, offsets, d);
    }
    Ok(outcome(loss, n, out))
}
