//! Attention as gemm products over blocks of query rows, each block
//! against the keys of its rows' windows: the whole sequence for global
//! attention (long inputs), or ModernBERT's sliding window, where query
//! `i` attends to keys `|i − j| ≤ w` only. Then work and scratch grow as
//! tokens × window, not tokens², which is what lets local layers read
//! 8,192 tokens.

use gemm::Parallelism;

use super::kernels::{softmax_row, AttentionJob, Scratch};

/// Query rows per block of a band: the block's keys span `rows + 2w`, so
/// a block much taller than the window would compute scores that the
/// window then throws away; much shorter, and the products get too thin
/// for gemm.
const BAND_BLOCK: usize = 32;

/// One (sequence, head) of a sequence longer than its window `w`.
#[inline(always)]
pub(super) fn attend_band(
    job: &AttentionJob,
    scratch: &mut Scratch,
    task: (usize, usize, usize),
    w: usize,
) {
    attend_blocked(job, scratch, task, (w, BAND_BLOCK));
}

/// One (sequence, head) `task` = (first row, length, head) with two gemm
/// calls per `block` of query rows, reading Q, K and V in place from the
/// packed QKV rows: `scores = scale · Q Kᵀ` against the block's keys (the
/// union of its rows' windows `|i − j| ≤ w`), the softmax over each row's
/// window alone (keys outside it get probability 0, as the masked softmax
/// gives them up to rounding), then `P · V` into the context rows. With
/// `w ≥ len` this is plain attention, each row's softmax over all keys.
#[inline(always)]
pub(super) fn attend_blocked(
    job: &AttentionJob,
    scratch: &mut Scratch,
    (start, len, h): (usize, usize, usize),
    (w, block): (usize, usize),
) {
    let AttentionJob {
        qkv,
        d,
        head_dim,
        scale,
        ..
    } = *job;
    let block = block.min(len);
    let widest = (block + 2 * w).min(len);
    let scores = &mut scratch.scores;
    scores.resize(block * widest, 0.0);
    let base = start * 3 * d + h * head_dim;
    assert!(
        base + (len - 1) * 3 * d + 2 * d + head_dim <= qkv.len(),
        "attention rows lie inside qkv"
    );
    let rs = 3 * d as isize;
    for first in (0..len).step_by(block) {
        let rows = block.min(len - first);
        // Keys of the block: the union of its rows' windows.
        let (k0, k1) = (first.saturating_sub(w), (first + rows + w).min(len));
        let keys = k1 - k0;
        let s = &mut scores[..rows * keys];
        // SAFETY: Q rows start+first..start+first+rows and K, V rows
        // start+k0..start+k1, columns of head h, lie inside qkv (asserted
        // above); s is [rows, keys]; the output rows
        // start+first..start+first+rows, columns of head h, lie inside ctx
        // (asserted by packed_attention) and no other task writes them.
        unsafe {
            let q = qkv[base..].as_ptr();
            let (k, v) = (q.add(d).offset(k0 as isize * rs), q.add(2 * d));
            let v = v.offset(k0 as isize * rs);
            let q = q.offset(first as isize * rs);
            crate::fast::matmul::gemm_f32(
                (rows, keys, head_dim),
                (s.as_mut_ptr(), 1, keys as isize, false),
                (q, 1, rs),
                (k, rs, 1),
                0.0,
                scale,
                Parallelism::None,
            );
            // A plain loop: a closure would be compiled without this
            // function's target features.
            for (r, row) in s.chunks_exact_mut(keys).enumerate() {
                let i = first + r;
                let (lo, hi) = (i.saturating_sub(w) - k0, (i + w + 1).min(len) - k0);
                row[..lo].fill(0.0);
                row[hi..].fill(0.0);
                softmax_row(&mut row[lo..hi]);
            }
            let out = job.out.0.add((start + first) * d + h * head_dim);
            crate::fast::matmul::gemm_f32(
                (rows, head_dim, keys),
                (out, 1, d as isize, false),
                (s.as_ptr(), 1, keys as isize),
                (v, 1, rs),
                0.0,
                1.0,
                Parallelism::None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::fast::kernels::packed_attention;
    use crate::fast::kernels::tests::worst_attention_error;

    /// The band against `softmax(scale · Q Kᵀ + mask) V` in f64 with the
    /// window's mask, for windows narrower and wider than the sequences,
    /// a sequence shorter than one block and one spanning several.
    #[test]
    fn band_attention_matches_the_masked_definition() {
        let (heads, hd) = (2, 8);
        let d = heads * hd;
        let offsets = [0, 7, 7 + 100, 7 + 100 + 33];
        let tokens = offsets[3];
        let qkv: Vec<f32> = (0..tokens * 3 * d)
            .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 2.0)
            .collect();
        for w in [0, 1, 5, 16, 40, 200] {
            for bf16 in [false, true] {
                let mut ctx = vec![0f32; tokens * d];
                packed_attention(&qkv, &mut ctx, &offsets, (heads, hd), bf16, Some(w));
                let worst = worst_attention_error(&qkv, &ctx, &offsets, (heads, hd), Some(w));
                // bf16 products (where the CPU has them) round the inputs
                // of sequences the window covers whole.
                let tol = if bf16 { 1e-2 } else { 1e-5 };
                assert!(worst < tol, "window {w}, bf16 {bf16}: {worst}");
            }
        }
    }
}
