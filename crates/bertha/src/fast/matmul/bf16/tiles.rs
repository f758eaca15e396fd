//! The tiles every bf16 product is made of: `MR_BF16` rows against one
//! panel, on the AVX512-BF16 or AMX kernels or the scalar loop; what a
//! tile reads ([`PairsIn`]) and where it stores ([`TileOut`]).

use super::pairs::{from_bf16, round_row_on};
use crate::fast::cpu::features;
use crate::fast::kernels::{activate_body, Act};
#[cfg(target_arch = "x86_64")]
use crate::fast::matmul::avx512;
use crate::fast::matmul::NR;
use crate::model::ops::act_grad;

/// Output rows per register tile (as fp32's: 12 × 2 accumulators).
pub(super) const MR_BF16: usize = 12;

/// Output rows per [`tile_bf16`] call.
pub(crate) const BF16_TILE_ROWS: usize = MR_BF16;

/// A tile's left operand: pair `i` of row `r` at `ptr[r · row + i · pair]`.
/// Rows of pairs (`row` = the row length, `pair` = 1), or, for the
/// transpose of a matrix whose rows were interleaved two by two
/// ([`interleave_rows`]), the pairs of one step side by side (`row` = 1,
/// `pair` = the width).
///
/// [`interleave_rows`]: super::transposed::interleave_rows
#[derive(Debug, Clone, Copy)]
pub(crate) struct PairsIn {
    pub ptr: *const u32,
    pub row: usize,
    pub pair: usize,
}

impl PairsIn {
    /// Rows of `k2` pairs, one after another.
    pub fn rows(a: &[u32], k2: usize) -> Self {
        Self {
            ptr: a.as_ptr(),
            row: k2,
            pair: 1,
        }
    }

    /// Pair `i` of row `r`.
    ///
    /// # Safety
    /// That pair must be inside the operand.
    unsafe fn at(self, r: usize, i: usize) -> u32 {
        // SAFETY: the caller's contract.
        unsafe { *self.ptr.add(r * self.row + i * self.pair) }
    }
}

/// Where a bf16 tile's sums go.
#[derive(Debug, Clone, Copy)]
pub(in crate::fast::matmul) enum TileOut {
    /// fp32 rows `ldc` apart, overwritten or (`accumulate`) added to.
    F32 {
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    },
    /// bf16 pairs of adjacent columns (the low half the even one), rows
    /// `ldc` pairs apart: a following multiply's rounded input.
    Pairs { c: *mut u32, ldc: usize },
    /// An activation's input: `act(sums + bias)` as pairs at `pairs`
    /// (rows `ldp` pairs apart), and its slope `act'(sums + bias)` as fp32
    /// rows at `slopes` (`lds` apart), all the activation's backward reads;
    /// with `panel`, `act(sums + bias)` once more as a right operand's
    /// panel rows (`NR` words per pair of rows, the tile's first at
    /// `panel`): the next layer's weight gradient `dyᵀ · act(…)` reads it
    /// so, unpacked.
    Both {
        slopes: *mut f32,
        lds: usize,
        pairs: *mut u32,
        ldp: usize,
        act: Act,
        panel: Option<*mut u32>,
    },
    /// The sums are an activation's output gradient: its input gradient
    /// `sums · slope` (the slopes [`TileOut::Both`] stored, rows `lds`
    /// apart) as pairs at `pairs` (rows `ldp` pairs apart), its column sums
    /// added into `sums` (the tile's columns); and once more as the
    /// transpose's interleaved blocks ([`Blocks`]) that the weight
    /// gradient `dzᵀ · x` reads as its left operand.
    ActGrad {
        slopes: *const f32,
        lds: usize,
        pairs: *mut u32,
        ldp: usize,
        sums: *mut f32,
        blocks: Blocks,
    },
}

/// Where a tile stores its sums transposed, as [`interleave_rows`] lays
/// out a transposed left operand: column `j` of the tile's pair of rows
/// `i` (the even row in the low half) at word `(j / width) · stride + i ·
/// width + j % width` from `at` (`at` already at the tile's first pair of
/// rows; `stride` = `width` × the pairs of rows in all, or for width 1
/// [`transposed_stride`]'s), for the tile's columns `c0..` (its panel's).
/// `width` is [`transposed_width`]'s.
///
/// [`interleave_rows`]: super::transposed::interleave_rows
/// [`transposed_stride`]: super::transposed::transposed_stride
/// [`transposed_width`]: super::transposed::transposed_width
#[derive(Debug, Clone, Copy)]
pub(in crate::fast::matmul) struct Blocks {
    pub at: *mut u32,
    pub stride: usize,
    pub c0: usize,
    pub width: usize,
}

impl Blocks {
    /// Column `j`'s word of the tile's pair of rows `i`.
    pub(in crate::fast::matmul) fn word(self, i: usize, j: usize) -> *mut u32 {
        let (j, w) = (self.c0 + j, self.width);
        self.at.wrapping_add(j / w * self.stride + i * w + j % w)
    }
}

/// One `mr` × `bias.len()` tile, stored as `out` says.
///
/// # Safety
/// `out` must address that tile, which no one else reads or writes
/// meanwhile; `simd` only when the CPU has AVX512-BF16 (or, on aarch64,
/// BF16).
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    simd: bool,
    a: PairsIn,
    k2: usize,
    mr: usize,
    panel: &[u16],
    bias: &[f32],
    act: Option<Act>,
    out: TileOut,
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        macro_rules! dispatch {
            ($($n:literal)*) => {
                match mr {
                    // SAFETY: the CPU has AVX512-BF16 (the caller checked);
                    // a gives mr rows of k2 pairs, the caller owns the tile.
                    $($n => unsafe {
                        avx512::tile_bf16::<$n>(a, k2, panel, bias, act, out)
                    },)*
                    _ => unreachable!("tiles have 1..=MR_BF16 rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
        return;
    }
    // NEON with BF16: the rows' sums by `bfdot`, the epilogue below.
    #[cfg(target_arch = "aarch64")]
    let neon_sums = simd.then(|| {
        let mut all = [[0f32; NR]; MR_BF16];
        let pairs = super::super::neon::Pairs {
            ptr: a.ptr,
            row: a.row,
            pair: a.pair,
        };
        // SAFETY: the CPU has BF16 (the caller checked); a gives mr
        // (≤ MR_BF16) rows of k2 pairs, the panel k2 pair rows.
        unsafe { super::super::neon::tile_sums_bf16(pairs, k2, mr, panel, &mut all) };
        all
    });
    #[cfg(not(target_arch = "aarch64"))]
    let neon_sums: Option<[[f32; NR]; MR_BF16]> = None;
    let _ = simd;
    let mut sums = [0f32; NR];
    // ActGrad's column sums over the tile's rows, added to the task's
    // after its last row (as the AVX-512 kernel adds them).
    let mut tile_sums = [0f32; NR];
    for r in 0..mr {
        let sums = &mut sums[..bias.len()];
        if let Some(all) = &neon_sums {
            sums.copy_from_slice(&all[r][..sums.len()]);
        } else {
            for (j, s) in sums.iter_mut().enumerate() {
                let mut acc = 0f32;
                for i in 0..k2 {
                    // SAFETY: row r < mr, pair i < k2 of the caller's operand.
                    let pair = unsafe { a.at(r, i) };
                    let w = &panel[(i * NR + j) * 2..][..2];
                    acc += from_bf16(pair as u16) * from_bf16(w[0])
                        + from_bf16((pair >> 16) as u16) * from_bf16(w[1]);
                }
                *s = acc;
            }
        }
        match out {
            TileOut::F32 { c, ldc, accumulate } => {
                sums.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
                // SAFETY: row r < mr, columns < bias.len() of the caller's tile.
                let y = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), bias.len()) };
                for (y, s) in y.iter_mut().zip(&*sums) {
                    *y = if accumulate { s + *y } else { *s };
                }
                if let Some(act) = act {
                    activate_body(y, act);
                }
            }
            TileOut::Pairs { c, ldc } => {
                // SAFETY: row r < mr of the caller's tile.
                unsafe { store_pairs_row(sums, bias, act, (c.add(r * ldc), None)) };
            }
            TileOut::Both {
                slopes,
                lds,
                pairs,
                ldp,
                act,
                panel,
            } => {
                let slopes = Some(slopes.wrapping_add(r * lds));
                let to = pairs.wrapping_add(r * ldp);
                // SAFETY: row r < mr of the caller's tile.
                unsafe { store_pairs_row(sums, bias, Some(act), (to, slopes)) };
                if let Some(panel) = panel {
                    // SAFETY: the tile's pair rows of its panel (NR words
                    // each) are the caller's; the row's pairs were just
                    // written.
                    unsafe {
                        let halves = std::slice::from_raw_parts(to.cast::<u16>(), bias.len());
                        store_panel_half(panel.add(r / 2 * NR), r % 2, halves);
                        if r % 2 == 0 && r + 1 == mr {
                            // An odd last row pairs with a row of zeros.
                            store_panel_half(panel.add(r / 2 * NR), 1, &[]);
                        }
                    }
                }
            }
            TileOut::ActGrad {
                slopes,
                lds,
                pairs,
                ldp,
                sums: column_sums,
                blocks,
            } => {
                // SAFETY: row r < mr of the caller's tile: bias.len()
                // slopes, as many column sums, their pairs.
                let (slopes, column_sums, to) = unsafe {
                    (
                        std::slice::from_raw_parts(slopes.add(r * lds), bias.len()),
                        std::slice::from_raw_parts_mut(column_sums, bias.len()),
                        std::slice::from_raw_parts_mut(pairs.add(r * ldp), bias.len().div_ceil(2)),
                    )
                };
                for ((s, slope), t) in sums.iter_mut().zip(slopes).zip(&mut tile_sums[..]) {
                    *s *= slope;
                    *t += *s;
                }
                round_row_on(false, sums, to);
                // The row's halves once more, transposed (an odd last row
                // pairs with zeros).
                let halves = || to.iter().flat_map(|w| [*w as u16, (w >> 16) as u16]);
                for (j, h) in halves().take(bias.len()).enumerate() {
                    // SAFETY: the tile's words of the blocks are the
                    // caller's; half r % 2 of a u32 is a u16.
                    unsafe {
                        let word = blocks.word(r / 2, j).cast::<u16>();
                        *word.add(r % 2) = h;
                        if r % 2 == 0 && r + 1 == mr {
                            *word.add(1) = 0;
                        }
                    }
                }
                if r + 1 == mr {
                    column_sums
                        .iter_mut()
                        .zip(&tile_sums[..])
                        .for_each(|(c, t)| *c += t);
                }
            }
        }
    }
}

/// The tiles of rows `rows` (from a multiple of [`MR_BF16`]) against one
/// panel: [`tile`] after tile, `left(r0)` the operand and `out(r0)` the
/// store of the tile from row `r0`; on AMX, where the left operand is
/// rows, tiles of 16 rows two at a time ([`avx512::tile_amx2`]:
/// each right tile is loaded once for 32 rows).
///
/// # Safety
/// As [`tile`]'s, for each tile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tiles(
    simd: bool,
    rows: std::ops::Range<usize>,
    left: impl Fn(usize) -> PairsIn,
    k2: usize,
    panel: &[u16],
    bias: &[f32],
    act: Option<Act>,
    out: impl Fn(usize) -> TileOut,
) {
    let mut r0 = rows.start;
    while r0 < rows.end {
        let (a, left_rows) = (left(r0), rows.end - r0);
        #[cfg(target_arch = "x86_64")]
        if simd && a.pair == 1 && features().amx {
            use avx512::{tile_amx, tile_amx2, AMX_ROWS};
            macro_rules! dispatch {
                ($rows:expr, $kernel:ident, $out:expr; $($n:literal)*) => {
                    match $rows {
                        // SAFETY: AMX and AVX512-BF16 (checked); a holds
                        // the rows of the tiles (rows of pairs, the
                        // caller's), whose outputs the caller owns.
                        $($n => unsafe { $kernel::<$n>(a, k2, panel, bias, act, $out) },)*
                        _ => unreachable!("AMX tiles have 1..=16 rows"),
                    }
                };
            }
            if left_rows > AMX_ROWS {
                let second = AMX_ROWS.min(left_rows - AMX_ROWS);
                let outs = (out(r0), out(r0 + AMX_ROWS));
                dispatch!(second, tile_amx2, outs; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
                r0 += AMX_ROWS + second;
            } else {
                dispatch!(left_rows, tile_amx, out(r0); 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
                r0 += left_rows;
            }
            continue;
        }
        let mr = MR_BF16.min(left_rows);
        // SAFETY: the caller's contract.
        unsafe { tile(simd, a, k2, mr, panel, bias, act, out(r0)) };
        r0 += mr;
    }
}

/// Half `half` (0: the even row's) of a panel's pair row at `row` (`NR`
/// words): `values`, then zeros to `NR` columns.
///
/// # Safety
/// `row` must address `NR` words no one else reads or writes meanwhile.
unsafe fn store_panel_half(row: *mut u32, half: usize, values: &[u16]) {
    // SAFETY: the caller's contract; the words' halves are u16s.
    let row = unsafe { std::slice::from_raw_parts_mut(row.cast::<u16>(), NR * 2) };
    for (j, word) in row.chunks_exact_mut(2).enumerate() {
        word[half] = values.get(j).copied().unwrap_or(0);
    }
}

/// One row of the scalar tile stored as bf16 pairs of `act(sums + bias)`
/// at `to`, and with `act`, the slopes `act'(sums + bias)` at `slopes`
/// (when given): the scalar twin of the AVX-512 kernel's `store_pairs!`.
///
/// # Safety
/// `to` must address `⌈sums.len() / 2⌉` pairs and `slopes` `sums.len()`
/// values that no one else reads or writes meanwhile.
unsafe fn store_pairs_row(
    sums: &mut [f32],
    bias: &[f32],
    act: Option<Act>,
    (to, slopes): (*mut u32, Option<*mut f32>),
) {
    sums.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
    if let (Some(act), Some(slopes)) = (act, slopes) {
        // SAFETY: the caller's contract.
        let slopes = unsafe { std::slice::from_raw_parts_mut(slopes, sums.len()) };
        slopes
            .iter_mut()
            .zip(&*sums)
            .for_each(|(g, z)| *g = act_grad(*z, act));
    }
    if let Some(act) = act {
        activate_body(sums, act);
    }
    // SAFETY: the caller's contract.
    let y = unsafe { std::slice::from_raw_parts_mut(to, sums.len().div_ceil(2)) };
    round_row_on(false, sums, y);
}

/// One bf16 register tile: `c[r, j] = Σ_i a[r, i] · panel[i, j]` over
/// `k2` pairs, `r < mr` (≤ [`BF16_TILE_ROWS`]), `j < cols` (≤ 32), no
/// bias.
///
/// # Safety
/// `c` must address an `mr` × `cols` tile (row stride `ldc`) that no one
/// else reads or writes meanwhile; `a` holds `mr` rows of `k2` pairs and
/// `panel` `k2` pair rows.
pub(crate) unsafe fn tile_bf16(
    a: &[u32],
    k2: usize,
    mr: usize,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    const ZEROS: [f32; NR] = [0.0; NR];
    assert!(a.len() >= mr * k2 && panel.len() >= k2 * NR * 2 && cols <= NR);
    let left = |r0: usize| PairsIn::rows(&a[r0 * k2..], k2);
    let out = |r0: usize| TileOut::F32 {
        c: c.wrapping_add(r0 * ldc),
        ldc,
        accumulate: false,
    };
    // SAFETY: as the caller promised; sizes asserted above.
    unsafe {
        tiles(
            features().bf16,
            0..mr,
            left,
            k2,
            panel,
            &ZEROS[..cols],
            None,
            out,
        )
    }
}
