//! Products whose tiles store, beside or instead of the fp32 sums, what
//! the next step reads, so that no pass over the output follows: an
//! activation's slopes, pairs and panels (forward); its input gradient's
//! pairs and transpose, and the bias gradient (backward); or the sums
//! plus bias as bf16 pairs alone.

use super::driver::{product_bf16_writing, product_bf16_writing_on, SharedIn, SharedPairs, Store};
use super::operands::{Left, LeftIn, Right};
use super::pairs::{padded_pairs, pair_stride};
use super::panels::panels_len;
use super::tiles::MR_BF16;
use super::transposed::{transposed_len, transposed_stride, transposed_width};
use crate::fast::buffers::Unwritten;
use crate::fast::cpu::features;
use crate::fast::kernels::Act;
use crate::fast::matmul::{SharedOut, ROWS_PER_TASK};

/// `z = bf16(a)[m, k] · bf16(b)[k, n] + bias` with fp32 sums, stored from
/// the register tiles as the activation's slopes `act'(z)` `[m, n]` and
/// `pairs` `[m, ⌈n / 2⌉]` (the words of an fp32 buffer): `act(z)` as bf16
/// pairs. All the activation's backward reads ([`product_bf16_act_grad`]),
/// and the next product's rounded input ([`product_bf16_pairs_right`]), without
/// a pass over either between the two products. The bits of computing
/// `act(z)`, rounding it, and `act'(z)` apart. And `act(z)` once more as
/// the panels of a right operand `[m, n]` (`panels_len(m, n) / 2` words
/// of an fp32 buffer, the bits `pack_panels` makes of the pairs): the
/// next product's weight gradient reads them unpacked
/// ([`product_bf16_transposed_pairs_packed`]). The three new buffers,
/// written whole (not zeroed first).
///
/// [`product_bf16_pairs_right`]: super::products::product_bf16_pairs_right
/// [`product_bf16_transposed_pairs_packed`]: super::products::product_bf16_transposed_pairs_packed
pub(crate) fn product_bf16_act(
    dims: (usize, usize, usize),
    a: LeftIn,
    b: Right,
    (bias, act): (&[f32], Act),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    product_bf16_act_on(features().bf16, dims, a, b, (bias, act))
}

/// [`product_bf16_act`] on AVX512-BF16 or the scalar loop (`simd`).
fn product_bf16_act_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: LeftIn,
    b: Right,
    (bias, act): (&[f32], Act),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    assert_eq!(bias.len(), n, "product_bf16_act: bias is not [{n}]");
    let mut c = Unwritten::new(m * n);
    let ldp = pair_stride(n);
    let mut pairs = padded_pairs(m, n);
    let mut panels = Unwritten::new(panels_len(m, n) / 2);
    let store = Store::Both {
        bias,
        act,
        pairs: SharedPairs(pairs.as_mut_ptr().cast()),
        ldp,
        panels: SharedPairs(panels.as_mut_ptr().cast()),
    };
    // The slopes are the product's fp32 output.
    product_bf16_writing_on(simd, (m, n, k), a.left(), b, Some(&mut c), store);
    // SAFETY: product_bf16_writing wrote every value of c, its tiles every
    // pair of each row (⌈n / 2⌉ words), padded_pairs the rest, and every
    // pair row of every panel (each tile its rows' pairs, all NR columns,
    // an odd last row's partner zeros).
    unsafe {
        (
            c.assume_written(),
            pairs.assume_written(),
            panels.assume_written(),
        )
    }
}

/// `bf16(a)[m, k] · bf16(b)[k, n] + bias` as bf16 pairs only, `[m, ⌈n /
/// 2⌉]` in a new buffer (the words of an fp32 buffer) written whole by the
/// tiles: a product whose every use rounds it again (attention's Q, K and
/// V), so no fp32 copy is stored. The bits of rounding the fp32 sums.
pub(crate) fn product_bf16_to_pairs_new(
    (m, n, k): (usize, usize, usize),
    a: LeftIn,
    b: Right,
    bias: &[f32],
) -> Vec<f32> {
    assert_eq!(
        bias.len(),
        n,
        "product_bf16_to_pairs_new: bias is not [{n}]"
    );
    let mut pairs = Unwritten::new(m * n.div_ceil(2));
    let store = Store::Pairs {
        bias,
        pairs: SharedPairs(pairs.as_mut_ptr().cast()),
    };
    product_bf16_writing((m, n, k), a.left(), b, None, store);
    // SAFETY: the tiles wrote every pair of each row (⌈n / 2⌉ words).
    unsafe { pairs.assume_written() }
}

/// `dz = (a · b) ⊙ slopes`, `a · b` an activation's output gradient (`[m,
/// n]`, bf16 products, fp32 sums) and `slopes` its slopes `act'(z)` `[m,
/// n]` ([`product_bf16_act`]'s): the activation's input gradient as bf16
/// pairs `[m, ⌈n / 2⌉]` in a new buffer (the words of fp32 storage,
/// written whole by the tiles), its column sums added into `dbias`. The
/// output gradient is never stored, nor read back by a pass of its own.
/// The pairs are the bits of the stored product times the slopes,
/// rounded; the column sums are added tile by tile, task by
/// task (rows of [`ROWS_PER_TASK`]), then over the tasks in row
/// order: fixed by the shapes, not the threads. Beside the pairs, their
/// transpose as the weight gradient `dzᵀ · x` reads it, interleaved
/// ([`product_bf16_interleaved`]'s left operand), from the same tiles.
///
/// [`product_bf16_interleaved`]: super::products::product_bf16_interleaved
pub(crate) fn product_bf16_act_grad(
    dims: (usize, usize, usize),
    a: &[u32],
    b: Right,
    slopes: &[f32],
    dbias: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    act_grad_on(features().bf16, dims, a, b, slopes, dbias)
}

/// [`product_bf16_act_grad`] on AVX512-BF16 or the scalar loop (`simd`).
pub(super) fn act_grad_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Right,
    slopes: &[f32],
    dbias: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    assert!(
        slopes.len() == m * n && dbias.len() == n,
        "product_bf16_act_grad: the slopes or the bias gradient are not [{m}, {n}], [{n}]"
    );
    let tasks = m.div_ceil(ROWS_PER_TASK);
    let mut sums = crate::fast::buffers::zeros(tasks * n);
    let mut pairs = padded_pairs(m, n);
    let mut blocks = transposed_blocks(n, m);
    let store = Store::ActGrad {
        slopes: SharedIn(slopes.as_ptr()),
        pairs: SharedPairs(pairs.as_mut_ptr().cast()),
        ldp: pair_stride(n),
        sums: SharedOut(sums.as_mut_ptr()),
        blocks: SharedPairs(blocks.as_mut_ptr().cast()),
    };
    product_bf16_writing_on(simd, (m, n, k), Left::Pairs(a), b, None, store);
    for block in sums.chunks_exact(n.max(1)) {
        dbias.iter_mut().zip(block).for_each(|(d, s)| *d += s);
    }
    crate::fast::buffers::recycle(sums);
    // SAFETY: the tiles wrote every pair of each row (⌈n / 2⌉ words),
    // padded_pairs the rest; and every word of the blocks' n rows (each
    // tile its columns of its pairs of rows, an odd last row's partner
    // zeros), transposed_blocks those past them.
    unsafe { (pairs.assume_written(), blocks.assume_written()) }
}

/// A new buffer for the transpose of a `[k, m]` matrix as the interleaved
/// blocks of a left operand `[m, k]` ([`Blocks`]): `⌈m / MR_BF16⌉` blocks
/// of `⌈k / 2⌉` steps of `MR_BF16` words, the words of the last block's
/// rows past `m` zeroed (no tile reads them; whoever writes the others
/// leaves them). On AMX `m` rows of [`transposed_stride`] words, their
/// padding zeroed.
///
/// [`Blocks`]: super::tiles::Blocks
fn transposed_blocks(m: usize, k: usize) -> Unwritten {
    let (k2, full) = (k.div_ceil(2), m / MR_BF16);
    let len = transposed_len(m, k2);
    let mut blocks = Unwritten::new(len);
    let stride = transposed_stride(k2);
    if transposed_width() == 1 && stride > k2 {
        // Rows of pairs: each row's padding words.
        let words: *mut u32 = blocks.as_mut_ptr().cast();
        for r in 0..m {
            // SAFETY: words k2..stride of row r < m lie inside the buffer.
            unsafe { std::slice::from_raw_parts_mut(words.add(r * stride + k2), stride - k2) }
                .fill(0);
        }
    } else if transposed_width() > 1 && !m.is_multiple_of(MR_BF16) {
        let words: *mut u32 = blocks.as_mut_ptr().cast();
        for i in 0..k2 {
            // SAFETY: the last block's step i lies inside the buffer.
            let step = unsafe {
                std::slice::from_raw_parts_mut(words.add((full * k2 + i) * MR_BF16), MR_BF16)
            };
            step[m % MR_BF16..].fill(0);
        }
    }
    blocks
}
