//! The AVX2 + FMA micro-kernels of [`super`], for x86-64 CPUs without
//! AVX-512 (Zen 2 / Zen 3, Intel client cores since Alder Lake): fp32
//! tiles and exact int8 products on the same weight panels' columns.
//!
//! AVX2 has 16 ymm registers of 8 floats. A tile is 6 rows × 16 columns
//! (half a 32-column panel): 12 accumulators, two weight vectors and a
//! broadcast, the shape of MLAS's `SgemmKernelFma3`. Each k step loads
//! two weight vectors and six broadcasts for twelve FMAs, within the two
//! loads a cycle these cores sustain beside two FMAs. The two halves of a
//! panel run one after the other over the same rows of `a` (from L1).
//!
//! int8 runs on 16-bit products (`vpmaddwd`: two u16 × i16 products
//! summed into each i32 lane), on weights widened once at load
//! ([`super::PackedI8`]'s `wide` panels) and activations widened per
//! call. `vpmaddubsw` would take bytes directly, but its i16 sums of two
//! u8 × i8 products saturate (255 · 127 · 2 > 32,767) and so differ from
//! the exact integers the VNNI and scalar paths compute; `vpmaddwd`
//! cannot overflow here and does as many products per multiply µop.

use super::{group_quads, GroupQuant, NR};
use crate::fast::kernels::{activate_body, Act};
use std::arch::x86_64::*;

/// Rows of an AVX2 register tile.
pub(super) const MR: usize = 6;
/// Columns of an AVX2 register tile: half a panel.
const HALF: usize = NR / 2;
/// How far ahead (panel rows) the kernels prefetch.
const PREFETCH_ROWS: usize = 16;

/// Writes `R` rows of one half tile's sums (`acc`, 16 columns of which
/// `cols` are kept) plus `bias` to `c` (row stride `ldc`), then `act` on
/// each stored row: [`activate_body`] gives the bits every path gives.
#[inline(always)]
unsafe fn store_half<const R: usize>(
    acc: &[[__m256; 2]; R],
    c: *mut f32,
    ldc: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    let cols = bias.len();
    debug_assert!(cols <= HALF);
    if cols == HALF {
        let (b0, b1) = (
            _mm256_loadu_ps(bias.as_ptr()),
            _mm256_loadu_ps(bias.as_ptr().add(8)),
        );
        for (r, acc) in acc.iter().enumerate() {
            let dst = c.add(r * ldc);
            _mm256_storeu_ps(dst, _mm256_add_ps(acc[0], b0));
            _mm256_storeu_ps(dst.add(8), _mm256_add_ps(acc[1], b1));
        }
    } else {
        // A panel's last, partial columns: through a row on the stack (no
        // write past `cols`: the neighbouring columns belong to others).
        let mut row = [0f32; HALF];
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
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

/// `R` (≤ [`MR`]) rows × `cols` (≤ 32) columns of fp32 products:
/// `c[r, j] = act(Σ_i a[r, i] · panel[i, j] + bias[j])`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds `R` rows of `k`, `panel` `k` rows
/// of [`NR`]; `c` addresses an `R` × `cols` tile (row stride `ldc`) no one
/// else reads or writes meanwhile.
#[target_feature(enable = "avx2,fma")]
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
    for h0 in (0..cols).step_by(HALF) {
        let bp = panel.as_ptr().add(h0);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for i in 0..k {
            // The panel streams in from L3 on its first tile (a prefetch
            // past the end never faults).
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add((i + PREFETCH_ROWS) * NR) as *const i8);
            let b0 = _mm256_loadu_ps(bp.add(i * NR));
            let b1 = _mm256_loadu_ps(bp.add(i * NR + 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(r * k + i));
                acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
            }
        }
        let hc = HALF.min(cols - h0);
        store_half(&acc, c.add(h0), ldc, &bias[h0..h0 + hc], act);
    }
}

/// `R` (≤ [`MR`]) rows × `cols` columns of an int8 product on 16-bit
/// words: `wide` holds the panel's weights as pairs of i16 (inputs 2p,
/// 2p + 1 of each column adjacent, [`NR`] columns a pair row), `words` the
/// rows' activation bytes as u16 (`k4` a row). Per channel group the exact
/// i32 sums are scaled into floats as the VNNI kernel does:
/// `Σ_g (step · w_scale · Σ_i q_a · q_w + min · group_sum) + bias`.
///
/// # Safety
/// The CPU has AVX2 and FMA; the slices hold what is said; `c` addresses
/// an `R` × `bias.len()` tile (row stride `ldc`) no one else reads or
/// writes meanwhile.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_i16<const R: usize>(
    t: &super::I8Tile,
    wide: &[i16],
    words: &[u16],
    quants: &[GroupQuant],
    c: *mut f32,
    ldc: usize,
) {
    let (k4, n_groups, cols) = (t.k4, quants.len() / R, t.cols());
    debug_assert!(R <= MR && words.len() >= R * k4 && wide.len() >= k4 / 2 * 2 * NR);
    let rows: [*const u16; R] = std::array::from_fn(|r| words.as_ptr().add(r * k4));
    for h0 in (0..cols).step_by(HALF) {
        let bp = wide.as_ptr().add(2 * h0);
        // Float sums stay in memory: with twelve i32 accumulators, two
        // weight vectors and a broadcast, no register is left for them
        // (they are touched once a group).
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for g in 0..n_groups {
            let mut iacc = [[_mm256_setzero_si256(); 2]; R];
            // The group's input pairs, two per step (a group is whole
            // quads, so an even count of pairs).
            let quads = group_quads(g, t.group, k4);
            for q in quads {
                let row = bp.add(q * 4 * NR);
                let (w0, w1) = (
                    _mm256_load_si256(row as *const __m256i),
                    _mm256_load_si256(row.add(16) as *const __m256i),
                );
                let (w2, w3) = (
                    _mm256_load_si256(row.add(2 * NR) as *const __m256i),
                    _mm256_load_si256(row.add(2 * NR + 16) as *const __m256i),
                );
                for (r, iacc) in iacc.iter_mut().enumerate() {
                    let a = rows[r].add(4 * q) as *const i32;
                    let av = _mm256_set1_epi32(a.read_unaligned());
                    iacc[0] = _mm256_add_epi32(iacc[0], _mm256_madd_epi16(av, w0));
                    iacc[1] = _mm256_add_epi32(iacc[1], _mm256_madd_epi16(av, w1));
                }
                for (r, iacc) in iacc.iter_mut().enumerate() {
                    let a = rows[r].add(4 * q + 2) as *const i32;
                    let av = _mm256_set1_epi32(a.read_unaligned());
                    iacc[0] = _mm256_add_epi32(iacc[0], _mm256_madd_epi16(av, w2));
                    iacc[1] = _mm256_add_epi32(iacc[1], _mm256_madd_epi16(av, w3));
                }
            }
            let gs = t.group_sums.as_ptr().add(g * NR + h0);
            let ws = t.w_scales.as_ptr().add(g * NR + h0);
            let (s0, s1) = (_mm256_loadu_ps(gs), _mm256_loadu_ps(gs.add(8)));
            let (w0, w1) = (_mm256_loadu_ps(ws), _mm256_loadu_ps(ws.add(8)));
            for (r, (acc, iacc)) in acc.iter_mut().zip(&iacc).enumerate() {
                let GroupQuant { step, min } = quants[r * n_groups + g];
                let (step, min) = (_mm256_set1_ps(step), _mm256_set1_ps(min));
                let (step0, step1) = (_mm256_mul_ps(step, w0), _mm256_mul_ps(step, w1));
                acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[0]), step0, acc[0]);
                acc[0] = _mm256_fmadd_ps(min, s0, acc[0]);
                acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[1]), step1, acc[1]);
                acc[1] = _mm256_fmadd_ps(min, s1, acc[1]);
            }
        }
        let hc = HALF.min(cols - h0);
        store_half(&acc, c.add(h0), ldc, &t.bias[h0..h0 + hc], t.act);
    }
}

/// [`super::quantize_group`] on 8 lanes: the same values (min and max are
/// exact whatever the order; `vcvtps2dq` rounds to nearest even as
/// `round_ties_even` does), so the same bytes.
///
/// # Safety
/// The CPU has AVX2; `x_scales` and `out` hold at least `x.len()` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_group(x: &[f32], x_scales: &[f32], out: &mut [u8]) -> GroupQuant {
    let k = x.len();
    debug_assert!(x_scales.len() >= k && out.len() >= k);
    let whole = k - k % 8;
    let load = |i: usize| {
        _mm256_mul_ps(
            _mm256_loadu_ps(x.as_ptr().add(i)),
            _mm256_loadu_ps(x_scales.as_ptr().add(i)),
        )
    };
    let mut lo = _mm256_set1_ps(f32::INFINITY);
    let mut hi = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..whole).step_by(8) {
        let v = load(i);
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
    }
    let (mut lanes_lo, mut lanes_hi) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(lanes_lo.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes_hi.as_mut_ptr(), hi);
    let tail = (whole..k).map(|j| x[j] * x_scales[j]);
    let (lo_s, hi_s) = lanes_lo
        .into_iter()
        .zip(lanes_hi)
        .chain(tail.map(|v| (v, v)))
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), (l, h)| {
            (a.min(l), b.max(h))
        });
    let quant = super::group_quant(lo_s, hi_s);
    let (min, inv) = (_mm256_set1_ps(quant.min), _mm256_set1_ps(1.0 / quant.step));
    let (zero, top) = (_mm256_setzero_si256(), _mm256_set1_epi32(255));
    for i in (0..whole).step_by(8) {
        let v = _mm256_mul_ps(_mm256_sub_ps(load(i), min), inv);
        let q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), zero), top);
        let mut words = [0i32; 8];
        _mm256_storeu_si256(words.as_mut_ptr() as *mut __m256i, q);
        for (o, w) in out[i..i + 8].iter_mut().zip(words) {
            *o = w as u8;
        }
    }
    let inv = 1.0 / quant.step;
    for j in whole..k {
        let v = x[j] * x_scales[j];
        out[j] = ((v - quant.min) * inv).round_ties_even().clamp(0.0, 255.0) as u8;
    }
    quant
}

/// The rate of [`crate::fast::instruction_peak_gops`]'s fp32 chains on
/// AVX2: 12 independent `vfmadd` chains of 8 lanes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn fma_chains(iters: usize) -> u32 {
    let (b, c) = (_mm256_set1_ps(1.0), _mm256_set1_ps(0.5));
    let mut acc = [_mm256_setzero_ps(); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, b, c);
        }
    }
    let mut lanes = [0f32; 8];
    let sum = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, a| _mm256_add_ps(s, *a));
    _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
    lanes.iter().sum::<f32>() as u32
}
