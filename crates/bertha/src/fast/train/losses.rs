//! Cross-entropy over rows of logits, turned into its gradient in place.

use rayon::prelude::*;

use crate::fast::buffers::add;
use crate::fast::kernels::{fast_exp, lane_sum, multiversion};
use crate::fast::matmul::round_row;

/// What a cross-entropy pass gives: the summed loss and the rows whose
/// largest logit is the target.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CrossEntropy {
    pub sum: f64,
    pub correct: usize,
}

impl CrossEntropy {
    /// The pass's figures from each row's loss and whether it was right.
    fn of(rows: &[(f64, bool)]) -> Self {
        Self {
            sum: rows.iter().map(|r| r.0).sum(),
            correct: rows.iter().filter(|r| r.1).count(),
        }
    }
}

multiversion! {
    fn ce_rows = ce_rows_body(logits: &mut [f32], c: usize, targets: &[u32], weight: f32, out: &mut [(f64, bool)]);
    fn ce_row_into = ce_row_into_body(logits: &[f32], grad: &mut [f32], y: u32, weight: f32) -> (f64, bool);
}

/// `logits` `[N, C]` against `targets` (each in `0..C`): the summed
/// negative log-likelihood, and `logits` replaced by the gradient of
/// `weight · Σ loss` (`weight · (softmax − one-hot)`).
pub(crate) fn cross_entropy(
    logits: &mut [f32],
    c: usize,
    targets: &[u32],
    weight: f32,
) -> CrossEntropy {
    debug_assert_eq!(logits.len(), targets.len() * c);
    if c == 0 {
        return CrossEntropy::default();
    }
    let mut rows = vec![(0f64, false); targets.len()];
    const ROWS: usize = 4;
    logits
        .par_chunks_mut(c * ROWS)
        .zip(targets.par_chunks(ROWS))
        .zip(rows.par_chunks_mut(ROWS))
        .for_each(|((l, t), o)| ce_rows(l, c, t, weight, o));
    CrossEntropy::of(&rows)
}

/// Rows per block of [`cross_entropy_to_pairs`]: each block sums its
/// rows' gradients into its own partial column sums.
const SUM_BLOCK: usize = 32;

/// [`cross_entropy`] for a decoder whose backward products take bf16
/// operands: the gradient is made row by row in a per-thread row (the
/// logits are read, not overwritten: nothing reads the fp32 gradient),
/// rounded to bf16 pairs into `pairs` (`[N, ⌈C / 2⌉]`, both products' operand,
/// the bits the products' own rounding gives), and its column sums (the
/// decoder bias's gradient) are added into `col_sums`, per block of
/// [`SUM_BLOCK`] rows, then block by block (the same bits on any thread
/// count). Saves two passes over the `[N, C]` gradient and writing it.
pub(crate) fn cross_entropy_to_pairs(
    logits: &[f32],
    c: usize,
    targets: &[u32],
    weight: f32,
    pairs: &mut [u32],
    col_sums: &mut [f32],
) -> CrossEntropy {
    let c2 = c.div_ceil(2);
    debug_assert_eq!(logits.len(), targets.len() * c);
    assert_eq!(
        pairs.len(),
        targets.len() * c2,
        "cross_entropy_to_pairs: pairs"
    );
    assert_eq!(col_sums.len(), c, "cross_entropy_to_pairs: column sums");
    if c == 0 {
        return CrossEntropy::default();
    }
    let mut rows = vec![(0f64, false); targets.len()];
    let partials: Vec<Vec<f32>> = logits
        .par_chunks(c * SUM_BLOCK)
        .zip(targets.par_chunks(SUM_BLOCK))
        .zip(rows.par_chunks_mut(SUM_BLOCK))
        .zip(pairs.par_chunks_mut(c2 * SUM_BLOCK))
        .map(|(((l, t), o), p)| {
            let (mut sums, mut grad) = (vec![0f32; c], vec![0f32; c]);
            for (((row, &y), o), p) in l.chunks_exact(c).zip(t).zip(o).zip(p.chunks_exact_mut(c2)) {
                *o = ce_row_into(row, &mut grad, y, weight);
                round_row(&grad, p);
                add(&mut sums, &grad);
            }
            sums
        })
        .collect();
    for part in &partials {
        add(col_sums, part);
    }
    CrossEntropy::of(&rows)
}

/// Rows of [`cross_entropy`]: each row's loss and whether its largest
/// logit (the first, on ties) is the target.
#[inline(always)]
fn ce_rows_body(
    logits: &mut [f32],
    c: usize,
    targets: &[u32],
    weight: f32,
    out: &mut [(f64, bool)],
) {
    for ((row, &y), o) in logits.chunks_exact_mut(c).zip(targets).zip(out) {
        let (max, arg, target) = ce_row_start(row, y as usize);
        row.iter_mut().for_each(|v| *v = fast_exp(*v - max));
        *o = ce_row_end(row, (y as usize, weight), (max, arg, target));
    }
}

/// [`ce_rows_body`] on one row, the gradient written into `grad` (the
/// logits only read): the same operations, so the same bits.
#[inline(always)]
fn ce_row_into_body(logits: &[f32], grad: &mut [f32], y: u32, weight: f32) -> (f64, bool) {
    let (max, arg, target) = ce_row_start(logits, y as usize);
    for (g, &v) in grad.iter_mut().zip(logits) {
        *g = fast_exp(v - max);
    }
    ce_row_end(grad, (y as usize, weight), (max, arg, target))
}

/// A row's largest logit, where it first is, and the target's logit.
#[inline(always)]
fn ce_row_start(row: &[f32], y: usize) -> (f32, usize, f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let arg = row.iter().position(|&v| v == max).unwrap_or(0);
    (max, arg, row[y])
}

/// A row's loss and whether its largest logit is the target, its
/// exponentials `exp` (of the logits less `max`) turned into the gradient
/// `weight · (softmax − one-hot)` in place.
#[inline(always)]
fn ce_row_end(
    exp: &mut [f32],
    (y, weight): (usize, f32),
    (max, arg, target): (f32, usize, f32),
) -> (f64, bool) {
    let sum = lane_sum(exp);
    let scale = weight / sum;
    exp.iter_mut().for_each(|v| *v *= scale);
    exp[y] -= weight;
    (f64::from(sum.ln()) - f64::from(target - max), arg == y)
}

/// Binary cross-entropy with logits of one logit `x` against a target `y`,
/// computed stably as `max(x, 0) − x·y + log(1 + e^−|x|)`, and its
/// derivative with respect to `x`, `σ(x) − y`.
pub(crate) fn bce_with_logit(x: f32, y: f32) -> (f64, f32) {
    let e = (-x.abs()).exp();
    let loss = f64::from(x.max(0.0) - x * y + e.ln_1p());
    let sigmoid = if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    };
    (loss, sigmoid - y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_and_gradient_match_the_definition() {
        let c = 5;
        let logits: Vec<f32> = (0..3 * c)
            .map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0)
            .collect();
        let targets = [0u32, 4, 2];
        let mut g = logits.clone();
        let out = cross_entropy(&mut g, c, &targets, 0.5);
        let mut want_sum = 0.0;
        for (r, &y) in targets.iter().enumerate() {
            let row: Vec<f64> = logits[r * c..(r + 1) * c]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            want_sum += lse - row[y as usize];
            for j in 0..c {
                let p = (row[j] - lse).exp();
                let want = 0.5 * (p - if j == y as usize { 1.0 } else { 0.0 });
                assert!(
                    (f64::from(g[r * c + j]) - want).abs() < 1e-6,
                    "row {r} col {j}"
                );
            }
        }
        assert!(
            (out.sum - want_sum).abs() < 1e-5,
            "{} vs {want_sum}",
            out.sum
        );
    }

    /// The fused pass gives [`cross_entropy`]'s loss, its gradient's bf16
    /// pairs as rounding it apart does, and its column sums, over more than
    /// one block of rows and an odd width.
    #[test]
    fn the_pairs_pass_equals_the_loss_then_rounding_then_sums() {
        let (n, c) = (2 * SUM_BLOCK + 5, 37);
        let logits: Vec<f32> = (0..n * c)
            .map(|i| ((i * 7919) % 23) as f32 * 0.4 - 4.0)
            .collect();
        let targets: Vec<u32> = (0..n).map(|r| (r * 5 % c) as u32).collect();
        let mut want = logits.clone();
        let want_ce = cross_entropy(&mut want, c, &targets, 0.25);
        let mut pairs = vec![u32::MAX; n * c.div_ceil(2)];
        let mut sums = vec![1f32; c];
        let ce = cross_entropy_to_pairs(&logits, c, &targets, 0.25, &mut pairs, &mut sums);
        assert_eq!((ce.sum, ce.correct), (want_ce.sum, want_ce.correct));
        let mut want_pairs = vec![0u32; c.div_ceil(2)];
        for (r, row) in want.chunks_exact(c).enumerate() {
            round_row(row, &mut want_pairs);
            assert_eq!(
                &pairs[r * c.div_ceil(2)..][..c.div_ceil(2)],
                &want_pairs[..],
                "row {r}"
            );
        }
        for (j, s) in sums.iter().enumerate() {
            let col: f64 = (0..n).map(|r| f64::from(want[r * c + j])).sum();
            assert!(
                (f64::from(*s) - 1.0 - col).abs() < 1e-5,
                "column {j}: {s} vs 1 + {col}"
            );
        }
    }
}
