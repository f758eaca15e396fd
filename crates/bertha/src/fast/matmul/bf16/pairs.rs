//! bf16 pairs, two values to a 32-bit word (the even one in the low
//! half): fp32 rows rounded to them, the row strides of buffers of them,
//! and fp32 storage seen as them.

use rayon::prelude::*;

use super::operands::Strided;
use crate::fast::buffers::Unwritten;
use crate::fast::cpu::features;
#[cfg(target_arch = "x86_64")]
use crate::fast::matmul::avx512;

/// `x` rounded to the nearest bf16 (ties to even), as its bit pattern.
pub fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

pub fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// [`to_bf16`] as branch-free bit arithmetic (round to nearest even; a
/// NaN stays a quiet NaN), so the packing loops vectorise.
#[inline(always)]
pub(super) fn round_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        (b >> 16) | 0x40
    } else {
        (b + 0x7fff + ((b >> 16) & 1)) >> 16
    }
}

/// Rounds each row of `x` `[m, k]` to bf16 pairs `[m, k2]` (low half: the
/// even input), with AVX512-BF16's conversion when `simd`.
pub(super) fn round_rows(simd: bool, x: &[f32], m: usize, k: usize, k2: usize, out: &mut Vec<u32>) {
    round_rows_strided(simd, true, (x, k), m, k, k2, out);
}

/// [`round_rows`] for rows `rs` apart (`x.0` = the data, `x.1` = `rs`),
/// on every core or (not `parallel`) the calling thread.
pub(super) fn round_rows_strided(
    simd: bool,
    parallel: bool,
    (x, rs): (&[f32], usize),
    m: usize,
    k: usize,
    k2: usize,
    out: &mut Vec<u32>,
) {
    // Every pair is written below: grow the buffer, never zero it again.
    if out.len() < m * k2 {
        out.resize(m * k2, 0);
    }
    let round = |(r, pairs): (usize, &mut [u32])| round_row_on(simd, &x[r * rs..][..k], pairs);
    each_chunk(&mut out[..m * k2], (k2.max(1), 16), parallel, round);
}

/// `f((i, chunk))` for each `size.0`-long chunk of `out`, on every core
/// (tasks of at least `size.1` chunks) or (not `parallel`) on the calling
/// thread: an operand is prepared in parallel for a product of its own,
/// serially for one inside a parallel task.
pub(super) fn each_chunk<T: Send>(
    out: &mut [T],
    (size, min_len): (usize, usize),
    parallel: bool,
    f: impl Fn((usize, &mut [T])) + Send + Sync,
) {
    if parallel {
        out.par_chunks_mut(size)
            .enumerate()
            .with_min_len(min_len)
            .for_each(f);
    } else {
        out.chunks_mut(size).enumerate().for_each(f);
    }
}

/// One row of `x` as bf16 pairs in `out` (ceil(len / 2) of them), with
/// AVX512-BF16's conversion when `simd`.
pub(super) fn round_row_on(simd: bool, x: &[f32], out: &mut [u32]) {
    assert_eq!(out.len(), x.len().div_ceil(2), "round_row: output length");
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the CPU has AVX512-BF16 (the caller checked); out holds
        // ceil(len / 2) pairs.
        unsafe { avx512::round_row_bf16(x, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    for (pair, xs) in out.iter_mut().zip(x.chunks(2)) {
        let lo = u32::from(to_bf16(xs[0]));
        let hi = xs.get(1).map_or(0, |&v| u32::from(to_bf16(v)));
        *pair = lo | hi << 16;
    }
}

/// One row rounded to bf16 pairs (`out`: `x.len()` rounded up to even,
/// halved), on the calling thread.
pub(crate) fn round_row(x: &[f32], out: &mut [u32]) {
    round_row_on(features().bf16, x, out);
}

/// Rows of `a` `[m, k]` rounded to bf16 pairs `[m, k2]` for any strides,
/// element by element (neither rows nor columns contiguous: no product of
/// a training step takes this path).
pub(super) fn round_strided(a: Strided, m: usize, k: usize, k2: usize, out: &mut Vec<u32>) {
    // Every pair is written below: grow the buffer, never zero it again.
    if out.len() < m * k2 {
        out.resize(m * k2, 0);
    }
    let out = &mut out[..m * k2];
    out.par_chunks_mut(k2.max(1))
        .enumerate()
        .with_min_len(16)
        .for_each(|(r, row)| {
            for (i, pair) in row.iter_mut().enumerate() {
                let lo = round_bits(a.at(r, 2 * i));
                let hi = if 2 * i + 1 < k {
                    round_bits(a.at(r, 2 * i + 1))
                } else {
                    0
                };
                *pair = lo | hi << 16;
            }
        });
}

/// Words per row of a padded pairs buffer of `width` values (an FFN's
/// middle, which products read row by row): `⌈width / 2⌉`, plus 16 when
/// that would put rows a multiple of 4 KiB apart. The twelve rows a tile
/// reads side by side would then share one L1 set (8 ways) and evict each
/// other: FFN-out's forward at `small`'s 2,048 went from 0.77 to 0.87 of
/// the bf16 peak with the padding (`examples/train_products`).
pub(crate) fn pair_stride(width: usize) -> usize {
    let words = width.div_ceil(2);
    match words > 0 && words.is_multiple_of(1024) {
        true => words + 16,
        false => words,
    }
}

/// The row stride of a pairs buffer of `words` words holding `rows` rows
/// of `width` values: `⌈width / 2⌉`, or [`pair_stride`]'s when its maker
/// padded the rows (its length tells which).
pub(super) fn stride_of(words: usize, rows: usize, width: usize, what: &str) -> usize {
    let (dense, padded) = (width.div_ceil(2), pair_stride(width));
    match words {
        _ if words == rows * dense => dense,
        _ if words == rows * padded => padded,
        _ => panic!("product_bf16: {what} are not {rows} rows of {dense} pairs"),
    }
}

/// A new buffer of `m` rows of `n` values as bf16 pairs, [`pair_stride`]
/// words apart, its padding words zeroed (the tiles write the others).
pub(super) fn padded_pairs(m: usize, n: usize) -> Unwritten {
    let (dense, ldp) = (n.div_ceil(2), pair_stride(n));
    let mut pairs = Unwritten::new(m * ldp);
    if ldp > dense {
        let words: *mut u32 = pairs.as_mut_ptr().cast();
        for r in 0..m {
            // SAFETY: words dense..ldp of row r < m lie inside the m × ldp
            // buffer.
            unsafe { std::slice::from_raw_parts_mut(words.add(r * ldp + dense), ldp - dense) }
                .fill(0);
        }
    }
    pairs
}

/// fp32 storage holding bf16 values (panels) seen as them.
pub(crate) fn as_halves(x: &[f32]) -> &[u16] {
    // SAFETY: two u16 fill an f32's bytes, u16's alignment is smaller, and
    // every bit pattern is a u16.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len() * 2) }
}

/// bf16 pairs seen as the f32 bit patterns [`transpose16`] moves.
///
/// [`transpose16`]: crate::fast::matmul::transpose16
pub(crate) fn as_f32(x: &[u32]) -> &[f32] {
    // SAFETY: u32 and f32 have one size and alignment, and every bit
    // pattern is an f32; the values are only moved, never computed on.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
}

/// fp32 storage holding bf16 pairs seen as their u32 words.
pub(crate) fn as_words(x: &[f32]) -> &[u32] {
    // SAFETY: u32 and f32 have one size and alignment, and every bit
    // pattern is a u32.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
}

/// fp32 storage seen as the u32 words of bf16 pairs (a buffer from the
/// step's fp32 pool holding a product's rounded operand).
pub(crate) fn as_words_mut(x: &mut [f32]) -> &mut [u32] {
    // SAFETY: u32 and f32 have one size and alignment, and every bit
    // pattern is a u32.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len()) }
}

/// [`as_f32`] for a destination.
pub(crate) fn as_f32_mut(x: &mut [u32]) -> &mut [f32] {
    // SAFETY: as in as_f32; the f32 written are bit patterns of u32s.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len()) }
}
