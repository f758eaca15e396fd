//! Products on the calling thread, for the small per-head operands a
//! parallel task multiplies (attention's): operands rounded serially,
//! and products of them.

use super::driver::{product_bf16_into, with_buffers, Run, Store, Sums};
use super::operands::{Left, Right, Strided};
use super::pairs::round_rows_strided;
use super::tiles::{tiles, PairsIn, TileOut};
use super::transposed::{interleave_rows, transposed_left, transposed_len, Source};
use crate::fast::cpu::features;
use crate::fast::matmul::NR;

/// A left operand of [`product_pairs_serial`], rounded before.
#[derive(Clone, Copy)]
pub(crate) enum LeftPairs<'a> {
    /// `m` rows of `k2` pairs, rows `stride` words apart.
    Rows { words: &'a [u32], stride: usize },
    /// A transpose as [`interleave_transposed`] lays it out.
    Interleaved(&'a [u32]),
}

/// `m` rows of `k` values (one after another) rounded to bf16 pairs,
/// `⌈k / 2⌉` per row, on the calling thread ([`LeftPairs::Rows`]):
/// attention's `dS`.
pub(crate) fn round_rows_serial(x: &[f32], (m, k): (usize, usize), out: &mut Vec<u32>) {
    round_rows_strided(features().bf16, false, (x, k), m, k, k.div_ceil(2), out);
}

/// The transpose of `x` (`k` rows of `m` values, rows `stride` apart) as a
/// product's left operand `[m, k]`, rounded to bf16 ([`LeftPairs::Interleaved`]),
/// on the calling thread: attention's `Pᵀ` and `dSᵀ`.
pub(crate) fn interleave_transposed(
    x: &[f32],
    stride: usize,
    (k, m): (usize, usize),
    out: &mut Vec<u32>,
) {
    let src = Source::F32 {
        data: x,
        cs: stride,
    };
    interleave_rows(src, k, m, out, false);
}

/// `c[m, n] = scale · a[m, k] · b[k, n]` on the calling thread from a
/// rounded left operand and packed right one ([`pack_transposed_pairs`],
/// [`pack_row_pairs`], [`pack_panels_into`]), `k2 = ⌈k / 2⌉` pairs, `c`
/// rows `ldc` apart: attention's per-head products.
///
/// # Safety
/// `c` must address `m` rows of `n` values, `ldc` apart, that nothing else
/// reads or writes meanwhile.
///
/// [`pack_transposed_pairs`]: super::panels::pack_transposed_pairs
/// [`pack_row_pairs`]: super::panels::pack_row_pairs
/// [`pack_panels_into`]: super::panels::pack_panels_into
pub(crate) unsafe fn product_pairs_serial(
    a: LeftPairs,
    dims: (usize, usize, usize),
    panels: &[u16],
    (c, ldc): (*mut f32, usize),
    scale: f32,
) {
    let (m, n, _) = dims;
    // SAFETY: the caller's contract.
    unsafe { pairs_serial(a, dims, panels, SerialOut::F32(c, ldc)) };
    if scale != 1.0 {
        for r in 0..m {
            // SAFETY: row r of the caller's m × n destination.
            let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), n) };
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// [`product_pairs_serial`] (no scale) stored as bf16 pairs of adjacent
/// columns, `m` rows of `⌈n / 2⌉` words `ldc` words apart: a product whose
/// only use is another product's operand (attention's context).
///
/// # Safety
/// `c` must address `m` rows of `⌈n / 2⌉` words, `ldc` apart, that nothing
/// else reads or writes meanwhile.
pub(crate) unsafe fn product_pairs_serial_to_pairs(
    a: LeftPairs,
    dims: (usize, usize, usize),
    panels: &[u16],
    (c, ldc): (*mut u32, usize),
) {
    // SAFETY: the caller's contract.
    unsafe { pairs_serial(a, dims, panels, SerialOut::Pairs(c, ldc)) }
}

/// Where [`pairs_serial`] stores: fp32 rows or bf16 pairs, and the row
/// stride.
#[derive(Clone, Copy)]
enum SerialOut {
    F32(*mut f32, usize),
    Pairs(*mut u32, usize),
}

/// # Safety
/// As [`product_pairs_serial`] / [`product_pairs_serial_to_pairs`].
unsafe fn pairs_serial(
    a: LeftPairs,
    (m, n, k2): (usize, usize, usize),
    panels: &[u16],
    out: SerialOut,
) {
    if m == 0 || n == 0 {
        return;
    }
    let simd = features().bf16;
    match a {
        LeftPairs::Rows { words, stride } => assert!(
            words.len() >= (m - 1) * stride + k2 && stride >= k2,
            "product_pairs_serial: the left rows read past their data"
        ),
        LeftPairs::Interleaved(words) => assert!(
            words.len() >= transposed_len(m, k2),
            "product_pairs_serial: the interleaved left operand is short"
        ),
    }
    assert!(
        panels.len() >= n.div_ceil(NR) * k2 * NR * 2,
        "product_pairs_serial: the panels are short"
    );
    let zeros = [0f32; NR];
    for p in 0..n.div_ceil(NR) {
        let panel = &panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
        let cols = NR.min(n - p * NR);
        let left = |r0: usize| match a {
            LeftPairs::Rows { words, stride } => PairsIn {
                ptr: words[r0 * stride..].as_ptr(),
                row: stride,
                pair: 1,
            },
            LeftPairs::Interleaved(words) => transposed_left(words, r0, k2),
        };
        let out = |r0: usize| match out {
            SerialOut::F32(c, ldc) => TileOut::F32 {
                c: c.wrapping_add(r0 * ldc + p * NR),
                ldc,
                accumulate: false,
            },
            SerialOut::Pairs(c, ldc) => TileOut::Pairs {
                c: c.wrapping_add(r0 * ldc + p * NR / 2),
                ldc,
            },
        };
        // SAFETY: a holds rows 0..m of k2 pairs (asserted above), the
        // panel k2 pair rows; the caller owns c's tiles.
        unsafe { tiles(simd, 0..m, left, k2, panel, &zeros[..cols], None, out) };
    }
}

/// [`product_bf16`] on the calling thread into `c` with rows `ldc` apart,
/// times `scale` (which needs `accumulate` off): for the small products a
/// parallel task makes (attention's, one sequence and head each).
///
/// # Safety
/// `c` must address `m` rows of `n` values, `ldc` apart, that nothing
/// else reads or writes meanwhile.
///
/// [`product_bf16`]: super::products::product_bf16
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_bf16_serial(
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Strided,
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    scale: f32,
) {
    assert!(
        scale == 1.0 || !accumulate,
        "product_bf16_serial: a scaled product cannot accumulate"
    );
    let sums = Sums {
        bias: None,
        accumulate,
    };
    let run = Run {
        simd: features().bf16,
        parallel: false,
    };
    let (a, store) = (Left::Strided(a), Store::Sums(sums));
    // SAFETY: the caller's contract.
    with_buffers(|buffers| unsafe {
        product_bf16_into(run, (m, n, k), a, Right::F32(b), (c, ldc), store, buffers)
    });
    if scale != 1.0 {
        for r in 0..m {
            // SAFETY: row r of the caller's m × n destination.
            let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), n) };
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
}
