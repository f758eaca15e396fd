//! The NEON micro-kernels of [`super`], for aarch64 CPUs (AWS Graviton,
//! Ampere, Apple silicon): fp32 tiles, int8 products by `sdot` (the
//! dotprod extension) with exact integer sums, and bf16 sums by `bfdot`,
//! on the same weight panels as the x86 kernels.
//!
//! NEON has 32 registers of 4 floats. An fp32 tile is 4 rows × 16 columns
//! (half a 32-column panel): 16 accumulators, 4 weight vectors, and 4
//! registers each holding 4 consecutive inputs of one row, whose lanes
//! `fmla (by element)` broadcasts: the shape of MLAS's `SgemmKernelNeon`.
//! Per 4 inputs that is 4 + 16 loads for 64 FMAs, within the load ports of
//! every core from Cortex-A72 to Neoverse V2. The two halves of a panel run
//! one after the other over the same rows of `a` (from L1).
//!
//! int8: `sdot` multiplies signed bytes by signed bytes (four products
//! summed into each i32 lane), and the activations are unsigned bytes.
//! Each one is flipped to `a − 128` (an exclusive or with 0x80) and the
//! kernel adds `128 · Σ w` back per column and channel group, from integer
//! column sums made once at load: the integer sums are exact, the same
//! integers the VNNI and scalar kernels compute. (`usdot`, which takes
//! unsigned × signed bytes directly, needs i8mm, which Graviton 2 lacks.)
//!
//! bf16: `bfdot` (the BF16 extension: Graviton 3, Apple M2 and later)
//! sums two bf16 products into each fp32 lane, on the same pair panels
//! as AVX512-BF16's `vdpbf16ps`; the tile's epilogue (bias, activation,
//! rounding to pairs, slopes) is the scalar one every bf16 tile shares.
//!
//! Speed is not measured here: the tests run under qemu, which says only
//! whether the kernels are right.

use super::{group_quads, GroupQuant, NR};
use crate::fast::kernels::{activate_body, Act};
use std::arch::aarch64::*;
use std::arch::asm;

/// Rows of a NEON register tile (fp32 and int8).
pub(super) const MR: usize = 4;
/// Columns of a NEON register tile: half a panel.
const HALF: usize = NR / 2;

/// Writes `R` rows of one half tile's sums (`acc`, 16 columns of which
/// `cols` are kept) plus `bias` to `c` (row stride `ldc`), then `act` on
/// each stored row: [`activate_body`] gives the bits every path gives.
#[inline(always)]
unsafe fn store_half<const R: usize>(
    acc: &[[float32x4_t; 4]; R],
    c: *mut f32,
    ldc: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    let cols = bias.len();
    debug_assert!(cols <= HALF);
    if cols == HALF {
        let b = [0, 4, 8, 12].map(|j| vld1q_f32(bias.as_ptr().add(j)));
        for (r, acc) in acc.iter().enumerate() {
            let dst = c.add(r * ldc);
            for (j, (s, b)) in acc.iter().zip(b).enumerate() {
                vst1q_f32(dst.add(4 * j), vaddq_f32(*s, b));
            }
        }
    } else {
        // A panel's last, partial columns: through a row on the stack (no
        // write past `cols`: the neighbouring columns belong to others).
        let mut row = [0f32; HALF];
        for (r, acc) in acc.iter().enumerate() {
            for (j, s) in acc.iter().enumerate() {
                vst1q_f32(row.as_mut_ptr().add(4 * j), *s);
            }
            let dst = std::slice::from_raw_parts_mut(c.add(r * ldc), cols);
            for ((y, s), b) in dst.iter_mut().zip(row).zip(bias) {
                *y = s + b;
            }
        }
    }
    if let Some(act) = act {
        for r in 0..R {
            activate_body(std::slice::from_raw_parts_mut(c.add(r * ldc), cols), act);
        }
    }
}

/// One input step of an fp32 half tile: the panel row at `row` (16
/// columns) times lane `L` of each row's 4-input vector `av`.
#[inline(always)]
unsafe fn fma_lane<const L: i32, const R: usize>(
    acc: &mut [[float32x4_t; 4]; R],
    row: *const f32,
    av: &[float32x4_t; R],
) {
    let b = [0, 4, 8, 12].map(|j| vld1q_f32(row.add(j)));
    for (acc, a) in acc.iter_mut().zip(av) {
        for (s, b) in acc.iter_mut().zip(b) {
            *s = vfmaq_laneq_f32::<L>(*s, b, *a);
        }
    }
}

/// `R` (≤ [`MR`]) rows × `cols` (≤ 32) columns of fp32 products:
/// `c[r, j] = act(Σ_i a[r, i] · panel[i, j] + bias[j])`.
///
/// # Safety
/// The CPU has NEON (every aarch64 CPU); `a` holds `R` rows of `k`,
/// `panel` `k` rows of [`NR`]; `c` addresses an `R` × `cols` tile (row
/// stride `ldc`) no one else reads or writes meanwhile.
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_f32<const R: usize>(
    a: &[f32],
    k: usize,
    panel: &[f32],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    debug_assert!(R <= MR && a.len() >= R * k && panel.len() >= k * NR && cols <= NR);
    let ap = a.as_ptr();
    let k4 = k - k % 4;
    for h0 in (0..cols).step_by(HALF) {
        let bp = panel.as_ptr().add(h0);
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        for i in (0..k4).step_by(4) {
            let av: [float32x4_t; R] = std::array::from_fn(|r| vld1q_f32(ap.add(r * k + i)));
            fma_lane::<0, R>(&mut acc, bp.add(i * NR), &av);
            fma_lane::<1, R>(&mut acc, bp.add((i + 1) * NR), &av);
            fma_lane::<2, R>(&mut acc, bp.add((i + 2) * NR), &av);
            fma_lane::<3, R>(&mut acc, bp.add((i + 3) * NR), &av);
        }
        for i in k4..k {
            let row = bp.add(i * NR);
            let b = [0, 4, 8, 12].map(|j| vld1q_f32(row.add(j)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = *ap.add(r * k + i);
                for (s, b) in acc.iter_mut().zip(b) {
                    *s = vfmaq_n_f32(*s, b, a);
                }
            }
        }
        let hc = HALF.min(cols - h0);
        store_half(&acc, c.add(h0), ldc, &bias[h0..h0 + hc], act);
    }
}

/// `acc += w · a[L]`: in each i32 lane, one column's four signed weight
/// bytes times the four signed activation bytes of 32-bit lane `L` of `a`.
/// By `asm!`: the intrinsic is not stable Rust yet.
#[inline(always)]
unsafe fn sdot_lane<const L: i32>(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{lane}]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        lane = const L,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// One quad (4 inputs) of an int8 half tile: the 16 columns' weights at
/// `quad` times lane `L` of each row's flipped activations `av`.
#[inline(always)]
unsafe fn sdot_quad<const L: i32, const R: usize>(
    iacc: &mut [[int32x4_t; 4]; R],
    quad: *const i8,
    av: &[int8x16_t; R],
) {
    let w = [0, 16, 32, 48].map(|j| vld1q_s8(quad.add(j)));
    for (iacc, a) in iacc.iter_mut().zip(av) {
        for (s, w) in iacc.iter_mut().zip(w) {
            *s = sdot_lane::<L>(*s, w, *a);
        }
    }
}

/// `R` (≤ [`MR`]) rows × `cols` columns of an int8 product by `sdot`:
/// `qa` holds the rows' activation bytes (`k4` a row), `col_sums` the
/// panel's integer weight sums per channel group and column (made at load
/// by `int8::column_sums`). Per group the exact sums `Σ (qa − 128) · w +
/// 128 · Σ w` are scaled into floats as the other kernels do:
/// `Σ_g (step · w_scale · Σ_i qa · w + min · group_sum) + bias`.
///
/// # Safety
/// The CPU has NEON and dotprod; the slices hold what is said; `c`
/// addresses an `R` × `t.cols()` tile (row stride `ldc`) no one else reads
/// or writes meanwhile.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn tile_i8<const R: usize>(
    t: &super::I8Tile,
    col_sums: &[i32],
    qa: &[u8],
    quants: &[GroupQuant],
    c: *mut f32,
    ldc: usize,
) {
    let (k4, n_groups, cols) = (t.k4, quants.len() / R, t.cols());
    debug_assert!(R <= MR && qa.len() >= R * k4 && t.panel.len() >= k4 * NR);
    debug_assert!(col_sums.len() >= n_groups * NR);
    let (ap, flip) = (qa.as_ptr(), vdupq_n_u8(0x80));
    // A row's bytes at input `i` as signed `a − 128`, 16 of them.
    let load =
        |r: usize, i: usize| vreinterpretq_s8_u8(veorq_u8(vld1q_u8(ap.add(r * k4 + i)), flip));
    for h0 in (0..cols).step_by(HALF) {
        // A quad's weights: NR columns × 4 bytes; this half's 16 columns.
        let bp = t.panel.as_ptr().add(4 * h0);
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        for g in 0..n_groups {
            let mut iacc = [[vdupq_n_s32(0); 4]; R];
            let quads = group_quads(g, t.group, k4);
            let mut q = quads.start;
            while q + 4 <= quads.end {
                let av: [int8x16_t; R] = std::array::from_fn(|r| load(r, 4 * q));
                sdot_quad::<0, R>(&mut iacc, bp.add(q * 4 * NR), &av);
                sdot_quad::<1, R>(&mut iacc, bp.add((q + 1) * 4 * NR), &av);
                sdot_quad::<2, R>(&mut iacc, bp.add((q + 2) * 4 * NR), &av);
                sdot_quad::<3, R>(&mut iacc, bp.add((q + 3) * 4 * NR), &av);
                q += 4;
            }
            for q in q..quads.end {
                // One quad: its 4 bytes in lane 0 (no read past the row).
                let av: [int8x16_t; R] = std::array::from_fn(|r| {
                    let quad = (ap.add(r * k4 + 4 * q) as *const u32).read_unaligned();
                    let bytes = vreinterpretq_u8_u32(vdupq_n_u32(quad));
                    vreinterpretq_s8_u8(veorq_u8(bytes, flip))
                });
                sdot_quad::<0, R>(&mut iacc, bp.add(q * 4 * NR), &av);
            }
            // 128 · Σ w: the flip's offset, back; exact (|Σ| < 2^31).
            let sums = col_sums.as_ptr().add(g * NR + h0);
            let back = [0, 4, 8, 12].map(|j| vshlq_n_s32::<7>(vld1q_s32(sums.add(j))));
            let gs = t.group_sums.as_ptr().add(g * NR + h0);
            let ws = t.w_scales.as_ptr().add(g * NR + h0);
            let gs = [0, 4, 8, 12].map(|j| vld1q_f32(gs.add(j)));
            let ws = [0, 4, 8, 12].map(|j| vld1q_f32(ws.add(j)));
            for (r, (acc, iacc)) in acc.iter_mut().zip(&iacc).enumerate() {
                let GroupQuant { step, min } = quants[r * n_groups + g];
                for j in 0..4 {
                    let exact = vcvtq_f32_s32(vaddq_s32(iacc[j], back[j]));
                    acc[j] = vfmaq_f32(acc[j], exact, vmulq_n_f32(ws[j], step));
                    acc[j] = vfmaq_n_f32(acc[j], gs[j], min);
                }
            }
        }
        let hc = HALF.min(cols - h0);
        store_half(&acc, c.add(h0), ldc, &t.bias[h0..h0 + hc], t.act);
    }
}

/// `acc += w · a[L]` on bf16 pairs: in each fp32 lane, one column's two
/// bf16 weights times the two bf16 inputs of 32-bit lane `L` of `a`
/// (`bfdot`, the BF16 extension; the layout of AVX512-BF16's `vdpbf16ps`).
/// By `asm!`: the intrinsic is not stable Rust yet.
#[inline(always)]
unsafe fn bfdot_lane<const L: i32>(acc: float32x4_t, w: uint32x4_t, a: uint32x4_t) -> float32x4_t {
    let mut acc = acc;
    asm!(
        "bfdot {acc:v}.4s, {w:v}.8h, {a:v}.2h[{lane}]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        lane = const L,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// One pair row of a bf16 half tile: the 16 columns' weight pairs at
/// `row` times lane `L` of each row's 4 input pairs `av`.
#[inline(always)]
unsafe fn bfdot_row<const L: i32, const R: usize>(
    acc: &mut [[float32x4_t; 4]; R],
    row: *const u16,
    av: &[uint32x4_t; R],
) {
    let w = [0, 8, 16, 24].map(|j| vld1q_u32(row.add(j) as *const u32));
    for (acc, a) in acc.iter_mut().zip(av) {
        for (s, w) in acc.iter_mut().zip(w) {
            *s = bfdot_lane::<L>(*s, w, *a);
        }
    }
}

/// The left operand of a bf16 tile: pair `i` of row `r` is at
/// `ptr[r · row + i · pair]` (the fields of `bf16::PairsIn`).
#[derive(Clone, Copy)]
pub(super) struct Pairs {
    pub ptr: *const u32,
    pub row: usize,
    pub pair: usize,
}

impl Pairs {
    /// Pairs `i..i + 4` of row `r` as one vector.
    #[inline(always)]
    unsafe fn four(self, r: usize, i: usize) -> uint32x4_t {
        let at = self.ptr.add(r * self.row + i * self.pair);
        if self.pair == 1 {
            vld1q_u32(at)
        } else {
            let p = self.pair;
            vld1q_u32([*at, *at.add(p), *at.add(2 * p), *at.add(3 * p)].as_ptr())
        }
    }
}

/// The fp32 sums of `R` (≤ [`MR`]) rows × 32 columns of a bf16 pair
/// product: `sums[r][j] = Σ_i a[r, i] · panel[i, j]`, each term two bf16
/// products (the epilogue, which every bf16 tile shares, is the caller's).
///
/// # Safety
/// The CPU has NEON and BF16; `a` addresses `R` rows of `k2` pairs,
/// `panel` `k2` pair rows of [`NR`] columns.
#[target_feature(enable = "neon,bf16")]
unsafe fn sums_bf16<const R: usize>(a: Pairs, k2: usize, panel: &[u16], sums: &mut [[f32; NR]]) {
    debug_assert!(R <= MR && panel.len() >= k2 * NR * 2 && sums.len() >= R);
    let k4 = k2 - k2 % 4;
    for h0 in (0..NR).step_by(HALF) {
        let bp = panel.as_ptr().add(2 * h0);
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        for i in (0..k4).step_by(4) {
            let av: [uint32x4_t; R] = std::array::from_fn(|r| a.four(r, i));
            bfdot_row::<0, R>(&mut acc, bp.add(i * NR * 2), &av);
            bfdot_row::<1, R>(&mut acc, bp.add((i + 1) * NR * 2), &av);
            bfdot_row::<2, R>(&mut acc, bp.add((i + 2) * NR * 2), &av);
            bfdot_row::<3, R>(&mut acc, bp.add((i + 3) * NR * 2), &av);
        }
        for i in k4..k2 {
            // One pair: in lane 0.
            let av: [uint32x4_t; R] =
                std::array::from_fn(|r| vdupq_n_u32(*a.ptr.add(r * a.row + i * a.pair)));
            bfdot_row::<0, R>(&mut acc, bp.add(i * NR * 2), &av);
        }
        for (row, acc) in sums.iter_mut().zip(&acc) {
            for (j, s) in acc.iter().enumerate() {
                vst1q_f32(row.as_mut_ptr().add(h0 + 4 * j), *s);
            }
        }
    }
}

/// [`sums_bf16`] for `mr` rows, [`MR`] at a time: `sums[r]` for `r < mr`.
///
/// # Safety
/// The CPU has NEON and BF16; `a` addresses `mr` rows of `k2` pairs,
/// `panel` `k2` pair rows of [`NR`] columns; `sums` holds `mr` rows.
pub(super) unsafe fn tile_sums_bf16(
    a: Pairs,
    k2: usize,
    mr: usize,
    panel: &[u16],
    sums: &mut [[f32; NR]],
) {
    for r0 in (0..mr).step_by(MR) {
        let rows = MR.min(mr - r0);
        let a = Pairs {
            ptr: a.ptr.wrapping_add(r0 * a.row),
            ..a
        };
        let sums = &mut sums[r0..];
        match rows {
            1 => sums_bf16::<1>(a, k2, panel, sums),
            2 => sums_bf16::<2>(a, k2, panel, sums),
            3 => sums_bf16::<3>(a, k2, panel, sums),
            _ => sums_bf16::<4>(a, k2, panel, sums),
        }
    }
}

/// The rate of [`crate::fast::instruction_peak_gops`]'s fp32 chains on
/// NEON: 16 independent `fmla` chains of 4 lanes.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn fma_chains(iters: usize) -> u32 {
    let (b, c) = (vdupq_n_f32(1.0), vdupq_n_f32(0.5));
    let mut acc = [vdupq_n_f32(0.0); 16];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = vfmaq_f32(c, *a, b);
        }
    }
    let sum = acc.iter().fold(vdupq_n_f32(0.0), |s, a| vaddq_f32(s, *a));
    vaddvq_f32(sum) as u32
}

#[cfg(test)]
mod tests {
    use super::super::int8::{groups, QGROUP};
    use super::super::tests::{assert_f32_tiles_equal_the_definition, data};
    use super::super::*;

    fn has_dotprod() -> bool {
        std::arch::is_aarch64_feature_detected!("dotprod")
    }

    /// The NEON tiles against the f64 definition.
    #[test]
    fn neon_f32_tiles_equal_the_definition() {
        assert_f32_tiles_equal_the_definition(
            super::MR,
            false,
            &|rows, x, k, panel, c, ldc, cols, bias, act| {
                // SAFETY: every aarch64 CPU has NEON; c holds the rows × cols
                // tile at stride ldc.
                unsafe {
                    match rows {
                        1 => super::tile_f32::<1>(x, k, panel, c, ldc, cols, bias, act),
                        2 => super::tile_f32::<2>(x, k, panel, c, ldc, cols, bias, act),
                        3 => super::tile_f32::<3>(x, k, panel, c, ldc, cols, bias, act),
                        _ => super::tile_f32::<4>(x, k, panel, c, ldc, cols, bias, act),
                    }
                }
            },
        );
    }

    /// The `sdot` kernel's integer sums are exact, so its floats equal the
    /// scalar loop's within the rounding of fused multiply-adds, for every
    /// tile height, with groups whose quads are not a multiple of 4, a
    /// ragged last group and bytes at both ends of their range (0 and 255
    /// flip to −128 and 127).
    #[test]
    fn neon_int8_equals_the_scalar_loop() {
        if !has_dotprod() {
            eprintln!("no dotprod on this CPU: nothing to compare");
            return;
        }
        for group in [QGROUP, 8] {
            let (m, k, n) = (super::MR, 2 * QGROUP + 18, 40);
            let (mut x, w, b) = (data(m * k, 21), data(k * n, 22), data(n, 23));
            x.iter_mut().step_by(3).for_each(|v| *v = v.signum() * 8.0);
            let scheme = I8Scheme { group, alpha: 0.5 };
            let packed = PackedI8::new(&w, k, n, None, scheme);
            let sums = super::super::int8::column_sums(&packed.panels, k, packed.k4, group);
            let mut scratch = QuantScratch::default();
            scratch.quantize(&x, m, k, packed.k4, group, &packed.x_scales);
            assert!(scratch.bytes.contains(&0) && scratch.bytes.contains(&255));
            let n_groups = groups(k, group);
            for p in 0..n.div_ceil(NR) {
                let cols = NR.min(n - p * NR);
                let tile = I8Tile {
                    k4: packed.k4,
                    group,
                    panel: &packed.panels[p * packed.k4 * NR..(p + 1) * packed.k4 * NR],
                    group_sums: &packed.group_sums[p * n_groups * NR..(p + 1) * n_groups * NR],
                    w_scales: &packed.w_scales[p * n_groups * NR..(p + 1) * n_groups * NR],
                    bias: &b[p * NR..p * NR + cols],
                    act: None,
                };
                let sums = &sums[p * n_groups * NR..(p + 1) * n_groups * NR];
                for rows in 1..=m {
                    let (qa, quants) = (
                        &scratch.bytes[..rows * packed.k4],
                        &scratch.quants[..rows * n_groups],
                    );
                    let (mut ours, mut theirs) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
                    let op = ours.as_mut_ptr();
                    // SAFETY: dotprod checked; `rows` rows of bytes and
                    // quants; the rows × cols tiles.
                    unsafe {
                        match rows {
                            1 => super::tile_i8::<1>(&tile, sums, qa, quants, op, cols),
                            2 => super::tile_i8::<2>(&tile, sums, qa, quants, op, cols),
                            3 => super::tile_i8::<3>(&tile, sums, qa, quants, op, cols),
                            _ => super::tile_i8::<4>(&tile, sums, qa, quants, op, cols),
                        }
                        tile.run_scalar(qa, quants, rows, theirs.as_mut_ptr(), cols);
                    }
                    for (o, t) in ours.iter().zip(&theirs) {
                        // Fused multiply-adds round once where the loop
                        // rounds twice.
                        assert!(
                            (o - t).abs() <= 1e-5 * t.abs().max(1.0),
                            "group {group} panel {p} rows {rows}: {o} vs {t}"
                        );
                    }
                }
            }
        }
    }
}
