//! [`PackedBf16`]: an inference weight rounded and packed once, at load,
//! and its products with fp32 rows or with pairs a product stored.

use super::driver::SharedPairs;
use super::operands::Strided;
use super::pairs::round_rows;
use super::panels::pack_panels;
use super::tiles::{tiles, PairsIn, TileOut};
use crate::fast::cpu::features;
use crate::fast::kernels::Act;
use crate::fast::matmul::{check_shapes, for_each_task, SharedOut, NR};
use crate::io::quantized::PackedData;

/// bf16 weights `[k, n]` in column panels: panel `p`, pair row `i` holds,
/// for each of its [`NR`] columns `c`, `w[2i, c]` then `w[2i + 1, c]` (the
/// `vdpbf16ps` operand layout; an odd `k` is padded with a zero row).
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    panels: Vec<u16>,
    k: usize,
    /// Input pairs: `k` rounded up to even, halved.
    k2: usize,
    n: usize,
}

impl PackedBf16 {
    /// Rounds and packs `w_t`, row-major `[k, n]`.
    pub fn new(w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "PackedBf16: weight is not [{k}, {n}]");
        let panels = pack_panels(Strided::rows(w_t, n), k, n);
        Self {
            panels,
            k,
            k2: k.div_ceil(2),
            n,
        }
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// The stored form (what [`PackedBf16::from_parts`] takes back).
    pub fn to_parts(&self) -> PackedData {
        PackedData::Bf16 {
            panels: self.panels.clone(),
        }
    }

    /// A `[k, n]` multiply from its stored panels; `Err` when their size
    /// does not fit.
    pub fn from_parts(panels: Vec<u16>, k: usize, n: usize) -> std::result::Result<Self, String> {
        let k2 = k.div_ceil(2);
        let want = n.div_ceil(NR) * k2 * NR * 2;
        if panels.len() != want {
            return Err(format!(
                "packed has {} values, expected {want}",
                panels.len()
            ));
        }
        Ok(Self { panels, k, k2, n })
    }

    /// `y[m, n] = act(bf16(x)[m, k] · W + bias)`, `x` rounded into
    /// `scratch` (reused between calls).
    pub fn matmul(
        &self,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        self.matmul_on(features().bf16, x, bias, y, m, scratch, act);
    }

    /// [`PackedBf16::matmul`] on AVX512-BF16 (`simd`, which the caller
    /// checked the CPU has) or the scalar loop.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_on(
        &self,
        simd: bool,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        let (k, k2, n) = (self.k, self.k2, self.n);
        check_shapes(x, bias, y, m, k, n);
        round_rows(simd, x, m, k, k2, scratch);
        self.run_tiles(simd, &scratch[..m * k2], bias, Dest::F32(y), m, act);
    }

    /// `act(pairs · W + bias)` for `m` rows of input already rounded to
    /// bf16 pairs (`[m, ⌈k / 2⌉]`, as [`PackedBf16::matmul_to_pairs`]
    /// writes them), into `y` `[m, n]`.
    pub fn matmul_pairs(
        &self,
        pairs: &[u32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        act: Option<Act>,
    ) {
        assert_eq!(
            pairs.len(),
            m * self.k2,
            "matmul_pairs: input is not [{m}, {}] pairs",
            self.k2
        );
        assert_eq!(bias.len(), self.n, "matmul_pairs: bias is not [{}]", self.n);
        assert_eq!(
            y.len(),
            m * self.n,
            "matmul_pairs: output is not [{m}, {}]",
            self.n
        );
        self.run_tiles(features().bf16, pairs, bias, Dest::F32(y), m, act);
    }

    /// [`PackedBf16::matmul`] with its output rounded to bf16 pairs of
    /// adjacent columns in the tiles' store (`pairs_out`: `[m, ⌈n / 2⌉]`,
    /// grown as needed): the input of a following bf16 multiply, without
    /// an fp32 round trip. The bits equal rounding the fp32 output.
    pub fn matmul_to_pairs(
        &self,
        x: &[f32],
        bias: &[f32],
        pairs_out: &mut Vec<u32>,
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        let (k, k2, n2) = (self.k, self.k2, self.n.div_ceil(2));
        assert_eq!(x.len(), m * k, "matmul_to_pairs: input is not [{m}, {k}]");
        assert_eq!(
            bias.len(),
            self.n,
            "matmul_to_pairs: bias is not [{}]",
            self.n
        );
        let simd = features().bf16;
        round_rows(simd, x, m, k, k2, scratch);
        if pairs_out.len() < m * n2 {
            pairs_out.resize(m * n2, 0);
        }
        let out = Dest::Pairs(&mut pairs_out[..m * n2]);
        self.run_tiles(simd, &scratch[..m * k2], bias, out, m, act);
    }

    /// Every tile of the product of `m` rows of input `pairs` with the
    /// panels, stored into `dest`.
    fn run_tiles(
        &self,
        simd: bool,
        pairs: &[u32],
        bias: &[f32],
        dest: Dest,
        m: usize,
        act: Option<Act>,
    ) {
        let (k2, n) = (self.k2, self.n);
        let n2 = n.div_ceil(2);
        let base = match dest {
            Dest::F32(y) => Base::F32(SharedOut(y.as_mut_ptr())),
            Dest::Pairs(p) => Base::Pairs(SharedPairs(p.as_mut_ptr())),
        };
        for_each_task(m, n, std::mem::size_of_val(pairs), |p, rows| {
            let panel = &self.panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
            let cs = p * NR..(p * NR + NR).min(n);
            let bias = &bias[cs];
            let left = |r0: usize| PairsIn::rows(&pairs[r0 * k2..], k2);
            let out = |r0: usize| match base {
                Base::F32(y) => TileOut::F32 {
                    c: y.at(r0 * n + p * NR),
                    ldc: n,
                    accumulate: false,
                },
                Base::Pairs(y) => TileOut::Pairs {
                    c: y.at(r0 * n2 + p * NR / 2),
                    ldc: n2,
                },
            };
            // SAFETY: the task's rows, the columns (or pairs) of panel p
            // lie inside the output (shapes checked by the callers) and
            // belong to this task only; pairs holds m rows of k2.
            unsafe { tiles(simd, rows, left, k2, panel, bias, act, out) };
        });
    }
}

/// Where [`PackedBf16::run_tiles`] stores.
enum Dest<'a> {
    F32(&'a mut [f32]),
    Pairs(&'a mut [u32]),
}

/// [`Dest`] as the pointer its tasks share.
#[derive(Clone, Copy)]
enum Base {
    F32(SharedOut),
    Pairs(SharedPairs),
}
