//! The AVX-512 micro-kernels of [`super`]: fp32 tiles and int8 VNNI
//! products, and the activation quantizer, in registers; the bf16 and AMX
//! kernels in [`bf16`].

use super::{group_quads, GroupQuant, I8Tile, NR};

/// How far ahead (panel rows: 128 bytes each, in both kernels) the
/// kernels prefetch.
const PREFETCH_ROWS: usize = 24;
use crate::fast::kernels::Act;
use std::arch::x86_64::*;

/// Stores `R` rows × `bias.len()` (≤ 32) columns of fp32 sums at `c`
/// (row stride `ldc`), adding the bias, with `accumulate` what `c` holds,
/// and applying `act` in registers.
/// A macro, expanded in each kernel: a function taking the accumulators
/// by reference was not inlined, which put them on the stack (zeroed by a
/// `memset` per tile). Applying `act` to the stored row instead read back
/// what a masked store had just written, which the CPU cannot forward:
/// that stall cost more than the GELU itself.
macro_rules! store_tile {
    ($acc:ident, $c:expr, $ldc:expr, $bias:expr, $act:expr, $accumulate:expr) => {{
        let (c, ldc, bias, act): (*mut f32, usize, &[f32], Option<Act>) = ($c, $ldc, $bias, $act);
        let accumulate: bool = $accumulate;
        let (m0, m1) = masks(bias.len());
        let bias0 = _mm512_maskz_loadu_ps(m0, bias.as_ptr());
        let bias1 = _mm512_maskz_loadu_ps(m1, bias.as_ptr().wrapping_add(16));
        // Rows by constant index (a loop over 11 or 12 rows is not
        // unrolled, and indexing by a variable keeps the array in memory).
        assert!($acc.len() <= 16, "store_tile! stores at most 16 rows");
        store_tile!(@rows $acc, c, ldc, bias0, bias1, m0, m1, act, accumulate;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }};
    (@rows $acc:ident, $c:ident, $ldc:ident, $b0:ident, $b1:ident, $m0:ident, $m1:ident,
     $act:ident, $accumulate:ident; $($r:literal)*) => {
        $(
            if let Some(acc) = $acc.get($r) {
                let dst = $c.add($r * $ldc);
                let (mut v0, mut v1) = (_mm512_add_ps(acc[0], $b0), _mm512_add_ps(acc[1], $b1));
                if $accumulate {
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps($m0, dst));
                    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps($m1, dst.wrapping_add(16)));
                }
                if let Some(act) = $act {
                    (v0, v1) = (activate(v0, act), activate(v1, act));
                }
                _mm512_mask_storeu_ps(dst, $m0, v0);
                _mm512_mask_storeu_ps(dst.wrapping_add(16), $m1, v1);
            }
        )*
    };
}

// The bf16 kernels use `store_tile!` above (macros are in scope from here).
mod bf16;
pub(super) use bf16::{
    interleave48_bf16, pack_pair_rows, round_row_bf16, tile_amx, tile_amx2, tile_bf16,
    transpose_pairs16, AMX_ROWS,
};

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
    store_tile!(acc, c, ldc, &bias[..cols], act, false);
}

/// `dst[c · dst_stride + r] = src[r · src_stride + c]` for `c < cols`, all
/// `r < 16` (rows from `rows` on are written as 0): a 16 × 16 block
/// transposed in registers (four rounds of shuffles), where element-wise
/// stores would each touch another row.
///
/// # Safety
/// `rows` and `cols` ≤ 16; `src` rows `r < rows` hold `cols` readable
/// floats, `dst` rows `c < cols` 16 writable ones.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose16(
    src: *const f32,
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let mask = tail(cols, 0);
    let mut r = [_mm512_setzero_ps(); 16];
    for (i, row) in r.iter_mut().enumerate().take(rows) {
        *row = _mm512_maskz_loadu_ps(mask, src.add(i * src_stride));
    }
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        let b = 4 * i;
        r[b] = _mm512_shuffle_ps::<0x44>(t[b], t[b + 2]);
        r[b + 1] = _mm512_shuffle_ps::<0xEE>(t[b], t[b + 2]);
        r[b + 2] = _mm512_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
        r[b + 3] = _mm512_shuffle_ps::<0xEE>(t[b + 1], t[b + 3]);
    }
    for h in 0..2 {
        let b = 8 * h;
        for i in 0..4 {
            t[b + i] = _mm512_shuffle_f32x4::<0x88>(r[b + i], r[b + 4 + i]);
            t[b + 4 + i] = _mm512_shuffle_f32x4::<0xDD>(r[b + i], r[b + 4 + i]);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[8 + i]);
        r[8 + i] = _mm512_shuffle_f32x4::<0xDD>(t[i], t[8 + i]);
    }
    for (c, row) in r.iter().enumerate().take(cols) {
        _mm512_storeu_ps(dst.add(c * dst_stride), *row);
    }
}

/// [`crate::fast::kernels::activate_body`] on 16 lanes: the same
/// operations in the same order, so the same bits (a test sweeps both).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn activate(x: __m512, act: Act) -> __m512 {
    let half = _mm512_set1_ps(0.5);
    let one = _mm512_set1_ps(1.0);
    match act {
        Act::Relu => _mm512_max_ps(x, _mm512_setzero_ps()),
        Act::GeluErf => {
            let e = erf(_mm512_mul_ps(
                x,
                _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
            ));
            _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, e))
        }
        Act::GeluTanh => {
            // u = √(2/π)·(x + 0.044715·x³)
            let cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044_715), x), x);
            let cube = _mm512_mul_ps(cube, x);
            let inner = _mm512_mul_ps(_mm512_set1_ps(0.797_884_6), _mm512_add_ps(x, cube));
            let t = tanh(inner);
            _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, t))
        }
        Act::Tanh => tanh(x),
    }
}

/// [`crate::fast::kernels::tanh`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tanh(x: __m512) -> __m512 {
    let one = _mm512_set1_ps(1.0);
    let e = exp(_mm512_mul_ps(_mm512_set1_ps(2.0), x));
    _mm512_sub_ps(
        one,
        _mm512_div_ps(_mm512_set1_ps(2.0), _mm512_add_ps(e, one)),
    )
}

/// [`crate::fast::kernels::erf`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn erf(x: __m512) -> __m512 {
    erf_and_gauss(x).0
}

/// [`crate::fast::kernels::erf_and_gauss`] on 16 lanes: `erf(x)` and the
/// `exp(-x²)` it is made from, by the same operations in the same order.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn erf_and_gauss(x: __m512) -> (__m512, __m512) {
    let sign = _mm512_set1_epi32(i32::MIN);
    let xi = _mm512_castps_si512(x);
    let a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, xi));
    let one = _mm512_set1_ps(1.0);
    let t = _mm512_div_ps(
        one,
        _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(0.327_591_1), a)),
    );
    let c = |v: f32| _mm512_set1_ps(v);
    let mut poly = _mm512_add_ps(c(-1.453_152_1), _mm512_mul_ps(t, c(1.061_405_4)));
    poly = _mm512_add_ps(c(1.421_413_7), _mm512_mul_ps(t, poly));
    poly = _mm512_add_ps(c(-0.284_496_74), _mm512_mul_ps(t, poly));
    poly = _mm512_add_ps(c(0.254_829_6), _mm512_mul_ps(t, poly));
    poly = _mm512_mul_ps(t, poly);
    let neg_a = _mm512_castsi512_ps(_mm512_xor_si512(sign, _mm512_castps_si512(a)));
    let gauss = exp(_mm512_mul_ps(neg_a, a));
    let y = _mm512_sub_ps(one, _mm512_mul_ps(poly, gauss));
    // y.copysign(x)
    let y = _mm512_andnot_si512(sign, _mm512_castps_si512(y));
    let e = _mm512_castsi512_ps(_mm512_or_si512(y, _mm512_and_si512(sign, xi)));
    (e, gauss)
}

/// [`activate`] and [`crate::model::ops::act_grad`] on 16 lanes: `act(z)`
/// and `act'(z)` from one evaluation of what they share (erf and its
/// Gaussian, or the tanh), each by the same operations in the same order
/// as apart, so the same bits (a test sweeps them).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn act_and_grad(z: __m512, act: Act) -> (__m512, __m512) {
    let c = |v: f32| _mm512_set1_ps(v);
    let (half, one) = (c(0.5), c(1.0));
    match act {
        // 0.5·z·(1 + erf(z/√2)); Φ(z) + z·φ(z)
        Act::GeluErf => {
            let (e, gauss) = erf_and_gauss(_mm512_mul_ps(z, c(std::f32::consts::FRAC_1_SQRT_2)));
            let y = _mm512_mul_ps(_mm512_mul_ps(half, z), _mm512_add_ps(one, e));
            let density = _mm512_mul_ps(_mm512_mul_ps(z, gauss), c(0.398_942_3));
            let slope = _mm512_add_ps(_mm512_mul_ps(half, _mm512_add_ps(one, e)), density);
            (y, slope)
        }
        // 0.5·z·(1 + t); 0.5·(1 + t) + 0.5·z·(1 - t²)·√(2/π)·(1 + 3·0.044715·z²)
        Act::GeluTanh => {
            let cube = _mm512_mul_ps(_mm512_mul_ps(c(0.044_715), z), z);
            let cube = _mm512_mul_ps(cube, z);
            let inner = _mm512_mul_ps(c(0.797_884_6), _mm512_add_ps(z, cube));
            let t = tanh(inner);
            let y = _mm512_mul_ps(_mm512_mul_ps(half, z), _mm512_add_ps(one, t));
            let left = _mm512_mul_ps(half, _mm512_add_ps(one, t));
            let mut right = _mm512_mul_ps(half, z);
            right = _mm512_mul_ps(right, _mm512_sub_ps(one, _mm512_mul_ps(t, t)));
            right = _mm512_mul_ps(right, c(0.797_884_6));
            let zz = _mm512_mul_ps(_mm512_mul_ps(c(0.134_145), z), z);
            right = _mm512_mul_ps(right, _mm512_add_ps(one, zz));
            (y, _mm512_add_ps(left, right))
        }
        // 1 - tanh(z)²
        Act::Tanh => {
            let t = tanh(z);
            (t, _mm512_sub_ps(one, _mm512_mul_ps(t, t)))
        }
        // The slope is 0 at z = 0, as PyTorch's.
        Act::Relu => {
            let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(z, _mm512_setzero_ps());
            (
                _mm512_max_ps(z, _mm512_setzero_ps()),
                _mm512_maskz_mov_ps(positive, one),
            )
        }
    }
}

/// [`crate::fast::kernels::fast_exp`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp(x: __m512) -> __m512 {
    const SHIFT: f32 = 12_582_912.0;
    let c = |v: f32| _mm512_set1_ps(v);
    // x.clamp(-87.3, 88.7), the bound second so a NaN passes through.
    let x = _mm512_min_ps(c(88.7), _mm512_max_ps(c(-87.3), x));
    let shifted = _mm512_add_ps(_mm512_mul_ps(x, c(std::f32::consts::LOG2_E)), c(SHIFT));
    let n = _mm512_sub_ps(shifted, c(SHIFT));
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, c(0.693_145_75))),
        _mm512_mul_ps(n, c(1.428_606_8e-6)),
    );
    let mut p = _mm512_add_ps(c(1.0 / 120.0), _mm512_mul_ps(r, c(1.0 / 720.0)));
    for coef in [1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_add_ps(c(coef), _mm512_mul_ps(r, p));
    }
    let bits = _mm512_add_epi32(
        _mm512_sub_epi32(
            _mm512_castps_si512(shifted),
            _mm512_set1_epi32(SHIFT.to_bits() as i32),
        ),
        _mm512_set1_epi32(127),
    );
    _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(bits)))
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
    store_tile!(acc, c, ldc, t.bias, t.act, false);
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
