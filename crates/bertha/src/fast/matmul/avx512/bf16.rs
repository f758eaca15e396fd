//! The AVX512-BF16 and AMX kernels of [`super`]: bf16 pair tiles
//! (`vdpbf16ps`, `tdpbf16ps`) with their epilogues (fp32 sums, rounded
//! pairs for the next product, an activation's slope and input gradient),
//! and the packing, transposing and rounding into pair layouts.

use super::super::bf16::{Blocks, PairsIn, Source, TileOut};
use super::super::NR;
use super::{act_and_grad, activate, masks, PREFETCH_ROWS};
use crate::fast::kernels::Act;
use std::arch::x86_64::*;

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
pub(in crate::fast::matmul) unsafe fn pack_pair_rows(
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
pub(in crate::fast::matmul) unsafe fn tile_bf16<const R: usize>(
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
pub(in crate::fast::matmul) const AMX_ROWS: usize = 16;

/// [`tile_bf16`] with the sums from an AMX tile ([`super::super::amx::sums`]) of
/// `R` ≤ [`AMX_ROWS`] rows, for a left operand of rows (`a.pair == 1`),
/// then the same epilogue.
///
/// # Safety
/// As [`tile_bf16`]'s (for `R` rows), and the CPU must have AMX, granted
/// (`features().amx`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(in crate::fast::matmul) unsafe fn tile_amx<const R: usize>(
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
    super::super::amx::sums::<R, 0>(a.ptr, a.row, k2, panel.as_ptr().cast(), sums);
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
pub(in crate::fast::matmul) unsafe fn tile_amx2<const R: usize>(
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
    super::super::amx::sums::<AMX_ROWS, R>(a.ptr, a.row, k2, panel.as_ptr().cast(), sums);
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
pub(in crate::fast::matmul) unsafe fn transpose_pairs16(
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
pub(in crate::fast::matmul) unsafe fn interleave48_bf16(
    src: Source,
    k: usize,
    r0: usize,
    out: &mut [u32],
) {
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
pub(in crate::fast::matmul) unsafe fn round_row_bf16(x: &[f32], out: &mut [u32]) {
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
