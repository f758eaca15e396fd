//! The training losses of the heads, as PyTorch computes them, built from
//! ops with a backward pass.

use candle_core::{DType, Tensor, D};

use crate::error::{Error, Result};

/// transformers' `ignore_index` for token-level labels.
pub const IGNORE_INDEX: i64 = -100;

/// Integer labels as i64 (they may be any integer or float dtype).
pub(crate) fn label_values(labels: &Tensor, what: &str) -> Result<Vec<i64>> {
    let v = labels
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    v.into_iter()
        .enumerate()
        .map(|(i, x)| {
            if x.fract() != 0.0 || !x.is_finite() {
                Err(Error::Input(format!(
                    "{what}: label {x} at position {i} is not a class id"
                )))
            } else {
                Ok(x as i64)
            }
        })
        .collect()
}

pub(crate) fn float_labels(labels: &Tensor, shape: &[usize], what: &str) -> Result<Tensor> {
    if labels.elem_count() != shape.iter().product::<usize>() {
        return Err(Error::Input(format!(
            "{what}: expected {shape:?} values, got a tensor of shape {:?}",
            labels.dims()
        )));
    }
    Ok(labels.to_dtype(DType::F32)?.reshape(shape)?)
}

/// CE over [B, T, C] logits and [B, T] labels, -100 ignored.
pub(crate) fn token_cross_entropy(logits: &Tensor, labels: &Tensor, what: &str) -> Result<Tensor> {
    let c = logits.dim(D::Minus1)?;
    let rows = logits.elem_count() / c.max(1);
    if labels.elem_count() != rows {
        return Err(Error::Input(format!(
            "{what}: expected {:?} labels, got a tensor of shape {:?}",
            &logits.dims()[..logits.rank() - 1],
            labels.dims()
        )));
    }
    cross_entropy_with_ignore(
        &logits.reshape((rows, c))?,
        &label_values(labels, what)?,
        IGNORE_INDEX,
        what,
    )
}

/// Mean cross-entropy of `logits` [N, C] against class ids, skipping rows
/// labelled `ignore` (PyTorch's `CrossEntropyLoss(ignore_index=...)`).
/// Built from ops with a backward pass. A batch where every row is
/// ignored gives 0 (PyTorch gives NaN), so training can go on.
pub fn cross_entropy_with_ignore(
    logits: &Tensor,
    labels: &[i64],
    ignore: i64,
    what: &str,
) -> Result<Tensor> {
    let (n, c) = logits.dims2()?;
    if labels.len() != n {
        return Err(Error::Input(format!(
            "{what}: expected {n} labels, got {}",
            labels.len()
        )));
    }
    let mut targets = Vec::with_capacity(n);
    let mut keep = Vec::with_capacity(n);
    for (i, &l) in labels.iter().enumerate() {
        if l == ignore {
            targets.push(0u32);
            keep.push(0f32);
        } else if (0..c as i64).contains(&l) {
            targets.push(l as u32);
            keep.push(1f32);
        } else {
            return Err(Error::Input(format!(
                "{what}: label {l} at position {i} is not a class id in 0..{c} (use {ignore} to ignore a position)"
            )));
        }
    }
    let count = keep.iter().filter(|&&k| k > 0.0).count();
    let dev = logits.device();
    let targets = Tensor::from_vec(targets, (n, 1), dev)?;
    let keep = Tensor::from_vec(keep, n, dev)?;
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = log_probs.gather(&targets, 1)?.squeeze(1)?;
    let total = (picked * keep)?.sum_all()?;
    Ok((total.neg()? / count.max(1) as f64)?)
}

/// Mean binary cross-entropy with logits (PyTorch's `BCEWithLogitsLoss`):
/// max(x, 0) - x·y + log(1 + exp(-|x|)).
pub fn bce_with_logits(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let pos = logits.relu()?;
    let xy = (logits * targets)?;
    let softplus = (logits.abs()?.neg()?.exp()? + 1.0)?.log()?;
    Ok(((pos - xy)? + softplus)?.mean_all()?)
}

/// Cross-entropy of `logits` [N, C] against `labels` [N] class ids, -100
/// ignored: the loss of the sequence-level heads.
pub(crate) fn class_cross_entropy(logits: &Tensor, labels: &Tensor, what: &str) -> Result<Tensor> {
    cross_entropy_with_ignore(logits, &label_values(labels, what)?, IGNORE_INDEX, what)
}
