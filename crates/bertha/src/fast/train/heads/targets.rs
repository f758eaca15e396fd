//! The heads' losses on their logits: sequence classification's (by its
//! `problem_type`, multiple choice's softmax over each example's choices,
//! a caller's ranking loss), token classification's and QA's span
//! cross-entropies, each turning the logits into the gradient of
//! `weight · loss` and carrying it back to the rows below.

use super::super::encoder::{drop_rows, Linear};
use super::super::losses::{bce_with_logit, cross_entropy};
use super::{outcome, HeadBatch, HeadOutcome, HeadTargets};
use crate::config::ProblemType;
use crate::error::{Error, Result};
use crate::fast::buffers::zeros;
use crate::model::{DropoutMask, IGNORE_INDEX};

/// Sequence classification's loss on `logits` `[N, C]`, as
/// `SequenceClassificationModule` picks it: the config's `problem_type`,
/// else regression for one label, single-label for class ids, multi-label
/// otherwise. Replaces the logits by the gradient of `weight · loss`.
pub(super) fn sequence_loss(
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
pub(super) fn token_step(
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
pub(super) fn answer_step(
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
