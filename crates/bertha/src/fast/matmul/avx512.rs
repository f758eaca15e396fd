//! The AVX-512 micro-kernels of [`super`]: fp32 tiles and int8 VNNI
//! products, and the activation quantizer, in registers.

use super::{group_quads, GroupQuant, I8Tile, NR};

/// How far ahead (panel rows: 128 bytes each, in both kernels) the
/// kernels prefetch.
const PREFETCH_ROWS: usize = 24;
use crate::fast::kernels::{activate_body, Act};
use std::arch::x86_64::*;

/// `R` rows × 32 columns of fp32 products, accumulated in registers.
#[target_feature(enable = "avx512f")]
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
    debug_assert!(a.len() >= R * k && panel.len() >= k * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (ap, bp) = (a.as_ptr(), panel.as_ptr());
    for i in 0..k {
        // The panel streams in from L3 on its first tile: ask for the
        // rows a few iterations ahead (past the end is harmless: a
        // prefetch never faults).
        let ahead = bp.wrapping_add((i + PREFETCH_ROWS) * NR) as *const i8;
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        let b0 = _mm512_loadu_ps(bp.add(i * NR));
        let b1 = _mm512_loadu_ps(bp.add(i * NR + 16));
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*ap.add(r * k + i));
            acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
        }
    }
    store_tile(&acc, c, ldc, &bias[..cols], act);
}

/// Stores `R` rows × `bias.len()` (≤ 32) columns of fp32 sums at `c`
/// (row stride `ldc`), adding the bias and applying `act` while the rows
/// are in cache.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_tile<const R: usize>(
    acc: &[[__m512; 2]; R],
    c: *mut f32,
    ldc: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    let cols = bias.len();
    let (m0, m1) = masks(cols);
    let bias0 = _mm512_maskz_loadu_ps(m0, bias.as_ptr());
    let bias1 = _mm512_maskz_loadu_ps(m1, bias.as_ptr().wrapping_add(16));
    for (r, acc) in acc.iter().enumerate() {
        let dst = c.add(r * ldc);
        _mm512_mask_storeu_ps(dst, m0, _mm512_add_ps(acc[0], bias0));
        _mm512_mask_storeu_ps(dst.wrapping_add(16), m1, _mm512_add_ps(acc[1], bias1));
        if let Some(act) = act {
            // Inlined here, so compiled for AVX-512 too.
            activate_body(std::slice::from_raw_parts_mut(dst, cols), act);
        }
    }
}

/// Masks of the valid lanes of the two halves of a 32-column tile.
fn masks(cols: usize) -> (__mmask16, __mmask16) {
    let bits = if cols >= 32 {
        u32::MAX
    } else {
        (1u32 << cols) - 1
    };
    (bits as u16, (bits >> 16) as u16)
}

/// `R` rows × 32 columns of u8 × i8 products, four per lane per
/// `vpdpbusd`, turned into floats group by group.
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn tile_i8<const R: usize>(
    t: &I8Tile,
    qa: &[u8],
    quants: &[GroupQuant],
    c: *mut f32,
    ldc: usize,
) {
    let (k4, n_groups) = (t.k4, quants.len() / R);
    debug_assert!(qa.len() >= R * k4 && t.panel.len() >= k4 * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (ap, bp) = (qa.as_ptr(), t.panel.as_ptr());
    for g in 0..n_groups {
        let mut iacc = [[_mm512_setzero_si512(); 2]; R];
        for q in group_quads(g, t.group, k4) {
            let ahead = bp.wrapping_add((q + PREFETCH_ROWS) * 4 * NR);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            let b0 = _mm512_loadu_si512(bp.add(q * 4 * NR) as *const _);
            let b1 = _mm512_loadu_si512(bp.add(q * 4 * NR + 64) as *const _);
            for (r, iacc) in iacc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32((ap.add(r * k4 + 4 * q) as *const i32).read_unaligned());
                iacc[0] = _mm512_dpbusd_epi32(iacc[0], av, b0);
                iacc[1] = _mm512_dpbusd_epi32(iacc[1], av, b1);
            }
        }
        let s0 = _mm512_loadu_ps(t.group_sums.as_ptr().add(g * NR));
        let s1 = _mm512_loadu_ps(t.group_sums.as_ptr().add(g * NR + 16));
        let w0 = _mm512_loadu_ps(t.w_scales.as_ptr().add(g * NR));
        let w1 = _mm512_loadu_ps(t.w_scales.as_ptr().add(g * NR + 16));
        for (r, (acc, iacc)) in acc.iter_mut().zip(&iacc).enumerate() {
            let GroupQuant { step, min } = quants[r * n_groups + g];
            let (step, min) = (_mm512_set1_ps(step), _mm512_set1_ps(min));
            let (step0, step1) = (_mm512_mul_ps(step, w0), _mm512_mul_ps(step, w1));
            acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[0]), step0, acc[0]);
            acc[0] = _mm512_fmadd_ps(min, s0, acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[1]), step1, acc[1]);
            acc[1] = _mm512_fmadd_ps(min, s1, acc[1]);
        }
    }
    store_tile(&acc, c, ldc, t.bias, t.act);
}

/// Mask of the `k - i` (at most 16) lanes left from `i`.
fn tail(k: usize, i: usize) -> __mmask16 {
    if k - i >= 16 {
        0xffff
    } else {
        (1u16 << (k - i)) - 1
    }
}

/// Asymmetric quantization of one channel group to bytes (round to
/// nearest even, as `vcvtps2dq` does by default).
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_group(x: &[f32], x_scales: &[f32], out: &mut [u8]) -> GroupQuant {
    let k = x.len();
    debug_assert!(x_scales.len() >= k && out.len() >= k);
    let load = |i: usize| {
        let m = tail(k, i);
        _mm512_mul_ps(
            _mm512_maskz_loadu_ps(m, x.as_ptr().add(i)),
            _mm512_maskz_loadu_ps(m, x_scales.as_ptr().add(i)),
        )
    };
    let mut lo = _mm512_set1_ps(f32::INFINITY);
    let mut hi = _mm512_set1_ps(f32::NEG_INFINITY);
    for i in (0..k).step_by(16) {
        let (m, v) = (tail(k, i), load(i));
        lo = _mm512_mask_min_ps(lo, m, lo, v);
        hi = _mm512_mask_max_ps(hi, m, hi, v);
    }
    let quant = super::group_quant(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
    let min = _mm512_set1_ps(quant.min);
    let inv = _mm512_set1_ps(1.0 / quant.step);
    let (zero, top) = (_mm512_setzero_si512(), _mm512_set1_epi32(255));
    for i in (0..k).step_by(16) {
        let v = _mm512_mul_ps(_mm512_sub_ps(load(i), min), inv);
        let q = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), zero), top);
        _mm512_mask_cvtepi32_storeu_epi8(out.as_mut_ptr().add(i) as *mut _, tail(k, i), q);
    }
    quant
}

/// `R` rows × 32 columns of bf16 pair products (`vdpbf16ps`), summed in
/// fp32 registers: `a` holds `R` rows of `k2` bf16 pairs, `panel` `k2`
/// rows of 32 columns × 2 bf16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn tile_bf16<const R: usize>(
    a: &[u32],
    k2: usize,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    debug_assert!(a.len() >= R * k2 && panel.len() >= k2 * NR * 2);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (ap, bp) = (a.as_ptr(), panel.as_ptr());
    for i in 0..k2 {
        let row = bp.add(i * NR * 2);
        let ahead = row.wrapping_add(PREFETCH_ROWS * NR * 2) as *const i8;
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(row as *const __m512i));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(row.add(32) as *const __m512i));
        for (r, acc) in acc.iter_mut().enumerate() {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(r * k2 + i) as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
        }
    }
    store_tile(&acc, c, ldc, bias, act);
}

/// One row of `x` rounded to bf16 pairs in `out` (`x.len()` rounded up to
/// even, halved; an odd last input pairs with 0), 32 values per
/// `vcvtne2ps2bf16` (round to nearest even).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn round_row_bf16(x: &[f32], out: &mut [u32]) {
    debug_assert_eq!(out.len(), x.len().div_ceil(2));
    let (k, src, dst) = (x.len(), x.as_ptr(), out.as_mut_ptr() as *mut i16);
    let mut j = 0;
    while j < k {
        let left = k - j;
        let lo_mask: __mmask16 = if left >= 16 {
            u16::MAX
        } else {
            (1u16 << left) - 1
        };
        let hi_left = left.saturating_sub(16);
        let hi_mask: __mmask16 = if hi_left >= 16 {
            u16::MAX
        } else {
            (1u16 << hi_left) - 1
        };
        let lo = _mm512_maskz_loadu_ps(lo_mask, src.add(j));
        let hi = _mm512_maskz_loadu_ps(hi_mask, src.add(j).wrapping_add(16));
        let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        // bf16 values to store: up to 32, the row's even length at its end.
        let n = left.div_ceil(2).min(16) * 2;
        let mask: __mmask32 = if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
        _mm512_mask_storeu_epi16(dst.add(j), mask, packed);
        j += 32;
    }
}
