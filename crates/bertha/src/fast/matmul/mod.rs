//! Matrix multiplies against weights packed once, at load time.
//!
//! A general gemm repacks its right-hand side on every call: for the
//! inference fast path that means copying every weight matrix of the model
//! on every forward pass, which dominates at small batches (a sentence at
//! batch 1 is ~25 rows against 10 M weights). Here the weights are laid out
//! once in column panels the micro-kernel streams straight through:
//!
//! - [`PackedF32`]: fp32, panels of [`NR`] columns, each `k` rows of `NR`
//!   floats; the AVX-512 kernel keeps an 8 × 32 tile of the output in
//!   registers.
//! - [`PackedI8`]: int8 weights with one scale per output column and
//!   group of input channels, for `--precision int8`. Activations are
//!   quantized on the fly, per row and group of input channels
//!   ([`QGROUP`] by default), to unsigned bytes between the
//!   group's minimum and maximum (asymmetric: a one-sided range keeps all
//!   256 levels), after dividing each input channel
//!   by a smoothing factor that was multiplied into the weights instead
//!   (SmoothQuant: channels with large activations would otherwise set the
//!   row's scale for all). Products run on AVX-512 VNNI (`vpdpbusd`, four
//!   8-bit products per 32-bit lane); the integer sums are exact, so the
//!   scalar fallback computes the same integers.
//!
//! Both run in parallel over (column panel, row block) tasks on the rayon
//! pool and write `y = x · W + bias` row-major.

mod bf16;

pub(crate) use bf16::{
    as_f32, as_f32_mut, as_halves, as_words, as_words_mut, interleave_transposed, pack_panels_into,
    pack_row_pairs, pack_transposed_pairs, product_bf16_act, product_bf16_act_grad,
    product_bf16_both_pairs, product_bf16_interleaved, product_bf16_new, product_bf16_pairs_new,
    product_bf16_pairs_right, product_bf16_right, product_bf16_serial, product_bf16_to_pairs_new,
    product_bf16_transposed_pairs_packed, product_pairs_serial, product_pairs_serial_to_pairs,
    round_row, round_rows_serial, tile_bf16, Dst, LeftIn, LeftPairs, PanelWriter, Right,
    WeightPanels, BF16_TILE_ROWS,
};
pub use bf16::{product_bf16, product_bf16_transposed_pairs, PackedBf16, Strided, Sums};

use rayon::prelude::*;

use super::cpu::features;
use super::kernels::{activate_body, Act};
use crate::io::quantized::PackedData;

/// Output columns per panel: two 16-float AVX-512 registers.
pub const NR: usize = 32;
/// Output rows per fp32 register tile: 12 × 2 accumulators leave room
/// for the two weight vectors and a broadcast in AVX-512's 32 registers.
const MR_F32: usize = 12;
/// The most rows one [`tile_f32`] call takes.
pub(crate) const F32_TILE_ROWS: usize = MR_F32;

/// Whether [`tile_f32`] runs on register tiles here, AVX-512 or AVX2
/// (else a scalar loop, which callers with their own fallback should not
/// use).
pub(crate) fn has_f32_tiles() -> bool {
    let f = features();
    f.avx512_bw || f.avx2_fma
}

/// Output rows per int8 register tile: 6 × 2 int32 sums and 6 × 2 fp32
/// sums (a group's sums are scaled into floats every `group` inputs) with
/// the two weight vectors and a broadcast fit AVX-512's 32 registers; 8
/// rows did not, and ran 3–5 % slower (`examples/kernel_rates`).
const MR: usize = 6;
/// Rows per parallel task (a multiple of both tile heights): a task reuses
/// one weight panel over these.
const ROWS_PER_TASK: usize = 96;
/// Input channels sharing one activation scale in int8 products, by
/// default (a multiple of 4, the `vpdpbusd` depth): finer groups track the
/// ranges of different channels better, at two float multiply-adds per
/// group and row.
pub const QGROUP: usize = 64;

/// How one int8 multiply quantizes: the activation channel group and the
/// SmoothQuant migration strength.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct I8Scheme {
    /// Input channels per activation scale (a multiple of 4).
    pub group: usize,
    /// Smoothing factor of channel `j`: `max|x_j|^alpha / max|w_j|^(1 - alpha)`
    /// (0: none; 0.5 evens the two ranges).
    pub alpha: f32,
}

impl Default for I8Scheme {
    fn default() -> Self {
        Self {
            group: QGROUP,
            alpha: 0.5,
        }
    }
}

/// fp32 weights `[k, n]`: in column panels for the AVX-512 and AVX2 tile
/// kernels; row-major for the gemm crate on other CPUs, whose NEON
/// kernels beat a portable tile loop by far.
#[derive(Debug, Clone)]
pub struct PackedF32 {
    layout: F32Layout,
    k: usize,
    n: usize,
}

#[derive(Debug, Clone)]
enum F32Layout {
    /// Panel `p` holds columns `p·NR..`, `k` rows of `NR` floats (zero
    /// padded past `n`).
    Panels(Vec<f32>),
    /// Row-major `[k, n]`, multiplied by the gemm crate.
    RowMajor(Vec<f32>),
}

impl PackedF32 {
    /// Packs `w_t`, row-major `[k, n]` (a transposed `nn.Linear` weight).
    pub fn new(w_t: &[f32], k: usize, n: usize) -> Self {
        Self::with_panels(w_t, k, n, has_f32_tiles())
    }

    fn with_panels(w_t: &[f32], k: usize, n: usize, panels: bool) -> Self {
        assert_eq!(w_t.len(), k * n, "PackedF32: weight is not [{k}, {n}]");
        if !panels {
            return Self {
                layout: F32Layout::RowMajor(w_t.to_vec()),
                k,
                n,
            };
        }
        let n_panels = n.div_ceil(NR);
        let mut panels = vec![0f32; n_panels * k * NR];
        for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
            let cols = NR.min(n - p * NR);
            for (row, dst) in panel.chunks_exact_mut(NR).enumerate() {
                dst[..cols].copy_from_slice(&w_t[row * n + p * NR..][..cols]);
            }
        }
        Self {
            layout: F32Layout::Panels(panels),
            k,
            n,
        }
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    pub fn out_dim(&self) -> usize {
        self.n
    }

    /// The weights back as row-major `[k, n]`.
    pub fn unpack(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let panels = match &self.layout {
            F32Layout::RowMajor(w_t) => return w_t.clone(),
            F32Layout::Panels(p) => p,
        };
        let mut w_t = vec![0f32; k * n];
        for (p, panel) in panels.chunks_exact(k * NR).enumerate() {
            let cols = NR.min(n - p * NR);
            for (row, src) in panel.chunks_exact(NR).enumerate() {
                w_t[row * n + p * NR..][..cols].copy_from_slice(&src[..cols]);
            }
        }
        w_t
    }

    /// `y[m, n] = act(x[m, k] · W + bias)` (the activation applied while
    /// the tile is still in cache, when given).
    pub fn matmul(&self, x: &[f32], bias: &[f32], y: &mut [f32], m: usize, act: Option<Act>) {
        let (k, n) = (self.k, self.n);
        check_shapes(x, bias, y, m, k, n);
        let panels = match &self.layout {
            F32Layout::RowMajor(w_t) => {
                crate::fast::kernels::linear(x, w_t, bias, y, m, k, n);
                if let Some(act) = act {
                    y.par_chunks_mut(n * ROWS_PER_TASK)
                        .for_each(|rows| activate_body(rows, act));
                }
                return;
            }
            F32Layout::Panels(p) => p,
        };
        let out = SharedOut(y.as_mut_ptr());
        for_each_task(m, n, std::mem::size_of_val(x), |p, rows| {
            let panel = &panels[p * k * NR..(p + 1) * k * NR];
            let cols = NR.min(n - p * NR);
            let bias = &bias[p * NR..p * NR + cols];
            for r0 in rows.step_by(MR_F32) {
                let mr = MR_F32.min(m - r0);
                let a = &x[r0 * k..(r0 + mr) * k];
                // Rows r0..r0+mr, columns p·NR..p·NR+cols of y lie inside
                // y (shapes checked) and belong to this task only.
                let c = out.at(r0 * n + p * NR);
                // SAFETY: as just said.
                unsafe { tile_f32(a, k, mr, panel, c, n, cols, bias, act) };
            }
        });
    }
}

/// int8 weights `[k, n]` with one scale per output column and channel
/// group: smoothing makes some input rows of the weights large, and a
/// scale per group keeps them from coarsening every other row's steps.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    /// Panel `p`, quad `g` (inputs 4g..4g+4): `NR` columns × 4 bytes, each
    /// column's four weights adjacent (the `vpdpbusd` operand layout).
    panels: Vec<i8>,
    /// Per panel and channel group, the `NR` columns' dequantisation
    /// scales (`max |w| / 127` over the group's rows).
    w_scales: Vec<f32>,
    /// Per panel and channel group, `NR` sums `scale · Σ_k q[k, c]` of the
    /// quantized weights: a group's activation bytes count up from its
    /// minimum, and `minimum · sum` adds it back.
    group_sums: Vec<f32>,
    /// What each input channel is multiplied by before quantization (the
    /// inverse of the smoothing factor folded into the weights).
    x_scales: Vec<f32>,
    k: usize,
    /// `k` rounded up to a multiple of 4.
    k4: usize,
    n: usize,
    /// Input channels per activation scale (a multiple of 4).
    group: usize,
    /// On AVX2 without VNNI: the panels' weights as i16 pairs for
    /// `vpmaddwd` ([`wide_panels`]), made once at load; else empty.
    wide: Vec<i16>,
}

/// Channel groups of `k` inputs, `group` each.
fn groups(k: usize, group: usize) -> usize {
    k.div_ceil(group)
}

/// The quads (4-input steps) of channel group `g`.
fn group_quads(g: usize, group: usize, k4: usize) -> std::ops::Range<usize> {
    g * group / 4..((g + 1) * group / 4).min(k4 / 4)
}

impl PackedI8 {
    /// Quantizes and packs `w_t`, row-major `[k, n]`. `act_max`, the
    /// largest |activation| seen on each input channel (calibration),
    /// turns on smoothing: channel `j` is scaled by
    /// `act_max[j]^α / max_c |w[j, c]|^(1 − α)` in the weights and by its
    /// inverse in the activations, which moves range from the activations
    /// to the weights (α = 0.5 evens the two).
    pub fn new(w_t: &[f32], k: usize, n: usize, act_max: Option<&[f32]>, scheme: I8Scheme) -> Self {
        assert_eq!(w_t.len(), k * n, "PackedI8: weight is not [{k}, {n}]");
        assert!(
            scheme.group > 0 && scheme.group.is_multiple_of(4),
            "PackedI8: group {} is not a positive multiple of 4",
            scheme.group
        );
        let smooth: Vec<f32> = match act_max {
            Some(a) => {
                assert_eq!(a.len(), k, "PackedI8: act_max is not [{k}]");
                (0..k)
                    .map(|j| {
                        let wmax = w_t[j * n..(j + 1) * n]
                            .iter()
                            .fold(0f32, |m, v| m.max(v.abs()));
                        a[j].max(1e-5).powf(scheme.alpha) / wmax.max(1e-5).powf(1.0 - scheme.alpha)
                    })
                    .collect()
            }
            None => vec![1.0; k],
        };
        let x_scales = smooth.iter().map(|s| 1.0 / s).collect();
        let k4 = k.div_ceil(4) * 4;
        let group = scheme.group;
        let (n_panels, n_groups) = (n.div_ceil(NR), groups(k, group));
        let mut w_scales = vec![1f32; n_panels * n_groups * NR];
        let mut panels = vec![0i8; n_panels * k4 * NR];
        for c in 0..n {
            let w = |r: usize| w_t[r * n + c] * smooth[r];
            let (p, lane) = (c / NR, c % NR);
            for g in 0..n_groups {
                let rows = g * group..((g + 1) * group).min(k);
                let amax = rows.clone().map(|r| w(r).abs()).fold(0f32, f32::max);
                let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                w_scales[(p * n_groups + g) * NR + lane] = scale;
                for r in rows {
                    let q = (w(r) / scale).round().clamp(-127.0, 127.0) as i8;
                    panels[p * k4 * NR + (r / 4) * 4 * NR + lane * 4 + r % 4] = q;
                }
            }
        }
        Self::from_parts(panels, w_scales, x_scales, group, k, n)
            .expect("the parts are packed to fit")
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// The stored form: panels, weight scales, inverse smoothing factors
    /// and group (what [`PackedI8::from_parts`] takes back).
    pub fn to_parts(&self) -> PackedData {
        PackedData::I8 {
            panels: self.panels.clone(),
            w_scales: self.w_scales.clone(),
            x_scales: self.x_scales.clone(),
            group: self.group,
        }
    }

    /// A `[k, n]` multiply from its stored parts (the group sums are
    /// recomputed: exact integer sums); `Err` says which part does not fit.
    pub fn from_parts(
        panels: Vec<i8>,
        w_scales: Vec<f32>,
        x_scales: Vec<f32>,
        group: usize,
        k: usize,
        n: usize,
    ) -> std::result::Result<Self, String> {
        let k4 = k.div_ceil(4) * 4;
        let n_panels = n.div_ceil(NR);
        let fits = |what: &str, got: usize, want: usize| {
            (got == want)
                .then_some(())
                .ok_or(format!("{what} has {got} values, expected {want}"))
        };
        if group == 0 || !group.is_multiple_of(4) {
            return Err(format!("group {group} is not a positive multiple of 4"));
        }
        let n_groups = groups(k, group);
        fits("packed", panels.len(), n_panels * k4 * NR)?;
        fits("w_scales", w_scales.len(), n_panels * n_groups * NR)?;
        fits("x_scales", x_scales.len(), k)?;
        let mut group_sums = vec![0f32; n_panels * n_groups * NR];
        for (p, panel) in panels.chunks_exact(k4 * NR).enumerate() {
            for (q, quad) in panel.chunks_exact(4 * NR).enumerate() {
                for (lane, w) in quad.chunks_exact(4).enumerate() {
                    for (i, &w) in w.iter().enumerate() {
                        let r = 4 * q + i;
                        if r < k {
                            group_sums[(p * n_groups + r / group) * NR + lane] += f32::from(w);
                        }
                    }
                }
            }
        }
        for (s, w) in group_sums.iter_mut().zip(&w_scales) {
            *s *= w;
        }
        let f = features();
        let wide = if f.avx2_fma && !f.vnni {
            wide_panels(&panels, k4)
        } else {
            Vec::new()
        };
        Ok(Self {
            wide,
            panels,
            w_scales,
            group_sums,
            x_scales,
            k,
            k4,
            n,
            group,
        })
    }

    /// `y[m, n] ≈ x[m, k] · W + bias`, with `x` quantized into `scratch`
    /// (reused between calls).
    pub fn matmul(
        &self,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut QuantScratch,
        act: Option<Act>,
    ) {
        let (k, k4, n) = (self.k, self.k4, self.n);
        check_shapes(x, bias, y, m, k, n);
        scratch.quantize(x, m, k, k4, self.group, &self.x_scales);
        if !self.wide.is_empty() {
            scratch.widen();
        }
        let QuantScratch {
            bytes,
            quants,
            words,
            ..
        } = &*scratch;
        #[cfg(not(target_arch = "x86_64"))]
        let _ = words;
        let n_groups = groups(k, self.group);
        let out = SharedOut(y.as_mut_ptr());
        for_each_task(m, n, m * k4, |p, block| {
            let cs = p * NR..(p * NR + NR).min(n);
            let tile = I8Tile {
                k4,
                group: self.group,
                panel: &self.panels[p * k4 * NR..(p + 1) * k4 * NR],
                group_sums: &self.group_sums[p * n_groups * NR..(p + 1) * n_groups * NR],
                w_scales: &self.w_scales[p * n_groups * NR..(p + 1) * n_groups * NR],
                bias: &bias[cs],
                act,
            };
            #[cfg(target_arch = "x86_64")]
            if !self.wide.is_empty() {
                let wide = &self.wide[p * k4 * NR..(p + 1) * k4 * NR];
                for r0 in block.clone().step_by(avx2::MR) {
                    let mr = avx2::MR.min(m - r0);
                    let (words, quants) = (
                        &words[r0 * k4..(r0 + mr) * k4],
                        &quants[r0 * n_groups..(r0 + mr) * n_groups],
                    );
                    let c = out.at(r0 * n + p * NR);
                    macro_rules! dispatch {
                        ($($n:literal)*) => {
                            match mr {
                                // SAFETY: the CPU has AVX2 and FMA (the
                                // wide panels exist only then); the slices
                                // hold mr rows; the tile at rows r0..,
                                // columns p·NR.. of y is this task's.
                                $($n => unsafe {
                                    avx2::tile_i16::<$n>(&tile, wide, words, quants, c, n)
                                },)*
                                _ => unreachable!("tiles have 1..=6 rows"),
                            }
                        };
                    }
                    dispatch!(1 2 3 4 5 6);
                }
                return;
            }
            for r0 in block.step_by(MR) {
                let mr = MR.min(m - r0);
                // SAFETY: the tile at rows r0.., columns p·NR.. lies inside
                // y (shapes checked) and belongs to this task only.
                unsafe {
                    tile.run(
                        &bytes[r0 * k4..(r0 + mr) * k4],
                        &quants[r0 * n_groups..(r0 + mr) * n_groups],
                        mr,
                        out.at(r0 * n + p * NR),
                        n,
                    )
                };
            }
        });
    }
}

/// One column panel of a [`PackedI8`] multiply.
struct I8Tile<'a> {
    k4: usize,
    group: usize,
    panel: &'a [i8],
    group_sums: &'a [f32],
    w_scales: &'a [f32],
    bias: &'a [f32],
    act: Option<Act>,
}

impl I8Tile<'_> {
    fn cols(&self) -> usize {
        self.bias.len()
    }

    /// `c[r, j] = Σ_g (step[r, g] · scale[g, j] · Σ_{i∈g} qa[r, i] · w[i, j]
    /// + min[r, g] · sum[g, j]) + bias[j]` for `r < mr`, `j < cols`; `c`
    /// has row stride `ldc`.
    ///
    /// # Safety
    /// `c` must address an `mr` × `cols` tile (row stride `ldc`) that no
    /// one else reads or writes meanwhile.
    unsafe fn run(&self, qa: &[u8], quants: &[GroupQuant], mr: usize, c: *mut f32, ldc: usize) {
        #[cfg(target_arch = "x86_64")]
        if features().vnni {
            macro_rules! dispatch {
                ($($n:literal)*) => {
                    match mr {
                        // SAFETY: the CPU has AVX-512 VNNI (checked); qa
                        // holds mr rows of k4 bytes, quants mr rows of
                        // groups, and the caller owns the tile at c.
                        $($n => unsafe { avx512::tile_i8::<$n>(self, qa, quants, c, ldc) },)*
                        _ => unreachable!("tiles have 1..=MR rows"),
                    }
                };
            }
            dispatch!(1 2 3 4 5 6);
            return;
        }
        let n_groups = quants.len() / mr;
        for r in 0..mr {
            let row = &qa[r * self.k4..(r + 1) * self.k4];
            let mut acc = [0f32; NR];
            for (g, quant) in quants[r * n_groups..(r + 1) * n_groups].iter().enumerate() {
                let sums = int_sums(row, self.panel, group_quads(g, self.group, self.k4));
                let gsum = &self.group_sums[g * NR..(g + 1) * NR];
                let scales = &self.w_scales[g * NR..(g + 1) * NR];
                for (((a, s), w), ws) in acc.iter_mut().zip(sums).zip(gsum).zip(scales) {
                    *a += s as f32 * (quant.step * ws) + quant.min * w;
                }
            }
            // SAFETY: row r < mr, columns < cols of the caller's tile.
            let out = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), self.cols()) };
            for ((y, a), b) in out.iter_mut().zip(acc).zip(self.bias) {
                *y = a + b;
            }
            if let Some(act) = self.act {
                activate_body(out, act);
            }
        }
    }
}

/// The weights of int8 `panels` (each `k4` inputs × [`NR`] columns in
/// quads: a column's four inputs adjacent) as i16 pairs: per panel, per
/// pair of inputs, `NR` columns of two words, the operand layout of
/// `vpmaddwd` (each i32 lane sums a column's two products).
fn wide_panels(panels: &[i8], k4: usize) -> Vec<i16> {
    let mut wide = vec![0i16; panels.len()];
    for (src, dst) in panels
        .chunks_exact(k4 * NR)
        .zip(wide.chunks_exact_mut(k4 * NR))
    {
        for (q, quad) in src.chunks_exact(4 * NR).enumerate() {
            for (col, w) in quad.chunks_exact(4).enumerate() {
                for (i, &w) in w.iter().enumerate() {
                    let pair = 2 * q + i / 2;
                    dst[pair * 2 * NR + 2 * col + i % 2] = i16::from(w);
                }
            }
        }
    }
    wide
}

/// Σ over the 4-input quads `quads` of `row` bytes times the panel's
/// weights, per column: the integers the VNNI kernel must equal.
fn int_sums(row: &[u8], panel: &[i8], quads: std::ops::Range<usize>) -> [i32; NR] {
    let mut acc = [0i32; NR];
    for g in quads {
        let x = &row[4 * g..4 * g + 4];
        let quad = &panel[g * 4 * NR..(g + 1) * 4 * NR];
        for (s, w) in acc.iter_mut().zip(quad.chunks_exact(4)) {
            *s += x
                .iter()
                .zip(w)
                .map(|(&x, &w)| i32::from(x) * i32::from(w))
                .sum::<i32>();
        }
    }
    acc
}

/// A quantized channel group of one row: `x ≈ min + step · byte`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupQuant {
    step: f32,
    min: f32,
}

/// A multiply's activations in the weights' number format (per-row,
/// per-group int8; bf16 pairs), reused across calls.
#[derive(Debug, Default)]
pub struct QuantScratch {
    /// [m, k4] bytes (padding: 0; the weights there are 0).
    bytes: Vec<u8>,
    /// [m, groups].
    quants: Vec<GroupQuant>,
    /// [m, k4] the bytes as 16-bit words, for the AVX2 int8 kernel.
    words: Vec<u16>,
    /// [m, k2] bf16 pairs for [`PackedBf16`].
    pairs: Vec<u32>,
}

impl QuantScratch {
    /// The buffer [`PackedBf16::matmul`] rounds its input into.
    pub fn bf16_pairs(&mut self) -> &mut Vec<u32> {
        &mut self.pairs
    }

    /// `words` = `bytes`, widened.
    fn widen(&mut self) {
        self.words.clear();
        self.words.extend(self.bytes.iter().map(|&b| u16::from(b)));
    }

    fn quantize(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        k4: usize,
        group: usize,
        x_scales: &[f32],
    ) {
        let n_groups = groups(k, group);
        self.bytes.clear();
        self.bytes.resize(m * k4, 0);
        self.quants.clear();
        self.quants.resize(m * n_groups, GroupQuant::default());
        self.bytes
            .par_chunks_mut(k4)
            .zip(self.quants.par_chunks_mut(n_groups))
            .zip(x.par_chunks(k))
            .with_min_len(16)
            .for_each(|((bytes, quants), row)| {
                for ((g, x), q) in row.chunks(group).enumerate().zip(quants) {
                    let xs = &x_scales[g * group..][..x.len()];
                    *q = quantize_group(x, xs, &mut bytes[g * group..][..x.len()]);
                }
            });
    }
}

/// Quantizes one group of channels (`x · x_scales`) into `out`.
fn quantize_group(x: &[f32], x_scales: &[f32], out: &mut [u8]) -> GroupQuant {
    #[cfg(target_arch = "x86_64")]
    if features().avx512_bw {
        // SAFETY: the CPU has AVX-512F and BW (checked).
        return unsafe { avx512::quantize_group(x, x_scales, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if features().avx2_fma {
        // SAFETY: the CPU has AVX2 (checked).
        return unsafe { avx2::quantize_group(x, x_scales, out) };
    }
    quantize_group_scalar(x, x_scales, out)
}

/// [`quantize_group`]'s definition, which the vector versions equal.
fn quantize_group_scalar(x: &[f32], x_scales: &[f32], out: &mut [u8]) -> GroupQuant {
    let v = |j: usize| x[j] * x_scales[j];
    let (lo, hi) = (0..x.len()).fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), j| {
        (lo.min(v(j)), hi.max(v(j)))
    });
    let quant = group_quant(lo, hi);
    let inv = 1.0 / quant.step;
    for (j, o) in out.iter_mut().enumerate() {
        *o = ((v(j) - lo) * inv).round_ties_even().clamp(0.0, 255.0) as u8;
    }
    quant
}

/// The step and origin of a group whose values span `lo..=hi`.
fn group_quant(lo: f32, hi: f32) -> GroupQuant {
    let span = hi - lo;
    GroupQuant {
        step: if span > 0.0 { span / 255.0 } else { 1.0 },
        min: lo,
    }
}

fn check_shapes(x: &[f32], bias: &[f32], y: &[f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k, "matmul: input is not [{m}, {k}]");
    assert_eq!(bias.len(), n, "matmul: bias is not [{n}]");
    assert_eq!(y.len(), m * n, "matmul: output is not [{m}, {n}]");
}

/// The output pointer, shared by tasks that write disjoint tiles.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: every task writes only its own (panel, row block) tile.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Through a method, so closures capture the `Sync` wrapper and not
    /// the bare pointer field.
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// A left operand up to this size (bytes) stays in a core's L2 cache
/// (1 MiB on this EPYC) while the tiles of one column panel read it.
const LEFT_IN_L2: usize = 1 << 20;

/// Runs `f(panel, rows)` for every column panel and block of rows, in
/// parallel, for a product whose left operand takes `left_bytes`. A left
/// operand that fits in L2 goes panel by panel (the tasks of one panel
/// adjacent: a thread keeps reusing it, and re-reads the left operand
/// from L2); a larger one block of rows by block (the tasks of one block
/// adjacent: the block stays in L2 while every panel passes over it).
/// Panel by panel, a larger one was read from L3 or memory once per
/// panel: the decoder's weight gradient (37 MB of `dYᵀ`, 16 panels) took
/// 69 ms instead of 51 (`examples/train_products`).
fn for_each_task(
    m: usize,
    n: usize,
    left_bytes: usize,
    f: impl Fn(usize, std::ops::Range<usize>) + Sync,
) {
    let n_panels = n.div_ceil(NR);
    let n_blocks = m.div_ceil(ROWS_PER_TASK);
    let by_rows = left_bytes > LEFT_IN_L2;
    let task = |t: usize| {
        let (p, b) = match by_rows {
            true => (t % n_panels, t / n_panels),
            false => (t / n_blocks, t % n_blocks),
        };
        f(p, b * ROWS_PER_TASK..m.min((b + 1) * ROWS_PER_TASK));
    };
    if rayon::current_num_threads() <= 1 || n_panels * n_blocks == 1 {
        (0..n_panels * n_blocks).for_each(task);
    } else {
        (0..n_panels * n_blocks).into_par_iter().for_each(task);
    }
}

/// `dst[c · dst_stride + r] = src[r · src_stride + c]` for `r < 16`,
/// `c < cols` (≤ 16), reading rows `r < rows` (≤ 16) and writing 0 for the
/// rest: a block of a matrix transposed into a column panel.
pub(crate) fn transpose16(
    src: &[f32],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
) {
    assert!(
        rows <= 16 && cols <= 16,
        "transpose16: block larger than 16 × 16"
    );
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        src.len() >= (rows - 1) * src_stride + cols,
        "transpose16: source too short"
    );
    assert!(
        dst.len() >= (cols - 1) * dst_stride + 16,
        "transpose16: destination too short"
    );
    #[cfg(target_arch = "x86_64")]
    if features().avx512_bw {
        // SAFETY: the CPU has AVX-512F (checked); the sizes are asserted.
        unsafe {
            avx512::transpose16(
                src.as_ptr(),
                src_stride,
                rows,
                cols,
                dst.as_mut_ptr(),
                dst_stride,
            )
        };
        return;
    }
    for c in 0..cols {
        for r in 0..16 {
            dst[c * dst_stride + r] = if r < rows {
                src[r * src_stride + c]
            } else {
                0.0
            };
        }
    }
}

/// One output tile: `c[r, j] = Σ_i a[r, i] · panel[i, j] + bias[j]` for
/// `r < mr`, `j < cols`; `c` has row stride `ldc`.
///
/// # Safety
/// `c` must address an `mr` × `cols` tile (row stride `ldc`) that no one
/// else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_f32(
    a: &[f32],
    k: usize,
    mr: usize,
    panel: &[f32],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    #[cfg(target_arch = "x86_64")]
    if features().avx512_bw {
        macro_rules! dispatch {
            ($($n:literal)*) => {
                match mr {
                    // SAFETY: the CPU has AVX-512F (checked); the slices
                    // hold mr rows of k and k rows of NR.
                    $($n => unsafe { avx512::tile_f32::<$n>(a, k, panel, c, ldc, cols, bias, act) },)*
                    _ => unreachable!("tiles have 1..=MR_F32 rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if features().avx2_fma {
        for r0 in (0..mr).step_by(avx2::MR) {
            let rows = avx2::MR.min(mr - r0);
            let (a, c) = (&a[r0 * k..(r0 + rows) * k], c.add(r0 * ldc));
            macro_rules! dispatch {
                ($($n:literal)*) => {
                    match rows {
                        // SAFETY: the CPU has AVX2 and FMA (checked); the
                        // slices hold `rows` rows of k and k rows of NR;
                        // rows r0.. of the caller's tile.
                        $($n => unsafe { avx2::tile_f32::<$n>(a, k, panel, c, ldc, cols, bias, act) },)*
                        _ => unreachable!("AVX2 tiles have 1..=6 rows"),
                    }
                };
            }
            dispatch!(1 2 3 4 5 6);
        }
        return;
    }
    for r in 0..mr {
        let mut acc = [0f32; NR];
        for (i, brow) in panel.chunks_exact(NR).enumerate() {
            let av = a[r * k + i];
            for (s, b) in acc.iter_mut().zip(brow) {
                *s += av * b;
            }
        }
        // SAFETY: row r < mr, columns < cols of the caller's tile.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), cols) };
        for ((y, a), b) in row.iter_mut().zip(acc).zip(bias) {
            *y = a + b;
        }
        if let Some(act) = act {
            activate_body(row, act);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use amx::peak_chains as amx_peak_chains;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::fma_chains as avx2_fma_chains;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u32) -> Vec<f32> {
        // A small LCG: deterministic values in [-1, 1).
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn reference(x: &[f32], w_t: &[f32], bias: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                let dot: f64 = (0..k)
                    .map(|i| f64::from(x[r * k + i]) * f64::from(w_t[i * n + c]))
                    .sum();
                y[r * n + c] = dot as f32 + bias[c];
            }
        }
        y
    }

    #[test]
    fn fp32_matches_the_definition_on_ragged_shapes() {
        for &(m, k, n) in &[(1, 3, 1), (7, 33, 45), (70, 64, 96), (9, 384, 40)] {
            let (x, w, b) = (data(m * k, 1), data(k * n, 2), data(n, 3));
            // Both layouts: panels (AVX-512 CPUs) and row-major (others).
            for panels in [true, false] {
                let packed = PackedF32::with_panels(&w, k, n, panels);
                let mut y = vec![f32::NAN; m * n];
                packed.matmul(&x, &b, &mut y, m, None);
                let want = reference(&x, &w, &b, m, k, n);
                for (i, (g, w)) in y.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < 1e-4, "({m},{k},{n}) [{i}]: {g} vs {w}");
                }
                assert_eq!(packed.unpack(), w);
            }
        }
    }

    fn int8_error(
        x: &[f32],
        w: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        act_max: Option<&[f32]>,
    ) -> (f32, f32) {
        let want = reference(x, w, b, m, k, n);
        let packed = PackedI8::new(w, k, n, act_max, I8Scheme::default());
        let mut y = vec![f32::NAN; m * n];
        packed.matmul(x, b, &mut y, m, &mut QuantScratch::default(), None);
        let err: Vec<f32> = y.iter().zip(&want).map(|(g, w)| g - w).collect();
        let rms = (err.iter().map(|e| e * e).sum::<f32>() / err.len() as f32).sqrt();
        (rms, err.iter().fold(0f32, |m, e| m.max(e.abs())))
    }

    #[test]
    fn int8_error_is_the_rounding_error() {
        let (m, k, n) = (19, 130, 70);
        let (x, w, b) = (data(m * k, 4), data(k * n, 5), data(n, 6));
        // Rounding both factors to 8 bits: each product is off by
        // ~|x|·Δw + |w|·Δx (Δ uniform in ±step/2, steps 1/127 and 2/255
        // here), std ≈ 0.0019; over 130 products ≈ 0.021.
        let (rms, max) = int8_error(&x, &w, &b, m, k, n, None);
        assert!(rms < 0.025 && max < 0.1, "rms {rms}, max {max}");
    }

    #[test]
    fn smoothing_tames_an_outlier_channel() {
        let (m, k, n) = (19, 130, 70);
        let (mut x, w, b) = (data(m * k, 4), data(k * n, 5), data(n, 6));
        // Channel 3 carries activations 30x the others (as LayerNorm
        // outputs of real BERTs do): it sets the range of its group.
        for row in x.chunks_exact_mut(k) {
            row[3] *= 30.0;
        }
        let act_max: Vec<f32> = (0..k)
            .map(|j| x.chunks_exact(k).fold(0f32, |a, r| a.max(r[j].abs())))
            .collect();
        let (plain, _) = int8_error(&x, &w, &b, m, k, n, None);
        let (smoothed, _) = int8_error(&x, &w, &b, m, k, n, Some(&act_max));
        assert!(
            smoothed < 0.7 * plain,
            "smoothed rms {smoothed}, plain {plain}"
        );
    }

    #[test]
    fn int8_kernel_equals_the_scalar_loops() {
        // k spans two full channel groups and a ragged third.
        let (m, k, n) = (5, 2 * QGROUP + 18, 40);
        let (x, w, b) = (data(m * k, 8), data(k * n, 9), data(n, 10));
        let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
        let mut scratch = QuantScratch::default();
        scratch.quantize(&x, m, k, packed.k4, packed.group, &packed.x_scales);
        let n_groups = groups(k, packed.group);
        let tile = I8Tile {
            k4: packed.k4,
            group: packed.group,
            panel: &packed.panels[..packed.k4 * NR],
            group_sums: &packed.group_sums[..n_groups * NR],
            w_scales: &packed.w_scales[..n_groups * NR],
            bias: &b[..NR],
            act: None,
        };
        let mut fast = vec![0f32; m * NR];
        // SAFETY: `fast` is the m × NR tile.
        unsafe { tile.run(&scratch.bytes, &scratch.quants, m, fast.as_mut_ptr(), NR) };
        for r in 0..m {
            let row = &scratch.bytes[r * packed.k4..(r + 1) * packed.k4];
            let mut want = [0f32; NR];
            for g in 0..n_groups {
                let q = scratch.quants[r * n_groups + g];
                let sums = int_sums(row, tile.panel, group_quads(g, packed.group, packed.k4));
                for j in 0..NR {
                    let (ws, gs) = (tile.w_scales[g * NR + j], tile.group_sums[g * NR + j]);
                    want[j] += sums[j] as f32 * (q.step * ws) + q.min * gs;
                }
            }
            for j in 0..NR {
                let want = want[j] + b[j];
                let got = fast[r * NR + j];
                // Fused multiply-adds round once where the loop rounds twice.
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{got} vs {want}"
                );
            }
        }
    }

    /// The AVX2 tiles (where the CPU has AVX2, whatever BERTHA_ISA picks)
    /// against the f64 definition: every tile height, partial halves and
    /// panels, k from 1 to past a group, with the activation applied.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_f32_tiles_equal_the_definition() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        for (k, cols) in [(1, 32), (7, 5), (33, 16), (64, 17), (130, 31)] {
            let (w, b) = (data(k * NR, k as u32), data(NR, 3));
            let packed = PackedF32::with_panels(&w, k, NR, true);
            let F32Layout::Panels(panel) = &packed.layout else {
                unreachable!("asked for panels")
            };
            for rows in 1..=avx2::MR {
                let x = data(rows * k, 40 + rows as u32);
                let want = reference(&x, &w, &b, rows, k, NR);
                for act in [None, Some(Act::GeluErf)] {
                    // A stride past the tile: columns from `cols` on and
                    // the gap stay NaN (nothing is written there).
                    let ldc = NR + 3;
                    let mut c = vec![f32::NAN; rows * ldc];
                    let bias = &b[..cols];
                    macro_rules! run {
                        ($($n:literal)*) => {
                            match rows {
                                // SAFETY: AVX2 + FMA checked; c holds the
                                // rows × cols tile at stride ldc.
                                $($n => unsafe {
                                    avx2::tile_f32::<$n>(&x, k, panel, c.as_mut_ptr(), ldc, cols, bias, act)
                                },)*
                                _ => unreachable!(),
                            }
                        };
                    }
                    run!(1 2 3 4 5 6);
                    for r in 0..rows {
                        let mut row = want[r * NR..r * NR + cols].to_vec();
                        if let Some(act) = act {
                            activate_body(&mut row, act);
                        }
                        let got = &c[r * ldc..(r + 1) * ldc];
                        for (j, (g, w)) in got.iter().zip(&row).enumerate() {
                            assert!(
                                (g - w).abs() < 1e-4,
                                "k {k} rows {rows} [{r},{j}]: {g} vs {w}"
                            );
                        }
                        assert!(got[cols..].iter().all(|v| v.is_nan()), "wrote past {cols}");
                    }
                }
            }
        }
    }

    /// The AVX2 int8 kernel on widened words computes the exact integer
    /// sums, so it gives the VNNI kernel's floats bit for bit (same
    /// epilogue, same order) and the scalar loop's within its rounding.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_int8_equals_the_other_int8_kernels() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        // Two full channel groups and a ragged third; large activations
        // and weights, where vpmaddubsw's i16 sums would saturate.
        let (m, k, n) = (6, 2 * QGROUP + 18, 40);
        let (mut x, w, b) = (data(m * k, 21), data(k * n, 22), data(n, 23));
        x.iter_mut().step_by(3).for_each(|v| *v = v.signum() * 8.0);
        let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
        let wide = wide_panels(&packed.panels, packed.k4);
        let mut scratch = QuantScratch::default();
        scratch.quantize(&x, m, k, packed.k4, packed.group, &packed.x_scales);
        scratch.widen();
        let n_groups = groups(k, packed.group);
        for p in 0..n.div_ceil(NR) {
            let cols = NR.min(n - p * NR);
            let tile = I8Tile {
                k4: packed.k4,
                group: packed.group,
                panel: &packed.panels[p * packed.k4 * NR..(p + 1) * packed.k4 * NR],
                group_sums: &packed.group_sums[p * n_groups * NR..(p + 1) * n_groups * NR],
                w_scales: &packed.w_scales[p * n_groups * NR..(p + 1) * n_groups * NR],
                bias: &b[p * NR..p * NR + cols],
                act: None,
            };
            let wide = &wide[p * packed.k4 * NR..(p + 1) * packed.k4 * NR];
            let (mut ours, mut theirs) = (vec![0f32; m * cols], vec![0f32; m * cols]);
            // SAFETY: AVX2 + FMA checked; 6 rows of words and quants; the
            // m × cols tiles.
            unsafe {
                avx2::tile_i16::<6>(
                    &tile,
                    wide,
                    &scratch.words,
                    &scratch.quants,
                    ours.as_mut_ptr(),
                    cols,
                );
                tile.run(
                    &scratch.bytes,
                    &scratch.quants,
                    m,
                    theirs.as_mut_ptr(),
                    cols,
                );
            }
            if features().vnni {
                assert_eq!(ours, theirs, "panel {p}: AVX2 vs VNNI");
            } else {
                for (o, t) in ours.iter().zip(&theirs) {
                    // Fused multiply-adds round once where the loop rounds twice.
                    assert!((o - t).abs() <= 1e-5 * t.abs().max(1.0), "{o} vs {t}");
                }
            }
        }
    }

    /// The vector quantizers (each the CPU has) give the scalar one's
    /// bytes and range, bit for bit, on groups of every length to past
    /// two vectors, with ties, a constant group and a zero scale.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_quantizers_equal_the_scalar_one() {
        use std::arch::is_x86_feature_detected as has;
        for len in 1..=70 {
            let mut x = data(len, len as u32);
            let mut xs: Vec<f32> = data(len, 100 + len as u32)
                .iter()
                .map(|v| 1.5 + v)
                .collect();
            if len % 5 == 0 {
                x.iter_mut().for_each(|v| *v = 0.25);
            }
            if len > 3 {
                xs[2] = 0.0;
                // Exactly halfway between two steps: round to even.
                x[1] = x[0] + 0.5 * (x[3] - x[0]);
            }
            let mut want = vec![0u8; len];
            let q = quantize_group_scalar(&x, &xs, &mut want);
            let check = |name: &str, got: GroupQuant, bytes: &[u8]| {
                assert_eq!(bytes, &want[..], "{name}, len {len}");
                assert_eq!(
                    (got.step.to_bits(), got.min.to_bits()),
                    (q.step.to_bits(), q.min.to_bits()),
                    "{name}"
                );
            };
            if has!("avx2") && has!("fma") {
                let mut got = vec![0u8; len];
                // SAFETY: AVX2 checked; all three hold len values.
                let g = unsafe { avx2::quantize_group(&x, &xs, &mut got) };
                check("avx2", g, &got);
            }
            if has!("avx512f") && has!("avx512bw") {
                let mut got = vec![0u8; len];
                // SAFETY: AVX-512 F + BW checked; all three hold len values.
                let g = unsafe { avx512::quantize_group(&x, &xs, &mut got) };
                check("avx512", g, &got);
            }
        }
    }

    #[test]
    fn stored_parts_give_back_the_same_multiply() {
        let (m, k, n) = (7, 2 * QGROUP + 20, 45);
        let (x, w, b) = (data(m * k, 14), data(k * n, 15), data(n, 16));
        let act_max: Vec<f32> = (0..k).map(|j| 0.5 + (j % 7) as f32).collect();
        let scheme = I8Scheme {
            group: 32,
            alpha: 0.6,
        };
        let packed = PackedI8::new(&w, k, n, Some(&act_max), scheme);
        let PackedData::I8 {
            panels,
            w_scales,
            x_scales,
            group,
        } = packed.to_parts()
        else {
            panic!("int8 weights store as int8");
        };
        assert_eq!(group, 32);
        let back =
            PackedI8::from_parts(panels.clone(), w_scales.clone(), x_scales, group, k, n).unwrap();
        assert_eq!(back.group_sums, packed.group_sums);
        let mut scratch = QuantScratch::default();
        let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
        packed.matmul(&x, &b, &mut want, m, &mut scratch, None);
        back.matmul(&x, &b, &mut got, m, &mut scratch, None);
        assert_eq!(want, got);
        // Parts of the wrong size are refused, naming the part.
        let short = PackedI8::from_parts(panels, w_scales[1..].to_vec(), vec![1.0; k], 32, k, n);
        assert!(short.unwrap_err().contains("w_scales"));
        let bf = PackedBf16::new(&w, k, n);
        let PackedData::Bf16 { panels } = bf.to_parts() else {
            panic!("bf16 weights store as bf16");
        };
        let back = PackedBf16::from_parts(panels.clone(), k, n).unwrap();
        let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
        bf.matmul(&x, &b, &mut want, m, scratch.bf16_pairs(), None);
        back.matmul(&x, &b, &mut got, m, scratch.bf16_pairs(), None);
        assert_eq!(want, got);
        assert!(PackedBf16::from_parts(panels, k + 2, n).is_err());
    }

    #[test]
    fn group_weight_scales_keep_small_rows_fine() {
        // One input row of the weights 50x the others (what smoothing an
        // outlier channel makes): with a scale per column it would set the
        // step of every row (50/127); per group, only of its own group.
        let (k, n) = (4 * QGROUP, 40);
        let mut w = data(k * n, 18);
        for v in &mut w[5 * n..6 * n] {
            *v *= 50.0;
        }
        let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
        let n_groups = groups(k, QGROUP);
        for r in 0..k {
            for c in 0..n {
                let (p, lane) = (c / NR, c % NR);
                let q = packed.panels[p * packed.k4 * NR + (r / 4) * 4 * NR + lane * 4 + r % 4];
                let scale = packed.w_scales[(p * n_groups + r / QGROUP) * NR + lane];
                let err = (f32::from(q) * scale - w[r * n + c]).abs();
                let bound = if r < QGROUP {
                    25.0 / 127.0
                } else {
                    0.5 / 127.0
                };
                assert!(err <= bound * 1.001, "row {r}, column {c}: error {err}");
            }
        }
    }

    #[test]
    fn a_constant_row_quantizes_exactly() {
        let (m, k, n) = (2, 8, 3);
        let w = data(k * n, 7);
        let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
        let mut y = vec![f32::NAN; m * n];
        let x = vec![0.0; m * k];
        packed.matmul(
            &x,
            &[1.0, 2.0, 3.0],
            &mut y,
            m,
            &mut QuantScratch::default(),
            None,
        );
        assert_eq!(y, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn the_fused_activation_is_the_activation_of_the_product() {
        let (m, k, n) = (11, 40, 50);
        let (x, w, b) = (data(m * k, 11), data(k * n, 12), data(n, 13));
        let (f, q) = (
            PackedF32::new(&w, k, n),
            PackedI8::new(&w, k, n, None, I8Scheme::default()),
        );
        let row_major = PackedF32::with_panels(&w, k, n, false);
        let mut scratch = QuantScratch::default();
        for act in [Act::Relu, Act::GeluErf, Act::GeluTanh, Act::Tanh] {
            let (mut plain, mut fused) = (vec![0f32; m * n], vec![0f32; m * n]);
            for f in [&f, &row_major] {
                f.matmul(&x, &b, &mut plain, m, None);
                f.matmul(&x, &b, &mut fused, m, Some(act));
                activate_body(&mut plain, act);
                assert_eq!(plain, fused, "{act:?} (fp32)");
            }
            q.matmul(&x, &b, &mut plain, m, &mut scratch, None);
            q.matmul(&x, &b, &mut fused, m, &mut scratch, Some(act));
            activate_body(&mut plain, act);
            for (p, f) in plain.iter().zip(&fused) {
                assert!((p - f).abs() < 1e-6, "{act:?} (int8): {p} vs {f}");
            }
        }
        assert!(fused_has_negatives_clipped(&f, &x, &b, m));
    }

    /// The tile store's activations in registers give the bits of the
    /// scalar loops, over a dense sweep and at the extremes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_activations_equal_the_scalar_ones() {
        use std::arch::x86_64::{_mm512_loadu_ps, _mm512_storeu_ps};
        if !features().avx512_bw {
            return;
        }
        let mut xs: Vec<f32> = (-200_000..200_000).map(|i| i as f32 * 1e-4).collect();
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            88.0,
            -88.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 3.0);
        for act in [Act::Relu, Act::GeluErf, Act::GeluTanh, Act::Tanh] {
            let mut want = xs.clone();
            activate_body(&mut want, act);
            let mut got = vec![0f32; xs.len()];
            for (x, y) in xs.chunks_exact(16).zip(got.chunks_exact_mut(16)) {
                // SAFETY: the CPU has AVX-512F (checked); 16 lanes each.
                unsafe {
                    _mm512_storeu_ps(
                        y.as_mut_ptr(),
                        avx512::activate(_mm512_loadu_ps(x.as_ptr()), act),
                    )
                };
            }
            for ((x, w), g) in xs.iter().zip(&want).zip(&got) {
                assert_eq!(w.to_bits(), g.to_bits(), "{act:?}({x}): {w} vs {g}");
            }
            // With the slope (the FFN-in tiles' store): the same outputs,
            // and the slopes of the scalar derivative.
            for (chunk, want) in xs.chunks_exact(16).zip(want.chunks_exact(16)) {
                let (mut y, mut slope) = ([0f32; 16], [0f32; 16]);
                // SAFETY: the CPU has AVX-512F (checked); 16 lanes each.
                unsafe {
                    let (v, g) = avx512::act_and_grad(_mm512_loadu_ps(chunk.as_ptr()), act);
                    _mm512_storeu_ps(y.as_mut_ptr(), v);
                    _mm512_storeu_ps(slope.as_mut_ptr(), g);
                }
                for (j, x) in chunk.iter().enumerate() {
                    let w = crate::model::ops::act_grad(*x, act);
                    assert_eq!(
                        want[j].to_bits(),
                        y[j].to_bits(),
                        "{act:?}({x}) with its slope"
                    );
                    assert_eq!(
                        w.to_bits(),
                        slope[j].to_bits(),
                        "{act:?}'({x}): {w} vs {}",
                        slope[j]
                    );
                }
            }
        }
    }

    #[test]
    fn transpose16_transposes_partial_blocks() {
        let (ss, ds) = (21, 19);
        let src: Vec<f32> = (0..16 * ss).map(|i| i as f32 + 0.5).collect();
        for (rows, cols) in [(16, 16), (9, 16), (16, 7), (1, 1), (13, 11)] {
            let mut dst = vec![-1f32; 15 * ds + 16];
            transpose16(&src, ss, rows, cols, &mut dst, ds);
            for c in 0..16 {
                for r in 0..16 {
                    let got = dst[c * ds + r];
                    let want = match (c < cols, r < rows) {
                        (false, _) => -1.0,
                        (true, false) => 0.0,
                        (true, true) => src[r * ss + c],
                    };
                    assert_eq!(got, want, "{rows} × {cols} block, [{c}, {r}]");
                }
            }
        }
    }

    /// ReLU really ran: the plain product has negatives, the fused none.
    fn fused_has_negatives_clipped(f: &PackedF32, x: &[f32], b: &[f32], m: usize) -> bool {
        let n = f.out_dim();
        let (mut plain, mut fused) = (vec![0f32; m * n], vec![0f32; m * n]);
        f.matmul(x, b, &mut plain, m, None);
        f.matmul(x, b, &mut fused, m, Some(Act::Relu));
        plain.iter().any(|v| *v < 0.0) && fused.iter().all(|v| *v >= 0.0)
    }
}
