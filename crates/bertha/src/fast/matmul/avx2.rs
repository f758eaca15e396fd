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
//! int8 runs on AVX-VNNI's `vpdpbusd` where the CPU has it (four u8 × i8
//! products per i32 lane, on the panels as packed). Elsewhere it runs on
//! 16-bit products (`vpmaddwd`: two u16 × i16 products
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
/// How far ahead (panel rows) the kernels prefetch: 64 rows are ~400
/// cycles of a 6-row tile, about a memory latency (8 KB ahead in rows of
/// 32, 4 KB in a panel's halves, where 128 rows measured the same). At
/// batch 1 a panel's first tile reads it from memory (all-MiniLM-L6-v2's
/// fp32 weights, 42 MB, outgrow a 32 MB L3), and 16 rows ahead covered
/// only an L3 hit: 64 took batch-1 p50 from 11.0 to 10.0 ms on Zen 3
/// (three A/B runs), level at batch 32.
const PREFETCH_ROWS: usize = 64;

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
/// `c[r, j] = act(Σ_i a[r, i] · panel[i, j] + bias[j])`, on a panel of `k`
/// rows of [`NR`] (attention's), or in halves (the first 16
/// columns, `k` rows of 16, then the last 16: `HALVES`, a constant so
/// that a half's addresses are constant offsets), as [`super::PackedF32`]
/// lays out the weights where this tile runs. In halves a half tile reads
/// its weights in sequence, 64 bytes a step, where in rows of 32 it read
/// every other 64 bytes, 128 apart: the batch-32 and batch-1 shapes of
/// all-MiniLM-L6-v2's linears ran 8 % and 9-12 % faster so (Zen 4,
/// alternating in one process).
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds `R` rows of `k`, `panel` `k` rows
/// of [`NR`]; `c` addresses an `R` × `cols` tile (row stride `ldc`) no one
/// else reads or writes meanwhile.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_f32<const R: usize, const HALVES: bool>(
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
    for h0 in (0..cols).step_by(HALF) {
        let (b, ldb) = match HALVES {
            true => (panel.as_ptr().add(h0 * k), HALF),
            false => (panel.as_ptr().add(h0), NR),
        };
        let acc = half_sums::<R>(a.as_ptr(), k, b, ldb);
        let hc = HALF.min(cols - h0);
        store_half(&acc, c.add(h0), ldc, &bias[h0..h0 + hc], act);
    }
}

/// The sums of one half tile: `Σ_i a[r, i] · b[i, ..16]` for `R` rows of
/// `a` (`k` apart) and `k` rows of 16 weights (`ldb` apart), four inputs
/// a loop turn: the loop's counter and address µops come once a turn, not
/// once an input, beside a step's eight loads and twelve FMAs (which fill
/// most of the six µops a cycle these cores issue).
#[inline(always)]
unsafe fn half_sums<const R: usize>(
    a: *const f32,
    k: usize,
    b: *const f32,
    ldb: usize,
) -> [[__m256; 2]; R] {
    const U: usize = 4;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let (mut ap, mut bp) = (a, b);
    for _ in 0..k / U {
        for u in 0..U {
            half_step(&mut acc, ap.add(u), k, bp.add(u * ldb), ldb);
        }
        ap = ap.add(U);
        bp = bp.add(U * ldb);
    }
    for _ in 0..k % U {
        half_step(&mut acc, ap, k, bp, ldb);
        ap = ap.add(1);
        bp = bp.add(ldb);
    }
    acc
}

/// One input of [`half_sums`]: column `ap` of `a`'s rows (`k` apart)
/// times the 16 weights at `bp`.
#[inline(always)]
unsafe fn half_step<const R: usize>(
    acc: &mut [[__m256; 2]; R],
    ap: *const f32,
    k: usize,
    bp: *const f32,
    ldb: usize,
) {
    // The weights stream in from L3 or memory on a panel's first tile (a
    // prefetch past the end never faults).
    _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(PREFETCH_ROWS * ldb) as *const i8);
    let b0 = _mm256_loadu_ps(bp);
    let b1 = _mm256_loadu_ps(bp.add(8));
    for (r, acc) in acc.iter_mut().enumerate() {
        let av = _mm256_broadcast_ss(&*ap.add(r * k));
        acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
        acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
    }
}

/// One register tile of [`super::general`]'s products: `rows` (≤ 6) ×
/// `cols` (≤ 16) of `c (+)= scale · Σ_i a[:, i] ⊗ b[i, :]` over `kc`
/// inputs. Row `r`'s input `i` of `a` is at `a + r · a_rs + i · a_ks`: a
/// packed strip (`a_rs` 1, `a_ks` 6) or six rows of a row-major matrix
/// (`a_ks` 1). `b` is a packed strip, `kc` rows of 16, `ldb` apart; `c`
/// has rows `ldc` apart. With `add` off, `c` is only written.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` addresses 6 rows of `kc` inputs as said,
/// `b` `kc` rows of 16 values; `c` addresses a `rows` × `cols` tile that
/// no one else reads or writes meanwhile.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_packed(
    kc: usize,
    (a, a_rs, a_ks): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    (rows, cols): (usize, usize),
    (add, scale): (bool, f32),
) {
    const R: usize = 6;
    debug_assert!(rows <= R && cols <= HALF);
    // The tile's rows of c are read (or written) only after the sums,
    // ~1,500 cycles from here: time enough to bring them from memory.
    for r in 0..rows {
        let row = c.wrapping_add(r * ldc);
        _mm_prefetch::<_MM_HINT_T0>(row as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(HALF - 1) as *const i8);
    }
    let (a0, a3) = (a, a.add(3 * a_rs));
    let mut bp = b;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for i in 0..kc {
        let b0 = _mm256_loadu_ps(bp);
        let b1 = _mm256_loadu_ps(bp.add(8));
        let at = i * a_ks;
        let inputs = [
            a0.add(at),
            a0.add(at + a_rs),
            a0.add(at + 2 * a_rs),
            a3.add(at),
            a3.add(at + a_rs),
            a3.add(at + 2 * a_rs),
        ];
        for (acc, x) in acc.iter_mut().zip(inputs) {
            let av = _mm256_broadcast_ss(&*x);
            acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
        }
        bp = bp.add(ldb);
    }
    let s = _mm256_set1_ps(scale);
    if rows == R && cols == HALF {
        for (r, acc) in acc.iter().enumerate() {
            let dst = c.add(r * ldc);
            let (v0, v1) = if add {
                (
                    _mm256_fmadd_ps(acc[0], s, _mm256_loadu_ps(dst)),
                    _mm256_fmadd_ps(acc[1], s, _mm256_loadu_ps(dst.add(8))),
                )
            } else {
                (_mm256_mul_ps(acc[0], s), _mm256_mul_ps(acc[1], s))
            };
            _mm256_storeu_ps(dst, v0);
            _mm256_storeu_ps(dst.add(8), v1);
        }
        return;
    }
    // An edge tile: through a row on the stack, writing only its part.
    let mut row = [0f32; HALF];
    for (r, acc) in acc.iter().enumerate().take(rows) {
        _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
        let dst = std::slice::from_raw_parts_mut(c.add(r * ldc), cols);
        // The interior's arithmetic, one lane at a time (fused when adding).
        for (y, v) in dst.iter_mut().zip(row) {
            *y = if add { v.mul_add(scale, *y) } else { v * scale };
        }
    }
}

/// `dst[c · dst_stride + r] = src[r · src_stride + c]` for `r, c < 8`: an
/// 8 × 8 block transposed, for [`super::general`]'s packing of a
/// transposed operand.
///
/// # Safety
/// The CPU has AVX2; both blocks lie inside their buffers.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn transpose8(
    src: *const f32,
    src_stride: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_stride)));
    // Pairs of rows interleaved, then pairs of pairs, then the halves.
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let out = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (i, v) in out.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * dst_stride), v);
    }
}

/// Adds channel group `g`'s exact sums `iacc` (columns `h0..h0 + 16`)
/// to the float sums `acc`, scaled as the AVX-512 VNNI kernel does:
/// `step · w_scale · Σ_i q_a · q_w + min · group_sum`, row by row.
#[inline(always)]
unsafe fn add_group<const R: usize>(
    acc: &mut [[__m256; 2]; R],
    iacc: &[[__m256i; 2]; R],
    t: &super::I8Tile,
    quants: &[GroupQuant],
    g: usize,
    h0: usize,
) {
    let n_groups = quants.len() / R;
    let gs = t.group_sums.as_ptr().add(g * NR + h0);
    let ws = t.w_scales.as_ptr().add(g * NR + h0);
    let (s0, s1) = (_mm256_loadu_ps(gs), _mm256_loadu_ps(gs.add(8)));
    let (w0, w1) = (_mm256_loadu_ps(ws), _mm256_loadu_ps(ws.add(8)));
    for (r, (acc, iacc)) in acc.iter_mut().zip(iacc).enumerate() {
        let GroupQuant { step, min } = quants[r * n_groups + g];
        let (step, min) = (_mm256_set1_ps(step), _mm256_set1_ps(min));
        let (step0, step1) = (_mm256_mul_ps(step, w0), _mm256_mul_ps(step, w1));
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[0]), step0, acc[0]);
        acc[0] = _mm256_fmadd_ps(min, s0, acc[0]);
        acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[1]), step1, acc[1]);
        acc[1] = _mm256_fmadd_ps(min, s1, acc[1]);
    }
}

/// `R` (≤ [`MR`]) rows × `cols` columns of an int8 product on 16-bit
/// words: `wide` holds the panel's weights as pairs of i16 (inputs 2p,
/// 2p + 1 of each column adjacent) in halves (the first 16 columns, 16 a
/// pair row, then the last 16: [`super::int8::wide_panels`]), `words` the
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
        let bp = wide.as_ptr().add(h0 * k4);
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
                // The quad's two pair rows, 64 bytes each, one after
                // the other.
                let row = bp.add(q * 4 * HALF);
                let (w0, w1) = (
                    _mm256_load_si256(row as *const __m256i),
                    _mm256_load_si256(row.add(16) as *const __m256i),
                );
                let (w2, w3) = (
                    _mm256_load_si256(row.add(2 * HALF) as *const __m256i),
                    _mm256_load_si256(row.add(2 * HALF + 16) as *const __m256i),
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
            add_group(&mut acc, &iacc, t, quants, g, h0);
        }
        let hc = HALF.min(cols - h0);
        store_half(&acc, c.add(h0), ldc, &t.bias[h0..h0 + hc], t.act);
    }
}

/// An int8 tile by AVX-VNNI's `vpdpbusd` on ymm ([`quad_bytes`]): the
/// rows' activation bytes (`qa`, `k4` a row) against the panel's int8
/// quads as packed, four u8 × i8 products summed into each i32 lane,
/// exactly (no saturation: `vpdpbusd`, not `vpdpbusds`). The shape of the
/// AVX-512 VNNI kernel on half-width registers.
///
/// # Safety
/// The CPU has AVX2, FMA and AVX-VNNI; `qa` holds `R` rows of `k4` bytes;
/// `c` addresses an `R` × `bias.len()` tile (row stride `ldc`) no one else
/// reads or writes meanwhile.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_i8_vnni<const R: usize>(
    t: &super::I8Tile,
    qa: &[u8],
    quants: &[GroupQuant],
    c: *mut f32,
    ldc: usize,
) {
    quad_bytes::<R>(t, qa, quants, c, ldc, |acc, a, w| {
        _mm256_dpbusd_avx_epi32(acc, a, w)
    })
}

/// [`tile_i8_vnni`] with `vpdpbusd` built from AVX2 instructions (bytes
/// split into 16-bit words, two `vpmaddwd`): the same integers on any
/// AVX2 CPU, so tests check the VNNI tile's addressing and epilogue where
/// the CPU lacks the instruction (qemu does not emulate it either).
///
/// # Safety
/// As [`tile_i8_vnni`], without AVX-VNNI.
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_i8_vnni_emulated<const R: usize>(
    t: &super::I8Tile,
    qa: &[u8],
    quants: &[GroupQuant],
    c: *mut f32,
    ldc: usize,
) {
    let low_bytes = _mm256_set1_epi16(0xff);
    quad_bytes::<R>(t, qa, quants, c, ldc, |acc, a, w| {
        // Even bytes (the low byte of each word) and odd ones, widened:
        // activations unsigned, weights sign-extended.
        let (a_even, a_odd) = (_mm256_and_si256(a, low_bytes), _mm256_srli_epi16::<8>(a));
        let w_even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w));
        let w_odd = _mm256_srai_epi16::<8>(w);
        let sums = _mm256_add_epi32(
            _mm256_madd_epi16(a_even, w_even),
            _mm256_madd_epi16(a_odd, w_odd),
        );
        _mm256_add_epi32(acc, sums)
    })
}

/// `R` (≤ [`MR`]) rows × `bias.len()` columns of an int8 product on
/// activation bytes (`qa`, `k4` a row) and the panel's quads as packed,
/// with `dot` adding four u8 × i8 products per i32 lane (`vpdpbusd`'s
/// definition); per channel group the exact sums are scaled into floats
/// as in [`tile_i16`].
///
/// # Safety
/// As [`tile_i8_vnni`], with the CPU able to run `dot`.
#[inline(always)]
unsafe fn quad_bytes<const R: usize>(
    t: &super::I8Tile,
    qa: &[u8],
    quants: &[GroupQuant],
    c: *mut f32,
    ldc: usize,
    dot: impl Fn(__m256i, __m256i, __m256i) -> __m256i,
) {
    let (k4, n_groups, cols) = (t.k4, quants.len() / R, t.cols());
    debug_assert!(R <= MR && qa.len() >= R * k4 && t.panel.len() >= k4 * NR);
    let rows: [*const u8; R] = std::array::from_fn(|r| qa.as_ptr().add(r * k4));
    for h0 in (0..cols).step_by(HALF) {
        // A quad row is NR columns × 4 bytes: the half's 16 columns are
        // two vectors of eight columns' quads.
        let bp = t.panel.as_ptr().add(4 * h0);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for g in 0..n_groups {
            let mut iacc = [[_mm256_setzero_si256(); 2]; R];
            for q in group_quads(g, t.group, k4) {
                let row = bp.add(q * 4 * NR);
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(PREFETCH_ROWS * 4 * NR));
                let w0 = _mm256_loadu_si256(row as *const __m256i);
                let w1 = _mm256_loadu_si256(row.add(32) as *const __m256i);
                for (r, iacc) in iacc.iter_mut().enumerate() {
                    let a = rows[r].add(4 * q) as *const i32;
                    let av = _mm256_set1_epi32(a.read_unaligned());
                    iacc[0] = dot(iacc[0], av, w0);
                    iacc[1] = dot(iacc[1], av, w1);
                }
            }
            add_group(&mut acc, &iacc, t, quants, g, h0);
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

/// The rate of [`crate::fast::instruction_peak_gops`]'s int8 chains on
/// AVX-VNNI: 12 independent `vpdpbusd` chains of 32 byte products.
#[target_feature(enable = "avx2,avxvnni")]
pub(crate) unsafe fn vnni_chains(iters: usize) -> u32 {
    let (a8, b8) = (
        _mm256_set1_epi32(0x0101_0101),
        _mm256_set1_epi32(0x0102_0304),
    );
    let mut acc = [_mm256_setzero_si256(); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_dpbusd_avx_epi32(*a, a8, b8);
        }
    }
    let sum = acc
        .iter()
        .fold(_mm256_setzero_si256(), |s, a| _mm256_add_epi32(s, *a));
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum);
    lanes.iter().fold(0u32, |s, v| s.wrapping_add(*v))
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
