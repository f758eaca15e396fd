//! Self-attention over packed sequences, one task per (sequence, head):
//! the job and scratch its tasks share, the choice of path, each path
//! (fp32 or bf16 register tiles, gemm, loops), and attention at one row
//! per sequence.

use rayon::prelude::*;

use super::lanes::lane_dot_centered;
use super::multiversion;
use super::softmax::softmax_row;

/// Attention work (multiply-adds) below which all heads run on the calling
/// thread, for the same reason.
const SERIAL_ATTENTION_WORK: usize = 1 << 20;

multiversion! {
    fn attend = attend_body(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize);
}

/// A raw pointer that may cross threads: attention tasks write disjoint
/// elements of one buffer.
#[derive(Clone, Copy)]
pub(in crate::fast) struct SharedMut(pub(in crate::fast) *mut f32);
// SAFETY: every task writes a disjoint set of elements (see `attend_body`).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

/// What every attention task shares.
pub(in crate::fast) struct AttentionJob<'a> {
    pub(in crate::fast) qkv: &'a [f32],
    pub(in crate::fast) out: SharedMut,
    pub(in crate::fast) d: usize,
    pub(in crate::fast) head_dim: usize,
    pub(in crate::fast) scale: f32,
    /// `None`: gemm from [`ATTENTION_GEMM_MIN_LEN`] tokens, else loops.
    path: Option<AttentionPath>,
    /// A sliding window (ModernBERT's local layers): query `i` sees keys
    /// `j` with `|i − j| ≤` this; sequences longer than the window run
    /// [`attend_band`](crate::fast::band::attend_band).
    half_window: Option<usize>,
}

/// Per-thread buffers of the attention tasks.
#[derive(Default)]
pub(in crate::fast) struct Scratch {
    kt: Vec<f32>,
    pub(in crate::fast) scores: Vec<f32>,
    acc: Vec<f32>,
    /// Q of one head, scaled, `[len, head_dim]` (register-tile path).
    q: Vec<f32>,
    /// V of one head in column panels (register-tile path).
    v: Vec<f32>,
    /// bf16 path: Q, then the probabilities, as pairs.
    pairs: Vec<u32>,
    /// bf16 path: K as pairs `[len, head_dim / 2]`, then its panels.
    k_pairs: Vec<u32>,
    k_panels: Vec<u32>,
    /// bf16 path: V's panels.
    v_panels: Vec<u16>,
}

/// How a (sequence, head) is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AttentionPath {
    /// The fp32 register tiles of the packed multiplies (AVX-512).
    Tiles,
    /// The bf16 register tiles (AVX512-BF16): Q, K, V and the
    /// probabilities rounded to bf16, sums in fp32.
    TilesBf16,
    /// Two gemm-crate products per block of query rows.
    Gemm,
    /// Plain loops (short sequences without AVX-512).
    Loops,
}

/// Self-attention over packed sequences.
///
/// `qkv` is [tokens, 3·D] (Q | K | V per token, heads contiguous inside
/// each); sequence `s` owns rows `offsets[s]..offsets[s+1]`, so no work is
/// spent on padding. Writes the context [tokens, D] into `ctx`. One task
/// per (sequence, head), so even a single text uses every core.
///
/// `bf16_products`: both products on bf16 tiles where the CPU has
/// AVX512-BF16 (the softmax stays fp32), for the bf16 and int8 precisions.
/// `half_window`: query `i` attends to keys `|i − j| ≤ half_window` only,
/// at a cost that grows as tokens × window on longer sequences.
pub fn packed_attention(
    qkv: &[f32],
    ctx: &mut [f32],
    offsets: &[usize],
    (num_heads, head_dim): (usize, usize),
    bf16_products: bool,
    half_window: Option<usize>,
) {
    let path = if bf16_products && crate::fast::cpu::features().bf16 {
        Some(AttentionPath::TilesBf16)
    } else {
        crate::fast::matmul::has_f32_tiles().then_some(AttentionPath::Tiles)
    };
    packed_attention_on((path, half_window), qkv, ctx, offsets, num_heads, head_dim);
}

pub(super) fn packed_attention_on(
    (path, half_window): (Option<AttentionPath>, Option<usize>),
    qkv: &[f32],
    ctx: &mut [f32],
    offsets: &[usize],
    num_heads: usize,
    head_dim: usize,
) {
    let d = num_heads * head_dim;
    let tokens = offsets.last().copied().unwrap_or(0);
    assert_eq!(
        qkv.len(),
        tokens * 3 * d,
        "packed_attention: qkv is not [{tokens}, {}]",
        3 * d
    );
    assert_eq!(
        ctx.len(),
        tokens * d,
        "packed_attention: ctx is not [{tokens}, {d}]"
    );
    let job = AttentionJob {
        qkv,
        out: SharedMut(ctx.as_mut_ptr()),
        d,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        path,
        half_window,
    };
    let tasks: Vec<(usize, usize, usize)> = offsets
        .windows(2)
        .flat_map(|w| (0..num_heads).map(move |h| (w[0], w[1] - w[0], h)))
        .collect();
    let work: usize = tasks
        .iter()
        .map(|&(_, len, _)| 2 * len * len.min(half_window.map_or(len, |w| 2 * w + 1)) * head_dim)
        .sum();
    if work < SERIAL_ATTENTION_WORK {
        let mut scratch = Scratch::default();
        for (start, len, h) in tasks {
            attend(&job, &mut scratch, start, len, h);
        }
        return;
    }
    tasks
        .into_par_iter()
        .for_each_init(Scratch::default, |scratch, (start, len, h)| {
            attend(&job, scratch, start, len, h)
        });
}

/// Below this many tokens a sequence's attention runs as plain loops;
/// from it on, as two matrix multiplies per head (gemm's packing and
/// register blocking win once the score matrix is bigger than a few rows).
const ATTENTION_GEMM_MIN_LEN: usize = 24;

#[inline(always)]
fn attend_body(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize) {
    if len == 0 {
        // An empty sequence has no rows to write (and its start may be
        // the end of qkv).
        return;
    }
    if let Some(w) = job.half_window {
        // A sequence the window covers whole is plain attention.
        if len > w + 1 {
            return crate::fast::band::attend_band(job, scratch, (start, len, h), w);
        }
    }
    let path = job.path.unwrap_or(if len >= ATTENTION_GEMM_MIN_LEN {
        AttentionPath::Gemm
    } else {
        AttentionPath::Loops
    });
    match path {
        AttentionPath::Tiles => attend_tiles(job, scratch, start, len, h),
        AttentionPath::TilesBf16 => attend_tiles_bf16(job, scratch, start, len, h),
        AttentionPath::Gemm => attend_gemm(job, scratch, start, len, h),
        AttentionPath::Loops => attend_loops(job, scratch, start, len, h),
    }
}

/// [`attend_tiles`] on bf16 tiles: Q (scaled), K, V and each row of
/// probabilities rounded to bf16 at the products' inputs, sums and softmax
/// in fp32. K's pairs (two adjacent head dimensions of one key) are
/// transposed into panels as 32-bit words, V is packed as a weight is.
#[inline(always)]
fn attend_tiles_bf16(
    job: &AttentionJob,
    scratch: &mut Scratch,
    start: usize,
    len: usize,
    h: usize,
) {
    use crate::fast::matmul::{
        as_f32, as_f32_mut, pack_panels_into, round_row, tile_bf16, transpose16, Strided,
        BF16_TILE_ROWS as TR, NR,
    };
    let AttentionJob {
        qkv,
        d,
        head_dim: hd,
        scale,
        ..
    } = *job;
    let Scratch {
        scores,
        q,
        pairs,
        k_pairs,
        k_panels,
        v_panels,
        ..
    } = scratch;
    let (hd2, len2) = (hd.div_ceil(2), len.div_ceil(2));
    let row = |t: usize, part: usize| &qkv[(start + t) * 3 * d + part * d + h * hd..][..hd];
    // Q scaled, as pairs [len, hd2]; behind them, room for one query
    // block's probabilities as pairs.
    q.resize(hd, 0.0);
    pairs.resize(len * hd2 + QUERY_BLOCK.min(len) * len2, 0);
    let (q_pairs, p_pairs) = pairs.split_at_mut(len * hd2);
    for (i, out) in q_pairs.chunks_exact_mut(hd2).enumerate() {
        for (o, x) in q.iter_mut().zip(row(i, 0)) {
            *o = x * scale;
        }
        round_row(q, out);
    }
    k_pairs.resize(len * hd2, 0);
    for (j, out) in k_pairs.chunks_exact_mut(hd2).enumerate() {
        round_row(row(j, 1), out);
    }
    // Panel p: hd2 pair rows of NR keys, one 32-bit pair per key.
    let key_panels = len.div_ceil(NR);
    k_panels.resize(key_panels * hd2 * NR, 0);
    for j in (0..len).step_by(16) {
        let panel = (j / NR) * hd2 * NR + j % NR;
        for c in (0..hd2).step_by(16) {
            let (rows, cols) = (16.min(len - j), 16.min(hd2 - c));
            transpose16(
                as_f32(&k_pairs[j * hd2 + c..]),
                hd2,
                rows,
                cols,
                as_f32_mut(&mut k_panels[panel + c * NR..]),
                NR,
            );
        }
    }
    // SAFETY: any two u16 are one u32 (little-endian: the low half first,
    // as the tiles read a pair), same allocation, twice the count.
    let k_panels: &[u16] =
        unsafe { std::slice::from_raw_parts(k_panels.as_ptr().cast(), k_panels.len() * 2) };
    let v = Strided::rows(&qkv[start * 3 * d + 2 * d + h * hd..], 3 * d);
    pack_panels_into(v, len, hd, v_panels);
    scores.resize(QUERY_BLOCK.min(len) * len, 0.0);
    for first in (0..len).step_by(QUERY_BLOCK) {
        let rows = QUERY_BLOCK.min(len - first);
        let s = &mut scores[..rows * len];
        for r0 in (0..rows).step_by(TR) {
            let mr = TR.min(rows - r0);
            let a = &q_pairs[(first + r0) * hd2..(first + r0 + mr) * hd2];
            for p in 0..key_panels {
                let panel = &k_panels[p * hd2 * NR * 2..(p + 1) * hd2 * NR * 2];
                // SAFETY: rows r0..r0+mr, columns p·NR.. (at most NR, up
                // to len) of s ([rows, len]).
                unsafe {
                    let c = s.as_mut_ptr().add(r0 * len + p * NR);
                    tile_bf16(a, hd2, mr, panel, c, len, NR.min(len - p * NR));
                }
            }
        }
        let p_pairs = &mut p_pairs[..rows * len2];
        for (r, out) in s.chunks_exact_mut(len).zip(p_pairs.chunks_exact_mut(len2)) {
            softmax_row(r);
            round_row(r, out);
        }
        for r0 in (0..rows).step_by(TR) {
            let mr = TR.min(rows - r0);
            let a = &p_pairs[r0 * len2..(r0 + mr) * len2];
            for p in 0..hd.div_ceil(NR) {
                let panel = &v_panels[p * len2 * NR * 2..(p + 1) * len2 * NR * 2];
                // SAFETY: context rows start+first+r0.., columns of head h
                // (panel p) lie inside ctx (asserted by packed_attention)
                // and no other task writes them.
                unsafe {
                    let c = job.out.0.add((start + first + r0) * d + h * hd + p * NR);
                    tile_bf16(a, len2, mr, panel, c, d, NR.min(hd - p * NR));
                }
            }
        }
    }
}

/// One (sequence, head) on the packed multiplies' fp32 register tiles:
/// Q scaled into a contiguous block, K laid out as column panels of
/// [`NR`](crate::fast::matmul::NR) keys and V as panels of `NR` of its
/// columns, once per head; then per block of query rows, scores = Q·Kᵀ,
/// softmax, and P·V written straight into the context rows. At sentence
/// lengths (~25 tokens) the gemm crate's packing and dispatch cost more
/// than these products, and plain loops leave most lanes idle.
#[inline(always)]
fn attend_tiles(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize) {
    use crate::fast::matmul::{tile_f32, transpose16, F32_TILE_ROWS as TR, NR};
    const ZEROS: [f32; NR] = [0.0; NR];
    let AttentionJob {
        qkv,
        d,
        head_dim: hd,
        scale,
        ..
    } = *job;
    let Scratch {
        kt, scores, q, v, ..
    } = scratch;
    let row = |t: usize, part: usize| &qkv[(start + t) * 3 * d + part * d + h * hd..][..hd];
    q.resize(len * hd, 0.0);
    for (i, out) in q.chunks_exact_mut(hd).take(len).enumerate() {
        for (o, x) in out.iter_mut().zip(row(i, 0)) {
            *o = x * scale;
        }
    }
    // Panel p of Kᵀ: hd rows of NR keys (columns past len are never
    // stored: the tile masks them), transposed 16 × 16 at a time.
    let key_panels = len.div_ceil(NR);
    kt.resize(key_panels * hd * NR, 0.0);
    for j in (0..len).step_by(16) {
        let panel = (j / NR) * hd * NR + j % NR;
        for c in (0..hd).step_by(16) {
            let src = &qkv[(start + j) * 3 * d + d + h * hd + c..];
            let (rows, cols) = (16.min(len - j), 16.min(hd - c));
            transpose16(src, 3 * d, rows, cols, &mut kt[panel + c * NR..], NR);
        }
    }
    // Panel p of V: len rows of its columns p·NR.. (past hd: stale
    // values in columns the tile masks).
    let v_panels = hd.div_ceil(NR);
    v.resize(v_panels * len * NR, 0.0);
    for j in 0..len {
        let src = row(j, 2);
        for p in 0..v_panels {
            let cols = NR.min(hd - p * NR);
            v[(p * len + j) * NR..][..cols].copy_from_slice(&src[p * NR..][..cols]);
        }
    }
    scores.resize(QUERY_BLOCK.min(len) * len, 0.0);
    for first in (0..len).step_by(QUERY_BLOCK) {
        let rows = QUERY_BLOCK.min(len - first);
        let s = &mut scores[..rows * len];
        for r0 in (0..rows).step_by(TR) {
            let mr = TR.min(rows - r0);
            let a = &q[(first + r0) * hd..(first + r0 + mr) * hd];
            for p in 0..key_panels {
                let cols = NR.min(len - p * NR);
                // SAFETY: rows r0..r0+mr, columns p·NR..p·NR+cols of s
                // ([rows, len]); a holds mr rows of hd, the panel hd rows.
                unsafe {
                    let c = s.as_mut_ptr().add(r0 * len + p * NR);
                    let panel = &kt[p * hd * NR..(p + 1) * hd * NR];
                    tile_f32(a, hd, mr, panel, c, len, cols, &ZEROS, None);
                }
            }
        }
        for r in s.chunks_exact_mut(len) {
            softmax_row(r);
        }
        for r0 in (0..rows).step_by(TR) {
            let mr = TR.min(rows - r0);
            let a = &s[r0 * len..(r0 + mr) * len];
            for p in 0..v_panels {
                let cols = NR.min(hd - p * NR);
                // SAFETY: context rows start+first+r0.., columns of head h
                // (panel p) lie inside ctx (asserted by packed_attention)
                // and no other task writes them; a holds mr rows of len,
                // the panel len rows.
                unsafe {
                    let c = job.out.0.add((start + first + r0) * d + h * hd + p * NR);
                    let panel = &v[p * len * NR..(p + 1) * len * NR];
                    tile_f32(a, len, mr, panel, c, d, cols, &ZEROS, None);
                }
            }
        }
    }
}

/// Self-attention of one query row per sequence: row `rows[s]` of
/// sequence `s` (packed as in [`packed_attention`]) over all of the
/// sequence's keys, into row `s` of `ctx` `[sequences, D]`. For a last
/// layer whose output is read at one row per text (`[CLS]` pooling, the
/// pooler): a score row per head, in fp32, instead of a score matrix.
pub fn attention_at_rows(
    qkv: &[f32],
    ctx: &mut [f32],
    offsets: &[usize],
    rows: &[usize],
    num_heads: usize,
    head_dim: usize,
) {
    let d = num_heads * head_dim;
    let tokens = offsets.last().copied().unwrap_or(0);
    assert_eq!(qkv.len(), tokens * 3 * d, "attention_at_rows: qkv");
    assert_eq!(
        rows.len() + 1,
        offsets.len(),
        "attention_at_rows: a row per sequence"
    );
    assert_eq!(ctx.len(), rows.len() * d, "attention_at_rows: ctx");
    let scale = 1.0 / (head_dim as f32).sqrt();
    ctx.par_chunks_mut(d.max(1)).enumerate().for_each_init(
        Vec::new,
        |scores: &mut Vec<f32>, (s, out)| {
            let (start, len) = (offsets[s], offsets[s + 1] - offsets[s]);
            assert!(
                rows[s] < len,
                "attention_at_rows: row {} of a {len}-token sequence",
                rows[s]
            );
            let q_row = &qkv[(start + rows[s]) * 3 * d..][..d];
            for h in 0..num_heads {
                let cols = h * head_dim..(h + 1) * head_dim;
                let q = &q_row[cols.clone()];
                scores.clear();
                scores.extend((0..len).map(|j| {
                    let k = &qkv[(start + j) * 3 * d + d..][cols.clone()];
                    scale * lane_dot_centered(q, k, 0.0)
                }));
                softmax_row(scores);
                let acc = &mut out[cols.clone()];
                acc.iter_mut().for_each(|a| *a = 0.0);
                for (j, p) in scores.iter().enumerate() {
                    let v = &qkv[(start + j) * 3 * d + 2 * d..][cols.clone()];
                    for (a, b) in acc.iter_mut().zip(v) {
                        *a += p * b;
                    }
                }
            }
        },
    );
}

/// Query rows per block of a long sequence's attention: the scores held at
/// once are `QUERY_BLOCK × len` (128 KB at 512 tokens) rather than
/// `len × len` (1 MB), so they stay in L2 beside the head's K and V while
/// the softmax and the second product read them back.
pub(super) const QUERY_BLOCK: usize = 64;

/// One (sequence, head) as `softmax(scale · Q Kᵀ) V` with two gemm calls
/// per block of query rows, reading Q, K and V in place from the packed
/// QKV rows: [`attend_blocked`](crate::fast::band::attend_blocked) with
/// a window that covers the sequence. Each row's softmax sees all its
/// keys, so blocking changes no result.
#[inline(always)]
fn attend_gemm(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize) {
    crate::fast::band::attend_blocked(job, scratch, (start, len, h), (len, QUERY_BLOCK));
}

/// One (sequence, head) of a short sequence, as plain loops.
#[inline(always)]
fn attend_loops(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize) {
    let AttentionJob {
        qkv,
        d,
        head_dim,
        scale,
        ..
    } = *job;
    let Scratch {
        kt, scores, acc, ..
    } = scratch;
    kt.resize(head_dim * len, 0.0);
    scores.resize(len, 0.0);
    acc.resize(head_dim, 0.0);
    // K of this head transposed to [head_dim, len]: the score loop then
    // runs over contiguous keys.
    for j in 0..len {
        let k = &qkv[(start + j) * 3 * d + d + h * head_dim..][..head_dim];
        for (c, v) in k.iter().enumerate() {
            kt[c * len + j] = *v;
        }
    }
    for i in 0..len {
        let q = &qkv[(start + i) * 3 * d + h * head_dim..][..head_dim];
        let scores = &mut scores[..len];
        scores.iter_mut().for_each(|s| *s = 0.0);
        for (c, qc) in q.iter().enumerate() {
            let qc = qc * scale;
            for (s, k) in scores.iter_mut().zip(&kt[c * len..(c + 1) * len]) {
                *s += qc * k;
            }
        }
        softmax_row(scores);
        acc.iter_mut().for_each(|v| *v = 0.0);
        for (j, p) in scores.iter().enumerate() {
            let v = &qkv[(start + j) * 3 * d + 2 * d + h * head_dim..][..head_dim];
            for (a, b) in acc.iter_mut().zip(v) {
                *a += p * b;
            }
        }
        // SAFETY: row start+i, columns of head h: no other task writes
        // them, and they lie inside ctx (asserted by packed_attention).
        unsafe {
            let dst = job.out.0.add((start + i) * d + h * head_dim);
            std::ptr::copy_nonoverlapping(acc.as_ptr(), dst, head_dim);
        }
    }
}
