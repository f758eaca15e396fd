//! The AVX-512 micro-kernels of [`super`]: fp32 tiles and int8 VNNI
//! products, and the activation quantizer, in registers.

use super::bf16::{Blocks, PairsIn, Source, TileOut};
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

/// Stores `R` rows × `bias.len()` (≤ 32) columns as bf16 pairs of adjacent
/// columns at `c` (row stride `ldc` pairs), after the bias and `act` in
/// registers: the next multiply's rounded input, rounded as
/// [`round_row_bf16`] rounds (`vcvtne2ps2bf16`), so the same bits.
/// Columns past `bias.len()` are 0 (their weights and bias are), which
/// pairs an odd last column with 0 as the rounding does. With `slopes`
/// (fp32 rows and their stride) and `act`, each row's `act'(sums + bias)`
/// is stored there too: the activation's slope, all its backward needs,
/// and the next multiply's rounded input from one tile.
macro_rules! store_pairs {
    ($acc:ident, $c:expr, $ldc:expr, $bias:expr, $act:expr, $slopes:expr, $panel:expr) => {{
        let (c, ldc, bias, act): (*mut u32, usize, &[f32], Option<Act>) = ($c, $ldc, $bias, $act);
        let slopes: Option<(*mut f32, usize)> = $slopes;
        let panel: Option<*mut u32> = $panel;
        let (m0, m1) = masks(bias.len());
        let bias0 = _mm512_maskz_loadu_ps(m0, bias.as_ptr());
        let bias1 = _mm512_maskz_loadu_ps(m1, bias.as_ptr().wrapping_add(16));
        let pairs = bias.len().div_ceil(2);
        let mask: __mmask16 = if pairs >= 16 { u16::MAX } else { (1u16 << pairs) - 1 };
        // The even row's values until the odd one comes (the panel's
        // words pair them), 0 past the columns.
        let columns: __mmask32 = if bias.len() >= 32 { u32::MAX } else { (1u32 << bias.len()) - 1 };
        let mut even = _mm512_setzero_si512();
        assert!($acc.len() <= 16, "store_pairs! stores at most 16 rows");
        store_pairs!(@rows $acc, c, ldc, bias0, bias1, m0, m1, mask, act, slopes, panel, columns, even;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        if let Some(panel) = panel {
            if $acc.len() % 2 == 1 {
                // An odd last row pairs with a row of zeros.
                store_panel_pair(panel.add($acc.len() / 2 * NR), even, _mm512_setzero_si512());
            }
        }
    }};
    (@rows $acc:ident, $c:ident, $ldc:ident, $b0:ident, $b1:ident, $m0:ident, $m1:ident,
     $mask:ident, $act:ident, $slopes:ident, $panel:ident, $columns:ident, $even:ident; $($r:literal)*) => {
        $(
            if let Some(acc) = $acc.get($r) {
                let (mut v0, mut v1) = (_mm512_add_ps(acc[0], $b0), _mm512_add_ps(acc[1], $b1));
                match ($act, $slopes) {
                    (Some(act), Some((slopes, ld))) => {
                        let ((y0, g0), (y1, g1)) = (act_and_grad(v0, act), act_and_grad(v1, act));
                        let dst = slopes.add($r * ld);
                        _mm512_mask_storeu_ps(dst, $m0, g0);
                        _mm512_mask_storeu_ps(dst.wrapping_add(16), $m1, g1);
                        (v0, v1) = (y0, y1);
                    }
                    (Some(act), None) => (v0, v1) = (activate(v0, act), activate(v1, act)),
                    (None, _) => {}
                }
                let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(v1, v0));
                _mm512_mask_storeu_epi32($c.add($r * $ldc) as *mut i32, $mask, packed);
                if let Some(panel) = $panel {
                    let packed = _mm512_maskz_mov_epi16($columns, packed);
                    if $r % 2 == 0 {
                        $even = packed;
                    } else {
                        store_panel_pair(panel.add($r / 2 * NR), $even, packed);
                    }
                }
            }
        )*
    };
}

/// Two rows' 32 bf16 values (`even` row `2i`, `odd` row `2i + 1`) as 32
/// words, word `j` column `j` of both rows (the even row's in the low
/// half): columns 0..16, then 16..32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair_words(even: __m512i, odd: __m512i) -> [__m512i; 2] {
    static LOW: [u16; 32] = [
        0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 8, 40, 9, 41, 10, 42, 11, 43, 12,
        44, 13, 45, 14, 46, 15, 47,
    ];
    static HIGH: [u16; 32] = [
        16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27,
        59, 28, 60, 29, 61, 30, 62, 31, 63,
    ];
    let low = _mm512_loadu_si512(LOW.as_ptr() as *const __m512i);
    let high = _mm512_loadu_si512(HIGH.as_ptr() as *const __m512i);
    [
        _mm512_permutex2var_epi16(even, low, odd),
        _mm512_permutex2var_epi16(even, high, odd),
    ]
}

/// Two rows' values ([`pair_words`]) as pair row `i` of a right operand's
/// panel at `dst` (32 words), the layout `pack_panels` makes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store_panel_pair(dst: *mut u32, even: __m512i, odd: __m512i) {
    let [w0, w1] = pair_words(even, odd);
    _mm512_storeu_si512(dst as *mut __m512i, w0);
    _mm512_storeu_si512(dst.add(16) as *mut __m512i, w1);
}

/// Rows ahead [`pack_pair_rows`] asks for.
const PACK_AHEAD: usize = 8;

/// Pair rows of one panel from `k` rows of bf16 pairs (`row` words apart,
/// starting at `src`): pair row `i` holds rows `2i` and `2i + 1`'s first
/// `words` words (≤ 16) side by side as [`pair_words`] lays them (an odd
/// last row pairs with zeros), `2 · words` words of each `NR` written.
/// The words `pack_panel_pairs_body` moves one half at a time.
///
/// # Safety
/// `src` must hold the first `words` words of rows `0..k`, `row` apart;
/// `out` `⌈k / 2⌉` pair rows of `NR` words.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_pair_rows(
    src: *const u32,
    row: usize,
    k: usize,
    words: usize,
    out: *mut u32,
) {
    debug_assert!(words <= 16);
    let load: __mmask16 = ((1u32 << words) - 1) as __mmask16;
    let n = 2 * words;
    let store0: __mmask16 = ((1u32 << n.min(16)) - 1) as __mmask16;
    let store1: __mmask16 = ((1u32 << n.saturating_sub(16)) - 1) as __mmask16;
    for i in 0..k.div_ceil(2) {
        // Rows a head's columns are read from lie far apart (Q, K and V
        // rows of every head side by side): ask for them ahead.
        let ahead = src.wrapping_add((2 * i + PACK_AHEAD) * row) as *const i8;
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(4 * row));
        let even = _mm512_maskz_loadu_epi32(load, src.add(2 * i * row) as *const i32);
        let odd = match 2 * i + 1 < k {
            true => _mm512_maskz_loadu_epi32(load, src.add((2 * i + 1) * row) as *const i32),
            false => _mm512_setzero_si512(),
        };
        let [w0, w1] = pair_words(even, odd);
        let dst = out.add(i * NR) as *mut i32;
        _mm512_mask_storeu_epi32(dst, store0, w0);
        _mm512_mask_storeu_epi32(dst.add(16), store1, w1);
    }
}

/// Two rows' values ([`pair_words`]), their first `cols` columns, as the
/// tile's pair of rows `i` of the transposed blocks (each run of columns
/// inside one block of `MR_BF16` by a masked store; a lane masked off
/// neither writes nor faults).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store_blocks_pair(blocks: Blocks, i: usize, cols: usize, even: __m512i, odd: __m512i) {
    let b = blocks.width;
    if b == 1 {
        // Rows of the transpose: column j's word is row j's, a scatter
        // (16 rows' byte offsets in i32 lanes).
        debug_assert!(blocks.stride < (i32::MAX / 64) as usize);
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let index = _mm512_mullo_epi32(lane, _mm512_set1_epi32(blocks.stride as i32));
        for (v, words) in pair_words(even, odd).into_iter().enumerate() {
            let lanes = cols.saturating_sub(16 * v).min(16);
            if lanes > 0 {
                let mask = ((1u32 << lanes) - 1) as __mmask16;
                let base = blocks.word(i, 16 * v) as *mut i32;
                _mm512_mask_i32scatter_epi32::<4>(base, mask, index, words);
            }
        }
        return;
    }
    for (v, words) in pair_words(even, odd).into_iter().enumerate() {
        let (first, lanes) = (16 * v, cols.saturating_sub(16 * v).min(16));
        let mut l = 0;
        while l < lanes {
            let j = blocks.c0 + first + l;
            let run = (b - j % b).min(lanes - l);
            let mask = (((1u32 << run) - 1) << l) as __mmask16;
            // Lane l lands on column j's word.
            let dst = blocks.word(i, first + l).wrapping_sub(l) as *mut i32;
            _mm512_mask_storeu_epi32(dst, mask, words);
            l += run;
        }
    }
}

/// Stores `R` rows × `cols.len()` (≤ 32) columns of an activation's input
/// gradient from the sums `dy` of its output gradient: `dz = dy · slope`,
/// the slopes `act'(f + bias)` stored by the forward's tiles (fp32 rows
/// `lds` apart), as bf16 pairs at `c` (rows `ldc` pairs apart), the tile's
/// column sums of `dz` added into `sums` (32 values: the bias gradient's
/// share of the task). The bits of storing the sums, multiplying and
/// rounding apart.
macro_rules! store_act_grad {
    ($acc:ident, $slopes:expr, $lds:expr, $c:expr, $ldc:expr, $sums:expr, $cols:expr, $blocks:expr) => {{
        let (slopes, lds, c, ldc, sums, cols): (*const f32, usize, *mut u32, usize, *mut f32, usize) =
            ($slopes, $lds, $c, $ldc, $sums, $cols);
        let blocks: Blocks = $blocks;
        let (m0, m1) = masks(cols);
        let pairs = cols.div_ceil(2);
        let mask: __mmask16 = if pairs >= 16 { u16::MAX } else { (1u16 << pairs) - 1 };
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        // The even row's values until the odd one comes.
        let mut even = _mm512_setzero_si512();
        assert!($acc.len() <= 16, "store_act_grad! stores at most 16 rows");
        store_act_grad!(@rows $acc, slopes, lds, c, ldc, m0, m1, mask, s0, s1, blocks, cols, even;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        if $acc.len() % 2 == 1 {
            // An odd last row pairs with a row of zeros.
            store_blocks_pair(blocks, $acc.len() / 2, cols, even, _mm512_setzero_si512());
        }
        _mm512_mask_storeu_ps(sums, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, sums), s0));
        let sums1 = sums.wrapping_add(16);
        _mm512_mask_storeu_ps(sums1, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, sums1), s1));
    }};
    (@rows $acc:ident, $slopes:ident, $lds:ident, $c:ident, $ldc:ident,
     $m0:ident, $m1:ident, $mask:ident, $s0:ident, $s1:ident, $blocks:ident, $cols:ident,
     $even:ident; $($r:literal)*) => {
        $(
            if let Some(acc) = $acc.get($r) {
                let row = $slopes.add($r * $lds);
                // Lanes past the columns: 0 · 0.
                let d0 = _mm512_mul_ps(acc[0], _mm512_maskz_loadu_ps($m0, row));
                let d1 = _mm512_mul_ps(acc[1], _mm512_maskz_loadu_ps($m1, row.wrapping_add(16)));
                $s0 = _mm512_add_ps($s0, d0);
                $s1 = _mm512_add_ps($s1, d1);
                let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(d1, d0));
                _mm512_mask_storeu_epi32($c.add($r * $ldc) as *mut i32, $mask, packed);
                if $r % 2 == 0 {
                    $even = packed;
                } else {
                    store_blocks_pair($blocks, $r / 2, $cols, $even, packed);
                }
            }
        )*
    };
}

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

/// Panel rows before a bf16 tile's last that its epilogue's memory is
/// asked for ([`prefetch_out`]): ~750 cycles of products, about a miss to
/// memory.
const EPILOGUE_AHEAD: usize = 32;

/// Asks for the lines a tile's epilogue reads or writes (`rows` rows of
/// `cols` columns of `out`), so that they arrive while its last products
/// run: the sums a weight gradient adds to and the slopes an activation's
/// backward reads were written long before, and their cache misses were
/// half of the epilogue's samples (the epilogue 7 % of the tiles'). The
/// first and last line of each row's run: asking for every line (a run of
/// 32 fp32 not aligned to 64 bytes spans three), the panel rows and the
/// transposed blocks as well measured the same.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn prefetch_out(out: TileOut, rows: usize, cols: usize) {
    let line = |p: *const u8, bytes: usize| {
        if bytes > 0 {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(bytes - 1) as *const i8);
        }
    };
    let (f32s, words) = (cols * 4, cols.div_ceil(2) * 4);
    // The fp32 rows (and their stride), and the pairs' rows if any.
    let (f32_rows, pair_rows) = match out {
        TileOut::F32 { c, ldc, .. } => (Some((c as *const f32, ldc)), None),
        TileOut::Pairs { c, ldc } => (None, Some((c, ldc))),
        TileOut::Both {
            slopes,
            lds,
            pairs,
            ldp,
            ..
        } => (Some((slopes as *const f32, lds)), Some((pairs, ldp))),
        TileOut::ActGrad {
            slopes,
            lds,
            pairs,
            ldp,
            ..
        } => (Some((slopes, lds)), Some((pairs, ldp))),
    };
    for r in 0..rows {
        if let Some((base, stride)) = f32_rows {
            line(base.wrapping_add(r * stride) as _, f32s);
        }
        if let Some((pairs, ldp)) = pair_rows {
            line(pairs.wrapping_add(r * ldp) as _, words);
        }
    }
}

/// Stores a bf16 tile's accumulators as `out` says (the epilogue both
/// bf16 kernels share).
macro_rules! store_out {
    ($acc:ident, $bias:ident, $act:ident, $out:ident) => {
        match $out {
            TileOut::F32 { c, ldc, accumulate } => {
                store_tile!($acc, c, ldc, $bias, $act, accumulate)
            }
            TileOut::Pairs { c, ldc } => store_pairs!($acc, c, ldc, $bias, $act, None, None),
            TileOut::Both {
                slopes,
                lds,
                pairs,
                ldp,
                act,
                panel,
            } => store_pairs!(
                $acc,
                pairs,
                ldp,
                $bias,
                Some(act),
                Some((slopes, lds)),
                panel
            ),
            TileOut::ActGrad {
                slopes,
                lds,
                pairs,
                ldp,
                sums,
                blocks,
            } => store_act_grad!($acc, slopes, lds, pairs, ldp, sums, $bias.len(), blocks),
        }
    };
}

/// `R` rows × 32 columns of bf16 pair products (`vdpbf16ps`), summed in
/// fp32 registers: `a` gives `R` rows of `k2` bf16 pairs (see
/// [`PairsIn`]), `panel` `k2` rows of 32 columns × 2 bf16; stored as `out`
/// says.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn tile_bf16<const R: usize>(
    a: PairsIn,
    k2: usize,
    panel: &[u16],
    bias: &[f32],
    act: Option<Act>,
    out: TileOut,
) {
    debug_assert!(panel.len() >= k2 * NR * 2);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (ap, bp) = (a.ptr, panel.as_ptr());
    let (a_row, a_pair) = (a.row, a.pair);
    // The k-steps of a range: the loop runs in two parts, around the
    // epilogue's prefetch, with the accumulators kept in registers.
    macro_rules! steps {
        ($range:expr) => {
            for i in $range {
                let row = bp.add(i * NR * 2);
                let ahead = row.wrapping_add(PREFETCH_ROWS * NR * 2) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(ahead);
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(row as *const __m512i));
                let b1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(row.add(32) as *const __m512i));
                let ai = ap.add(i * a_pair);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*ai.add(r * a_row) as i32));
                    acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
                }
            }
        };
    }
    let split = k2.saturating_sub(EPILOGUE_AHEAD);
    steps!(0..split);
    prefetch_out(out, R, bias.len());
    steps!(split..k2);
    store_out!(acc, bias, act, out);
}

/// Rows per AMX tile: a tile register's 16.
pub(super) const AMX_ROWS: usize = 16;

/// [`tile_bf16`] with the sums from an AMX tile ([`super::amx::sums`]) of
/// `R` ≤ [`AMX_ROWS`] rows, for a left operand of rows (`a.pair == 1`),
/// then the same epilogue.
///
/// # Safety
/// As [`tile_bf16`]'s (for `R` rows), and the CPU must have AMX, granted
/// (`features().amx`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn tile_amx<const R: usize>(
    a: PairsIn,
    k2: usize,
    panel: &[u16],
    bias: &[f32],
    act: Option<Act>,
    out: TileOut,
) {
    debug_assert!(a.pair == 1 && panel.len() >= k2 * NR * 2);
    let mut sums = std::mem::MaybeUninit::<[f32; AMX_ROWS * NR]>::uninit();
    let sums = sums.as_mut_ptr().cast::<f32>();
    prefetch_out(out, R, bias.len());
    // SAFETY: the caller's contract: R rows of k2 pairs a.row apart, k2
    // panel rows; sums writes R rows of NR values, which are all read.
    super::amx::sums::<R, 0>(a.ptr, a.row, k2, panel.as_ptr().cast(), sums);
    let acc = SumRows::<R>(sums);
    store_out!(acc, bias, act, out);
}

/// Two tiles on AMX, rows `0..16` of `a` stored as `first` says and rows
/// `16..16 + R` as `second` says: [`tile_amx`] twice, with each step's
/// right operand loaded once for both.
///
/// # Safety
/// As [`tile_amx`]'s, for `16 + R` rows of `a` and both tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn tile_amx2<const R: usize>(
    a: PairsIn,
    k2: usize,
    panel: &[u16],
    bias: &[f32],
    act: Option<Act>,
    (first, second): (TileOut, TileOut),
) {
    debug_assert!(a.pair == 1 && panel.len() >= k2 * NR * 2);
    let mut sums = std::mem::MaybeUninit::<[f32; 2 * AMX_ROWS * NR]>::uninit();
    let sums = sums.as_mut_ptr().cast::<f32>();
    prefetch_out(first, AMX_ROWS, bias.len());
    prefetch_out(second, R, bias.len());
    // SAFETY: the caller's contract: 16 + R rows of k2 pairs a.row apart,
    // k2 panel rows; sums writes 16 + R rows of NR values, all read.
    super::amx::sums::<AMX_ROWS, R>(a.ptr, a.row, k2, panel.as_ptr().cast(), sums);
    let acc = SumRows::<AMX_ROWS>(sums);
    store_out!(acc, bias, act, first);
    let acc = SumRows::<R>(sums.add(AMX_ROWS * NR));
    store_out!(acc, bias, act, second);
}

/// `R` rows of [`NR`] fp32 sums an AMX tile stored, which the epilogue
/// macros read as they read the register tiles' accumulators (`get(r)`,
/// `len()`), one row's two registers at a time: loaded all at once, the
/// 32 registers and the GELU's temporaries spilled to the stack.
#[derive(Clone, Copy)]
struct SumRows<const R: usize>(*const f32);

impl<const R: usize> SumRows<R> {
    fn len(&self) -> usize {
        R
    }

    /// Row `r`'s sums, columns 0..16 and 16..32; `None` past `R`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn get(&self, r: usize) -> Option<[__m512; 2]> {
        let row = self.0.wrapping_add(r * NR);
        (r < R).then(|| [_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))])
    }
}

/// Words `i0..i0 + 16` of rows `r0..r0 + 16` of the transpose `a[r, c] =
/// src[c, r]` as rows of bf16 pairs (`transpose_rows`: word `i` of a row
/// pairs `a[r, 2i]`, low half, with `a[r, 2i + 1]`, 0 past `k`), row `r0 +
/// j` at `out + j · stride`: per step, source rows `2i` and `2i + 1` rounded
/// by `vcvtne2ps2bf16` (as `round_bits` rounds; bf16 sources as they are)
/// into one register of 16 words, then the 16 × 16 words transposed.
///
/// # Safety
/// `src` must hold rows `0..k` of at least `r0 + 16` values, `i0 + 16 ≤
/// ⌈k / 2⌉`, `out` 16 rows of ≥ `i0 + 16` words, `stride` apart.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn transpose_pairs16(
    src: Source,
    k: usize,
    r0: usize,
    i0: usize,
    out: *mut u32,
    stride: usize,
) {
    debug_assert!(i0 + 16 <= k.div_ceil(2) && src.covers(k, r0 + 16));
    let mut w = [_mm512_setzero_si512(); 16];
    for (s, w) in w.iter_mut().enumerate() {
        let i = i0 + s;
        let has_hi = 2 * i + 1 < k;
        let (lo, hi): (__m512i, __m512i) = match src {
            Source::F32 { data, cs } => {
                let lo = data.as_ptr().add(2 * i * cs + r0);
                let l = _mm512_loadu_ps(lo);
                let h = match has_hi {
                    true => _mm512_loadu_ps(lo.add(cs)),
                    false => _mm512_setzero_ps(),
                };
                // Low 256 bits: row 2i's 16 values; high: row 2i + 1's.
                let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(h, l));
                (
                    _mm512_cvtepu16_epi32(_mm512_castsi512_si256(both)),
                    _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(both)),
                )
            }
            Source::Pairs { data, row } => {
                let halves = data.as_ptr() as *const u16;
                let lo = halves.add(2 * (2 * i * row) + r0);
                let l = _mm256_loadu_si256(lo as *const __m256i);
                let h = match has_hi {
                    true => _mm256_loadu_si256(lo.add(2 * row) as *const __m256i),
                    false => _mm256_setzero_si256(),
                };
                (_mm512_cvtepu16_epi32(l), _mm512_cvtepu16_epi32(h))
            }
        };
        // Lane j: the word of transposed row r0 + j at step i.
        *w = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
    }
    for (j, row) in transpose16x16(w).into_iter().enumerate() {
        _mm512_storeu_si512(out.add(j * stride + i0) as *mut __m512i, row);
    }
}

/// The 16 × 16 transpose of 32-bit lanes: lane `j` of row `s` becomes
/// lane `s` of row `j`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16x16(r: [__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for p in 0..8 {
        t[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let b = 4 * q;
        u[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
        u[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
        u[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
        u[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    // u[4q + c] holds, in each 128-bit lane l, column 4l + c of rows
    // 4q..4q + 4: gather the lanes.
    for q in 0..2 {
        for c in 0..4 {
            let (a, b) = (u[8 * q + c], u[8 * q + 4 + c]);
            t[8 * q + c] = _mm512_shuffle_i32x4::<0x88>(a, b);
            t[8 * q + 4 + c] = _mm512_shuffle_i32x4::<0xdd>(a, b);
        }
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..8 {
        out[c] = _mm512_shuffle_i32x4::<0x88>(t[c], t[8 + c]);
        out[8 + c] = _mm512_shuffle_i32x4::<0xdd>(t[c], t[8 + c]);
    }
    out
}

/// Rows `r0..r0 + 48` of the transpose `a[r, c] = src[c, r]` as the
/// interleaved pair blocks of `interleave_rows` (four blocks of 12 rows,
/// `k2` steps of 12 words each, one after another at `out`): per step,
/// source rows `2i` and `2i + 1` rounded by `vcvtne2ps2bf16` (as
/// `round_bits` rounds; bf16 sources as they are) and interleaved by one
/// `vpermw`.
///
/// # Safety
/// `src` must hold rows `0..k` of at least `r0 + 48` values, `out`
/// `4 · k2 · 12` words.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn interleave48_bf16(src: Source, k: usize, r0: usize, out: &mut [u32]) {
    const B: usize = 12;
    static LANES: [u16; 32] = [
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12,
        28, 13, 29, 14, 30, 15, 31,
    ];
    let k2 = k.div_ceil(2);
    debug_assert!(out.len() >= 4 * k2 * B);
    debug_assert!(k == 0 || src.covers(k, r0 + 48));
    let idx = _mm512_loadu_si512(LANES.as_ptr() as *const __m512i);
    let dst = out.as_mut_ptr() as *mut i32;
    for i in 0..k2 {
        let has_hi = 2 * i + 1 < k;
        let mut w = [_mm512_setzero_si512(); 3];
        for (v, w) in w.iter_mut().enumerate() {
            // Sixteen values of row 2i in the low half, of row 2i + 1 in
            // the high half.
            let packed: __m512i = match src {
                Source::F32 { data, cs } => {
                    let lo = data.as_ptr().add(2 * i * cs + r0 + 16 * v);
                    let l = _mm512_loadu_ps(lo);
                    let h = match has_hi {
                        true => _mm512_loadu_ps(lo.add(cs)),
                        false => _mm512_setzero_ps(),
                    };
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(h, l))
                }
                Source::Pairs { data, row } => {
                    // bf16 value c of a row is half c of its words (x86 is
                    // little-endian: the low half first).
                    let halves = data.as_ptr() as *const u16;
                    let lo = halves.add(2 * (2 * i * row) + r0 + 16 * v);
                    let l = _mm256_loadu_si256(lo as *const __m256i);
                    let h = match has_hi {
                        true => _mm256_loadu_si256(lo.add(2 * row) as *const __m256i),
                        false => _mm256_setzero_si256(),
                    };
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l), h)
                }
            };
            *w = _mm512_permutexvar_epi16(idx, packed);
        }
        // Words 0..48 of the step go 12 to a block; a masked store writes
        // only its lanes (and faults on no other).
        let block = |b: usize| dst.add(b * k2 * B + i * B);
        _mm512_mask_storeu_epi32(block(0), 0x0fff, w[0]);
        _mm512_mask_storeu_epi32(block(1).wrapping_sub(12), 0xf000, w[0]);
        _mm512_mask_storeu_epi32(block(1).add(4), 0x00ff, w[1]);
        _mm512_mask_storeu_epi32(block(2).wrapping_sub(8), 0xff00, w[1]);
        _mm512_mask_storeu_epi32(block(2).add(8), 0x000f, w[2]);
        _mm512_mask_storeu_epi32(block(3).wrapping_sub(4), 0xfff0, w[2]);
    }
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
