//! Self-attention over packed sequences with its backward pass: one task
//! per (sequence, head), each sequence attending over its own tokens only.
//! A sequence may end in padding rows that attend to its tokens but that
//! no row attends to (`keys`: the rows of each sequence that are keys), as
//! in a padded batch.
//!
//! The forward keeps each task's probabilities (before dropout) for the
//! backward; the dropout mask is recomputed from its key, not stored.

use rayon::prelude::*;

use super::products::{product, Compute};
use crate::fast::matmul::{product_bf16_serial, Strided};
use crate::model::ops::{softmax_backward, softmax_rows};
use crate::model::DropoutMask;

/// The attention's shape: heads and their width.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub count: usize,
    pub dim: usize,
}

impl Heads {
    fn width(&self) -> usize {
        self.count * self.dim
    }
}

/// Where each (sequence, head)'s `len × keys` probabilities start in the
/// probabilities buffer, and its total length. `keys`: the leading rows of
/// each sequence that are keys (empty: all of them).
pub(crate) fn probability_offsets(
    offsets: &[usize],
    keys: &[usize],
    heads: Heads,
) -> (Vec<usize>, usize) {
    let mut at = Vec::with_capacity(offsets.len().saturating_sub(1) * heads.count);
    let mut total = 0;
    for (s, w) in offsets.windows(2).enumerate() {
        let len = w[1] - w[0];
        for _ in 0..heads.count {
            at.push(total);
            total += len * key_count(keys, s, len);
        }
    }
    (at, total)
}

/// Sequence `s`'s keys: its first `keys[s]` rows, or all `len`.
fn key_count(keys: &[usize], s: usize, len: usize) -> usize {
    keys.get(s).map_or(len, |&k| k.min(len))
}

/// A pointer tasks share, each writing its own disjoint elements.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: every task writes only the rows of its sequence and the columns
// of its head (and its own probabilities block).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// One task: sequence `s` (rows `start..start + len`, the first `keys`
/// of them keys), head `h`, its probabilities at `p_at`.
#[derive(Clone, Copy)]
struct Task {
    s: usize,
    start: usize,
    len: usize,
    keys: usize,
    h: usize,
    p_at: usize,
}

fn tasks(offsets: &[usize], keys: &[usize], heads: Heads, p_offsets: &[usize]) -> Vec<Task> {
    let mut out = Vec::with_capacity(p_offsets.len());
    for (s, w) in offsets.windows(2).enumerate() {
        let len = w[1] - w[0];
        for h in 0..heads.count {
            out.push(Task {
                s,
                start: w[0],
                len,
                keys: key_count(keys, s, len),
                h,
                p_at: p_offsets[s * heads.count + h],
            });
        }
    }
    out
}

/// `dst[m, n] (+)= scale · a[m, k] · b[k, n]` (rows `dst_rs` apart) on
/// the calling thread, in `compute`: fp32 on the gemm crate, or bf16
/// operands with fp32 sums on the register tiles (`scale` applied to the
/// sums).
///
/// # Safety
/// `dst` must address `m` rows of `n` values, `dst_rs` apart, that no one
/// else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn head_product(
    compute: Compute,
    dims: (usize, usize, usize),
    (dst, dst_rs): (*mut f32, usize),
    accumulate: bool,
    a: Strided,
    b: Strided,
    scale: f32,
) {
    // SAFETY: the caller's contract for dst; a and b address the
    // operands' own slices (bf16 checks their extents, gemm trusts them).
    unsafe {
        match compute {
            Compute::F32 => product(
                dims,
                dst,
                dst_rs,
                accumulate,
                a.into(),
                b.into(),
                scale,
                false,
            ),
            Compute::Bf16 => product_bf16_serial(dims, a, b, (dst, dst_rs), accumulate, scale),
        }
    }
}

/// `ctx = dropout(softmax(Q Kᵀ / √d)) V` per (sequence, head) from the
/// fused `qkv` rows `[T, 3·D]`; `probs` receives the softmax output. The
/// two products run in `compute`; the softmax in fp32.
pub(crate) fn forward(
    qkv: &[f32],
    ctx: &mut [f32],
    probs: &mut [f32],
    (offsets, keys): (&[usize], &[usize]),
    (heads, compute): (Heads, Compute),
    dropout: Option<&DropoutMask>,
) {
    let d = heads.width();
    let tokens = offsets.last().copied().unwrap_or(0);
    assert_eq!(
        qkv.len(),
        tokens * 3 * d,
        "attention: qkv is not [{tokens}, {}]",
        3 * d
    );
    assert_eq!(
        ctx.len(),
        tokens * d,
        "attention: ctx is not [{tokens}, {d}]"
    );
    let (p_offsets, total) = probability_offsets(offsets, keys, heads);
    assert_eq!(probs.len(), total, "attention: probabilities buffer");
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let (ctx_out, p_out) = (Shared(ctx.as_mut_ptr()), Shared(probs.as_mut_ptr()));
    tasks(offsets, keys, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Vec::new, |dropped: &mut Vec<f32>, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let q = &qkv[t.start * 3 * d + t.h * hd..];
            let k = &q[d..];
            let v = &q[2 * d..];
            // SAFETY: the task's probabilities block is its own; Q, K, V of
            // its rows lie inside qkv (asserted lengths); its ctx rows and
            // head columns are written by no other task.
            unsafe {
                let p = std::slice::from_raw_parts_mut(p_out.at(t.p_at), len * nk);
                head_product(
                    compute,
                    (len, nk, hd),
                    (p.as_mut_ptr(), nk),
                    false,
                    Strided::rows(q, 3 * d),
                    Strided::transposed(k, 3 * d),
                    scale,
                );
                softmax_rows(p, nk.max(1));
                let used: &[f32] = match dropout {
                    Some(mask) => {
                        dropped.clear();
                        dropped.extend_from_slice(p);
                        for (i, row) in dropped.chunks_exact_mut(nk.max(1)).enumerate() {
                            mask.apply_row(mask.row_key(&[t.s, t.h, i]), row);
                        }
                        dropped
                    }
                    None => p,
                };
                head_product(
                    compute,
                    (len, hd, nk),
                    (ctx_out.at(t.start * d + t.h * hd), d),
                    false,
                    Strided::rows(used, nk),
                    Strided::rows(v, 3 * d),
                    1.0,
                );
            }
        });
}

/// Per-task buffers of the backward pass.
#[derive(Default)]
struct Scratch {
    dropped: Vec<f32>,
    dp: Vec<f32>,
    ds: Vec<f32>,
}

/// The backward of [`forward`]: `dqkv [T, 3·D]` from `dctx [T, D]`, the
/// saved probabilities and the same dropout mask.
pub(crate) fn backward(
    qkv: &[f32],
    probs: &[f32],
    dctx: &[f32],
    dqkv: &mut [f32],
    (offsets, keys): (&[usize], &[usize]),
    (heads, compute): (Heads, Compute),
    dropout: Option<&DropoutMask>,
) {
    let d = heads.width();
    let tokens = offsets.last().copied().unwrap_or(0);
    assert_eq!(qkv.len(), tokens * 3 * d, "attention backward: qkv");
    assert_eq!(dqkv.len(), tokens * 3 * d, "attention backward: dqkv");
    assert_eq!(dctx.len(), tokens * d, "attention backward: dctx");
    let (p_offsets, total) = probability_offsets(offsets, keys, heads);
    assert_eq!(probs.len(), total, "attention backward: probabilities");
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let out = Shared(dqkv.as_mut_ptr());
    tasks(offsets, keys, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Scratch::default, |sc, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let p = &probs[t.p_at..t.p_at + len * nk];
            let q = &qkv[t.start * 3 * d + t.h * hd..];
            let k = &q[d..];
            let v = &q[2 * d..];
            let dc = &dctx[t.start * d + t.h * hd..];
            let mask_keys = |i: usize| dropout.map(|m| (m, m.row_key(&[t.s, t.h, i])));
            // The probabilities the forward multiplied V by.
            let used: &[f32] = match dropout {
                Some(_) => {
                    sc.dropped.clear();
                    sc.dropped.extend_from_slice(p);
                    for (i, row) in sc.dropped.chunks_exact_mut(nk.max(1)).enumerate() {
                        if let Some((m, key)) = mask_keys(i) {
                            m.apply_row(key, row);
                        }
                    }
                    &sc.dropped
                }
                None => p,
            };
            sc.dp.resize(len * nk, 0.0);
            sc.ds.resize(len * nk, 0.0);
            let base = t.start * 3 * d + t.h * hd;
            // SAFETY: the operands lie inside qkv / dctx / the scratch
            // (asserted lengths); the task's rows and head columns of dqkv
            // are written by no other task.
            unsafe {
                // dV = usedᵀ · dctx (key rows only; padding rows are no keys)
                head_product(
                    compute,
                    (nk, hd, len),
                    (out.at(base + 2 * d), 3 * d),
                    false,
                    Strided::transposed(used, nk),
                    Strided::rows(dc, d),
                    1.0,
                );
                // d(used) = dctx · Vᵀ, then through the mask.
                head_product(
                    compute,
                    (len, nk, hd),
                    (sc.dp.as_mut_ptr(), nk),
                    false,
                    Strided::rows(dc, d),
                    Strided::transposed(v, 3 * d),
                    1.0,
                );
            }
            for (i, row) in sc.dp.chunks_exact_mut(nk.max(1)).enumerate() {
                if let Some((m, key)) = mask_keys(i) {
                    m.apply_row(key, row);
                }
            }
            softmax_backward(p, &sc.dp, &mut sc.ds, nk.max(1));
            // SAFETY: as above.
            unsafe {
                // dQ = scale · dS · K
                head_product(
                    compute,
                    (len, hd, nk),
                    (out.at(base), 3 * d),
                    false,
                    Strided::rows(&sc.ds, nk),
                    Strided::rows(k, 3 * d),
                    scale,
                );
                // dK = scale · dSᵀ · Q (key rows only)
                head_product(
                    compute,
                    (nk, hd, len),
                    (out.at(base + d), 3 * d),
                    false,
                    Strided::transposed(&sc.ds, nk),
                    Strided::rows(q, 3 * d),
                    scale,
                );
            }
        });
}
