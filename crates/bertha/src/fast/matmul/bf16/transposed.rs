//! A transposed left operand (a weight gradient's `dyᵀ`) without a
//! transpose: its source rows (fp32, rounded as they are read, or pairs)
//! interleaved two by two in blocks of a tile's rows, or on AMX the
//! transpose's rows of pairs.

use super::pairs::{each_chunk, round_bits};
use super::tiles::{PairsIn, MR_BF16};
use crate::fast::cpu::{features, multiversion};
#[cfg(target_arch = "x86_64")]
use crate::fast::matmul::avx512;

/// The rows of a transposed left operand's blocks ([`interleave_rows`]):
/// [`MR_BF16`], a register tile's, every step's pairs of a block side by
/// side; or 1 on AMX, whose tiles load each row's pairs as one run: the
/// blocks are then the transpose's rows of pairs, [`PairsIn::rows`].
pub(super) fn transposed_width() -> usize {
    match features().amx {
        true => 1,
        false => MR_BF16,
    }
}

/// Words per row of a transposed left operand laid out as rows (AMX):
/// `k2`, plus 16 when that would put rows a multiple of 2 KiB apart. The
/// 32 rows two AMX tiles load would then share two of L1's 64 sets and
/// evict each other (at 4,096 tokens, every weight gradient's: 8 KiB
/// apart); padded, a 512 × 4,096 × 512 product ran at 689 GFLOP/s a
/// core instead of 559.
pub(super) fn transposed_stride(k2: usize) -> usize {
    match transposed_width() == 1 && k2 > 0 && k2.is_multiple_of(512) {
        true => k2 + 16,
        false => k2,
    }
}

/// Words of a transposed left operand of `m` rows of `k2` pairs as
/// [`interleave_rows`] lays it out.
pub(super) fn transposed_len(m: usize, k2: usize) -> usize {
    match transposed_width() {
        1 => m * transposed_stride(k2),
        width => m.div_ceil(width) * width * k2,
    }
}

/// A transposed left operand's tile from row `r0` (a multiple of
/// [`MR_BF16`]) of `k2` pairs, laid out as [`interleave_rows`] lays it.
pub(super) fn transposed_left(words: &[u32], r0: usize, k2: usize) -> PairsIn {
    match transposed_width() {
        1 => {
            let stride = transposed_stride(k2);
            PairsIn::rows(&words[r0 * stride..], stride)
        }
        width => PairsIn {
            ptr: words[r0 * k2..].as_ptr(),
            row: 1,
            pair: width,
        },
    }
}

// interleave48_bf16 writes four blocks of 12 rows.
const _: () = assert!(MR_BF16 == 12 && INTERLEAVE_BLOCKS == 4);

/// Row blocks per task of [`interleave_rows`]: 48 rows, three cache lines
/// of each source row.
const INTERLEAVE_BLOCKS: usize = 4;

/// The rows of a matrix whose transpose is a product's left operand
/// (a weight gradient's `dy`): `k` rows of at least `m` values.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// fp32, rows `cs` apart, rounded as they are read.
    F32 { data: &'a [f32], cs: usize },
    /// bf16 pairs, `row` words per row (value `c` of a row is the low half
    /// of word `c / 2` for even `c`, the high half for odd).
    Pairs { data: &'a [u32], row: usize },
}

impl Source<'_> {
    /// Whether it holds `rows` rows of at least `width` values.
    pub(crate) fn covers(&self, rows: usize, width: usize) -> bool {
        rows == 0
            || match *self {
                Source::F32 { data, cs } => data.len() >= (rows - 1) * cs + width,
                Source::Pairs { data, row } => {
                    2 * row >= width && data.len() >= (rows - 1) * row + width.div_ceil(2)
                }
            }
    }
}

/// The transpose `a[r, c] = src[c, r]` (`[m, k]`) as bf16 pairs of its
/// columns, in blocks of [`MR_BF16`] rows (a tile's), step after step:
/// word `(b·k2 + i)·MR_BF16 + j` pairs `a[r, 2i]` (low half) with
/// `a[r, 2i + 1]` (0 past `k`), `r = b·MR_BF16 + j`. That is source rows
/// `2i` and `2i + 1` rounded and interleaved, no transpose; a tile reads
/// its block's pairs as one stream ([`PairsIn`] `row` 1, `pair`
/// `MR_BF16`). Words of rows past `m` in the last block are not written.
/// On AMX ([`transposed_width`] 1) the transpose's rows instead
/// ([`transpose_rows`]).
pub(super) fn interleave_rows(src: Source, k: usize, m: usize, out: &mut Vec<u32>, parallel: bool) {
    assert!(
        src.covers(k, m),
        "interleave_rows: the source is not [{k}, {m}]"
    );
    let k2 = k.div_ceil(2);
    let len = transposed_len(m, k2);
    // Every word read is written below: grow the buffer, never zero it.
    if out.len() < len {
        out.resize(len, 0);
    }
    if transposed_width() == 1 {
        return transpose_rows(src, k, m, &mut out[..len], parallel);
    }
    let simd = features().bf16;
    let task = |(t, blocks): (usize, &mut [u32])| {
        let r0 = t * INTERLEAVE_BLOCKS * MR_BF16;
        #[cfg(target_arch = "x86_64")]
        if simd && m - r0 >= 48 {
            // SAFETY: the CPU has AVX512-BF16; rows r0..r0 + 48 are inside
            // every source row (k rows of m values, checked above), and the
            // task's four blocks hold 4 · k2 · 12 words.
            unsafe { avx512::interleave48_bf16(src, k, r0, blocks) };
            return;
        }
        let _ = simd;
        interleave_blocks(src, k, m, r0, blocks)
    };
    let chunk = (INTERLEAVE_BLOCKS * MR_BF16 * k2).max(1);
    each_chunk(&mut out[..len], (chunk, 1), parallel, task);
}

multiversion! {
    fn interleave_blocks = interleave_blocks_body(src: Source, k: usize, m: usize, r0: usize, out: &mut [u32]);
    fn transpose_rows_at = transpose_rows_body(src: Source, k: usize, r0: usize, i0: usize, out: &mut [u32]);
}

/// Transposed rows per task of [`transpose_rows`].
pub(super) const TRANSPOSE_ROWS: usize = 16;

/// [`interleave_rows`]'s layout on AMX: the transpose `a[r, c] = src[c,
/// r]` (`[m, k]`) as rows of bf16 pairs, word `r · k2 + i` pairing
/// `a[r, 2i]` (low half) with `a[r, 2i + 1]` (0 past `k`). Source rows
/// `2i`, `2i + 1` are read 16 values at a time and 16 × 16 words
/// transposed in registers, so each row's words are written a cache line
/// at a time.
pub(super) fn transpose_rows(src: Source, k: usize, m: usize, out: &mut [u32], parallel: bool) {
    let k2 = k.div_ceil(2);
    let stride = transposed_stride(k2);
    debug_assert_eq!(out.len(), m * stride);
    // The register transpose is AVX-512's (NEON's bf16 runs the loops).
    let simd = cfg!(target_arch = "x86_64") && features().bf16;
    let task = |(t, rows): (usize, &mut [u32])| {
        let r0 = t * TRANSPOSE_ROWS;
        let full = match simd && rows.len() == TRANSPOSE_ROWS * stride {
            true => k2 / 16 * 16,
            false => 0,
        };
        #[cfg(target_arch = "x86_64")]
        for i0 in (0..full).step_by(16) {
            // SAFETY: the CPU has AVX512-BF16; steps i0..i0 + 16 < k2 and
            // rows r0..r0 + 16 ≤ m of the source (k rows of m values,
            // checked by the caller) and of the task's 16 rows, stride
            // words apart.
            unsafe { avx512::transpose_pairs16(src, k, r0, i0, rows.as_mut_ptr(), stride) };
        }
        transpose_rows_at(src, k, r0, full, rows);
    };
    let chunk = (TRANSPOSE_ROWS * stride).max(1);
    each_chunk(out, (chunk, 1), parallel, task);
}

/// Steps `i0..` of [`transpose_rows`]'s rows `r0..` (as many as `out`
/// holds, [`transposed_stride`] words each), one word at a time, and the
/// rows' padding words, zeros.
#[inline(always)]
pub(super) fn transpose_rows_body(src: Source, k: usize, r0: usize, i0: usize, out: &mut [u32]) {
    let k2 = k.div_ceil(2);
    let stride = transposed_stride(k2);
    let value = |r: usize, c: usize| -> u32 {
        match src {
            Source::F32 { data, cs } => round_bits(data[r * cs + c]),
            Source::Pairs { data, row } => data[r * row + c / 2] >> (16 * (c % 2)) & 0xffff,
        }
    };
    for (j, row) in out.chunks_exact_mut(stride.max(1)).enumerate() {
        let (row, padding) = row.split_at_mut(k2);
        padding.fill(0);
        let c = r0 + j;
        for (i, w) in row.iter_mut().enumerate().skip(i0) {
            let hi = match 2 * i + 1 < k {
                true => value(2 * i + 1, c),
                false => 0,
            };
            *w = value(2 * i, c) | hi << 16;
        }
    }
}

/// The blocks of [`interleave_rows`] from row `r0` (as many as `out`
/// holds).
#[inline(always)]
fn interleave_blocks_body(src: Source, k: usize, m: usize, r0: usize, out: &mut [u32]) {
    match src {
        Source::F32 { data, cs } => interleave_from(k, m, r0, out, |r, bits| {
            for (b, v) in bits.iter_mut().zip(&data[r * cs + r0..]) {
                *b = round_bits(*v);
            }
        }),
        Source::Pairs { data, row } => interleave_from(k, m, r0, out, |r, bits| {
            let words = &data[r * row..];
            for (j, b) in bits.iter_mut().enumerate() {
                let c = r0 + j;
                *b = words[c / 2] >> (16 * (c % 2)) & 0xffff;
            }
        }),
    }
}

/// [`interleave_blocks_body`] with `row_bits(r, bits)` writing values
/// `r0..r0 + bits.len()` of source row `r` as bf16 bits (a task's rows,
/// at most [`INTERLEAVE_BLOCKS`] blocks of them, side by side first).
#[inline(always)]
fn interleave_from(
    k: usize,
    m: usize,
    r0: usize,
    out: &mut [u32],
    row_bits: impl Fn(usize, &mut [u32]),
) {
    const B: usize = MR_BF16;
    let k2 = k.div_ceil(2);
    let rows = (m - r0).min(out.len() / k2.max(1));
    let (mut lo, mut hi) = ([0u32; INTERLEAVE_BLOCKS * B], [0u32; INTERLEAVE_BLOCKS * B]);
    let (lo, hi) = (&mut lo[..rows], &mut hi[..rows]);
    for i in 0..k2 {
        row_bits(2 * i, lo);
        match 2 * i + 1 < k {
            true => row_bits(2 * i + 1, hi),
            false => hi.fill(0),
        }
        for (b, dst) in out.chunks_exact_mut(k2 * B).enumerate() {
            let dst = &mut dst[i * B..][..B];
            let n = rows.saturating_sub(b * B).min(B);
            for (j, w) in dst.iter_mut().enumerate().take(n) {
                *w = lo[b * B + j] | hi[b * B + j] << 16;
            }
        }
    }
}
