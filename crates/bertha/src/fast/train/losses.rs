//! Cross-entropy over rows of logits, turned into its gradient in place.

use rayon::prelude::*;

use crate::fast::kernels::{fast_exp, lane_sum, multiversion};

/// What a cross-entropy pass gives: the summed loss and the rows whose
/// largest logit is the target.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CrossEntropy {
    pub sum: f64,
    pub correct: usize,
}

multiversion! {
    fn ce_rows = ce_rows_body(logits: &mut [f32], c: usize, targets: &[u32], weight: f32, out: &mut [(f64, bool)]);
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
    CrossEntropy {
        sum: rows.iter().map(|r| r.0).sum(),
        correct: rows.iter().filter(|r| r.1).count(),
    }
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
        let y = y as usize;
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let arg = row.iter().position(|&v| v == max).unwrap_or(0);
        let target = row[y];
        row.iter_mut().for_each(|v| *v = fast_exp(*v - max));
        let sum = lane_sum(row);
        let scale = weight / sum;
        row.iter_mut().for_each(|v| *v *= scale);
        row[y] -= weight;
        *o = (f64::from(sum.ln()) - f64::from(target - max), arg == y);
    }
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
}
