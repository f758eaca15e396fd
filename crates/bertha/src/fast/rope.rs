//! Rotary position embeddings (NeoX `rotate_half`, as ModernBERT uses
//! them) applied in place to the Q and K columns of packed QKV rows,
//! right after the multiply that makes them: each token rotated by its
//! position inside its own sequence.

use rayon::prelude::*;

use super::kernels::{multiversion, ROWS_PER_TASK};
use crate::model::family::modernbert::rotary::half_tables;

multiversion! {
    fn rotate_rows = rotate_rows_body(rows: &mut [f32], positions: &[u32], table: &Rotary, num_heads: usize);
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
        let d3 = 3 * num_heads * self.head_dim;
        let positions: Vec<u32> = offsets
            .windows(2)
            .flat_map(|w| 0..(w[1] - w[0]) as u32)
            .collect();
        assert_eq!(qkv.len(), positions.len() * d3, "rotary: qkv rows");
        assert!(
            offsets.windows(2).all(|w| w[1] - w[0] <= self.positions),
            "rotary: a sequence longer than the table"
        );
        if positions.len() <= ROWS_PER_TASK {
            return rotate_rows(qkv, &positions, self, num_heads);
        }
        qkv.par_chunks_mut(d3 * ROWS_PER_TASK)
            .zip(positions.par_chunks(ROWS_PER_TASK))
            .for_each(|(rows, pos)| rotate_rows(rows, pos, self, num_heads));
    }
}

/// `x · cos + rotate_half(x) · sin` on each head of Q and K: for the
/// halves `x1`, `x2`, `(x1·cos − x2·sin, x2·cos + x1·sin)`, each product
/// rounded before the sum as the candle ops round them.
#[inline(always)]
fn rotate_rows_body(rows: &mut [f32], positions: &[u32], table: &Rotary, num_heads: usize) {
    let hd = table.head_dim;
    let half = hd / 2;
    let d = num_heads * hd;
    for (row, &p) in rows.chunks_exact_mut(3 * d).zip(positions) {
        let p = p as usize;
        let (cos, sin) = (
            &table.cos[p * half..(p + 1) * half],
            &table.sin[p * half..(p + 1) * half],
        );
        // Q and K: the first 2·D columns, head by head.
        for head in row[..2 * d].chunks_exact_mut(hd) {
            let (x1, x2) = head.split_at_mut(half);
            for (((a, b), c), s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
                let (u, v) = (*a, *b);
                *a = u * c - v * s;
                *b = v * c + u * s;
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
}
