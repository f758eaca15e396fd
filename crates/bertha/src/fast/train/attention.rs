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
use super::rows::{Rows, Selection};
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

/// How the rows are packed: each sequence's rows, which of them are keys
/// and which are queries.
#[derive(Clone, Copy)]
pub(crate) struct Packing<'a> {
    /// Sequence `s`'s rows are `offsets[s]..offsets[s + 1]`.
    pub offsets: &'a [usize],
    /// The leading rows of each sequence that are keys (empty: all).
    pub keys: &'a [usize],
    /// The query rows (`None`: every row).
    pub queries: Option<&'a Selection>,
}

impl<'a> Packing<'a> {
    /// A layer's packing: its queries are `outputs` in the last layer
    /// (`last`), every row elsewhere.
    pub fn of_layer(
        offsets: &'a [usize],
        keys: &'a [usize],
        outputs: Option<&'a Selection>,
        last: bool,
    ) -> Self {
        Self {
            offsets,
            keys,
            queries: outputs.filter(|_| last),
        }
    }

    fn sequences(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Sequence `s`'s query rows: where they start in Q, and how many.
    fn queries_of(&self, s: usize) -> (usize, usize) {
        match self.queries {
            Some(sel) => sel.of_sequence(s),
            None => (self.offsets[s], self.offsets[s + 1] - self.offsets[s]),
        }
    }

    /// Query row `i` of sequence `s`'s position in it (its dropout key).
    fn position(&self, s: usize, i: usize) -> usize {
        match self.queries {
            Some(sel) => sel.key(sel.of_sequence(s).0 + i)[1],
            None => i,
        }
    }

    /// Sequence `s`'s keys: its first `keys[s]` rows, or all of them.
    fn key_count(&self, s: usize) -> usize {
        let len = self.offsets[s + 1] - self.offsets[s];
        self.keys.get(s).map_or(len, |&k| k.min(len))
    }

    /// The query rows: every packed row, or the selection.
    pub fn rows(&self) -> Rows<'a> {
        match self.queries {
            Some(sel) => Rows::Selected(sel),
            None => Rows::Packed(self.offsets),
        }
    }
}

/// Where each (sequence, head)'s `queries × keys` probabilities start in
/// the probabilities buffer, and its total length.
pub(crate) fn probability_offsets(packing: Packing, heads: Heads) -> (Vec<usize>, usize) {
    let mut at = Vec::with_capacity(packing.sequences() * heads.count);
    let mut total = 0;
    for s in 0..packing.sequences() {
        let len = packing.queries_of(s).1;
        for _ in 0..heads.count {
            at.push(total);
            total += len * packing.key_count(s);
        }
    }
    (at, total)
}

/// Q, K and V rows: Q's rows `q_stride` apart, K at the start of `kv`'s
/// rows and V `width` values after it: the fused `[T, 3·D]` rows, or a
/// selection's Q `[M, D]` beside every row's K and V `[T, 2·D]`.
#[derive(Clone, Copy)]
pub(crate) struct Qkv<'a> {
    q: &'a [f32],
    q_stride: usize,
    kv: &'a [f32],
    kv_stride: usize,
}

impl<'a> Qkv<'a> {
    /// The fused rows `[T, 3·D]`.
    pub fn fused(qkv: &'a [f32], d: usize) -> Self {
        Self {
            q: qkv,
            q_stride: 3 * d,
            kv: qkv.get(d..).unwrap_or(&[]),
            kv_stride: 3 * d,
        }
    }

    /// Q `[M, D]` and K, V `[T, 2·D]`.
    pub fn split(q: &'a [f32], kv: &'a [f32], d: usize) -> Self {
        Self {
            q,
            q_stride: d,
            kv,
            kv_stride: 2 * d,
        }
    }

    /// Whether Q covers `q_rows` rows and K, V `kv_rows`, of width `d`.
    fn covers(&self, q_rows: usize, kv_rows: usize, d: usize) -> bool {
        fits(self.q.len(), q_rows, self.q_stride, d)
            && fits(self.kv.len(), kv_rows, self.kv_stride, 2 * d)
    }
}

/// The gradients' [`Qkv`]: where dQ, dK and dV are written.
pub(crate) struct QkvGrad<'a> {
    q: Shared,
    q_stride: usize,
    q_len: usize,
    kv: Shared,
    kv_stride: usize,
    kv_len: usize,
    _rows: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> QkvGrad<'a> {
    /// Into the fused rows `[T, 3·D]`.
    pub fn fused(dqkv: &'a mut [f32], d: usize) -> Self {
        let (ptr, len) = (dqkv.as_mut_ptr(), dqkv.len());
        Self {
            q: Shared(ptr),
            q_stride: 3 * d,
            q_len: len,
            kv: Shared(ptr.wrapping_add(d)),
            kv_stride: 3 * d,
            kv_len: len.saturating_sub(d),
            _rows: std::marker::PhantomData,
        }
    }

    /// Into dQ `[M, D]` and dK, dV `[T, 2·D]`.
    pub fn split(dq: &'a mut [f32], dkv: &'a mut [f32], d: usize) -> Self {
        Self {
            q: Shared(dq.as_mut_ptr()),
            q_stride: d,
            q_len: dq.len(),
            kv: Shared(dkv.as_mut_ptr()),
            kv_stride: 2 * d,
            kv_len: dkv.len(),
            _rows: std::marker::PhantomData,
        }
    }

    fn covers(&self, q_rows: usize, kv_rows: usize, d: usize) -> bool {
        fits(self.q_len, q_rows, self.q_stride, d)
            && fits(self.kv_len, kv_rows, self.kv_stride, 2 * d)
    }
}

/// Whether `len` values hold `rows` rows of `width`, `stride` apart.
fn fits(len: usize, rows: usize, stride: usize, width: usize) -> bool {
    rows == 0 || len >= (rows - 1) * stride + width
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

/// One task: sequence `s` (its queries `q_start..q_start + len` of Q,
/// its rows from `start` in K and V, the first `keys` of them keys), head
/// `h`, its probabilities at `p_at`. Sequences without queries have none.
#[derive(Clone, Copy)]
struct Task {
    s: usize,
    q_start: usize,
    len: usize,
    start: usize,
    keys: usize,
    h: usize,
    p_at: usize,
}

fn tasks(packing: Packing, heads: Heads, p_offsets: &[usize]) -> Vec<Task> {
    let mut out = Vec::with_capacity(p_offsets.len());
    for s in 0..packing.sequences() {
        let (q_start, len) = packing.queries_of(s);
        if len == 0 {
            continue;
        }
        for h in 0..heads.count {
            out.push(Task {
                s,
                q_start,
                len,
                start: packing.offsets[s],
                keys: packing.key_count(s),
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
/// `qkv` rows, `ctx` on the query rows; `probs` receives the softmax
/// output. The two products run in `compute`; the softmax in fp32.
pub(crate) fn forward(
    qkv: Qkv,
    ctx: &mut [f32],
    probs: &mut [f32],
    packing: Packing,
    (heads, compute): (Heads, Compute),
    dropout: Option<&DropoutMask>,
) {
    let d = heads.width();
    let tokens = packing.offsets.last().copied().unwrap_or(0);
    let queries = packing.rows().count();
    assert!(
        qkv.covers(queries, tokens, d),
        "attention: Q, K, V do not cover {queries} queries and {tokens} keys"
    );
    assert_eq!(
        ctx.len(),
        queries * d,
        "attention: ctx is not [{queries}, {d}]"
    );
    let (p_offsets, total) = probability_offsets(packing, heads);
    assert_eq!(probs.len(), total, "attention: probabilities buffer");
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let (ctx_out, p_out) = (Shared(ctx.as_mut_ptr()), Shared(probs.as_mut_ptr()));
    tasks(packing, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Vec::new, |dropped: &mut Vec<f32>, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let q = &qkv.q[t.q_start * qkv.q_stride + t.h * hd..];
            let k = &qkv.kv[t.start * qkv.kv_stride + t.h * hd..];
            let v = &k[d..];
            // SAFETY: the task's probabilities block is its own; Q, K, V of
            // its rows lie inside qkv (asserted extents); its ctx rows and
            // head columns are written by no other task.
            unsafe {
                let p = std::slice::from_raw_parts_mut(p_out.at(t.p_at), len * nk);
                head_product(
                    compute,
                    (len, nk, hd),
                    (p.as_mut_ptr(), nk),
                    false,
                    Strided::rows(q, qkv.q_stride),
                    Strided::transposed(k, qkv.kv_stride),
                    scale,
                );
                softmax_rows(p, nk.max(1));
                let used: &[f32] = match dropout {
                    Some(mask) => {
                        dropped.clear();
                        dropped.extend_from_slice(p);
                        for (i, row) in dropped.chunks_exact_mut(nk.max(1)).enumerate() {
                            let key = [t.s, t.h, packing.position(t.s, i)];
                            mask.apply_row(mask.row_key(&key), row);
                        }
                        dropped
                    }
                    None => p,
                };
                head_product(
                    compute,
                    (len, hd, nk),
                    (ctx_out.at(t.q_start * d + t.h * hd), d),
                    false,
                    Strided::rows(used, nk),
                    Strided::rows(v, qkv.kv_stride),
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

/// The backward of [`forward`]: dQ, dK and dV into `dqkv` from `dctx`
/// (the query rows), the saved probabilities and the same dropout mask.
/// dK and dV are written on key rows only, and not at all for sequences
/// without queries.
pub(crate) fn backward(
    qkv: Qkv,
    probs: &[f32],
    dctx: &[f32],
    dqkv: QkvGrad,
    packing: Packing,
    (heads, compute): (Heads, Compute),
    dropout: Option<&DropoutMask>,
) {
    let d = heads.width();
    let tokens = packing.offsets.last().copied().unwrap_or(0);
    let queries = packing.rows().count();
    assert!(qkv.covers(queries, tokens, d), "attention backward: qkv");
    assert!(dqkv.covers(queries, tokens, d), "attention backward: dqkv");
    assert_eq!(dctx.len(), queries * d, "attention backward: dctx");
    let (p_offsets, total) = probability_offsets(packing, heads);
    assert_eq!(probs.len(), total, "attention backward: probabilities");
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let out = &dqkv;
    tasks(packing, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Scratch::default, |sc, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let p = &probs[t.p_at..t.p_at + len * nk];
            let q = &qkv.q[t.q_start * qkv.q_stride + t.h * hd..];
            let k = &qkv.kv[t.start * qkv.kv_stride + t.h * hd..];
            let v = &k[d..];
            let dc = &dctx[t.q_start * d + t.h * hd..];
            let mask_keys =
                |i: usize| dropout.map(|m| (m, m.row_key(&[t.s, t.h, packing.position(t.s, i)])));
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
            let dq_at = out.q.at(t.q_start * out.q_stride + t.h * hd);
            let dk_at = out.kv.at(t.start * out.kv_stride + t.h * hd);
            let dv_at = dk_at.wrapping_add(d);
            // SAFETY: the operands lie inside qkv / dctx / the scratch
            // (asserted extents); the task's rows and head columns of dQ,
            // dK and dV are written by no other task.
            unsafe {
                // dV = usedᵀ · dctx (key rows only; padding rows are no keys)
                head_product(
                    compute,
                    (nk, hd, len),
                    (dv_at, out.kv_stride),
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
                    Strided::transposed(v, qkv.kv_stride),
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
                    (dq_at, out.q_stride),
                    false,
                    Strided::rows(&sc.ds, nk),
                    Strided::rows(k, qkv.kv_stride),
                    scale,
                );
                // dK = scale · dSᵀ · Q (key rows only)
                head_product(
                    compute,
                    (nk, hd, len),
                    (dk_at, out.kv_stride),
                    false,
                    Strided::transposed(&sc.ds, nk),
                    Strided::rows(q, qkv.q_stride),
                    scale,
                );
            }
        });
}
