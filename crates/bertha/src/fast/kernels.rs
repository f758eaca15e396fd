//! CPU kernels for the inference fast path, on plain `f32` slices; the
//! training ops (`model::ops`) share the row loops and the multiversioning.
//!
//! candle runs each elementwise op as its own pass (single-threaded or
//! through a spinning barrier pool) and allocates its result; here the
//! work after each matrix multiply is fused into one pass over the rows,
//! parallel over rows with rayon (the pool gemm uses too), writing into
//! buffers the caller reuses.

use gemm::Parallelism;
use rayon::prelude::*;

pub(crate) use super::cpu::multiversion;

/// Rows per rayon task: big enough that scheduling is noise (the
/// training ops also sum weight gradients in blocks of this many rows).
pub(crate) const ROWS_PER_TASK: usize = 16;

/// Up to this many rows, row-wise passes run on the calling thread: waking
/// the pool costs more than the pass (a sentence at batch 1 is ~25 rows).
const SERIAL_ROWS: usize = 64;

/// Attention work (multiply-adds) below which all heads run on the calling
/// thread, for the same reason.
const SERIAL_ATTENTION_WORK: usize = 1 << 20;

/// Lanes of the manual accumulators below: sums kept in 16 independent
/// partial sums vectorise without fast-math reassociation.
pub(crate) const LANES: usize = 16;

multiversion! {
    fn norm_rows = norm_rows_body(x: &mut [f32], residual: Option<&[f32]>, gamma: &[f32], beta: &[f32], eps: f32);
    fn norm_rows_into = norm_rows_into_body(x: &[f32], y: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32);
    fn add_chunk = add_body(x: &mut [f32], y: &[f32]);
    fn attend = attend_body(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize);
}

pub(crate) fn parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

/// `y[m, n] = x[m, k] · w[k, n] + bias[n]` with `w` stored row-major
/// [k, n] (a transposed `nn.Linear` weight).
pub fn linear(x: &[f32], w_t: &[f32], bias: &[f32], y: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k, "linear: input is not [{m}, {k}]");
    assert_eq!(w_t.len(), k * n, "linear: weight is not [{k}, {n}]");
    assert_eq!(bias.len(), n, "linear: bias is not [{n}]");
    assert_eq!(y.len(), m * n, "linear: output is not [{m}, {n}]");
    if m == 0 {
        return;
    }
    // The bias goes in first and gemm accumulates onto it.
    y.par_chunks_mut(n * ROWS_PER_TASK)
        .for_each(|rows| rows.chunks_mut(n).for_each(|r| r.copy_from_slice(bias)));
    // SAFETY: the slices have the asserted sizes and the strides below
    // address exactly those row-major layouts.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            true,
            x.as_ptr(),
            1,
            k as isize,
            w_t.as_ptr(),
            1,
            n as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
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

#[inline(always)]
pub(crate) fn lane_sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + tail
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

/// The FFN non-linearity, in place (tanh: RoBERTa's classification
/// head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    GeluErf,
    GeluTanh,
    Relu,
    Tanh,
}

impl From<crate::config::Activation> for Act {
    fn from(a: crate::config::Activation) -> Self {
        use crate::config::Activation;
        match a {
            Activation::Gelu => Act::GeluErf,
            Activation::GeluTanh => Act::GeluTanh,
            Activation::Relu => Act::Relu,
            Activation::Tanh => Act::Tanh,
        }
    }
}

#[inline(always)]
pub(crate) fn activate_body(x: &mut [f32], act: Act) {
    match act {
        Act::GeluErf => x.iter_mut().for_each(|v| *v = gelu_erf(*v)),
        Act::GeluTanh => x.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        Act::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
        Act::Tanh => x.iter_mut().for_each(|v| *v = tanh(*v)),
    }
}

/// e^x for f32, branch-free so loops over it vectorise: range reduction
/// to 2^n · e^r with |r| ≤ ln2/2 and a degree-6 polynomial (relative
/// error ~2e-7 over the whole range; underflows to 0 below -87).
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.7);
    // Round to nearest with the 1.5·2^23 trick: `f32::round` is a libm
    // call on baseline x86-64 and would stop the loop from vectorising.
    const SHIFT: f32 = 12_582_912.0;
    let shifted = x * std::f32::consts::LOG2_E + SHIFT;
    let n = shifted - SHIFT;
    // ln 2 split in two so n·ln2 is exact in the first part.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^n from the bits of `shifted` (1.5·2^23 + n: the integer n sits in
    // the low mantissa bits), not from `n as i32`: Rust's saturating
    // float-to-int cast is done one lane at a time, which made the
    // softmax and GELU loops half scalar. n is in [-126, 128] after the
    // clamp; wrapping ops keep debug builds' overflow checks (a branch to
    // a panic) out of the loop.
    let bits = shifted
        .to_bits()
        .wrapping_sub(SHIFT.to_bits())
        .wrapping_add(127)
        << 23;
    p * f32::from_bits(bits)
}

/// erf(x) via Abramowitz & Stegun 7.1.26 (absolute error ≤ 1.5e-7).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    erf_and_gauss(x).0
}

/// erf(x) as [`erf`] computes it, and the `exp(-x²)` it computes on the
/// way (GELU's derivative needs both: one exponential instead of two).
#[inline(always)]
pub(crate) fn erf_and_gauss(x: f32) -> (f32, f32) {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let gauss = fast_exp(-a * a);
    let y = 1.0 - poly * gauss;
    (y.copysign(x), gauss)
}

#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + gelu_tanh_inner(x))
}

/// tanh(x) = 1 - 2 / (e^{2x} + 1), branch-free so loops over it
/// vectorise (absolute error ~2e-7).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (fast_exp(2.0 * x) + 1.0)
}

/// `tanh(√(2/π)·(x + 0.044715·x³))`, the tanh of the GELU approximation
/// (its derivative needs it too).
#[inline(always)]
pub(crate) fn gelu_tanh_inner(x: f32) -> f32 {
    tanh(0.797_884_6 * (x + 0.044_715 * x * x * x))
}

/// A raw pointer that may cross threads: attention tasks write disjoint
/// elements of one buffer.
#[derive(Clone, Copy)]
pub(super) struct SharedMut(pub(super) *mut f32);
// SAFETY: every task writes a disjoint set of elements (see `attend_body`).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

/// What every attention task shares.
pub(super) struct AttentionJob<'a> {
    pub(super) qkv: &'a [f32],
    pub(super) out: SharedMut,
    pub(super) d: usize,
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    /// `None`: gemm from [`ATTENTION_GEMM_MIN_LEN`] tokens, else loops.
    path: Option<AttentionPath>,
    /// A sliding window (ModernBERT's local layers): query `i` sees keys
    /// `j` with `|i − j| ≤` this; sequences longer than the window run
    /// [`attend_band`](super::band::attend_band).
    half_window: Option<usize>,
}

/// Per-thread buffers of the attention tasks.
#[derive(Default)]
pub(super) struct Scratch {
    kt: Vec<f32>,
    pub(super) scores: Vec<f32>,
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
enum AttentionPath {
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

fn packed_attention_on(
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
            return super::band::attend_band(job, scratch, (start, len, h), w);
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

/// Softmax of one row of scores, in place.
#[inline(always)]
pub(crate) fn softmax_row(scores: &mut [f32]) {
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let chunks = scores.chunks_exact(LANES);
    let mut max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (m, s) in maxes.iter_mut().zip(c) {
            *m = if *s > *m { *s } else { *m };
        }
    }
    max = maxes.iter().copied().fold(max, f32::max);
    // `for` loops, not `for_each`: a closure's `fold` may be compiled
    // apart from the caller, without its AVX-512.
    for s in scores.iter_mut() {
        *s = fast_exp(*s - max);
    }
    let inv = 1.0 / lane_sum(scores);
    for s in scores.iter_mut() {
        *s *= inv;
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

/// Σ a·(b - shift) in lane-wise partial sums (see `lane_sum`).
#[inline(always)]
pub(crate) fn lane_dot_centered(a: &[f32], b: &[f32], shift: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(a, b)| a * (b - shift))
        .sum();
    for (ca, cb) in ac.zip(bc) {
        for ((s, a), b) in acc.iter_mut().zip(ca).zip(cb) {
            *s += a * (b - shift);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Query rows per block of a long sequence's attention: the scores held at
/// once are `QUERY_BLOCK × len` (128 KB at 512 tokens) rather than
/// `len × len` (1 MB), so they stay in L2 beside the head's K and V while
/// the softmax and the second product read them back.
pub(super) const QUERY_BLOCK: usize = 64;

/// One (sequence, head) as `softmax(scale · Q Kᵀ) V` with two gemm calls
/// per block of query rows, reading Q, K and V in place from the packed
/// QKV rows: [`attend_blocked`](super::band::attend_blocked) with a window
/// that covers the sequence. Each row's softmax sees all its keys, so
/// blocking changes no result.
#[inline(always)]
fn attend_gemm(job: &AttentionJob, scratch: &mut Scratch, start: usize, len: usize, h: usize) {
    super::band::attend_blocked(job, scratch, (start, len, h), (len, QUERY_BLOCK));
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

/// The machine's fp32 matrix-multiply rate in GFLOP/s, measured now with
/// the multiply the encoder uses (best of `reps` products of two
/// `size`×`size` matrices), so benchmark figures can be read as a
/// fraction of it on a machine whose speed drifts.
pub fn matmul_gflops(size: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..size * size)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.1)
        .collect();
    let b: Vec<f32> = (0..size * size)
        .map(|i| ((i % 5) as f32 - 2.0) * 0.1)
        .collect();
    let bias = vec![0f32; size];
    let mut c = vec![0f32; size * size];
    linear(&a, &b, &bias, &mut c, size, size, size);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        linear(&a, &b, &bias, &mut c, size, size, size);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (size as f64).powi(3) / best / 1e9
}

/// The rate, in G multiply-adds × 2 per second, of one `[m, k] · [k, n]`
/// linear layer at `precision` on the packed kernels (best of `reps`),
/// input rounding or quantization included: what a benchmark compares
/// with the instruction peaks of `fast::cpu`.
pub fn linear_gops(precision: super::Precision, m: usize, k: usize, n: usize, reps: usize) -> f64 {
    use super::matmul::{PackedBf16, PackedF32, PackedI8, QuantScratch};
    let x: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) * 0.05).collect();
    let w: Vec<f32> = (0..k * n).map(|i| ((i % 11) as f32 - 5.0) * 0.02).collect();
    let (bias, mut y) = (vec![0f32; n], vec![0f32; m * n]);
    let mut scratch = QuantScratch::default();
    type Run = Box<dyn FnMut(&mut Vec<f32>, &mut QuantScratch)>;
    let mut run: Run = match precision {
        super::Precision::F32 => {
            let p = PackedF32::new(&w, k, n);
            Box::new(move |y, _| p.matmul(&x, &bias, y, m, None))
        }
        super::Precision::Bf16 => {
            let p = PackedBf16::new(&w, k, n);
            Box::new(move |y, s| p.matmul(&x, &bias, y, m, s.bf16_pairs(), None))
        }
        super::Precision::Int8 => {
            let p = PackedI8::new(&w, k, n, None, Default::default());
            Box::new(move |y, s| p.matmul(&x, &bias, y, m, s, None))
        }
    };
    run(&mut y, &mut scratch);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        run(&mut y, &mut scratch);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (m * k * n) as f64 / best / 1e9
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Packed attention against softmax(scale · Q Kᵀ) V in f64, on every
    /// path (the CPU's choice, gemm, loops, fp32 and bf16 tiles where the
    /// CPU has them), for short sequences, two key panels, query blocks
    /// with a partial last one, and an empty sequence.
    #[test]
    fn packed_attention_matches_the_definition() {
        let mut paths = vec![None, Some(AttentionPath::Gemm), Some(AttentionPath::Loops)];
        if crate::fast::matmul::has_f32_tiles() {
            paths.push(Some(AttentionPath::Tiles));
        }
        // Head widths below, at and above a panel of 32; lengths short,
        // spanning two key panels, and past two query blocks.
        for (heads, hd) in [(3, 8), (2, 32), (2, 40)] {
            let d = heads * hd;
            // The last sequence is empty: it starts at the end of qkv.
            let offsets = [
                0,
                5,
                5 + 33,
                5 + 33 + 2 * QUERY_BLOCK + 22,
                5 + 33 + 2 * QUERY_BLOCK + 22,
            ];
            let tokens = offsets[4];
            let qkv: Vec<f32> = (0..tokens * 3 * d)
                .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 2.0)
                .collect();
            for &path in &paths {
                let mut ctx = vec![0f32; tokens * d];
                packed_attention_on((path, None), &qkv, &mut ctx, &offsets, heads, hd);
                let worst = worst_attention_error(&qkv, &ctx, &offsets, (heads, hd), None);
                assert!(
                    worst < 1e-5,
                    "{path:?}, head_dim {hd}: largest difference {worst}"
                );
            }
            if crate::fast::cpu::features().bf16 {
                // Inputs rounded to 8 significant bits: errors of a few
                // 2^-9 of the values (|v| ≤ 1), far above fp32's.
                let mut ctx = vec![0f32; tokens * d];
                let path = Some(AttentionPath::TilesBf16);
                packed_attention_on((path, None), &qkv, &mut ctx, &offsets, heads, hd);
                let worst = worst_attention_error(&qkv, &ctx, &offsets, (heads, hd), None);
                assert!(
                    worst < 1e-2,
                    "bf16, head_dim {hd}: largest difference {worst}"
                );
                assert!(worst > 1e-5, "bf16 rounding shows ({worst})");
            }
        }
    }

    /// The largest difference of `ctx` from `softmax(scale · Q Kᵀ) V` in
    /// f64, each query over the keys within `window` of it (all without).
    pub(in crate::fast) fn worst_attention_error(
        qkv: &[f32],
        ctx: &[f32],
        offsets: &[usize],
        (heads, hd): (usize, usize),
        window: Option<usize>,
    ) -> f64 {
        let d = heads * hd;
        let lens: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
        let scale = 1.0 / (hd as f64).sqrt();
        let at = |t: usize, part: usize, h: usize, c: usize| {
            qkv[t * 3 * d + part * d + h * hd + c] as f64
        };
        let mut worst = 0f64;
        for s in 0..lens.len() {
            let (a, n) = (offsets[s], lens[s]);
            for h in 0..heads {
                for i in 0..n {
                    let keys: Vec<usize> = (0..n)
                        .filter(|j| match window {
                            Some(w) => i.abs_diff(*j) <= w,
                            None => true,
                        })
                        .collect();
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|&j| {
                            (0..hd)
                                .map(|c| at(a + i, 0, h, c) * at(a + j, 1, h, c))
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for c in 0..hd {
                        let want: f64 = keys
                            .iter()
                            .zip(&e)
                            .map(|(&j, p)| p / z * at(a + j, 2, h, c))
                            .sum();
                        let got = ctx[(a + i) * d + h * hd + c] as f64;
                        worst = worst.max((got - want).abs());
                    }
                }
            }
        }
        worst
    }

    /// The bit trick for 2^n gives what `n as i32` gave, for every input
    /// in the clamped range (sampled densely) and beyond it.
    #[test]
    fn fast_exp_scale_bits_equal_the_integer_cast() {
        let old = |x: f32| {
            let x = x.clamp(-87.3, 88.7);
            const SHIFT: f32 = 12_582_912.0;
            let n = (x * std::f32::consts::LOG2_E + SHIFT) - SHIFT;
            let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
            let p = 1.0
                + r * (1.0
                    + r * (0.5
                        + r * (1.0 / 6.0
                            + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
            p * f32::from_bits(((n as i32).wrapping_add(127) as u32) << 23)
        };
        let mut x = -100.0f32;
        while x < 100.0 {
            assert_eq!(fast_exp(x).to_bits(), old(x).to_bits(), "x = {x}");
            x += 0.000_37;
        }
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = -80.0f32;
        while x < 80.0 {
            let (got, want) = (fast_exp(x), x.exp());
            assert!(
                ((got - want) / want).abs() < 5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0173;
        }
        assert!(fast_exp(-1e9) < 1e-37, "underflows to (nearly) zero");
    }

    #[test]
    fn gelu_matches_the_erf_definition() {
        let mut x = -8.0f64;
        while x < 8.0 {
            let want = 0.5 * x * (1.0 + libm_erf(x / std::f64::consts::SQRT_2));
            let got = f64::from(gelu_erf(x as f32));
            assert!((got - want).abs() < 1e-6, "gelu({x}) = {got}, want {want}");
            x += 0.01;
        }
    }

    /// The exponential erf computes on the way is exp(-x²) (of x² rounded
    /// to fp32, as erf's argument is), and erf's value is the same with or
    /// without it.
    #[test]
    fn erf_hands_out_its_gaussian() {
        let mut x = -6.0f32;
        while x < 6.0 {
            let (e, gauss) = erf_and_gauss(x);
            let want = (-f64::from(x.abs() * x.abs())).exp();
            assert!(
                (f64::from(gauss) - want).abs() <= 1e-6 * want + 1e-30,
                "exp(-{x}²) = {gauss}, want {want}"
            );
            assert_eq!(e.to_bits(), erf(x).to_bits());
            x += 0.0137;
        }
    }

    /// erf by its Taylor/continued series in f64, as an independent check.
    fn libm_erf(x: f64) -> f64 {
        // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)); beyond
        // |x| = 4, |1 - |erf|| < 2e-8 and the series would lose precision.
        if x.abs() > 4.0 {
            return x.signum();
        }
        let mut sum = 0.0;
        let mut term = x;
        let mut n = 0.0;
        while term.abs() > 1e-17 || n < 5.0 {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -x * x / n;
            if n > 400.0 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn linear_adds_bias_and_multiplies() {
        // x [2,3], w_t [3,2]
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let w_t = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut y = [0.0; 4];
        linear(&x, &w_t, &[10.0, 20.0], &mut y, 2, 3, 2);
        assert_eq!(y, [14.0, 25.0, 20.0, 31.0]);
    }
}
