//! A product's operands as its callers give them: fp32 read through
//! strides, rows of bf16 pairs rounded before, transposes, or panels
//! packed before.

/// A matrix read through strides: element `(r, c)` is `data[r·rs + c·cs]`
/// (a row-major matrix or its transpose, without a transposed copy).
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Strided<'a> {
    /// Row-major, rows `stride` apart.
    pub fn rows(data: &'a [f32], stride: usize) -> Self {
        Self {
            data,
            rs: stride,
            cs: 1,
        }
    }

    /// The transpose of row-major `data` with rows `stride` apart.
    pub fn transposed(data: &'a [f32], stride: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: stride,
        }
    }

    #[inline(always)]
    pub(super) fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.rs + c * self.cs]
    }

    pub(super) fn check(&self, rows: usize, cols: usize, what: &str) {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * self.rs + (cols - 1) * self.cs;
            assert!(
                last < self.data.len(),
                "{what}: a [{rows}, {cols}] view reads past its data"
            );
        }
    }
}

/// A forward product's left operand as its callers give it: fp32 rows
/// (rounded on the call) or rows of `⌈k / 2⌉` bf16 pairs rounded before
/// (a LayerNorm's output, stored beside its fp32 rows).
#[derive(Clone, Copy)]
pub(crate) enum LeftIn<'a> {
    F32(Strided<'a>),
    Pairs(&'a [u32]),
}

impl<'a> LeftIn<'a> {
    pub(super) fn left(self) -> Left<'a> {
        match self {
            Self::F32(a) => Left::Strided(a),
            Self::Pairs(p) => Left::Pairs(p),
        }
    }
}

/// A product's left operand.
#[derive(Clone, Copy)]
pub(super) enum Left<'a> {
    /// fp32 read through strides, rounded on the call.
    Strided(Strided<'a>),
    /// Rows of `⌈k / 2⌉` bf16 pairs, rounded before.
    Pairs(&'a [u32]),
    /// The transpose of `k` rows of `⌈m / 2⌉` bf16 pairs.
    TransposedPairs(&'a [u32]),
    /// A transpose interleaved already, as [`interleave_rows`] lays it out
    /// (`⌈m / MR_BF16⌉ · MR_BF16 · ⌈k / 2⌉` words).
    ///
    /// [`interleave_rows`]: super::transposed::interleave_rows
    Interleaved(&'a [u32]),
}

/// A product's right operand `[k, n]`.
#[derive(Clone, Copy)]
pub(crate) enum Right<'a> {
    /// fp32 read through strides, rounded as it is packed.
    F32(Strided<'a>),
    /// Rows of `⌈n / 2⌉` bf16 pairs, rounded before.
    Pairs(&'a [u32]),
    /// Packed already ([`PackedBf16`]'s panels: a weight's
    /// [`WeightPanels`]).
    ///
    /// [`PackedBf16`]: super::packed::PackedBf16
    /// [`WeightPanels`]: super::weight_panels::WeightPanels
    Packed(&'a [u16]),
}
