//! Right operands packed into column panels of bf16 pairs
//! ([`PackedBf16`]'s layout): from fp32, rounded as they are packed, or
//! from pairs rounded before, moved.
//!
//! [`PackedBf16`]: super::packed::PackedBf16

use super::operands::{Right, Strided};
use super::pairs::{as_f32, as_f32_mut, each_chunk, round_bits, stride_of};
#[cfg(target_arch = "x86_64")]
use crate::fast::cpu::features;
use crate::fast::cpu::multiversion;
#[cfg(target_arch = "x86_64")]
use crate::fast::matmul::avx512;
use crate::fast::matmul::{transpose16, NR};

/// Values in the panels of a `[k, n]` right operand ([`PackedBf16`]'s
/// layout): `⌈n / NR⌉` panels of `⌈k / 2⌉` pair rows.
///
/// [`PackedBf16`]: super::packed::PackedBf16
pub(super) fn panels_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * k.div_ceil(2) * NR * 2
}

/// `b` `[k, n]` rounded to bf16 and laid out as [`PackedBf16`]'s panels.
///
/// [`PackedBf16`]: super::packed::PackedBf16
pub(super) fn pack_panels(b: Strided, k: usize, n: usize) -> Vec<u16> {
    let mut panels = Vec::new();
    pack_panels_reusing(Right::F32(b), k, n, &mut panels, true);
    panels
}

/// [`pack_panels`] into the first [`panels_len`] values of
/// `panels`, grown when short and otherwise not cleared: the packing
/// writes every value but a partial last panel's padding columns, which
/// are zeroed here.
pub(super) fn pack_panels_reusing(
    b: Right,
    k: usize,
    n: usize,
    panels: &mut Vec<u16>,
    parallel: bool,
) {
    let (k2, len) = (k.div_ceil(2), panels_len(k, n));
    if panels.len() < len {
        panels.resize(len, 0);
    }
    let row = match b {
        Right::Pairs(words) => stride_of(words.len(), k, n, "the right operand's pairs"),
        _ => 0,
    };
    let pack = |(p, panel): (usize, &mut [u16])| {
        let (c0, cols) = (p * NR, NR.min(n - p * NR));
        if cols < NR {
            panel.fill(0);
        }
        match b {
            Right::F32(b) => pack_panel(&b, k, c0, cols, panel),
            Right::Packed(_) => unreachable!("packed panels are not packed again"),
            Right::Pairs(words) => pack_panel_pairs(words, row, k, c0, cols, panel),
        }
    };
    each_chunk(
        &mut panels[..len],
        ((k2 * NR * 2).max(1), 1),
        parallel,
        pack,
    );
}

multiversion! {
    pub(super) fn pack_panel = pack_panel_body(b: &Strided<'_>, k: usize, c0: usize, cols: usize, panel: &mut [u16]);
    fn pack_panel_pairs_rows = pack_panel_pairs_body(words: &[u32], row: usize, k: usize, c0: usize, cols: usize, panel: &mut [u16]);
}

/// [`pack_panel_pairs_body`], on AVX-512 a pair row at a time
/// (`avx512::pack_pair_rows`, the same words).
pub(super) fn pack_panel_pairs(
    words: &[u32],
    row: usize,
    k: usize,
    c0: usize,
    cols: usize,
    panel: &mut [u16],
) {
    #[cfg(target_arch = "x86_64")]
    if features().avx512_bw && k > 0 && cols > 0 {
        let wn = cols.div_ceil(2);
        // SAFETY: any two u16 are a valid u32.
        let (head, out, _) = unsafe { panel.align_to_mut::<u32>() };
        if head.is_empty() {
            assert!(
                words.len() >= (k - 1) * row + c0 / 2 + wn && out.len() >= k.div_ceil(2) * NR,
                "pack_panel_pairs: {k} rows of {cols} columns from {c0} read or write past their buffers"
            );
            // SAFETY: the CPU has AVX-512 F + BW; the extents are asserted.
            unsafe {
                avx512::pack_pair_rows(words[c0 / 2..].as_ptr(), row, k, wn, out.as_mut_ptr())
            };
            return;
        }
    }
    pack_panel_pairs_rows(words, row, k, c0, cols, panel)
}

/// Columns `c0..c0 + cols` (`c0` even) of a matrix given as `k` rows of
/// bf16 pairs, `row` words apart, into one panel: the bits [`pack_panel`]
/// makes of its fp32 values, by moving halves (a pair row takes the low
/// halves of two rows' words, the next one their high halves). `panel`
/// holds `⌈k / 2⌉` pair rows.
#[inline(always)]
pub(super) fn pack_panel_pairs_body(
    words: &[u32],
    row: usize,
    k: usize,
    c0: usize,
    cols: usize,
    panel: &mut [u16],
) {
    let (w0, wn) = (c0 / 2, cols.div_ceil(2));
    // SAFETY: any two u16 are a valid u32.
    let (head, out, _) = unsafe { panel.align_to_mut::<u32>() };
    if !head.is_empty() {
        for (i, out) in panel
            .chunks_exact_mut(NR * 2)
            .enumerate()
            .take(k.div_ceil(2))
        {
            for (j, o) in out.chunks_exact_mut(4).take(wn).enumerate() {
                let a = words[2 * i * row + w0 + j];
                let b = match 2 * i + 1 < k {
                    true => words[(2 * i + 1) * row + w0 + j],
                    false => 0,
                };
                o.copy_from_slice(&[a as u16, b as u16, (a >> 16) as u16, (b >> 16) as u16]);
            }
        }
        return;
    }
    for (i, out) in out.chunks_exact_mut(NR).enumerate().take(k.div_ceil(2)) {
        let r0 = &words[2 * i * row + w0..][..wn];
        let r1 = match 2 * i + 1 < k {
            true => &words[(2 * i + 1) * row + w0..][..wn],
            false => &[][..],
        };
        if r1.is_empty() {
            for (o, a) in out.chunks_exact_mut(2).zip(r0) {
                o.copy_from_slice(&[a & 0xffff, a >> 16]);
            }
            continue;
        }
        // Word 2j of the pair row: value 2j of both rows (their words'
        // low halves); word 2j + 1: value 2j + 1 (the high halves).
        for ((o, a), b) in out.chunks_exact_mut(2).zip(r0).zip(r1) {
            o.copy_from_slice(&[a & 0xffff | b << 16, a >> 16 | b & 0xffff_0000]);
        }
    }
}

/// Columns `c0..c0 + cols` of `b` into one panel (see [`PackedBf16`]),
/// compiled per instruction set ([`multiversion!`]): a training step packs
/// every weight and activation it multiplies, so this loop is hot.
///
/// [`PackedBf16`]: super::packed::PackedBf16
#[inline(always)]
fn pack_panel_body(b: &Strided<'_>, k: usize, c0: usize, cols: usize, panel: &mut [u16]) {
    let data = b.data;
    if b.cs == 1 {
        // Rows contiguous: two rows give a pair row, written as one u32
        // per column (low half the even row) so the loop vectorises.
        // SAFETY: any two u16 are a valid u32.
        let (head, words, _) = unsafe { panel.align_to_mut::<u32>() };
        if head.is_empty() {
            for (i, out) in words.chunks_exact_mut(NR).enumerate() {
                let r0 = &data[2 * i * b.rs + c0..][..cols];
                if 2 * i + 1 < k {
                    let r1 = &data[(2 * i + 1) * b.rs + c0..][..cols];
                    for ((o, lo), hi) in out.iter_mut().zip(r0).zip(r1) {
                        *o = round_bits(*lo) | round_bits(*hi) << 16;
                    }
                } else {
                    for (o, lo) in out.iter_mut().zip(r0) {
                        *o = round_bits(*lo);
                    }
                }
            }
            return;
        }
        for (i, out) in panel.chunks_exact_mut(NR * 2).enumerate() {
            let r0 = &data[2 * i * b.rs + c0..][..cols];
            for (o, v) in out.chunks_exact_mut(2).zip(r0) {
                o[0] = round_bits(*v) as u16;
            }
            if 2 * i + 1 < k {
                let r1 = &data[(2 * i + 1) * b.rs + c0..][..cols];
                for (o, v) in out.chunks_exact_mut(2).zip(r1) {
                    o[1] = round_bits(*v) as u16;
                }
            }
        }
    } else if b.rs == 1 {
        // Columns contiguous (a transposed matrix: a forward's weight, the
        // decoder's word embeddings): a column's adjacent inputs are a
        // pair. Blocks of 16 columns × 16 pairs are rounded column by
        // column into a small tile, then transposed into the panel's pair
        // rows in registers (writing each pair to its own row touched a
        // cache line per value).
        const T: usize = 16;
        let k2 = k.div_ceil(2);
        // SAFETY: any two u16 are a valid u32.
        let (head, words, _) = unsafe { panel.align_to_mut::<u32>() };
        if head.is_empty() && k.is_multiple_of(2) {
            let mut tile = [[0u32; T]; T];
            for j0 in (0..cols).step_by(T) {
                let nc = T.min(cols - j0);
                for i0 in (0..k2).step_by(T) {
                    let ni = T.min(k2 - i0);
                    for (t, pairs) in tile.iter_mut().enumerate().take(nc) {
                        let col = &data[(c0 + j0 + t) * b.cs + 2 * i0..][..2 * ni];
                        for (p, v) in pairs.iter_mut().zip(col.chunks_exact(2)) {
                            *p = round_bits(v[0]) | round_bits(v[1]) << 16;
                        }
                    }
                    // Tile row t (column j0 + t) holds pairs i0..; the
                    // panel's pair row i0 + j takes column t's pair j.
                    let src = as_f32(tile.as_flattened());
                    let dst = as_f32_mut(&mut words[i0 * NR + j0..]);
                    if ni == T {
                        transpose16(src, T, nc, T, dst, NR);
                    } else {
                        for j in 0..ni {
                            for t in 0..nc {
                                dst[j * NR + t] = src[t * T + j];
                            }
                        }
                    }
                }
            }
            return;
        }
        for c in 0..cols {
            let col = &data[(c0 + c) * b.cs..][..k];
            for (i, pair) in col.chunks(2).enumerate() {
                let at = (i * NR + c) * 2;
                panel[at] = round_bits(pair[0]) as u16;
                panel[at + 1] = pair.get(1).map_or(0, |v| round_bits(*v) as u16);
            }
        }
    } else {
        for r in 0..k {
            let (i, half) = (r / 2, r % 2);
            for c in 0..cols {
                panel[(i * NR + c) * 2 + half] = round_bits(b.at(r, c0 + c)) as u16;
            }
        }
    }
}

/// `b` `[k, n]` packed as [`PackedBf16`]'s panels into `panels`, on the
/// calling thread (for small per-head operands).
///
/// [`PackedBf16`]: super::packed::PackedBf16
pub(crate) fn pack_panels_into(b: Strided, k: usize, n: usize, panels: &mut Vec<u16>) {
    b.check(k, n, "pack_panels_into");
    let k2 = k.div_ceil(2);
    panels.clear();
    panels.resize(n.div_ceil(NR) * k2 * NR * 2, 0);
    for (p, panel) in panels.chunks_exact_mut((k2 * NR * 2).max(1)).enumerate() {
        pack_panel(&b, k, p * NR, NR.min(n - p * NR), panel);
    }
}

/// Panels of `b = xᵀ` (`[2·k2, n]`) for `x` given as `n` rows of `k2`
/// bf16 pairs, rows `stride` words apart (one head's K for `Q · Kᵀ`): pair
/// row `i`, column `j` of the panels is row `j`'s pair `i`, moved as 32-bit
/// words by 16 × 16 transposes, no rounding. On the calling thread.
pub(crate) fn pack_transposed_pairs(
    x: &[u32],
    stride: usize,
    (n, k2): (usize, usize),
    panels: &mut Vec<u16>,
) {
    const T: usize = 16;
    assert!(
        n == 0 || k2 == 0 || x.len() >= (n - 1) * stride + k2,
        "pack_transposed_pairs: {n} rows of {k2} pairs, {stride} apart, read past the data"
    );
    let len = n.div_ceil(NR) * k2 * NR * 2;
    if panels.len() < len {
        panels.resize(len, 0);
    }
    // SAFETY: any two u16 are a valid u32.
    let (head, words, _) = unsafe { panels[..len].align_to_mut::<u32>() };
    if !head.is_empty() {
        // Not word-aligned (no allocator here gives that): value by value.
        for (i, w) in panels[..len].chunks_exact_mut(2).enumerate() {
            let (p, i, j) = (i / (k2 * NR), i / NR % k2, i % NR);
            let word = match p * NR + j < n {
                true => x[(p * NR + j) * stride + i],
                false => 0,
            };
            w.copy_from_slice(&[word as u16, (word >> 16) as u16]);
        }
        return;
    }
    for (p, panel) in words.chunks_exact_mut((k2 * NR).max(1)).enumerate() {
        for j0 in (0..NR).step_by(T) {
            let rows = n.saturating_sub(p * NR + j0).min(T);
            for i0 in (0..k2).step_by(T) {
                let cols = T.min(k2 - i0);
                let dst = &mut panel[i0 * NR + j0..];
                if rows == 0 {
                    for c in 0..cols {
                        dst[c * NR..c * NR + T].fill(0);
                    }
                    continue;
                }
                let src = &x[(p * NR + j0) * stride + i0..];
                transpose16(as_f32(src), stride, rows, cols, as_f32_mut(dst), NR);
            }
        }
    }
}

/// Panels of `b` `[k, n]` given as `k` rows of bf16 pairs, rows `stride`
/// words apart (one head's V for `P · V`, or K, Q in the backward): a pair
/// row takes two rows' halves, moved, no rounding. On the calling thread.
pub(crate) fn pack_row_pairs(
    x: &[u32],
    stride: usize,
    (k, n): (usize, usize),
    panels: &mut Vec<u16>,
) {
    assert!(
        k == 0 || n == 0 || x.len() >= (k - 1) * stride + n.div_ceil(2),
        "pack_row_pairs: {k} rows of {n} values, {stride} words apart, read past the data"
    );
    let k2 = k.div_ceil(2);
    let len = n.div_ceil(NR) * k2 * NR * 2;
    if panels.len() < len {
        panels.resize(len, 0);
    }
    for (p, panel) in panels[..len]
        .chunks_exact_mut((k2 * NR * 2).max(1))
        .enumerate()
    {
        let (c0, cols) = (p * NR, NR.min(n - p * NR));
        if cols < NR {
            panel.fill(0);
        }
        pack_panel_pairs(x, stride, k, c0, cols, panel);
    }
}
