//! Self-attention over packed sequences with its backward pass: one task
//! per (sequence, head), each sequence attending over its own tokens only.
//! A sequence may end in padding rows that attend to its tokens but that
//! no row attends to (`keys`: the rows of each sequence that are keys), as
//! in a padded batch.
//!
//! The forward keeps each task's probabilities (before dropout) for the
//! backward, and the dropout mask it draws as bits (one per probability),
//! which the backward applies again without drawing it anew.

use rayon::prelude::*;

use super::products::{product, Compute};
use super::rows::{Rows, Selection};
use crate::fast::matmul::{
    as_words, interleave_transposed, pack_row_pairs, pack_transposed_pairs, product_bf16_serial,
    product_pairs_serial, product_pairs_serial_to_pairs, round_rows_serial, LeftPairs, Strided,
};
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
    /// A sliding-window layer's half window: the query at position `i`
    /// sees the keys at `|i − j| ≤ w` only (`None`: every key).
    pub window: Option<usize>,
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
            window: None,
        }
    }

    /// This packing under a sliding window of half-width `window`.
    pub fn windowed(self, window: Option<usize>) -> Self {
        Self { window, ..self }
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

/// The words (32 keep bits each) of the dropout mask of every (sequence,
/// head)'s `queries × keys` probabilities, each query's row of keys in
/// whole words: the size of [`forward`]'s and [`backward`]'s `bits`.
pub(crate) fn mask_words(packing: Packing, heads: Heads) -> usize {
    (0..packing.sequences())
        .map(|s| packing.queries_of(s).1 * packing.key_count(s).div_ceil(32) * heads.count)
        .sum()
}

/// Q, K and V rows: Q's rows `q_stride` apart, K at the start of `kv`'s
/// rows and V `width` values after it: the fused `[T, 3·D]` rows, or a
/// selection's Q `[M, D]` beside every row's K and V `[T, 2·D]`. In fp32,
/// or (`pairs`) as the bf16 pairs the QKV product's tiles stored (the
/// words of fp32 storage; strides and offsets in words): in bf16 every use
/// of Q, K and V is a product's operand, which rounds them anyway.
#[derive(Clone, Copy)]
pub(crate) struct Qkv<'a> {
    q: &'a [f32],
    q_stride: usize,
    kv: &'a [f32],
    kv_stride: usize,
    pairs: bool,
}

impl<'a> Qkv<'a> {
    /// The fused rows `[T, 3·D]`, in fp32 or (`pairs`) as bf16 pairs
    /// `[T, 3·D / 2]` (`D` even).
    pub fn fused(qkv: &'a [f32], d: usize, pairs: bool) -> Self {
        let u = if pairs { d / 2 } else { d };
        Self {
            q: qkv,
            q_stride: 3 * u,
            kv: qkv.get(u..).unwrap_or(&[]),
            kv_stride: 3 * u,
            pairs,
        }
    }

    /// Q `[M, D]` and K, V `[T, 2·D]`, in fp32 or (`pairs`) as bf16 pairs.
    pub fn split(q: &'a [f32], kv: &'a [f32], d: usize, pairs: bool) -> Self {
        let u = if pairs { d / 2 } else { d };
        Self {
            q,
            q_stride: u,
            kv,
            kv_stride: 2 * u,
            pairs,
        }
    }

    /// Whether Q covers `q_rows` rows and K, V `kv_rows`, of width `d`.
    fn covers(&self, q_rows: usize, kv_rows: usize, d: usize) -> bool {
        let u = if self.pairs { d / 2 } else { d };
        fits(self.q.len(), q_rows, self.q_stride, u)
            && fits(self.kv.len(), kv_rows, self.kv_stride, 2 * u)
    }
}

/// The gradients' [`Qkv`]: where dQ, dK and dV are written.
pub(crate) struct QkvGrad<'a> {
    q: Shared<f32>,
    q_stride: usize,
    q_len: usize,
    kv: Shared<f32>,
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
struct Shared<T>(*mut T);
// SAFETY: every task writes only the rows of its sequence and the columns
// of its head (and its own probabilities and dropout bits blocks).
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

// Not derived: a derive would ask `T: Copy` of the pointee.
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}

impl<T> Shared<T> {
    fn at(self, offset: usize) -> *mut T {
        self.0.wrapping_add(offset)
    }
}

impl Shared<u32> {
    /// Task `t`'s dropout bits.
    ///
    /// # Safety
    /// The buffer must hold [`mask_words`] words, and no one else may use
    /// the task's words while the slice (of any lifetime the caller picks)
    /// lives.
    unsafe fn task_bits<'a>(self, t: Task) -> &'a mut [u32] {
        // SAFETY: the caller's contract; the task's block lies inside.
        unsafe { std::slice::from_raw_parts_mut(self.at(t.bits_at), t.len * t.row_words()) }
    }
}

/// Task `t`'s scores `p` (`len` rows of `keys`) outside the packing's
/// window set to `f32::MIN`, which the softmax turns into 0, as the candle
/// path's mask chooses `f32::MIN` there. The probabilities outside the
/// window are then 0, so the backward needs no mask of its own.
fn mask_window(p: &mut [f32], t: Task, packing: Packing) {
    let Some(w) = packing.window else {
        return;
    };
    for (i, row) in p.chunks_exact_mut(t.keys.max(1)).take(t.len).enumerate() {
        let (at, keys) = (packing.position(t.s, i), row.len());
        let lo = at.saturating_sub(w).min(keys);
        let hi = at.saturating_add(w + 1).clamp(lo, keys);
        row[..lo].fill(f32::MIN);
        row[hi..].fill(f32::MIN);
    }
}

/// Draws task `t`'s dropout mask into its `bits`, a row of words per query
/// (keyed as the candle modules key row `[s, h, position]`).
fn draw_mask(mask: &DropoutMask, bits: &mut [u32], t: Task, packing: Packing) {
    let w = t.row_words();
    for (i, words) in bits.chunks_exact_mut(w.max(1)).take(t.len).enumerate() {
        let key = [t.s, t.h, packing.position(t.s, i)];
        mask.row_bits(mask.row_key(&key), words);
    }
}

/// Task `t`'s probabilities `p` (`len` rows of `keys`) as the forward
/// multiplied V by: through the dropout mask's bits into `into`, or as
/// they are without dropout.
fn dropped<'a>(
    dropout: Option<(&DropoutMask, &[u32])>,
    t: Task,
    p: &'a [f32],
    into: &'a mut Vec<f32>,
) -> &'a [f32] {
    let Some((mask, bits)) = dropout else {
        return p;
    };
    into.resize(p.len(), 0.0);
    let (w, nk) = (t.row_words(), t.keys.max(1));
    for ((row, out), words) in p
        .chunks_exact(nk)
        .zip(into.chunks_exact_mut(nk))
        .zip(bits.chunks(w.max(1)))
    {
        mask.apply_bits_into(words, row, out);
    }
    into
}

/// `x` (task `t`'s `len` rows of `keys`) through its dropout mask's bits,
/// in place.
fn drop_in_place(dropout: Option<(&DropoutMask, &[u32])>, t: Task, x: &mut [f32]) {
    if let Some((mask, bits)) = dropout {
        let (w, nk) = (t.row_words(), t.keys.max(1));
        for (row, words) in x.chunks_exact_mut(nk).zip(bits.chunks(w.max(1))) {
            mask.apply_bits_in_place(words, row);
        }
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
    /// Its dropout mask's words (`len` rows of `⌈keys / 32⌉`), in the
    /// order of [`mask_words`].
    bits_at: usize,
}

impl Task {
    /// The words of one query's row of dropout bits.
    fn row_words(&self) -> usize {
        self.keys.div_ceil(32)
    }
}

fn tasks(packing: Packing, heads: Heads, p_offsets: &[usize]) -> Vec<Task> {
    let (mut out, mut bits_at) = (Vec::with_capacity(p_offsets.len()), 0);
    for s in 0..packing.sequences() {
        let (q_start, len) = packing.queries_of(s);
        if len == 0 {
            continue;
        }
        for h in 0..heads.count {
            let task = Task {
                s,
                q_start,
                len,
                start: packing.offsets[s],
                keys: packing.key_count(s),
                h,
                p_at: p_offsets[s * heads.count + h],
                bits_at,
            };
            bits_at += len * task.row_words();
            out.push(task);
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
/// `qkv` rows, `ctx` on the query rows (as bf16 pairs when `qkv` holds
/// pairs); `probs` receives the softmax output and, with dropout, the
/// mask's `bits` (its [`mask_words`] words) the keep bits drawn, for the
/// backward. The two products run in `compute`; the softmax in fp32.
pub(crate) fn forward(
    qkv: Qkv,
    ctx: &mut [f32],
    probs: &mut [f32],
    packing: Packing,
    (heads, compute): (Heads, Compute),
    dropout: Option<(&DropoutMask, &mut [u32])>,
) {
    let d = heads.width();
    let tokens = packing.offsets.last().copied().unwrap_or(0);
    let queries = packing.rows().count();
    assert!(
        qkv.covers(queries, tokens, d),
        "attention: Q, K, V do not cover {queries} queries and {tokens} keys"
    );
    // With Q, K and V as pairs, ctx is stored as pairs too (the words of
    // fp32 storage): only the attention output's products read it.
    let width = if qkv.pairs { d / 2 } else { d };
    assert_eq!(
        ctx.len(),
        queries * width,
        "attention: ctx is not [{queries}, {width}]"
    );
    let (p_offsets, total) = probability_offsets(packing, heads);
    assert_eq!(probs.len(), total, "attention: probabilities buffer");
    let dropout = dropout.map(|(mask, bits)| {
        let words = mask_words(packing, heads);
        assert_eq!(bits.len(), words, "attention: dropout bits");
        (mask, Shared(bits.as_mut_ptr()))
    });
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let (ctx_out, p_out) = (Shared(ctx.as_mut_ptr()), Shared(probs.as_mut_ptr()));
    if qkv.pairs {
        assert!(
            compute == Compute::Bf16 && heads.dim % 2 == 0,
            "attention: bf16 pairs need bf16 products and an even head width"
        );
        let run = |sc: &mut PairScratch, t: Task| {
            // SAFETY: the task's probabilities and bits blocks are its own
            // (offsets from probability_offsets and tasks, totals
            // asserted); its ctx rows and head columns are written by no
            // other task.
            unsafe {
                let p = std::slice::from_raw_parts_mut(p_out.at(t.p_at), t.len * t.keys);
                let ctx = ctx_out.at(t.q_start * width + t.h * heads.dim / 2).cast();
                let dropout = dropout.map(|(mask, bits)| (mask, bits.task_bits(t)));
                forward_pairs(sc, qkv, (t, heads, packing), p, ctx, dropout)
            }
        };
        let each = tasks(packing, heads, &p_offsets).into_par_iter();
        return each.for_each_init(PairScratch::default, run);
    }
    tasks(packing, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Vec::new, |dropped_buf: &mut Vec<f32>, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let q = &qkv.q[t.q_start * qkv.q_stride + t.h * hd..];
            let k = &qkv.kv[t.start * qkv.kv_stride + t.h * hd..];
            let v = &k[d..];
            // SAFETY: the task's probabilities and bits blocks are its own;
            // Q, K, V of its rows lie inside qkv (asserted extents); its ctx
            // rows and head columns are written by no other task.
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
                mask_window(p, t, packing);
                softmax_rows(p, nk.max(1));
                let drawn = dropout.map(|(mask, bits)| {
                    let bits = bits.task_bits(t);
                    draw_mask(mask, bits, t, packing);
                    (mask, &*bits)
                });
                let used = dropped(drawn, t, p, dropped_buf);
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
/// (the query rows; bf16 pairs when `qkv` holds pairs), the saved
/// probabilities and the dropout mask with the bits the forward drew.
/// dK and dV are written on key rows only, and not at all for sequences
/// without queries.
pub(crate) fn backward(
    qkv: Qkv,
    probs: &[f32],
    dctx: &[f32],
    dqkv: QkvGrad,
    packing: Packing,
    (heads, compute): (Heads, Compute),
    dropout: Option<(&DropoutMask, &[u32])>,
) {
    let d = heads.width();
    let tokens = packing.offsets.last().copied().unwrap_or(0);
    let queries = packing.rows().count();
    assert!(qkv.covers(queries, tokens, d), "attention backward: qkv");
    if let Some((_, bits)) = dropout {
        let words = mask_words(packing, heads);
        assert_eq!(bits.len(), words, "attention backward: dropout bits");
    }
    // A task's bits: its rows' words.
    let bits_of = |t: &Task| dropout.map(|(m, b)| (m, &b[t.bits_at..][..t.len * t.row_words()]));
    assert!(dqkv.covers(queries, tokens, d), "attention backward: dqkv");
    // dctx as pairs beside Q, K and V as pairs (see forward).
    let width = if qkv.pairs { d / 2 } else { d };
    assert_eq!(dctx.len(), queries * width, "attention backward: dctx");
    let (p_offsets, total) = probability_offsets(packing, heads);
    assert_eq!(probs.len(), total, "attention backward: probabilities");
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let out = &dqkv;
    if qkv.pairs {
        assert!(
            compute == Compute::Bf16 && heads.dim % 2 == 0,
            "attention backward: bf16 pairs need bf16 products and an even head width"
        );
        let run = |sc: &mut PairScratch, t: Task| {
            let p = &probs[t.p_at..t.p_at + t.len * t.keys];
            let dc = &as_words(dctx)[t.q_start * width + t.h * heads.dim / 2..];
            let dropout = bits_of(&t);
            // SAFETY: the task's rows and head columns of dQ, dK and dV
            // are written by no other task (extents asserted above).
            unsafe { backward_pairs(sc, qkv, (t, heads), (p, dc), out, dropout) }
        };
        let each = tasks(packing, heads, &p_offsets).into_par_iter();
        return each.for_each_init(PairScratch::default, run);
    }
    tasks(packing, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Scratch::default, |sc, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let p = &probs[t.p_at..t.p_at + len * nk];
            let q = &qkv.q[t.q_start * qkv.q_stride + t.h * hd..];
            let k = &qkv.kv[t.start * qkv.kv_stride + t.h * hd..];
            let v = &k[d..];
            let dc = &dctx[t.q_start * d + t.h * hd..];
            let dropout = bits_of(&t);
            let used = dropped(dropout, t, p, &mut sc.dropped);
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
            drop_in_place(dropout, t, &mut sc.dp);
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

/// Per-task buffers of the bf16 pairs path.
#[derive(Default)]
struct PairScratch {
    panels: Vec<u16>,
    left: Vec<u32>,
    dropped: Vec<f32>,
    dp: Vec<f32>,
    ds: Vec<f32>,
}

/// The rows of one head of Q, K and V as pairs: (words, stride) each.
struct HeadPairs<'a> {
    q: (&'a [u32], usize),
    k: (&'a [u32], usize),
    v: (&'a [u32], usize),
}

fn head_pairs<'a>(qkv: Qkv<'a>, t: Task, heads: Heads) -> HeadPairs<'a> {
    let (hw, d2) = (heads.dim / 2, heads.width() / 2);
    let (q, kv) = (as_words(qkv.q), as_words(qkv.kv));
    let k_at = t.start * qkv.kv_stride + t.h * hw;
    HeadPairs {
        q: (&q[t.q_start * qkv.q_stride + t.h * hw..], qkv.q_stride),
        k: (&kv[k_at..], qkv.kv_stride),
        v: (kv.get(k_at + d2..).unwrap_or(&[]), qkv.kv_stride),
    }
}

/// One task of [`forward`] on bf16 pairs: the products read Q, K and V as
/// stored (K's and V's panels moved as words, no rounding); the
/// probabilities after dropout are rounded once, as the next product's
/// operand. The bits of the fp32-operand path.
///
/// # Safety
/// `ctx` must address the task's `len` rows (`D / 2` words apart) of its
/// head's pairs, written by no one else meanwhile.
unsafe fn forward_pairs(
    sc: &mut PairScratch,
    qkv: Qkv,
    (t, heads, packing): (Task, Heads, Packing),
    p: &mut [f32],
    ctx: *mut u32,
    dropout: Option<(&DropoutMask, &mut [u32])>,
) {
    let (len, hd, nk) = (t.len, heads.dim, t.keys);
    let (hw, nk2, d2) = (hd / 2, nk.div_ceil(2), heads.width() / 2);
    let scale = 1.0 / (hd as f32).sqrt();
    let h = head_pairs(qkv, t, heads);
    pack_transposed_pairs(h.k.0, h.k.1, (nk, hw), &mut sc.panels);
    let q = LeftPairs::Rows {
        words: h.q.0,
        stride: h.q.1,
    };
    // SAFETY: p is the task's len × nk block; the operands' extents are
    // checked by the product.
    unsafe { product_pairs_serial(q, (len, nk, hw), &sc.panels, (p.as_mut_ptr(), nk), scale) };
    mask_window(p, t, packing);
    softmax_rows(p, nk.max(1));
    let drawn = dropout.map(|(mask, bits)| {
        draw_mask(mask, bits, t, packing);
        (mask, &*bits)
    });
    let used = dropped(drawn, t, p, &mut sc.dropped);
    round_rows_serial(used, (len, nk), &mut sc.left);
    pack_row_pairs(h.v.0, h.v.1, (nk, hd), &mut sc.panels);
    let used = LeftPairs::Rows {
        words: &sc.left,
        stride: nk2,
    };
    // SAFETY: the caller's contract for ctx.
    unsafe { product_pairs_serial_to_pairs(used, (len, hd, nk2), &sc.panels, (ctx, d2)) };
}

/// One task of [`backward`] on bf16 pairs (see [`forward_pairs`]), with
/// the task's dropout bits.
///
/// # Safety
/// The task's rows and head columns of `out` must be written by no one
/// else meanwhile.
unsafe fn backward_pairs(
    sc: &mut PairScratch,
    qkv: Qkv,
    (t, heads): (Task, Heads),
    (p, dc): (&[f32], &[u32]),
    out: &QkvGrad,
    dropout: Option<(&DropoutMask, &[u32])>,
) {
    let (len, hd, nk) = (t.len, heads.dim, t.keys);
    let (hw, nk2, len2, d) = (hd / 2, nk.div_ceil(2), len.div_ceil(2), heads.width());
    let d2 = d / 2;
    let scale = 1.0 / (hd as f32).sqrt();
    let h = head_pairs(qkv, t, heads);
    let dq_at = out.q.at(t.q_start * out.q_stride + t.h * hd);
    let dk_at = out.kv.at(t.start * out.kv_stride + t.h * hd);
    let dv_at = dk_at.wrapping_add(d);
    // The probabilities the forward multiplied V by.
    let used = dropped(dropout, t, p, &mut sc.dropped);
    // SAFETY (all products): the destinations are the task's own rows and
    // head columns (the caller's contract) or its scratch; the operands'
    // extents are checked by the products.
    // dV = usedᵀ · dctx (key rows only; padding rows are no keys)
    interleave_transposed(used, nk, (len, nk), &mut sc.left);
    pack_row_pairs(dc, d2, (len, hd), &mut sc.panels);
    let used_t = LeftPairs::Interleaved(&sc.left);
    unsafe {
        product_pairs_serial(
            used_t,
            (nk, hd, len2),
            &sc.panels,
            (dv_at, out.kv_stride),
            1.0,
        )
    };
    // d(used) = dctx · Vᵀ, then through the mask.
    pack_transposed_pairs(h.v.0, h.v.1, (nk, hw), &mut sc.panels);
    sc.dp.resize(len * nk, 0.0);
    let dc_pairs = LeftPairs::Rows {
        words: dc,
        stride: d2,
    };
    unsafe {
        product_pairs_serial(
            dc_pairs,
            (len, nk, hw),
            &sc.panels,
            (sc.dp.as_mut_ptr(), nk),
            1.0,
        )
    };
    drop_in_place(dropout, t, &mut sc.dp);
    sc.ds.resize(len * nk, 0.0);
    softmax_backward(p, &sc.dp, &mut sc.ds, nk.max(1));
    // dQ = scale · dS · K
    round_rows_serial(&sc.ds, (len, nk), &mut sc.left);
    pack_row_pairs(h.k.0, h.k.1, (nk, hd), &mut sc.panels);
    let ds = LeftPairs::Rows {
        words: &sc.left,
        stride: nk2,
    };
    unsafe { product_pairs_serial(ds, (len, hd, nk2), &sc.panels, (dq_at, out.q_stride), scale) };
    // dK = scale · dSᵀ · Q (key rows only)
    interleave_transposed(&sc.ds, nk, (len, nk), &mut sc.left);
    pack_row_pairs(h.q.0, h.q.1, (len, hd), &mut sc.panels);
    let ds_t = LeftPairs::Interleaved(&sc.left);
    unsafe {
        product_pairs_serial(
            ds_t,
            (nk, hd, len2),
            &sc.panels,
            (dk_at, out.kv_stride),
            scale,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::matmul::{as_words_mut, round_row};
    use crate::model::Dropout;

    fn val(i: usize, seed: usize) -> f32 {
        (((i * 7 + seed * 13) as f32) * 0.618).sin() * 2.0
    }

    /// `rows` rows of `width` values rounded to bf16 pairs (as the QKV
    /// product's tiles store them), in fp32 storage.
    fn as_pairs(x: &[f32], width: usize) -> Vec<f32> {
        let mut out = vec![0f32; x.len() / 2];
        for (row, pairs) in x
            .chunks_exact(width)
            .zip(as_words_mut(&mut out).chunks_exact_mut(width / 2))
        {
            round_row(row, pairs);
        }
        out
    }

    /// Q, K and V kept as bf16 pairs give, bit for bit, what the bf16
    /// products give from fp32 Q, K and V (they round them the same way):
    /// context (stored as pairs then: compared with the fp32 context
    /// rounded), probabilities, dQ, dK and dV from the context's gradient
    /// (as pairs, or rounded by the products), with and without dropout, on
    /// every row and on selected queries, with padding rows that are no
    /// keys and sequences of odd lengths (a partial tile, an odd pair).
    #[test]
    fn pairs_equal_rounding_fp32_operands() {
        let heads = Heads { count: 2, dim: 16 };
        let d = heads.width();
        let offsets = [0usize, 13, 13 + 40, 13 + 40 + 7];
        let keys = [13usize, 37, 7];
        let n = offsets[3];
        let selection =
            Selection::new(vec![[0, 2], [1, 0], [1, 5], [1, 39], [2, 6]], &offsets).unwrap();
        let drop = Dropout::new(0.25);
        for (queries, dropout) in [
            (None, None),
            (None, drop.next_mask(true)),
            (Some(&selection), drop.next_mask(true)),
        ] {
            let packing = Packing {
                offsets: &offsets,
                keys: &keys,
                queries,
                window: None,
            };
            let m = packing.rows().count();
            // The fp32 operands, rounded as the pairs are, so both paths
            // multiply the same values.
            let (q_w, kv_w) = match queries {
                None => (0, 3 * d),
                Some(_) => (d, 2 * d),
            };
            let kv: Vec<f32> = (0..n * kv_w).map(|i| val(i, 1)).collect();
            let q: Vec<f32> = (0..m * q_w).map(|i| val(i, 2)).collect();
            let (kv_pairs, q_pairs) = (as_pairs(&kv, kv_w), as_pairs(&q, q_w.max(2)));
            let (qkv_f32, qkv_bf16) = match queries {
                None => (Qkv::fused(&kv, d, false), Qkv::fused(&kv_pairs, d, true)),
                Some(_) => (
                    Qkv::split(&q, &kv, d, false),
                    Qkv::split(&q_pairs, &kv_pairs, d, true),
                ),
            };
            let (_, total) = probability_offsets(packing, heads);
            // The context's gradient, and with pairs, as pairs (the
            // context comes as pairs then: compared rounded).
            let dctx: Vec<f32> = (0..m * d).map(|i| val(i, 3)).collect();
            let dctx_pairs = as_pairs(&dctx, d);
            let mut outs = Vec::new();
            for (qkv, dctx) in [(qkv_f32, &dctx), (qkv_bf16, &dctx_pairs)] {
                let mut ctx = vec![f32::NAN; dctx.len()];
                let mut probs = vec![f32::NAN; total];
                let cfg = (heads, Compute::Bf16);
                let mut bits = vec![u32::MAX; mask_words(packing, heads)];
                let drawn = dropout.as_ref().map(|m| (m, &mut bits[..]));
                forward(qkv, &mut ctx, &mut probs, packing, cfg, drawn);
                let (mut dq, mut dkv) = (vec![0f32; m * q_w], vec![0f32; n * kv_w]);
                let grad = match queries {
                    None => QkvGrad::fused(&mut dkv, d),
                    Some(_) => QkvGrad::split(&mut dq, &mut dkv, d),
                };
                let drawn = dropout.as_ref().map(|m| (m, &bits[..]));
                backward(qkv, &probs, dctx, grad, packing, cfg, drawn);
                if !qkv.pairs {
                    ctx = as_pairs(&ctx, d);
                }
                outs.push([ctx, probs, dq, dkv]);
            }
            for (what, (a, b)) in ["ctx", "probs", "dq", "dkv"]
                .iter()
                .zip(outs[0].iter().zip(&outs[1]))
            {
                assert!(
                    a.iter().all(|v| v.is_finite()),
                    "{what}: not every value written"
                );
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{what} differs (queries {}, dropout {})",
                    queries.is_some(),
                    dropout.is_some()
                );
                assert!(
                    a.is_empty() || a.iter().any(|v| *v != 0.0),
                    "{what}: all zero"
                );
            }
        }
    }
}
