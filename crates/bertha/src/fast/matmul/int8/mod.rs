//! int8 products against weights quantized and packed once, at load: the
//! weights ([`PackedI8`]: int8 in `vpdpbusd` quads, one scale per column
//! and channel group, SmoothQuant factors folded in), the activations'
//! per-row, per-group quantizer ([`QuantScratch`]), and the driver that
//! runs each instruction set's tile kernel over them (VNNI, AVX2's 16-bit
//! products, NEON's `sdot`, or the scalar loops they all equal).

use rayon::prelude::*;

use super::{check_shapes, even_tiles, for_each_task, SharedOut, NR};
use crate::fast::aligned::Aligned;
use crate::fast::cpu::features;
use crate::fast::kernels::{activate_body, Act};
use crate::io::quantized::PackedData;

#[cfg(target_arch = "aarch64")]
use super::neon;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};

/// Output rows per int8 register tile: 6 × 2 int32 sums and 6 × 2 fp32
/// sums (a group's sums are scaled into floats every `group` inputs) with
/// the two weight vectors and a broadcast fit AVX-512's 32 registers; 8
/// rows did not, and ran 3–5 % slower (`examples/kernel_rates`).
const MR: usize = 6;
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

/// int8 weights `[k, n]` with one scale per output column and channel
/// group: smoothing makes some input rows of the weights large, and a
/// scale per group keeps them from coarsening every other row's steps.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    /// Panel `p`, quad `g` (inputs 4g..4g+4): `NR` columns × 4 bytes, each
    /// column's four weights adjacent (the `vpdpbusd` operand layout).
    pub(super) panels: Aligned<i8>,
    /// Per panel and channel group, the `NR` columns' dequantisation
    /// scales (`max |w| / 127` over the group's rows).
    pub(super) w_scales: Vec<f32>,
    /// Per panel and channel group, `NR` sums `scale · Σ_k q[k, c]` of the
    /// quantized weights: a group's activation bytes count up from its
    /// minimum, and `minimum · sum` adds it back.
    pub(super) group_sums: Vec<f32>,
    /// What each input channel is multiplied by before quantization (the
    /// inverse of the smoothing factor folded into the weights).
    pub(super) x_scales: Vec<f32>,
    pub(super) k: usize,
    /// `k` rounded up to a multiple of 4.
    pub(super) k4: usize,
    pub(super) n: usize,
    /// Input channels per activation scale (a multiple of 4).
    pub(super) group: usize,
    /// On AVX2 without either VNNI: the panels' weights as i16 pairs for
    /// `vpmaddwd` ([`wide_panels`]), made once at load; else empty.
    pub(super) wide: Aligned<i16>,
    /// On aarch64 with dotprod: per panel and channel group, the columns'
    /// integer weight sums the `sdot` kernel adds back
    /// ([`column_sums`]), made once at load; else empty.
    #[cfg(target_arch = "aarch64")]
    pub(super) col_sums: Vec<i32>,
}

/// Channel groups of `k` inputs, `group` each.
pub(super) fn groups(k: usize, group: usize) -> usize {
    k.div_ceil(group)
}

/// The quads (4-input steps) of channel group `g`.
pub(super) fn group_quads(g: usize, group: usize, k4: usize) -> std::ops::Range<usize> {
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
            panels: self.panels.to_vec(),
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
        // Exact integer sums (|Σ| < 2^24, so their floats are exact too).
        let col_sums = column_sums(&panels, k, k4, group);
        let group_sums = col_sums
            .iter()
            .zip(&w_scales)
            .map(|(&s, w)| s as f32 * w)
            .collect();
        let f = features();
        let wide = if f.avx2_fma && !f.vnni && !f.avx_vnni {
            wide_panels(&panels, k4)
        } else {
            Aligned::zeroed(0)
        };
        #[cfg(target_arch = "aarch64")]
        let col_sums = if f.dotprod { col_sums } else { Vec::new() };
        Ok(Self {
            wide,
            #[cfg(target_arch = "aarch64")]
            col_sums,
            panels: Aligned::from_slice(&panels),
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
        // AVX-VNNI takes the bytes and panels as they are, where AVX-512
        // VNNI (the tile's own kernel) is absent or masked.
        #[cfg(target_arch = "x86_64")]
        let avx_vnni = {
            let f = features();
            f.avx_vnni && !f.vnni
        };
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
            if avx_vnni || !self.wide.is_empty() {
                let wide = &self.wide[(p * k4 * NR).min(self.wide.len())..];
                for (r0, mr) in even_tiles(block.clone(), avx2::MR) {
                    let rows = r0 * k4..(r0 + mr) * k4;
                    let quants = &quants[r0 * n_groups..(r0 + mr) * n_groups];
                    let c = out.at(r0 * n + p * NR);
                    macro_rules! dispatch {
                        ($($n:literal)*) => {
                            match (mr, avx_vnni) {
                                // SAFETY: the CPU has AVX2, FMA and
                                // AVX-VNNI (checked), or AVX2 and FMA (the
                                // wide panels exist only then); the slices
                                // hold mr rows; the tile at rows r0..,
                                // columns p·NR.. of y is this task's.
                                $(($n, true) => unsafe {
                                    avx2::tile_i8_vnni::<$n>(&tile, &bytes[rows], quants, c, n)
                                },
                                ($n, false) => unsafe {
                                    avx2::tile_i16::<$n>(&tile, wide, &words[rows], quants, c, n)
                                },)*
                                _ => unreachable!("tiles have 1..=6 rows"),
                            }
                        };
                    }
                    dispatch!(1 2 3 4 5 6);
                }
                return;
            }
            #[cfg(target_arch = "aarch64")]
            if !self.col_sums.is_empty() {
                let sums = &self.col_sums[p * n_groups * NR..(p + 1) * n_groups * NR];
                for (r0, mr) in even_tiles(block.clone(), neon::MR) {
                    let (qa, quants) = (
                        &bytes[r0 * k4..(r0 + mr) * k4],
                        &quants[r0 * n_groups..(r0 + mr) * n_groups],
                    );
                    let c = out.at(r0 * n + p * NR);
                    // SAFETY: the CPU has dotprod (the sums exist only
                    // then); the slices hold mr rows; the tile at rows
                    // r0.., columns p·NR.. of y is this task's.
                    unsafe {
                        match mr {
                            1 => neon::tile_i8::<1>(&tile, sums, qa, quants, c, n),
                            2 => neon::tile_i8::<2>(&tile, sums, qa, quants, c, n),
                            3 => neon::tile_i8::<3>(&tile, sums, qa, quants, c, n),
                            _ => neon::tile_i8::<4>(&tile, sums, qa, quants, c, n),
                        }
                    }
                }
                return;
            }
            for (r0, mr) in even_tiles(block, MR) {
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
pub(super) struct I8Tile<'a> {
    pub(super) k4: usize,
    pub(super) group: usize,
    pub(super) panel: &'a [i8],
    pub(super) group_sums: &'a [f32],
    pub(super) w_scales: &'a [f32],
    pub(super) bias: &'a [f32],
    pub(super) act: Option<Act>,
}

impl I8Tile<'_> {
    pub(super) fn cols(&self) -> usize {
        self.bias.len()
    }

    /// `c[r, j] = Σ_g (step[r, g] · scale[g, j] · Σ_{i∈g} qa[r, i] · w[i, j]
    /// + min[r, g] · sum[g, j]) + bias[j]` for `r < mr`, `j < cols`; `c`
    /// has row stride `ldc`.
    ///
    /// # Safety
    /// `c` must address an `mr` × `cols` tile (row stride `ldc`) that no
    /// one else reads or writes meanwhile.
    pub(super) unsafe fn run(
        &self,
        qa: &[u8],
        quants: &[GroupQuant],
        mr: usize,
        c: *mut f32,
        ldc: usize,
    ) {
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
        self.run_scalar(qa, quants, mr, c, ldc);
    }

    /// [`Self::run`] as plain loops: the definition the vector kernels
    /// are tested against.
    ///
    /// # Safety
    /// As [`Self::run`].
    pub(super) unsafe fn run_scalar(
        &self,
        qa: &[u8],
        quants: &[GroupQuant],
        mr: usize,
        c: *mut f32,
        ldc: usize,
    ) {
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

/// Per panel, per channel group, [`NR`] integer sums of each column's
/// quantized weights: `minimum · sum` adds back what counting a group's
/// activation bytes up from its minimum leaves out, and NEON's `sdot`
/// kernel adds back `128 · sum` for its flip. Made once, at load.
pub(super) fn column_sums(panels: &[i8], k: usize, k4: usize, group: usize) -> Vec<i32> {
    let n_groups = groups(k, group);
    let mut sums = vec![0i32; panels.len() / (k4 * NR) * n_groups * NR];
    for (p, panel) in panels.chunks_exact(k4 * NR).enumerate() {
        for (q, quad) in panel.chunks_exact(4 * NR).enumerate() {
            for (lane, w) in quad.chunks_exact(4).enumerate() {
                for (i, &w) in w.iter().enumerate() {
                    let r = 4 * q + i;
                    if r < k {
                        sums[(p * n_groups + r / group) * NR + lane] += i32::from(w);
                    }
                }
            }
        }
    }
    sums
}

/// The weights of int8 `panels` (each `k4` inputs × [`NR`] columns in
/// quads: a column's four inputs adjacent) as i16 pairs, the operand
/// layout of `vpmaddwd` (each i32 lane sums a column's two products): per
/// panel, its first `NR / 2` columns, then the rest (the AVX2 tile's
/// halves, each read in sequence, as fp32's half panels); per half, per
/// pair of inputs, `NR / 2` columns of two words.
pub(super) fn wide_panels(panels: &[i8], k4: usize) -> Aligned<i16> {
    const HALF: usize = NR / 2;
    let mut wide = Aligned::zeroed(panels.len());
    for (src, dst) in panels
        .chunks_exact(k4 * NR)
        .zip(wide.chunks_exact_mut(k4 * NR))
    {
        for (q, quad) in src.chunks_exact(4 * NR).enumerate() {
            for (col, w) in quad.chunks_exact(4).enumerate() {
                let half = &mut dst[(col / HALF) * k4 * HALF..];
                for (i, &w) in w.iter().enumerate() {
                    let pair = 2 * q + i / 2;
                    half[pair * 2 * HALF + 2 * (col % HALF) + i % 2] = i16::from(w);
                }
            }
        }
    }
    wide
}

/// Σ over the 4-input quads `quads` of `row` bytes times the panel's
/// weights, per column: the integers the VNNI kernel must equal.
pub(super) fn int_sums(row: &[u8], panel: &[i8], quads: std::ops::Range<usize>) -> [i32; NR] {
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
    pub(super) step: f32,
    pub(super) min: f32,
}

/// A multiply's activations in the weights' number format (per-row,
/// per-group int8; bf16 pairs), reused across calls.
#[derive(Debug, Default)]
pub struct QuantScratch {
    /// [m, k4] bytes (padding: 0; the weights there are 0).
    pub(super) bytes: Vec<u8>,
    /// [m, groups].
    pub(super) quants: Vec<GroupQuant>,
    /// [m, k4] the bytes as 16-bit words, for the AVX2 int8 kernel.
    pub(super) words: Vec<u16>,
    /// [m, k2] bf16 pairs for [`PackedBf16`].
    pub(super) pairs: Vec<u32>,
}

impl QuantScratch {
    /// The buffer [`PackedBf16::matmul`] rounds its input into.
    pub fn bf16_pairs(&mut self) -> &mut Vec<u32> {
        &mut self.pairs
    }

    /// `words` = `bytes`, widened.
    pub(super) fn widen(&mut self) {
        self.words.clear();
        self.words.extend(self.bytes.iter().map(|&b| u16::from(b)));
    }

    pub(super) fn quantize(
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
pub(super) fn quantize_group(x: &[f32], x_scales: &[f32], out: &mut [u8]) -> GroupQuant {
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
pub(super) fn quantize_group_scalar(x: &[f32], x_scales: &[f32], out: &mut [u8]) -> GroupQuant {
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
pub(super) fn group_quant(lo: f32, hi: f32) -> GroupQuant {
    let span = hi - lo;
    GroupQuant {
        step: if span > 0.0 { span / 255.0 } else { 1.0 },
        min: lo,
    }
}

#[cfg(test)]
mod tests;
