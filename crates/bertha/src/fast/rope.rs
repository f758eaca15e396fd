//! Rotary position embeddings (NeoX `rotate_half`, as ModernBERT uses
//! them) applied in place to the Q and K columns of packed QKV rows,
//! right after the multiply that makes them: each token rotated by its
//! position inside its own sequence.

use rayon::prelude::*;

use super::kernels::{multiversion, ROWS_PER_TASK};
use crate::model::family::modernbert::rotary::half_tables;

multiversion! {
    fn rotate_rows = rotate_rows_body(rows: &mut [f32], positions: &[u32], table: &Rotary, span: Span);
}

/// Which columns of a row the rotation turns: the first `columns` (whole
/// heads) of rows `width` apart; `inverse` turns them back (the
/// transpose, which carries a gradient of the rotated values to the
/// values before).
#[derive(Clone, Copy)]
pub(crate) struct Span {
    pub width: usize,
    pub columns: usize,
    pub inverse: bool,
}

/// `cos` and `sin` `[positions, head_dim / 2]` for one base θ: the
/// numbers the candle modules use (`rotary::half_tables`).
pub(crate) struct Rotary {
    cos: Vec<f32>,
    sin: Vec<f32>,
    head_dim: usize,
    positions: usize,
}

impl Rotary {
    pub(crate) fn new(positions: usize, head_dim: usize, theta: f64) -> Self {
        let (cos, sin) = half_tables(positions, head_dim, theta);
        Self {
            cos,
            sin,
            head_dim,
            positions,
        }
    }

    /// Rotates Q and K of every row of `qkv` ([tokens, 3·D], sequence `s`
    /// owning rows `offsets[s]..offsets[s+1]`) by the row's position in
    /// its sequence. Sequences are no longer than the table (the caller
    /// checks lengths against `max_position_embeddings`).
    pub(crate) fn apply(&self, qkv: &mut [f32], offsets: &[usize], num_heads: usize) {
        let d = num_heads * self.head_dim;
        let positions: Vec<u32> = offsets
            .windows(2)
            .flat_map(|w| 0..(w[1] - w[0]) as u32)
            .collect();
        let span = Span {
            width: 3 * d,
            columns: 2 * d,
            inverse: false,
        };
        self.rotate(qkv, &positions, span);
    }

    /// Rotates `span`'s columns of each row of `rows` by the row's entry
    /// in `positions` (each below the table's length, as the callers check
    /// sequence lengths).
    pub(crate) fn rotate(&self, rows: &mut [f32], positions: &[u32], span: Span) {
        assert_eq!(rows.len(), positions.len() * span.width, "rotary: rows");
        assert!(
            span.columns <= span.width && span.columns.is_multiple_of(self.head_dim.max(1)),
            "rotary: the rotated columns are not whole heads of the row"
        );
        assert!(
            positions.iter().all(|&p| (p as usize) < self.positions),
            "rotary: a position beyond the table"
        );
        if positions.len() <= ROWS_PER_TASK {
            return rotate_rows(rows, positions, self, span);
        }
        rows.par_chunks_mut(span.width * ROWS_PER_TASK)
            .zip(positions.par_chunks(ROWS_PER_TASK))
            .for_each(|(rows, pos)| rotate_rows(rows, pos, self, span));
    }
}

/// `x · cos + rotate_half(x) · sin` on each head of the span: for the
/// halves `x1`, `x2`, `(x1·cos − x2·sin, x2·cos + x1·sin)`, each product
/// rounded before the sum as the candle ops round them; inverse, `(x1·cos
/// + x2·sin, x2·cos − x1·sin)`.
#[inline(always)]
fn rotate_rows_body(rows: &mut [f32], positions: &[u32], table: &Rotary, span: Span) {
    let hd = table.head_dim;
    let half = hd / 2;
    for (row, &p) in rows.chunks_exact_mut(span.width).zip(positions) {
        let p = p as usize;
        let (cos, sin) = (
            &table.cos[p * half..(p + 1) * half],
            &table.sin[p * half..(p + 1) * half],
        );
        for head in row[..span.columns].chunks_exact_mut(hd) {
            let (x1, x2) = head.split_at_mut(half);
            let turns = x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin);
            if span.inverse {
                for (((a, b), c), s) in turns {
                    let (u, v) = (*a, *b);
                    *a = u * c + v * s;
                    *b = v * c - u * s;
                }
            } else {
                for (((a, b), c), s) in turns {
                    let (u, v) = (*a, *b);
                    *a = u * c - v * s;
                    *b = v * c + u * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rotated query and key give a score that depends on their
    /// distance only, and position 0 is the identity.
    #[test]
    fn rotation_keeps_relative_scores() {
        let (heads, hd) = (2, 8);
        let d = heads * hd;
        let rope = Rotary::new(16, hd, 10_000.0);
        let base: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.37).sin()).collect();
        // Two sequences of 10 and 6 copies of the same row.
        let offsets = [0, 10, 16];
        let mut qkv: Vec<f32> = (0..16).flat_map(|_| base.clone()).collect();
        rope.apply(&mut qkv, &offsets, heads);
        assert_eq!(&qkv[..3 * d], &base[..], "position 0");
        assert_eq!(&qkv[10 * 3 * d..11 * 3 * d], &base[..], "a new sequence");
        let dot = |i: usize, j: usize| -> f32 {
            let q = &qkv[i * 3 * d..][..hd];
            let k = &qkv[j * 3 * d + d..][..hd];
            q.iter().zip(k).map(|(a, b)| a * b).sum()
        };
        assert!((dot(1, 3) - dot(5, 7)).abs() < 1e-5);
        assert!((dot(11, 14) - dot(2, 5)).abs() < 1e-5);
        assert!((dot(0, 1) - dot(0, 6)).abs() > 1e-3);
        // V is untouched.
        assert_eq!(&qkv[5 * 3 * d + 2 * d..6 * 3 * d], &base[2 * d..]);
    }

    /// The inverse turns rows back (a rotation's transpose is its
    /// inverse), on a span narrower than the row, leaving the rest.
    #[test]
    fn the_inverse_turns_back() {
        let (heads, hd) = (3, 8);
        let d = heads * hd;
        let rope = Rotary::new(40, hd, 160_000.0);
        let rows: Vec<f32> = (0..7 * 2 * d).map(|i| (i as f32 * 0.61).cos()).collect();
        let positions = [0u32, 39, 5, 17, 17, 2, 30];
        let mut turned = rows.clone();
        let span = |inverse| Span {
            width: 2 * d,
            columns: d,
            inverse,
        };
        rope.rotate(&mut turned, &positions, span(false));
        assert_ne!(
            turned[2 * d..3 * d],
            rows[2 * d..3 * d],
            "position 39 turns"
        );
        assert_eq!(turned[3 * d..4 * d], rows[3 * d..4 * d], "the span's end");
        rope.rotate(&mut turned, &positions, span(true));
        for (a, b) in turned.iter().zip(&rows) {
            assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
        }
    }
}
