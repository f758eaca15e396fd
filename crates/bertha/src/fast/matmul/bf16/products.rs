//! The products of a training step whose tiles store fp32 sums: operands
//! rounded and packed on the call, or given as pairs or panels made
//! before; into rows, or into a new buffer written whole.

use super::driver::{product_bf16_sums, product_bf16_writing, Dst, Store, Sums};
use super::operands::{Left, Right, Strided};
use crate::fast::buffers::Unwritten;

/// `c[m, n] (+)= bf16(a)[m, k] · bf16(b)[k, n] (+ bias)` with fp32 sums,
/// `c` row-major: both operands rounded (and `b` packed) on this call, for
/// products whose operands change every call (a training step's).
pub fn product_bf16<'c>(
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Strided,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Strided(a), Right::F32(b), c, sums)
}

/// [`product_bf16`] with any right operand (a weight's panels packed
/// already: [`WeightPanels`]).
///
/// [`WeightPanels`]: super::weight_panels::WeightPanels
pub(crate) fn product_bf16_right(
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Right,
    c: &mut [f32],
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Strided(a), b, c, sums)
}

/// [`product_bf16_right`] with the left operand already rounded: `m`
/// rows of `⌈k / 2⌉` bf16 pairs (padded or not: [`pair_stride`]), as the
/// tiles store them.
///
/// [`pair_stride`]: super::pairs::pair_stride
pub(crate) fn product_bf16_pairs_right(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Right,
    c: &mut [f32],
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Pairs(a), b, c, sums)
}

/// [`product_bf16`] with the left operand the transpose of a matrix
/// already rounded: `a` holds `k` rows of `⌈m / 2⌉` bf16 pairs (a weight
/// gradient's `dy`, as the pass that made it stored it), and the product
/// reads `aᵀ` `[m, k]`.
pub fn product_bf16_transposed_pairs<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Strided,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::TransposedPairs(a), Right::F32(b), c, sums)
}

/// [`product_bf16`] with both operands already rounded: `a` the transpose
/// of `k` rows of `⌈m / 2⌉` pairs (as [`product_bf16_transposed_pairs`]),
/// `b` `k` rows of `⌈n / 2⌉` pairs (as the tiles store them): a
/// weight gradient whose output gradient and input were both stored as
/// pairs.
pub(crate) fn product_bf16_both_pairs<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: &[u32],
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums(
        (m, n, k),
        Left::TransposedPairs(a),
        Right::Pairs(b),
        c,
        sums,
    )
}

/// `c[m, n] (+)= bf16(a) · bf16(b)`, `a` `[m, k]` given as the
/// interleaved transpose [`product_bf16_act_grad`] stores (the words of
/// fp32 storage) and `b` as fp32 rows: a weight gradient `dzᵀ · x` whose
/// `dz` the product that made it stored so.
///
/// [`product_bf16_act_grad`]: super::fused::product_bf16_act_grad
pub(crate) fn product_bf16_interleaved<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Strided,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Interleaved(a), Right::F32(b), c, sums)
}

/// `c[m, n] += bf16(a)ᵀ · b`, `a` given as `k` rows of `⌈m / 2⌉` bf16
/// pairs and `b` `[k, n]` as its panels (`panels_len(k, n)` halves, as
/// [`product_bf16_act`] stores them): a weight gradient whose input was
/// stored as panels by the product that made it.
///
/// [`product_bf16_act`]: super::fused::product_bf16_act
pub(crate) fn product_bf16_transposed_pairs_packed<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: &[u16],
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums(
        (m, n, k),
        Left::TransposedPairs(a),
        Right::Packed(b),
        c,
        sums,
    )
}

/// The sums (plus `bias`) of a product in a new buffer, not zeroed first.
fn product_bf16_fresh(
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let mut c = Unwritten::new(m * n);
    let store = Store::Sums(Sums {
        bias,
        accumulate: false,
    });
    product_bf16_writing((m, n, k), a, b, Some(&mut c), store);
    // SAFETY: product_bf16_writing wrote every value.
    unsafe { c.assume_written() }
}

/// [`product_bf16`] into a new buffer (sums plus `bias`, not zeroed first).
pub(crate) fn product_bf16_new(
    dims: (usize, usize, usize),
    a: Strided,
    b: Strided,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    product_bf16_fresh(dims, Left::Strided(a), Right::F32(b), bias)
}

/// [`product_bf16_pairs_right`] into a new buffer (sums plus `bias`).
pub(crate) fn product_bf16_pairs_new(
    dims: (usize, usize, usize),
    a: &[u32],
    b: Right,
    bias: &[f32],
) -> Vec<f32> {
    product_bf16_fresh(dims, Left::Pairs(a), b, Some(bias))
}
