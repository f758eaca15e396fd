//! LayerNorm over rows, fused with the residual add before it (and with
//! a dropout mask and the next product's bf16 rounding in training), and
//! the plain residual add.

use rayon::prelude::*;

use super::lanes::{lane_sum, LANES};
use super::{multiversion, ROWS_PER_TASK};

/// Up to this many rows, row-wise passes run on the calling thread: waking
/// the pool costs more than the pass (a sentence at batch 1 is ~25 rows).
const SERIAL_ROWS: usize = 64;

multiversion! {
    fn norm_rows = norm_rows_body(x: &mut [f32], residual: Option<&[f32]>, gamma: &[f32], beta: &[f32], eps: f32);
    fn norm_rows_into = norm_rows_into_body(x: &[f32], y: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32);
    fn add_chunk = add_body(x: &mut [f32], y: &[f32]);
}

/// `x = LayerNorm(x + residual)` row by row (`residual` may be `None`).
pub fn add_layer_norm(
    x: &mut [f32],
    residual: Option<&[f32]>,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) {
    let d = gamma.len();
    if x.len() <= d * SERIAL_ROWS {
        return norm_rows(x, residual, gamma, beta, eps);
    }
    let task = d * ROWS_PER_TASK;
    match residual {
        Some(r) => x
            .par_chunks_mut(task)
            .zip(r.par_chunks(task))
            .for_each(|(rows, res)| norm_rows(rows, Some(res), gamma, beta, eps)),
        None => x
            .par_chunks_mut(task)
            .for_each(|rows| norm_rows(rows, None, gamma, beta, eps)),
    }
}

/// LayerNorm of `src` rows into `dst` (pre-LN blocks keep the residual).
pub fn layer_norm_into(src: &[f32], dst: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    if src.len() <= gamma.len() * SERIAL_ROWS {
        dst.copy_from_slice(src);
        return norm_rows(dst, None, gamma, beta, eps);
    }
    let task = gamma.len() * ROWS_PER_TASK;
    dst.par_chunks_mut(task)
        .zip(src.par_chunks(task))
        .for_each(|(out, rows)| {
            out.copy_from_slice(rows);
            norm_rows(out, None, gamma, beta, eps);
        });
}

/// Rows `s` (of `gamma.len()`) finished in place by `prepare(row, values)`
/// (a dropout mask and the residual add), then `y = LayerNorm(s)`, and `y`
/// also as bf16 pairs, `⌈d / 2⌉` per row (the next bf16 product's rounded
/// input): one pass over each block of rows in place of a mask pass, an
/// add pass, the norm and the product's rounding. The bits of those passes
/// ([`norm_rows`] on the finished rows, then rounding).
pub(crate) fn finish_norm_pairs(
    s: &mut [f32],
    (y, pairs): (&mut [f32], &mut [u32]),
    (gamma, beta, eps): (&[f32], &[f32], f32),
    prepare: impl Fn(usize, &mut [f32]) + Sync,
) {
    let d = gamma.len();
    let (d2, rows) = (d.div_ceil(2), s.len() / d.max(1));
    assert!(
        s.len() == rows * d && y.len() == s.len() && pairs.len() == rows * d2,
        "finish_norm_pairs: the rows, their norm and its pairs are not [{rows}, {d}], [{rows}, {d}] and [{rows}, {d2}]"
    );
    if d == 0 {
        return;
    }
    s.par_chunks_mut(d * ROWS_PER_TASK)
        .zip(y.par_chunks_mut(d * ROWS_PER_TASK))
        .zip(pairs.par_chunks_mut(d2 * ROWS_PER_TASK))
        .enumerate()
        .for_each(|(block, ((s, y), pairs))| {
            for (r, row) in s.chunks_exact_mut(d).enumerate() {
                prepare(block * ROWS_PER_TASK + r, row);
            }
            norm_rows_into(s, y, gamma, beta, eps);
            for (row, out) in y.chunks_exact(d).zip(pairs.chunks_exact_mut(d2)) {
                crate::fast::matmul::round_row(row, out);
            }
        });
}

/// [`norm_rows_body`] (no residual) from `x` into `y`: the same
/// operations, without copying the rows first.
#[inline(always)]
fn norm_rows_into_body(x: &[f32], y: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let d = gamma.len();
    for (row, out) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        let (mean, rstd) = row_stats(row, eps);
        for (((o, v), g), b) in out.iter_mut().zip(row).zip(gamma).zip(beta) {
            *o = (*v - mean) * rstd * g + b;
        }
    }
}

#[inline(always)]
fn norm_rows_body(x: &mut [f32], residual: Option<&[f32]>, gamma: &[f32], beta: &[f32], eps: f32) {
    let d = gamma.len();
    for (i, row) in x.chunks_exact_mut(d).enumerate() {
        if let Some(r) = residual {
            for (a, b) in row.iter_mut().zip(&r[i * d..(i + 1) * d]) {
                *a += b;
            }
        }
        let (mean, rstd) = row_stats(row, eps);
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * rstd * g + b;
        }
    }
}

/// A row's mean and 1 / sqrt(biased variance + eps), as LayerNorm uses
/// them (its backward recomputes them with this same function).
#[inline(always)]
pub(crate) fn row_stats(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row) / n;
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|v| (v - mean) * (v - mean))
        .sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += (v - mean) * (v - mean);
        }
    }
    let var = (acc.iter().sum::<f32>() + tail) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `x += residual`, in parallel.
pub fn add_in_place(x: &mut [f32], residual: &[f32]) {
    if x.len() <= 4096 * 4 {
        return add_chunk(x, residual);
    }
    x.par_chunks_mut(4096)
        .zip(residual.par_chunks(4096))
        .for_each(|(a, b)| add_chunk(a, b));
}

#[inline(always)]
fn add_body(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}
