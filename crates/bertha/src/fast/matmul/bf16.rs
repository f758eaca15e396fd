//! bf16 products with fp32 sums: weights rounded to bf16 once, at packing;
//! activations rounded at the multiply's input only. AVX512-BF16's
//! `vdpbf16ps` multiplies two bf16 pairs per 32-bit lane and adds both
//! products to an fp32 sum, so a tile does twice fp32's work per
//! instruction.

use rayon::prelude::*;

use super::{check_shapes, for_each_task, SharedOut, NR};
use crate::fast::buffers::Unwritten;
use crate::fast::cpu::{features, multiversion};
use crate::fast::kernels::{activate_body, Act};
use crate::io::quantized::PackedData;
use crate::model::ops::act_grad;

/// Output rows per register tile (as fp32's: 12 × 2 accumulators).
const MR_BF16: usize = 12;

/// Words per row of a padded pairs buffer of `width` values (an FFN's
/// middle, which products read row by row): `⌈width / 2⌉`, plus 16 when
/// that would put rows a multiple of 4 KiB apart. The twelve rows a tile
/// reads side by side would then share one L1 set (8 ways) and evict each
/// other: FFN-out's forward at `small`'s 2,048 went from 0.77 to 0.87 of
/// the bf16 peak with the padding (`examples/train_products`).
pub(crate) fn pair_stride(width: usize) -> usize {
    let words = width.div_ceil(2);
    match words > 0 && words.is_multiple_of(1024) {
        true => words + 16,
        false => words,
    }
}

/// The row stride of a pairs buffer of `words` words holding `rows` rows
/// of `width` values: `⌈width / 2⌉`, or [`pair_stride`]'s when its maker
/// padded the rows (its length tells which).
fn stride_of(words: usize, rows: usize, width: usize, what: &str) -> usize {
    let (dense, padded) = (width.div_ceil(2), pair_stride(width));
    match words {
        _ if words == rows * dense => dense,
        _ if words == rows * padded => padded,
        _ => panic!("product_bf16: {what} are not {rows} rows of {dense} pairs"),
    }
}

/// bf16 weights `[k, n]` in column panels: panel `p`, pair row `i` holds,
/// for each of its [`NR`] columns `c`, `w[2i, c]` then `w[2i + 1, c]` (the
/// `vdpbf16ps` operand layout; an odd `k` is padded with a zero row).
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    panels: Vec<u16>,
    k: usize,
    /// Input pairs: `k` rounded up to even, halved.
    k2: usize,
    n: usize,
}

/// `x` rounded to the nearest bf16 (ties to even), as its bit pattern.
pub fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

pub fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl PackedBf16 {
    /// Rounds and packs `w_t`, row-major `[k, n]`.
    pub fn new(w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "PackedBf16: weight is not [{k}, {n}]");
        let panels = pack_panels(Strided::rows(w_t, n), k, n);
        Self {
            panels,
            k,
            k2: k.div_ceil(2),
            n,
        }
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// The stored form (what [`PackedBf16::from_parts`] takes back).
    pub fn to_parts(&self) -> PackedData {
        PackedData::Bf16 {
            panels: self.panels.clone(),
        }
    }

    /// A `[k, n]` multiply from its stored panels; `Err` when their size
    /// does not fit.
    pub fn from_parts(panels: Vec<u16>, k: usize, n: usize) -> std::result::Result<Self, String> {
        let k2 = k.div_ceil(2);
        let want = n.div_ceil(NR) * k2 * NR * 2;
        if panels.len() != want {
            return Err(format!(
                "packed has {} values, expected {want}",
                panels.len()
            ));
        }
        Ok(Self { panels, k, k2, n })
    }

    /// `y[m, n] = act(bf16(x)[m, k] · W + bias)`, `x` rounded into
    /// `scratch` (reused between calls).
    pub fn matmul(
        &self,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        self.matmul_on(features().bf16, x, bias, y, m, scratch, act);
    }

    /// [`PackedBf16::matmul`] on AVX512-BF16 (`simd`, which the caller
    /// checked the CPU has) or the scalar loop.
    #[allow(clippy::too_many_arguments)]
    fn matmul_on(
        &self,
        simd: bool,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        let (k, k2, n) = (self.k, self.k2, self.n);
        check_shapes(x, bias, y, m, k, n);
        round_rows(simd, x, m, k, k2, scratch);
        self.run_tiles(simd, &scratch[..m * k2], bias, Dest::F32(y), m, act);
    }

    /// `act(pairs · W + bias)` for `m` rows of input already rounded to
    /// bf16 pairs (`[m, ⌈k / 2⌉]`, as [`PackedBf16::matmul_to_pairs`]
    /// writes them), into `y` `[m, n]`.
    pub fn matmul_pairs(
        &self,
        pairs: &[u32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        act: Option<Act>,
    ) {
        assert_eq!(
            pairs.len(),
            m * self.k2,
            "matmul_pairs: input is not [{m}, {}] pairs",
            self.k2
        );
        assert_eq!(bias.len(), self.n, "matmul_pairs: bias is not [{}]", self.n);
        assert_eq!(
            y.len(),
            m * self.n,
            "matmul_pairs: output is not [{m}, {}]",
            self.n
        );
        self.run_tiles(features().bf16, pairs, bias, Dest::F32(y), m, act);
    }

    /// [`PackedBf16::matmul`] with its output rounded to bf16 pairs of
    /// adjacent columns in the tiles' store (`pairs_out`: `[m, ⌈n / 2⌉]`,
    /// grown as needed): the input of a following bf16 multiply, without
    /// an fp32 round trip. The bits equal rounding the fp32 output.
    pub fn matmul_to_pairs(
        &self,
        x: &[f32],
        bias: &[f32],
        pairs_out: &mut Vec<u32>,
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        let (k, k2, n2) = (self.k, self.k2, self.n.div_ceil(2));
        assert_eq!(x.len(), m * k, "matmul_to_pairs: input is not [{m}, {k}]");
        assert_eq!(
            bias.len(),
            self.n,
            "matmul_to_pairs: bias is not [{}]",
            self.n
        );
        let simd = features().bf16;
        round_rows(simd, x, m, k, k2, scratch);
        if pairs_out.len() < m * n2 {
            pairs_out.resize(m * n2, 0);
        }
        let out = Dest::Pairs(&mut pairs_out[..m * n2]);
        self.run_tiles(simd, &scratch[..m * k2], bias, out, m, act);
    }

    /// Every tile of the product of `m` rows of input `pairs` with the
    /// panels, stored into `dest`.
    fn run_tiles(
        &self,
        simd: bool,
        pairs: &[u32],
        bias: &[f32],
        dest: Dest,
        m: usize,
        act: Option<Act>,
    ) {
        let (k2, n) = (self.k2, self.n);
        let n2 = n.div_ceil(2);
        let base = match dest {
            Dest::F32(y) => Base::F32(SharedOut(y.as_mut_ptr())),
            Dest::Pairs(p) => Base::Pairs(SharedPairs(p.as_mut_ptr())),
        };
        for_each_task(m, n, std::mem::size_of_val(pairs), |p, rows| {
            let panel = &self.panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
            let cs = p * NR..(p * NR + NR).min(n);
            let bias = &bias[cs];
            let left = |r0: usize| PairsIn::rows(&pairs[r0 * k2..], k2);
            let out = |r0: usize| match base {
                Base::F32(y) => TileOut::F32 {
                    c: y.at(r0 * n + p * NR),
                    ldc: n,
                    accumulate: false,
                },
                Base::Pairs(y) => TileOut::Pairs {
                    c: y.at(r0 * n2 + p * NR / 2),
                    ldc: n2,
                },
            };
            // SAFETY: the task's rows, the columns (or pairs) of panel p
            // lie inside the output (shapes checked by the callers) and
            // belong to this task only; pairs holds m rows of k2.
            unsafe { tiles(simd, rows, left, k2, panel, bias, act, out) };
        });
    }
}

/// Where [`PackedBf16::run_tiles`] stores.
enum Dest<'a> {
    F32(&'a mut [f32]),
    Pairs(&'a mut [u32]),
}

/// [`Dest`] as the pointer its tasks share.
#[derive(Clone, Copy)]
enum Base {
    F32(SharedOut),
    Pairs(SharedPairs),
}

/// A pair output tasks share, each writing its own tiles.
#[derive(Clone, Copy)]
struct SharedPairs(*mut u32);
// SAFETY: every task writes only its own rows and pair columns.
unsafe impl Send for SharedPairs {}
unsafe impl Sync for SharedPairs {}

impl SharedPairs {
    fn at(self, offset: usize) -> *mut u32 {
        self.0.wrapping_add(offset)
    }
}

/// Where a bf16 tile's sums go.
#[derive(Debug, Clone, Copy)]
pub(super) enum TileOut {
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
#[derive(Debug, Clone, Copy)]
pub(super) struct Blocks {
    pub at: *mut u32,
    pub stride: usize,
    pub c0: usize,
    pub width: usize,
}

impl Blocks {
    /// Column `j`'s word of the tile's pair of rows `i`.
    pub(super) fn word(self, i: usize, j: usize) -> *mut u32 {
        let (j, w) = (self.c0 + j, self.width);
        self.at.wrapping_add(j / w * self.stride + i * w + j % w)
    }
}

/// The rows of a transposed left operand's blocks ([`interleave_rows`]):
/// [`MR_BF16`], a register tile's, every step's pairs of a block side by
/// side; or 1 on AMX, whose tiles load each row's pairs as one run: the
/// blocks are then the transpose's rows of pairs, [`PairsIn::rows`].
pub(super) fn transposed_width() -> usize {
    match features().amx {
        true => 1,
        false => MR_BF16,
    }
}

/// Words per row of a transposed left operand laid out as rows (AMX):
/// `k2`, plus 16 when that would put rows a multiple of 2 KiB apart. The
/// 32 rows two AMX tiles load would then share two of L1's 64 sets and
/// evict each other (at 4,096 tokens, every weight gradient's: 8 KiB
/// apart); padded, a 512 × 4,096 × 512 product ran at 689 GFLOP/s a
/// core instead of 559.
pub(super) fn transposed_stride(k2: usize) -> usize {
    match transposed_width() == 1 && k2 > 0 && k2.is_multiple_of(512) {
        true => k2 + 16,
        false => k2,
    }
}

/// Words of a transposed left operand of `m` rows of `k2` pairs as
/// [`interleave_rows`] lays it out.
pub(super) fn transposed_len(m: usize, k2: usize) -> usize {
    match transposed_width() {
        1 => m * transposed_stride(k2),
        width => m.div_ceil(width) * width * k2,
    }
}

/// A transposed left operand's tile from row `r0` (a multiple of
/// [`MR_BF16`]) of `k2` pairs, laid out as [`interleave_rows`] lays it.
fn transposed_left(words: &[u32], r0: usize, k2: usize) -> PairsIn {
    match transposed_width() {
        1 => {
            let stride = transposed_stride(k2);
            PairsIn::rows(&words[r0 * stride..], stride)
        }
        width => PairsIn {
            ptr: words[r0 * k2..].as_ptr(),
            row: 1,
            pair: width,
        },
    }
}

/// A tile's left operand: pair `i` of row `r` at `ptr[r · row + i · pair]`.
/// Rows of pairs (`row` = the row length, `pair` = 1), or, for the
/// transpose of a matrix whose rows were interleaved two by two
/// ([`interleave_rows`]), the pairs of one step side by side (`row` = 1,
/// `pair` = the width).
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

/// Rounds each row of `x` `[m, k]` to bf16 pairs `[m, k2]` (low half: the
/// even input), with AVX512-BF16's conversion when `simd`.
fn round_rows(simd: bool, x: &[f32], m: usize, k: usize, k2: usize, out: &mut Vec<u32>) {
    round_rows_strided(simd, true, (x, k), m, k, k2, out);
}

/// [`round_rows`] for rows `rs` apart (`x.0` = the data, `x.1` = `rs`),
/// on every core or (not `parallel`) the calling thread.
fn round_rows_strided(
    simd: bool,
    parallel: bool,
    (x, rs): (&[f32], usize),
    m: usize,
    k: usize,
    k2: usize,
    out: &mut Vec<u32>,
) {
    // Every pair is written below: grow the buffer, never zero it again.
    if out.len() < m * k2 {
        out.resize(m * k2, 0);
    }
    let round = |(r, pairs): (usize, &mut [u32])| round_row_on(simd, &x[r * rs..][..k], pairs);
    each_chunk(&mut out[..m * k2], (k2.max(1), 16), parallel, round);
}

/// `f((i, chunk))` for each `size.0`-long chunk of `out`, on every core
/// (tasks of at least `size.1` chunks) or (not `parallel`) on the calling
/// thread: an operand is prepared in parallel for a product of its own,
/// serially for one inside a parallel task.
fn each_chunk<T: Send>(
    out: &mut [T],
    (size, min_len): (usize, usize),
    parallel: bool,
    f: impl Fn((usize, &mut [T])) + Send + Sync,
) {
    if parallel {
        out.par_chunks_mut(size)
            .enumerate()
            .with_min_len(min_len)
            .for_each(f);
    } else {
        out.chunks_mut(size).enumerate().for_each(f);
    }
}

/// One row of `x` as bf16 pairs in `out` (ceil(len / 2) of them), with
/// AVX512-BF16's conversion when `simd`.
fn round_row_on(simd: bool, x: &[f32], out: &mut [u32]) {
    assert_eq!(out.len(), x.len().div_ceil(2), "round_row: output length");
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the CPU has AVX512-BF16 (the caller checked); out holds
        // ceil(len / 2) pairs.
        unsafe { super::avx512::round_row_bf16(x, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    for (pair, xs) in out.iter_mut().zip(x.chunks(2)) {
        let lo = u32::from(to_bf16(xs[0]));
        let hi = xs.get(1).map_or(0, |&v| u32::from(to_bf16(v)));
        *pair = lo | hi << 16;
    }
}

/// One `mr` × `bias.len()` tile, stored as `out` says.
///
/// # Safety
/// `out` must address that tile, which no one else reads or writes
/// meanwhile; `simd` only when the CPU has AVX512-BF16.
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
                        super::avx512::tile_bf16::<$n>(a, k2, panel, bias, act, out)
                    },)*
                    _ => unreachable!("tiles have 1..=MR_BF16 rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
        return;
    }
    let _ = simd;
    let mut sums = [0f32; NR];
    // ActGrad's column sums over the tile's rows, added to the task's
    // after its last row (as the AVX-512 kernel adds them).
    let mut tile_sums = [0f32; NR];
    for r in 0..mr {
        let sums = &mut sums[..bias.len()];
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
/// rows, tiles of 16 rows two at a time ([`super::avx512::tile_amx2`]:
/// each right tile is loaded once for 32 rows).
///
/// # Safety
/// As [`tile`]'s, for each tile.
#[allow(clippy::too_many_arguments)]
unsafe fn tiles(
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
            use super::avx512::{tile_amx, tile_amx2, AMX_ROWS};
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

/// Output rows per [`tile_bf16`] call.
pub(crate) const BF16_TILE_ROWS: usize = MR_BF16;

/// One row rounded to bf16 pairs (`out`: `x.len()` rounded up to even,
/// halved), on the calling thread.
pub(crate) fn round_row(x: &[f32], out: &mut [u32]) {
    round_row_on(features().bf16, x, out);
}

/// `b` `[k, n]` packed as [`PackedBf16`]'s panels into `panels`, on the
/// calling thread (for small per-head operands).
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
                super::transpose16(as_f32(src), stride, rows, cols, as_f32_mut(dst), NR);
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

/// A left operand of [`product_pairs_serial`], rounded before.
#[derive(Clone, Copy)]
pub(crate) enum LeftPairs<'a> {
    /// `m` rows of `k2` pairs, rows `stride` words apart.
    Rows { words: &'a [u32], stride: usize },
    /// A transpose as [`interleave_transposed`] lays it out.
    Interleaved(&'a [u32]),
}

/// `m` rows of `k` values (one after another) rounded to bf16 pairs,
/// `⌈k / 2⌉` per row, on the calling thread ([`LeftPairs::Rows`]):
/// attention's `dS`.
pub(crate) fn round_rows_serial(x: &[f32], (m, k): (usize, usize), out: &mut Vec<u32>) {
    round_rows_strided(features().bf16, false, (x, k), m, k, k.div_ceil(2), out);
}

/// The transpose of `x` (`k` rows of `m` values, rows `stride` apart) as a
/// product's left operand `[m, k]`, rounded to bf16 ([`LeftPairs::Interleaved`]),
/// on the calling thread: attention's `Pᵀ` and `dSᵀ`.
pub(crate) fn interleave_transposed(
    x: &[f32],
    stride: usize,
    (k, m): (usize, usize),
    out: &mut Vec<u32>,
) {
    let src = Source::F32 {
        data: x,
        cs: stride,
    };
    interleave_rows(src, k, m, out, false);
}

/// `c[m, n] = scale · a[m, k] · b[k, n]` on the calling thread from a
/// rounded left operand and packed right one ([`pack_transposed_pairs`],
/// [`pack_row_pairs`], [`pack_panels_into`]), `k2 = ⌈k / 2⌉` pairs, `c`
/// rows `ldc` apart: attention's per-head products.
///
/// # Safety
/// `c` must address `m` rows of `n` values, `ldc` apart, that nothing else
/// reads or writes meanwhile.
pub(crate) unsafe fn product_pairs_serial(
    a: LeftPairs,
    dims: (usize, usize, usize),
    panels: &[u16],
    (c, ldc): (*mut f32, usize),
    scale: f32,
) {
    let (m, n, _) = dims;
    // SAFETY: the caller's contract.
    unsafe { pairs_serial(a, dims, panels, SerialOut::F32(c, ldc)) };
    if scale != 1.0 {
        for r in 0..m {
            // SAFETY: row r of the caller's m × n destination.
            let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), n) };
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// [`product_pairs_serial`] (no scale) stored as bf16 pairs of adjacent
/// columns, `m` rows of `⌈n / 2⌉` words `ldc` words apart: a product whose
/// only use is another product's operand (attention's context).
///
/// # Safety
/// `c` must address `m` rows of `⌈n / 2⌉` words, `ldc` apart, that nothing
/// else reads or writes meanwhile.
pub(crate) unsafe fn product_pairs_serial_to_pairs(
    a: LeftPairs,
    dims: (usize, usize, usize),
    panels: &[u16],
    (c, ldc): (*mut u32, usize),
) {
    // SAFETY: the caller's contract.
    unsafe { pairs_serial(a, dims, panels, SerialOut::Pairs(c, ldc)) }
}

/// Where [`pairs_serial`] stores: fp32 rows or bf16 pairs, and the row
/// stride.
#[derive(Clone, Copy)]
enum SerialOut {
    F32(*mut f32, usize),
    Pairs(*mut u32, usize),
}

/// # Safety
/// As [`product_pairs_serial`] / [`product_pairs_serial_to_pairs`].
unsafe fn pairs_serial(
    a: LeftPairs,
    (m, n, k2): (usize, usize, usize),
    panels: &[u16],
    out: SerialOut,
) {
    if m == 0 || n == 0 {
        return;
    }
    let simd = features().bf16;
    match a {
        LeftPairs::Rows { words, stride } => assert!(
            words.len() >= (m - 1) * stride + k2 && stride >= k2,
            "product_pairs_serial: the left rows read past their data"
        ),
        LeftPairs::Interleaved(words) => assert!(
            words.len() >= transposed_len(m, k2),
            "product_pairs_serial: the interleaved left operand is short"
        ),
    }
    assert!(
        panels.len() >= n.div_ceil(NR) * k2 * NR * 2,
        "product_pairs_serial: the panels are short"
    );
    let zeros = [0f32; NR];
    for p in 0..n.div_ceil(NR) {
        let panel = &panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
        let cols = NR.min(n - p * NR);
        let left = |r0: usize| match a {
            LeftPairs::Rows { words, stride } => PairsIn {
                ptr: words[r0 * stride..].as_ptr(),
                row: stride,
                pair: 1,
            },
            LeftPairs::Interleaved(words) => transposed_left(words, r0, k2),
        };
        let out = |r0: usize| match out {
            SerialOut::F32(c, ldc) => TileOut::F32 {
                c: c.wrapping_add(r0 * ldc + p * NR),
                ldc,
                accumulate: false,
            },
            SerialOut::Pairs(c, ldc) => TileOut::Pairs {
                c: c.wrapping_add(r0 * ldc + p * NR / 2),
                ldc,
            },
        };
        // SAFETY: a holds rows 0..m of k2 pairs (asserted above), the
        // panel k2 pair rows; the caller owns c's tiles.
        unsafe { tiles(simd, 0..m, left, k2, panel, &zeros[..cols], None, out) };
    }
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

/// A matrix read through strides: element `(r, c)` is `data[r·rs + c·cs]`
/// (a row-major matrix or its transpose, without a transposed copy).
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Strided<'a> {
    /// Row-major, rows `stride` apart.
    pub fn rows(data: &'a [f32], stride: usize) -> Self {
        Self {
            data,
            rs: stride,
            cs: 1,
        }
    }

    /// The transpose of row-major `data` with rows `stride` apart.
    pub fn transposed(data: &'a [f32], stride: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: stride,
        }
    }

    #[inline(always)]
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.rs + c * self.cs]
    }

    fn check(&self, rows: usize, cols: usize, what: &str) {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * self.rs + (cols - 1) * self.cs;
            assert!(
                last < self.data.len(),
                "{what}: a [{rows}, {cols}] view reads past its data"
            );
        }
    }
}

/// [`to_bf16`] as branch-free bit arithmetic (round to nearest even; a
/// NaN stays a quiet NaN), so the packing loops vectorise.
#[inline(always)]
fn round_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        (b >> 16) | 0x40
    } else {
        (b + 0x7fff + ((b >> 16) & 1)) >> 16
    }
}

/// `b` `[k, n]` rounded to bf16 and laid out as [`PackedBf16`]'s panels.
fn pack_panels(b: Strided, k: usize, n: usize) -> Vec<u16> {
    let mut panels = Vec::new();
    pack_panels_reusing(Right::F32(b), k, n, &mut panels, true);
    panels
}

/// Values in the panels of a `[k, n]` right operand ([`PackedBf16`]'s
/// layout): `⌈n / NR⌉` panels of `⌈k / 2⌉` pair rows.
fn panels_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * k.div_ceil(2) * NR * 2
}

/// [`pack_panels`] into the first [`panels_len`] values of
/// `panels`, grown when short and otherwise not cleared: the packing
/// writes every value but a partial last panel's padding columns, which
/// are zeroed here.
fn pack_panels_reusing(b: Right, k: usize, n: usize, panels: &mut Vec<u16>, parallel: bool) {
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
    fn pack_panel = pack_panel_body(b: &Strided<'_>, k: usize, c0: usize, cols: usize, panel: &mut [u16]);
    fn pack_panel_pairs_rows = pack_panel_pairs_body(words: &[u32], row: usize, k: usize, c0: usize, cols: usize, panel: &mut [u16]);
}

/// [`pack_panel_pairs_body`], on AVX-512 a pair row at a time
/// (`avx512::pack_pair_rows`, the same words).
fn pack_panel_pairs(
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
                super::avx512::pack_pair_rows(
                    words[c0 / 2..].as_ptr(),
                    row,
                    k,
                    wn,
                    out.as_mut_ptr(),
                )
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
fn pack_panel_pairs_body(
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
                        super::transpose16(src, T, nc, T, dst, NR);
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

/// fp32 storage holding bf16 values (panels) seen as them.
pub(crate) fn as_halves(x: &[f32]) -> &[u16] {
    // SAFETY: two u16 fill an f32's bytes, u16's alignment is smaller, and
    // every bit pattern is a u16.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len() * 2) }
}

/// bf16 pairs seen as the f32 bit patterns [`super::transpose16`] moves.
pub(crate) fn as_f32(x: &[u32]) -> &[f32] {
    // SAFETY: u32 and f32 have one size and alignment, and every bit
    // pattern is an f32; the values are only moved, never computed on.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
}

/// fp32 storage holding bf16 pairs seen as their u32 words.
pub(crate) fn as_words(x: &[f32]) -> &[u32] {
    // SAFETY: u32 and f32 have one size and alignment, and every bit
    // pattern is a u32.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
}

/// fp32 storage seen as the u32 words of bf16 pairs (a buffer from the
/// step's fp32 pool holding a product's rounded operand).
pub(crate) fn as_words_mut(x: &mut [f32]) -> &mut [u32] {
    // SAFETY: u32 and f32 have one size and alignment, and every bit
    // pattern is a u32.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len()) }
}

/// [`as_f32`] for a destination.
pub(crate) fn as_f32_mut(x: &mut [u32]) -> &mut [f32] {
    // SAFETY: as in as_f32; the f32 written are bit patterns of u32s.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len()) }
}

const _: () = assert!(super::ROWS_PER_TASK.is_multiple_of(MR_BF16));
// interleave48_bf16 writes four blocks of 12 rows.
const _: () = assert!(MR_BF16 == 12 && INTERLEAVE_BLOCKS == 4);

/// Row blocks per task of [`interleave_rows`]: 48 rows, three cache lines
/// of each source row.
const INTERLEAVE_BLOCKS: usize = 4;

/// The rows of a matrix whose transpose is a product's left operand
/// (a weight gradient's `dy`): `k` rows of at least `m` values.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// fp32, rows `cs` apart, rounded as they are read.
    F32 { data: &'a [f32], cs: usize },
    /// bf16 pairs, `row` words per row (value `c` of a row is the low half
    /// of word `c / 2` for even `c`, the high half for odd).
    Pairs { data: &'a [u32], row: usize },
}

impl Source<'_> {
    /// Whether it holds `rows` rows of at least `width` values.
    pub(crate) fn covers(&self, rows: usize, width: usize) -> bool {
        rows == 0
            || match *self {
                Source::F32 { data, cs } => data.len() >= (rows - 1) * cs + width,
                Source::Pairs { data, row } => {
                    2 * row >= width && data.len() >= (rows - 1) * row + width.div_ceil(2)
                }
            }
    }
}

/// The transpose `a[r, c] = src[c, r]` (`[m, k]`) as bf16 pairs of its
/// columns, in blocks of [`MR_BF16`] rows (a tile's), step after step:
/// word `(b·k2 + i)·MR_BF16 + j` pairs `a[r, 2i]` (low half) with
/// `a[r, 2i + 1]` (0 past `k`), `r = b·MR_BF16 + j`. That is source rows
/// `2i` and `2i + 1` rounded and interleaved, no transpose; a tile reads
/// its block's pairs as one stream ([`PairsIn`] `row` 1, `pair`
/// `MR_BF16`). Words of rows past `m` in the last block are not written.
/// On AMX ([`transposed_width`] 1) the transpose's rows instead
/// ([`transpose_rows`]).
fn interleave_rows(src: Source, k: usize, m: usize, out: &mut Vec<u32>, parallel: bool) {
    assert!(
        src.covers(k, m),
        "interleave_rows: the source is not [{k}, {m}]"
    );
    let k2 = k.div_ceil(2);
    let len = transposed_len(m, k2);
    // Every word read is written below: grow the buffer, never zero it.
    if out.len() < len {
        out.resize(len, 0);
    }
    if transposed_width() == 1 {
        return transpose_rows(src, k, m, &mut out[..len], parallel);
    }
    let simd = features().bf16;
    let task = |(t, blocks): (usize, &mut [u32])| {
        let r0 = t * INTERLEAVE_BLOCKS * MR_BF16;
        #[cfg(target_arch = "x86_64")]
        if simd && m - r0 >= 48 {
            // SAFETY: the CPU has AVX512-BF16; rows r0..r0 + 48 are inside
            // every source row (k rows of m values, checked above), and the
            // task's four blocks hold 4 · k2 · 12 words.
            unsafe { super::avx512::interleave48_bf16(src, k, r0, blocks) };
            return;
        }
        let _ = simd;
        interleave_blocks(src, k, m, r0, blocks)
    };
    let chunk = (INTERLEAVE_BLOCKS * MR_BF16 * k2).max(1);
    each_chunk(&mut out[..len], (chunk, 1), parallel, task);
}

multiversion! {
    fn interleave_blocks = interleave_blocks_body(src: Source, k: usize, m: usize, r0: usize, out: &mut [u32]);
    fn transpose_rows_at = transpose_rows_body(src: Source, k: usize, r0: usize, i0: usize, out: &mut [u32]);
}

/// Transposed rows per task of [`transpose_rows`].
const TRANSPOSE_ROWS: usize = 16;

/// [`interleave_rows`]'s layout on AMX: the transpose `a[r, c] = src[c,
/// r]` (`[m, k]`) as rows of bf16 pairs, word `r · k2 + i` pairing
/// `a[r, 2i]` (low half) with `a[r, 2i + 1]` (0 past `k`). Source rows
/// `2i`, `2i + 1` are read 16 values at a time and 16 × 16 words
/// transposed in registers, so each row's words are written a cache line
/// at a time.
fn transpose_rows(src: Source, k: usize, m: usize, out: &mut [u32], parallel: bool) {
    let k2 = k.div_ceil(2);
    let stride = transposed_stride(k2);
    debug_assert_eq!(out.len(), m * stride);
    let simd = features().bf16;
    let task = |(t, rows): (usize, &mut [u32])| {
        let r0 = t * TRANSPOSE_ROWS;
        let full = match simd && rows.len() == TRANSPOSE_ROWS * stride {
            true => k2 / 16 * 16,
            false => 0,
        };
        #[cfg(target_arch = "x86_64")]
        for i0 in (0..full).step_by(16) {
            // SAFETY: the CPU has AVX512-BF16; steps i0..i0 + 16 < k2 and
            // rows r0..r0 + 16 ≤ m of the source (k rows of m values,
            // checked by the caller) and of the task's 16 rows, stride
            // words apart.
            unsafe { super::avx512::transpose_pairs16(src, k, r0, i0, rows.as_mut_ptr(), stride) };
        }
        transpose_rows_at(src, k, r0, full, rows);
    };
    let chunk = (TRANSPOSE_ROWS * stride).max(1);
    each_chunk(out, (chunk, 1), parallel, task);
}

/// Steps `i0..` of [`transpose_rows`]'s rows `r0..` (as many as `out`
/// holds, [`transposed_stride`] words each), one word at a time, and the
/// rows' padding words, zeros.
#[inline(always)]
fn transpose_rows_body(src: Source, k: usize, r0: usize, i0: usize, out: &mut [u32]) {
    let k2 = k.div_ceil(2);
    let stride = transposed_stride(k2);
    let value = |r: usize, c: usize| -> u32 {
        match src {
            Source::F32 { data, cs } => round_bits(data[r * cs + c]),
            Source::Pairs { data, row } => data[r * row + c / 2] >> (16 * (c % 2)) & 0xffff,
        }
    };
    for (j, row) in out.chunks_exact_mut(stride.max(1)).enumerate() {
        let (row, padding) = row.split_at_mut(k2);
        padding.fill(0);
        let c = r0 + j;
        for (i, w) in row.iter_mut().enumerate().skip(i0) {
            let hi = match 2 * i + 1 < k {
                true => value(2 * i + 1, c),
                false => 0,
            };
            *w = value(2 * i, c) | hi << 16;
        }
    }
}

/// The blocks of [`interleave_rows`] from row `r0` (as many as `out`
/// holds).
#[inline(always)]
fn interleave_blocks_body(src: Source, k: usize, m: usize, r0: usize, out: &mut [u32]) {
    match src {
        Source::F32 { data, cs } => interleave_from(k, m, r0, out, |r, bits| {
            for (b, v) in bits.iter_mut().zip(&data[r * cs + r0..]) {
                *b = round_bits(*v);
            }
        }),
        Source::Pairs { data, row } => interleave_from(k, m, r0, out, |r, bits| {
            let words = &data[r * row..];
            for (j, b) in bits.iter_mut().enumerate() {
                let c = r0 + j;
                *b = words[c / 2] >> (16 * (c % 2)) & 0xffff;
            }
        }),
    }
}

/// [`interleave_blocks_body`] with `row_bits(r, bits)` writing values
/// `r0..r0 + bits.len()` of source row `r` as bf16 bits (a task's rows,
/// at most [`INTERLEAVE_BLOCKS`] blocks of them, side by side first).
#[inline(always)]
fn interleave_from(
    k: usize,
    m: usize,
    r0: usize,
    out: &mut [u32],
    row_bits: impl Fn(usize, &mut [u32]),
) {
    const B: usize = MR_BF16;
    let k2 = k.div_ceil(2);
    let rows = (m - r0).min(out.len() / k2.max(1));
    let (mut lo, mut hi) = ([0u32; INTERLEAVE_BLOCKS * B], [0u32; INTERLEAVE_BLOCKS * B]);
    let (lo, hi) = (&mut lo[..rows], &mut hi[..rows]);
    for i in 0..k2 {
        row_bits(2 * i, lo);
        match 2 * i + 1 < k {
            true => row_bits(2 * i + 1, hi),
            false => hi.fill(0),
        }
        for (b, dst) in out.chunks_exact_mut(k2 * B).enumerate() {
            let dst = &mut dst[i * B..][..B];
            let n = rows.saturating_sub(b * B).min(B);
            for (j, w) in dst.iter_mut().enumerate().take(n) {
                *w = lo[b * B + j] | hi[b * B + j] << 16;
            }
        }
    }
}

/// Rows of `a` `[m, k]` rounded to bf16 pairs `[m, k2]` for any strides,
/// element by element (neither rows nor columns contiguous: no product of
/// a training step takes this path).
fn round_strided(a: Strided, m: usize, k: usize, k2: usize, out: &mut Vec<u32>) {
    // Every pair is written below: grow the buffer, never zero it again.
    if out.len() < m * k2 {
        out.resize(m * k2, 0);
    }
    let out = &mut out[..m * k2];
    out.par_chunks_mut(k2.max(1))
        .enumerate()
        .with_min_len(16)
        .for_each(|(r, row)| {
            for (i, pair) in row.iter_mut().enumerate() {
                let lo = round_bits(a.at(r, 2 * i));
                let hi = if 2 * i + 1 < k {
                    round_bits(a.at(r, 2 * i + 1))
                } else {
                    0
                };
                *pair = lo | hi << 16;
            }
        });
}

/// Where a [`product_bf16`] puts its sums.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sums<'a> {
    /// Added to every row (length `n`).
    pub bias: Option<&'a [f32]>,
    /// Add to what the output holds instead of overwriting it (gradients
    /// summed over products), in the tile's store.
    pub accumulate: bool,
}

/// A [`Sums`] product's fp32 output.
pub(crate) enum Dst<'a> {
    /// Rows it overwrites, or adds to ([`Sums::accumulate`]).
    Rows(&'a mut [f32]),
    /// A new buffer it writes whole (not accumulating): a weight
    /// gradient's first product of a step, with no pass zeroing it first.
    New(&'a mut Unwritten),
}

impl<'a> From<&'a mut [f32]> for Dst<'a> {
    fn from(c: &'a mut [f32]) -> Self {
        Self::Rows(c)
    }
}

impl<'a> From<&'a mut Vec<f32>> for Dst<'a> {
    fn from(c: &'a mut Vec<f32>) -> Self {
        Self::Rows(c)
    }
}

impl<'a> From<&'a mut Unwritten> for Dst<'a> {
    fn from(c: &'a mut Unwritten) -> Self {
        Self::New(c)
    }
}

/// The operands of the products on one thread, rounded and packed into
/// buffers kept between calls: a training step makes a few hundred
/// products, and fresh buffers cost a page fault and a zeroing each.
#[derive(Default)]
struct ProductBuffers {
    pairs: Vec<u32>,
    panels: Vec<u16>,
}

thread_local! {
    static BUFFERS: std::cell::RefCell<ProductBuffers> =
        const { std::cell::RefCell::new(ProductBuffers { pairs: Vec::new(), panels: Vec::new() }) };
}

/// `c[m, n] (+)= bf16(a)[m, k] · bf16(b)[k, n] (+ bias)` with fp32 sums,
/// `c` row-major: both operands rounded (and `b` packed) on this call, for
/// products whose operands change every call (a training step's).
pub fn product_bf16<'c>(
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Strided,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Strided(a), Right::F32(b), c, sums)
}

/// [`product_bf16`] with any right operand (a weight's panels packed
/// already: [`WeightPanels`]).
pub(crate) fn product_bf16_right(
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Right,
    c: &mut [f32],
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Strided(a), b, c, sums)
}

/// [`product_bf16_right`] with the left operand already rounded: `m`
/// rows of `⌈k / 2⌉` bf16 pairs (padded or not: [`pair_stride`]), as the
/// tiles store them.
pub(crate) fn product_bf16_pairs_right(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Right,
    c: &mut [f32],
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Pairs(a), b, c, sums)
}

/// [`product_bf16`] with the left operand the transpose of a matrix
/// already rounded: `a` holds `k` rows of `⌈m / 2⌉` bf16 pairs (a weight
/// gradient's `dy`, as the pass that made it stored it), and the product
/// reads `aᵀ` `[m, k]`.
pub fn product_bf16_transposed_pairs<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Strided,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::TransposedPairs(a), Right::F32(b), c, sums)
}

/// [`product_bf16`] with both operands already rounded: `a` the transpose
/// of `k` rows of `⌈m / 2⌉` pairs (as [`product_bf16_transposed_pairs`]),
/// `b` `k` rows of `⌈n / 2⌉` pairs (as the tiles store them): a
/// weight gradient whose output gradient and input were both stored as
/// pairs.
pub(crate) fn product_bf16_both_pairs<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: &[u32],
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums(
        (m, n, k),
        Left::TransposedPairs(a),
        Right::Pairs(b),
        c,
        sums,
    )
}

/// A product into `c` `[m, n]`, a new buffer that it writes whole (`store`
/// must not accumulate): every row block's tiles store every panel's
/// columns, reading none of them first, so `c` needs no zeroing.
fn product_bf16_writing(
    dims: (usize, usize, usize),
    a: Left,
    b: Right,
    c: Option<&mut Unwritten>,
    store: Store,
) {
    product_bf16_writing_on(features().bf16, dims, a, b, c, store)
}

/// [`product_bf16_writing`] on AVX512-BF16 or the scalar loop (`simd`).
fn product_bf16_writing_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    c: Option<&mut Unwritten>,
    store: Store,
) {
    if let Store::Sums(sums) = store {
        assert!(
            !sums.accumulate,
            "product_bf16: a new output cannot accumulate"
        );
    }
    // Only a Store::Pairs or ActGrad has no fp32 output (its tiles never
    // write one).
    let c = match c {
        Some(c) => {
            assert_eq!(c.len(), m * n, "product_bf16: output is not [{m}, {n}]");
            c.as_mut_ptr()
        }
        None => {
            assert!(
                matches!(store, Store::Pairs { .. } | Store::ActGrad { .. }),
                "product_bf16: no output"
            );
            std::ptr::null_mut()
        }
    };
    let run = Run {
        simd,
        parallel: true,
    };
    // SAFETY: c addresses m × n values owned by the caller's buffer (or,
    // null, is never written: Store::Pairs); a Store::Both's or
    // Store::Pairs's pairs were checked to be m × ⌈n / 2⌉ by their maker.
    with_buffers(|buffers| unsafe {
        product_bf16_into(run, (m, n, k), a, b, (c, n), store, buffers)
    });
}

/// The sums (plus `bias`) of a product in a new buffer, not zeroed first.
fn product_bf16_fresh(
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let mut c = Unwritten::new(m * n);
    let store = Store::Sums(Sums {
        bias,
        accumulate: false,
    });
    product_bf16_writing((m, n, k), a, b, Some(&mut c), store);
    // SAFETY: product_bf16_writing wrote every value.
    unsafe { c.assume_written() }
}

/// [`product_bf16`] into a new buffer (sums plus `bias`, not zeroed first).
pub(crate) fn product_bf16_new(
    dims: (usize, usize, usize),
    a: Strided,
    b: Strided,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    product_bf16_fresh(dims, Left::Strided(a), Right::F32(b), bias)
}

/// [`product_bf16_pairs_right`] into a new buffer (sums plus `bias`).
pub(crate) fn product_bf16_pairs_new(
    dims: (usize, usize, usize),
    a: &[u32],
    b: Right,
    bias: &[f32],
) -> Vec<f32> {
    product_bf16_fresh(dims, Left::Pairs(a), b, Some(bias))
}

/// `z = bf16(a)[m, k] · bf16(b)[k, n] + bias` with fp32 sums, stored from
/// the register tiles as the activation's slopes `act'(z)` `[m, n]` and
/// `pairs` `[m, ⌈n / 2⌉]` (the words of an fp32 buffer): `act(z)` as bf16
/// pairs. All the activation's backward reads ([`product_bf16_act_grad`]),
/// and the next product's rounded input ([`product_bf16_pairs_right`]), without
/// a pass over either between the two products. The bits of computing
/// `act(z)`, rounding it, and `act'(z)` apart. And `act(z)` once more as
/// the panels of a right operand `[m, n]` (`panels_len(m, n) / 2` words
/// of an fp32 buffer, the bits `pack_panels` makes of the pairs): the
/// next product's weight gradient reads them unpacked
/// ([`product_bf16_transposed_pairs_packed`]). The three new buffers,
/// written whole (not zeroed first).
pub(crate) fn product_bf16_act(
    dims: (usize, usize, usize),
    a: LeftIn,
    b: Right,
    (bias, act): (&[f32], Act),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    product_bf16_act_on(features().bf16, dims, a, b, (bias, act))
}

/// [`product_bf16_act`] on AVX512-BF16 or the scalar loop (`simd`).
fn product_bf16_act_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: LeftIn,
    b: Right,
    (bias, act): (&[f32], Act),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    assert_eq!(bias.len(), n, "product_bf16_act: bias is not [{n}]");
    let mut c = Unwritten::new(m * n);
    let ldp = pair_stride(n);
    let mut pairs = padded_pairs(m, n);
    let mut panels = Unwritten::new(panels_len(m, n) / 2);
    let store = Store::Both {
        bias,
        act,
        pairs: SharedPairs(pairs.as_mut_ptr().cast()),
        ldp,
        panels: SharedPairs(panels.as_mut_ptr().cast()),
    };
    // The slopes are the product's fp32 output.
    product_bf16_writing_on(simd, (m, n, k), a.left(), b, Some(&mut c), store);
    // SAFETY: product_bf16_writing wrote every value of c, its tiles every
    // pair of each row (⌈n / 2⌉ words), padded_pairs the rest, and every
    // pair row of every panel (each tile its rows' pairs, all NR columns,
    // an odd last row's partner zeros).
    unsafe {
        (
            c.assume_written(),
            pairs.assume_written(),
            panels.assume_written(),
        )
    }
}

/// `c[m, n] (+)= bf16(a) · bf16(b)`, `a` `[m, k]` given as the
/// interleaved transpose [`product_bf16_act_grad`] stores (the words of
/// fp32 storage) and `b` as fp32 rows: a weight gradient `dzᵀ · x` whose
/// `dz` the product that made it stored so.
pub(crate) fn product_bf16_interleaved<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Strided,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums((m, n, k), Left::Interleaved(a), Right::F32(b), c, sums)
}

/// `c[m, n] += bf16(a)ᵀ · b`, `a` given as `k` rows of `⌈m / 2⌉` bf16
/// pairs and `b` `[k, n]` as its panels (`panels_len(k, n)` halves, as
/// [`product_bf16_act`] stores them): a weight gradient whose input was
/// stored as panels by the product that made it.
pub(crate) fn product_bf16_transposed_pairs_packed<'c>(
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: &[u16],
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    product_bf16_sums(
        (m, n, k),
        Left::TransposedPairs(a),
        Right::Packed(b),
        c,
        sums,
    )
}

/// `bf16(a)[m, k] · bf16(b)[k, n] + bias` as bf16 pairs only, `[m, ⌈n /
/// 2⌉]` in a new buffer (the words of an fp32 buffer) written whole by the
/// tiles: a product whose every use rounds it again (attention's Q, K and
/// V), so no fp32 copy is stored. The bits of rounding the fp32 sums.
pub(crate) fn product_bf16_to_pairs_new(
    (m, n, k): (usize, usize, usize),
    a: LeftIn,
    b: Right,
    bias: &[f32],
) -> Vec<f32> {
    assert_eq!(
        bias.len(),
        n,
        "product_bf16_to_pairs_new: bias is not [{n}]"
    );
    let mut pairs = Unwritten::new(m * n.div_ceil(2));
    let store = Store::Pairs {
        bias,
        pairs: SharedPairs(pairs.as_mut_ptr().cast()),
    };
    product_bf16_writing((m, n, k), a.left(), b, None, store);
    // SAFETY: the tiles wrote every pair of each row (⌈n / 2⌉ words).
    unsafe { pairs.assume_written() }
}

/// `dz = (a · b) ⊙ slopes`, `a · b` an activation's output gradient (`[m,
/// n]`, bf16 products, fp32 sums) and `slopes` its slopes `act'(z)` `[m,
/// n]` ([`product_bf16_act`]'s): the activation's input gradient as bf16
/// pairs `[m, ⌈n / 2⌉]` in a new buffer (the words of fp32 storage,
/// written whole by the tiles), its column sums added into `dbias`. The
/// output gradient is never stored, nor read back by a pass of its own.
/// The pairs are the bits of the stored product times the slopes,
/// rounded; the column sums are added tile by tile, task by
/// task (rows of [`super::ROWS_PER_TASK`]), then over the tasks in row
/// order: fixed by the shapes, not the threads. Beside the pairs, their
/// transpose as the weight gradient `dzᵀ · x` reads it, interleaved
/// ([`product_bf16_interleaved`]'s left operand), from the same tiles.
pub(crate) fn product_bf16_act_grad(
    dims: (usize, usize, usize),
    a: &[u32],
    b: Right,
    slopes: &[f32],
    dbias: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    act_grad_on(features().bf16, dims, a, b, slopes, dbias)
}

/// [`product_bf16_act_grad`] on AVX512-BF16 or the scalar loop (`simd`).
fn act_grad_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: &[u32],
    b: Right,
    slopes: &[f32],
    dbias: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    assert!(
        slopes.len() == m * n && dbias.len() == n,
        "product_bf16_act_grad: the slopes or the bias gradient are not [{m}, {n}], [{n}]"
    );
    let tasks = m.div_ceil(super::ROWS_PER_TASK);
    let mut sums = crate::fast::buffers::zeros(tasks * n);
    let mut pairs = padded_pairs(m, n);
    let mut blocks = transposed_blocks(n, m);
    let store = Store::ActGrad {
        slopes: SharedIn(slopes.as_ptr()),
        pairs: SharedPairs(pairs.as_mut_ptr().cast()),
        ldp: pair_stride(n),
        sums: SharedOut(sums.as_mut_ptr()),
        blocks: SharedPairs(blocks.as_mut_ptr().cast()),
    };
    product_bf16_writing_on(simd, (m, n, k), Left::Pairs(a), b, None, store);
    for block in sums.chunks_exact(n.max(1)) {
        dbias.iter_mut().zip(block).for_each(|(d, s)| *d += s);
    }
    crate::fast::buffers::recycle(sums);
    // SAFETY: the tiles wrote every pair of each row (⌈n / 2⌉ words),
    // padded_pairs the rest; and every word of the blocks' n rows (each
    // tile its columns of its pairs of rows, an odd last row's partner
    // zeros), transposed_blocks those past them.
    unsafe { (pairs.assume_written(), blocks.assume_written()) }
}

/// A new buffer for the transpose of a `[k, m]` matrix as the interleaved
/// blocks of a left operand `[m, k]` ([`Blocks`]): `⌈m / MR_BF16⌉` blocks
/// of `⌈k / 2⌉` steps of `MR_BF16` words, the words of the last block's
/// rows past `m` zeroed (no tile reads them; whoever writes the others
/// leaves them). On AMX `m` rows of [`transposed_stride`] words, their
/// padding zeroed.
fn transposed_blocks(m: usize, k: usize) -> Unwritten {
    let (k2, full) = (k.div_ceil(2), m / MR_BF16);
    let len = transposed_len(m, k2);
    let mut blocks = Unwritten::new(len);
    let stride = transposed_stride(k2);
    if transposed_width() == 1 && stride > k2 {
        // Rows of pairs: each row's padding words.
        let words: *mut u32 = blocks.as_mut_ptr().cast();
        for r in 0..m {
            // SAFETY: words k2..stride of row r < m lie inside the buffer.
            unsafe { std::slice::from_raw_parts_mut(words.add(r * stride + k2), stride - k2) }
                .fill(0);
        }
    } else if transposed_width() > 1 && !m.is_multiple_of(MR_BF16) {
        let words: *mut u32 = blocks.as_mut_ptr().cast();
        for i in 0..k2 {
            // SAFETY: the last block's step i lies inside the buffer.
            let step = unsafe {
                std::slice::from_raw_parts_mut(words.add((full * k2 + i) * MR_BF16), MR_BF16)
            };
            step[m % MR_BF16..].fill(0);
        }
    }
    blocks
}

/// A new buffer of `m` rows of `n` values as bf16 pairs, [`pair_stride`]
/// words apart, its padding words zeroed (the tiles write the others).
fn padded_pairs(m: usize, n: usize) -> Unwritten {
    let (dense, ldp) = (n.div_ceil(2), pair_stride(n));
    let mut pairs = Unwritten::new(m * ldp);
    if ldp > dense {
        let words: *mut u32 = pairs.as_mut_ptr().cast();
        for r in 0..m {
            // SAFETY: words dense..ldp of row r < m lie inside the m × ldp
            // buffer.
            unsafe { std::slice::from_raw_parts_mut(words.add(r * ldp + dense), ldp - dense) }
                .fill(0);
        }
    }
    pairs
}

/// A product of these operands into `c` (`[m, n]`, row-major) as `sums`
/// says, on every core, with this thread's buffers.
fn product_bf16_sums<'c>(
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    let store = Store::Sums(sums);
    match c.into() {
        Dst::Rows(c) => with_buffers(|buffers| {
            product_bf16_on(features().bf16, (m, n, k), a, b, c, store, buffers)
        }),
        Dst::New(c) => product_bf16_writing((m, n, k), a, b, Some(c), store),
    }
}

/// A forward product's left operand as its callers give it: fp32 rows
/// (rounded on the call) or rows of `⌈k / 2⌉` bf16 pairs rounded before
/// (a LayerNorm's output, stored beside its fp32 rows).
#[derive(Clone, Copy)]
pub(crate) enum LeftIn<'a> {
    F32(Strided<'a>),
    Pairs(&'a [u32]),
}

impl<'a> LeftIn<'a> {
    fn left(self) -> Left<'a> {
        match self {
            Self::F32(a) => Left::Strided(a),
            Self::Pairs(p) => Left::Pairs(p),
        }
    }
}

/// A product's left operand.
#[derive(Clone, Copy)]
enum Left<'a> {
    /// fp32 read through strides, rounded on the call.
    Strided(Strided<'a>),
    /// Rows of `⌈k / 2⌉` bf16 pairs, rounded before.
    Pairs(&'a [u32]),
    /// The transpose of `k` rows of `⌈m / 2⌉` bf16 pairs.
    TransposedPairs(&'a [u32]),
    /// A transpose interleaved already, as [`interleave_rows`] lays it out
    /// (`⌈m / MR_BF16⌉ · MR_BF16 · ⌈k / 2⌉` words).
    Interleaved(&'a [u32]),
}

/// A product's right operand `[k, n]`.
#[derive(Clone, Copy)]
pub(crate) enum Right<'a> {
    /// fp32 read through strides, rounded as it is packed.
    F32(Strided<'a>),
    /// Rows of `⌈n / 2⌉` bf16 pairs, rounded before.
    Pairs(&'a [u32]),
    /// Packed already ([`PackedBf16`]'s panels: a weight's
    /// [`WeightPanels`]).
    Packed(&'a [u16]),
}

/// A weight `w` `[n, k]` (`nn.Linear`'s `[out, in]`) packed for both
/// products of a training step that read it: the forward `x · wᵀ` (the
/// panels of `wᵀ` `[k, n]`) and the input gradient `dy · w` (the panels of
/// `w` `[n, k]`), the bits [`pack_panels`] makes of each. Written block of
/// rows by block ([`PanelWriter::pack_rows`]) by the optimizer as it
/// updates the rows, while they are in cache: packed in the step instead,
/// every weight was read from memory twice more per step.
#[derive(Debug)]
pub(crate) struct WeightPanels {
    forward: Vec<u16>,
    backward: Vec<u16>,
    n: usize,
    k: usize,
}

impl WeightPanels {
    pub fn new(n: usize, k: usize) -> Self {
        Self {
            forward: vec![0; panels_len(k, n)],
            backward: vec![0; panels_len(n, k)],
            n,
            k,
        }
    }

    /// The weight's shape `[n, k]`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The forward product's right operand `wᵀ` `[k, n]`.
    pub fn forward(&self) -> Right<'_> {
        Right::Packed(&self.forward)
    }

    /// The input gradient's right operand `w` `[n, k]`.
    pub fn backward(&self) -> Right<'_> {
        Right::Packed(&self.backward)
    }

    /// A writer of blocks of rows, which threads share.
    pub fn writer(&mut self) -> PanelWriter<'_> {
        PanelWriter {
            forward: self.forward.as_mut_ptr(),
            backward: self.backward.as_mut_ptr(),
            n: self.n,
            k: self.k,
            _panels: std::marker::PhantomData,
        }
    }
}

/// Packs blocks of a weight's rows into its [`WeightPanels`], from any
/// thread: each block writes its own forward panels and its own pair rows
/// of every backward panel.
pub(crate) struct PanelWriter<'a> {
    forward: *mut u16,
    backward: *mut u16,
    n: usize,
    k: usize,
    _panels: std::marker::PhantomData<&'a mut WeightPanels>,
}

// SAFETY: blocks of rows starting at multiples of NR write disjoint values
// (pack_rows), and the writer borrows the panels mutably.
unsafe impl Send for PanelWriter<'_> {}
unsafe impl Sync for PanelWriter<'_> {}

impl PanelWriter<'_> {
    /// Packs rows `r0..r0 + rows.len() / k` of the weight, whose values
    /// `rows` holds. `r0` must be a multiple of [`NR`] (a block starts a
    /// forward panel and a pair row); blocks packed at once must not
    /// overlap.
    pub fn pack_rows(&self, r0: usize, rows: &[f32]) {
        let (n, k) = (self.n, self.k);
        let count = rows.len() / k.max(1);
        assert!(
            r0.is_multiple_of(NR) && rows.len() == count * k && r0 + count <= n,
            "pack_rows: rows {r0}..+{count} of a [{n}, {k}] weight from {} values",
            rows.len()
        );
        if count == 0 || k == 0 {
            return;
        }
        // Forward: the panels of these rows' columns of wᵀ.
        let (k2, wt) = (k.div_ceil(2), Strided::transposed(rows, k));
        for p in r0 / NR..(r0 + count).div_ceil(NR) {
            let (c0, cols) = (p * NR - r0, NR.min(r0 + count - p * NR));
            // SAFETY: panel p lies in the forward panels (p < ⌈n / NR⌉),
            // written by this block only (its rows are the panel's).
            let panel = unsafe {
                std::slice::from_raw_parts_mut(self.forward.add(p * k2 * NR * 2), k2 * NR * 2)
            };
            if cols < NR {
                panel.fill(0);
            }
            pack_panel(&wt, k, c0, cols, panel);
        }
        // Backward: these rows' pair rows of every panel of w.
        let (n2, pairs, w) = (n.div_ceil(2), count.div_ceil(2), Strided::rows(rows, k));
        for q in 0..k.div_ceil(NR) {
            let (c0, cols) = (q * NR, NR.min(k - q * NR));
            // SAFETY: pair rows r0 / 2.. of panel q (r0 even), as many as
            // the block's rows make, lie inside the backward panels and
            // belong to this block only.
            let panel = unsafe {
                let at = (q * n2 + r0 / 2) * NR * 2;
                std::slice::from_raw_parts_mut(self.backward.add(at), pairs * NR * 2)
            };
            if cols < NR {
                panel.fill(0);
            }
            pack_panel(&w, count, c0, cols, panel);
        }
    }
}

/// What a product's tiles store.
#[derive(Clone, Copy)]
enum Store<'a> {
    /// The sums, as [`Sums`] says.
    Sums(Sums<'a>),
    /// `act'(sums + bias)` as the fp32 output and `act(sums + bias)` as
    /// bf16 pairs ([`TileOut::Both`]), `⌈n / 2⌉` per row, and as the
    /// panels of a right operand `[m, n]` (`panels_len(m, n) / 2` words).
    Both {
        bias: &'a [f32],
        act: Act,
        pairs: SharedPairs,
        ldp: usize,
        panels: SharedPairs,
    },
    /// Only `sums + bias` as bf16 pairs ([`TileOut::Pairs`]), `⌈n / 2⌉`
    /// per row: a product whose every use is another product's operand.
    Pairs { bias: &'a [f32], pairs: SharedPairs },
    /// The sums are an activation's output gradient ([`TileOut::ActGrad`]):
    /// its input gradient as pairs, `⌈n / 2⌉` per row, from the
    /// activation's `slopes` (`[m, n]`); the column sums of each task's
    /// rows into row `rows.start / ROWS_PER_TASK` of `sums` (`[⌈m /
    /// ROWS_PER_TASK⌉, n]`, zeroed by the caller).
    ActGrad {
        slopes: SharedIn,
        pairs: SharedPairs,
        ldp: usize,
        sums: SharedOut,
        /// The input gradient transposed, as [`Blocks`] (`⌈n / MR_BF16⌉`
        /// blocks of `MR_BF16 · ⌈m / 2⌉` words).
        blocks: SharedPairs,
    },
}

/// A read-only input tasks share.
#[derive(Clone, Copy)]
struct SharedIn(*const f32);
// SAFETY: tasks only read through it, while the caller's borrow lasts.
unsafe impl Send for SharedIn {}
unsafe impl Sync for SharedIn {}

impl SharedIn {
    fn at(self, offset: usize) -> *const f32 {
        self.0.wrapping_add(offset)
    }
}

/// `f` with this thread's product buffers; a product started while they
/// are in use (a rayon task stolen while waiting inside one) gets its own.
fn with_buffers(f: impl FnOnce(&mut ProductBuffers)) {
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffers) => f(&mut buffers),
        Err(_) => f(&mut ProductBuffers::default()),
    })
}

/// [`product_bf16`] on the calling thread into `c` with rows `ldc` apart,
/// times `scale` (which needs `accumulate` off): for the small products a
/// parallel task makes (attention's, one sequence and head each).
///
/// # Safety
/// `c` must address `m` rows of `n` values, `ldc` apart, that nothing
/// else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_bf16_serial(
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Strided,
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    scale: f32,
) {
    assert!(
        scale == 1.0 || !accumulate,
        "product_bf16_serial: a scaled product cannot accumulate"
    );
    let sums = Sums {
        bias: None,
        accumulate,
    };
    let run = Run {
        simd: features().bf16,
        parallel: false,
    };
    let (a, store) = (Left::Strided(a), Store::Sums(sums));
    // SAFETY: the caller's contract.
    with_buffers(|buffers| unsafe {
        product_bf16_into(run, (m, n, k), a, Right::F32(b), (c, ldc), store, buffers)
    });
    if scale != 1.0 {
        for r in 0..m {
            // SAFETY: row r of the caller's m × n destination.
            let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), n) };
            row.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// How a product runs: on AVX512-BF16 or the scalar loop (`simd`), on
/// every core or the calling thread (`parallel`).
#[derive(Clone, Copy)]
struct Run {
    simd: bool,
    parallel: bool,
}

fn product_bf16_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    c: &mut [f32],
    store: Store,
    buffers: &mut ProductBuffers,
) {
    assert_eq!(c.len(), m * n, "product_bf16: output is not [{m}, {n}]");
    let run = Run {
        simd,
        parallel: true,
    };
    // SAFETY: c is m × n, rows n apart (asserted), and borrowed mutably;
    // a Store::Both's pairs were checked to be m × ⌈n / 2⌉ by its maker.
    unsafe { product_bf16_into(run, (m, n, k), a, b, (c.as_mut_ptr(), n), store, buffers) }
}

/// [`product_bf16_on`] into `m` rows of `n` values `ldc` apart at `c`.
///
/// # Safety
/// As [`product_bf16_serial`].
unsafe fn product_bf16_into(
    Run { simd, parallel }: Run,
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    (c, ldc): (*mut f32, usize),
    store: Store,
    buffers: &mut ProductBuffers,
) {
    match b {
        Right::F32(b) => b.check(k, n, "product_bf16 right operand"),
        Right::Packed(p) => assert_eq!(
            p.len(),
            panels_len(k, n),
            "product_bf16: the packed right operand is not [{k}, {n}]"
        ),
        Right::Pairs(_) => {}
    }
    let (bias, act) = match store {
        Store::Sums(sums) => (sums.bias, None),
        Store::Both { bias, act, .. } => (Some(bias), Some(act)),
        Store::Pairs { bias, .. } => (Some(bias), None),
        Store::ActGrad { .. } => (None, None),
    };
    if let Some(bias) = bias {
        assert_eq!(bias.len(), n, "product_bf16: bias is not [{n}]");
    }
    let k2 = k.div_ceil(2);
    // The left operand's words per row: rows of pairs as their maker laid
    // them out (padded or not), k2 as rounded here.
    let a_stride = match a {
        Left::Pairs(p) => stride_of(p.len(), m, k, "the left operand's pairs"),
        Left::TransposedPairs(p) => stride_of(p.len(), k, m, "the left operand's pairs"),
        Left::Interleaved(p) => {
            let len = transposed_len(m, k2);
            assert_eq!(p.len(), len, "product_bf16: the interleaved left operand");
            k2
        }
        Left::Strided(_) => k2,
    };
    if let Right::Pairs(p) = b {
        stride_of(p.len(), k, n, "the right operand's pairs");
    }
    if m == 0 || n == 0 {
        return;
    }
    let ProductBuffers { pairs, panels } = buffers;
    // A transposed left operand (a weight gradient's dYᵀ) is read as its
    // rows interleaved two by two, every step's pairs side by side: no
    // transpose. Others as rows of pairs.
    let interleaved = match a {
        Left::Strided(a) => a.cs != 1 && a.rs == 1,
        Left::Pairs(_) => false,
        Left::TransposedPairs(_) | Left::Interleaved(_) => true,
    };
    let pairs: &[u32] = match a {
        Left::Pairs(p) | Left::Interleaved(p) => p,
        Left::TransposedPairs(p) => {
            let src = Source::Pairs {
                data: p,
                row: a_stride,
            };
            interleave_rows(src, k, m, pairs, parallel);
            &pairs[..transposed_len(m, k2)]
        }
        Left::Strided(a) => {
            a.check(m, k, "product_bf16 left operand");
            if a.cs == 1 {
                round_rows_strided(simd, parallel, (a.data, a.rs), m, k, k2, pairs);
            } else if interleaved {
                let src = Source::F32 {
                    data: a.data,
                    cs: a.cs,
                };
                interleave_rows(src, k, m, pairs, parallel);
            } else {
                round_strided(a, m, k, k2, pairs);
            }
            match interleaved {
                true => &pairs[..transposed_len(m, k2)],
                false => &pairs[..m * k2],
            }
        }
    };
    let panels: &[u16] = match b {
        Right::Packed(p) => p,
        _ => {
            pack_panels_reusing(b, k, n, panels, parallel);
            panels
        }
    };
    let left = |r0: usize| match interleaved {
        // Tiles start at multiples of MR_BF16 (tasks at multiples of
        // ROWS_PER_TASK, a const assertion above), so r0 starts a block.
        true => transposed_left(pairs, r0, k2),
        false => PairsIn::rows(&pairs[r0 * a_stride..], a_stride),
    };
    let zeros = [0f32; NR];
    let (out, n2, width) = (SharedOut(c), n.div_ceil(2), transposed_width());
    let task = |p: usize, rows: std::ops::Range<usize>| {
        let panel = &panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
        let cs = p * NR..(p * NR + NR).min(n);
        let bias = bias.map_or(&zeros[..cs.len()], |b| &b[cs]);
        let block = rows.start / super::ROWS_PER_TASK;
        let dest = |r0: usize| {
            let c = out.at(r0 * ldc + p * NR);
            match store {
                Store::Sums(sums) => TileOut::F32 {
                    c,
                    ldc,
                    accumulate: sums.accumulate,
                },
                Store::Both {
                    pairs: to,
                    ldp,
                    act,
                    panels,
                    ..
                } => TileOut::Both {
                    slopes: c,
                    lds: ldc,
                    pairs: to.at(r0 * ldp + p * NR / 2),
                    ldp,
                    act,
                    // Panel p's pair rows, m.div_ceil(2) of NR words; r0 is
                    // even (a multiple of MR_BF16).
                    panel: Some(panels.at((p * m.div_ceil(2) + r0 / 2) * NR)),
                },
                Store::Pairs { pairs: to, .. } => TileOut::Pairs {
                    c: to.at(r0 * n2 + p * NR / 2),
                    ldc: n2,
                },
                Store::ActGrad {
                    slopes,
                    pairs: to,
                    ldp,
                    sums,
                    blocks,
                } => TileOut::ActGrad {
                    slopes: slopes.at(r0 * n + p * NR),
                    lds: n,
                    pairs: to.at(r0 * ldp + p * NR / 2),
                    ldp,
                    sums: sums.at(block * n + p * NR),
                    // r0 is even (a multiple of MR_BF16).
                    blocks: Blocks {
                        at: blocks.at(r0 / 2 * width),
                        stride: match width {
                            1 => transposed_stride(m.div_ceil(2)),
                            width => width * m.div_ceil(2),
                        },
                        c0: p * NR,
                        width,
                    },
                },
            }
        };
        // SAFETY: the task's rows, columns of panel p lie inside c (the
        // caller's m × n) and the pairs (m rows, n2 or the store's ldp
        // apart) and belong to this task only; the tiles read pairs of
        // their rows inside `pairs` (m rows of k2, a_stride apart).
        unsafe { tiles(simd, rows, left, k2, panel, bias, act, dest) };
    };
    if parallel {
        for_each_task(m, n, std::mem::size_of_val(pairs), task);
    } else {
        (0..n.div_ceil(NR)).for_each(|p| task(p, 0..m));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Pair rows packed a pair row at a time (AVX-512) are the words the
    /// scalar loop moves, for odd row counts (an odd last row pairs with
    /// zeros), odd and partial column counts and offsets; columns past
    /// `cols` keep what the panel held.
    #[test]
    fn pair_panels_equal_the_scalar_loop() {
        let (rows, row) = (13, 40);
        let words: Vec<u32> = (0..rows * row as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let cases: [(usize, usize, usize); 5] = [
            (13, 0, 32),
            (12, 2, 31),
            (1, 8, 5),
            (7, 48, 32),
            (13, 60, 20),
        ];
        for (k, c0, cols) in cases {
            // Whole words, so both take the word-aligned paths.
            let mut fast = vec![0xbeef_beefu32; k.div_ceil(2) * NR];
            let mut slow = fast.clone();
            // SAFETY: any u32 is two valid u16.
            let halves = |w: &mut Vec<u32>| unsafe { w.align_to_mut::<u16>().1.to_vec() };
            let (mut f, mut s) = (halves(&mut fast), halves(&mut slow));
            pack_panel_pairs(&words, row, k, c0, cols, &mut f);
            pack_panel_pairs_body(&words, row, k, c0, cols, &mut s);
            assert_eq!(f, s, "k {k}, columns {c0}..+{cols}");
        }
    }

    /// The transpose as rows of pairs (AMX's layout of a transposed left
    /// operand) equals its scalar twin's words, from fp32 and bf16 sources,
    /// with rows and steps past whole 16 × 16 blocks and an odd `k`.
    #[test]
    fn transposed_rows_equal_the_scalar_transpose() {
        let val = |i: usize| ((i as f32) * 0.618).sin() * 3.0;
        // k 1,024: rows of 512 words, padded on AMX (transposed_stride).
        for (k, m) in [(67, 53), (64, 32), (5, 16), (33, 17), (1024, 20)] {
            let cs = m + 3;
            let data: Vec<f32> = (0..k * cs).map(val).collect();
            let pairs: Vec<u32> = (0..k * cs.div_ceil(2))
                .map(|i| round_bits(val(2 * i)) | round_bits(val(2 * i + 1)) << 16)
                .collect();
            let sources = [
                Source::F32 { data: &data, cs },
                Source::Pairs {
                    data: &pairs,
                    row: cs.div_ceil(2),
                },
            ];
            for src in sources {
                let k2 = k.div_ceil(2);
                let stride = transposed_stride(k2);
                let mut fast = vec![u32::MAX; m * stride];
                transpose_rows(src, k, m, &mut fast, true);
                let mut slow = vec![u32::MAX; m * stride];
                for (t, rows) in slow.chunks_mut(TRANSPOSE_ROWS * stride).enumerate() {
                    transpose_rows_body(src, k, t * TRANSPOSE_ROWS, 0, rows);
                }
                assert_eq!(fast, slow, "[{k}, {m}] transposed");
                // Word (r, i) pairs source rows 2i and 2i + 1 of column r
                // (0 past k): the last row's last word.
                let value = |row: usize, c: usize| match src {
                    Source::F32 { data, cs } => round_bits(data[row * cs + c]),
                    Source::Pairs { data, row: w } => {
                        data[row * w + c / 2] >> (16 * (c % 2)) & 0xffff
                    }
                };
                let (r, i) = (m - 1, k2 - 1);
                let hi = if 2 * i + 1 < k {
                    value(2 * i + 1, r)
                } else {
                    0
                };
                assert_eq!(fast[r * stride + i], value(2 * i, r) | hi << 16);
                // The padding is written, with zeros.
                assert!(fast
                    .chunks(stride)
                    .all(|row| row[k2..].iter().all(|&w| w == 0)));
            }
        }
    }

    /// AMX tiles sum the same products as the AVX-512 register tiles (in
    /// another order: equal up to fp32 rounding), for every tile height,
    /// steps past whole 16-pair tile steps, partial panels and padded
    /// left rows. Where the CPU has no AMX there is nothing to compare.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn amx_tiles_equal_the_register_tiles() {
        if !features().amx {
            eprintln!("no AMX here: the register tiles alone are tested");
            return;
        }
        let val = |i: usize| ((i as f32) * 0.377).cos();
        for k2 in [1, 15, 16, 17, 40] {
            let lda = k2 + 3;
            let a: Vec<u32> = (0..12 * lda)
                .map(|i| round_bits(val(2 * i)) | round_bits(val(2 * i + 1)) << 16)
                .collect();
            let panel: Vec<u16> = (0..k2 * NR * 2).map(|i| to_bf16(val(i + 7))).collect();
            let bias: Vec<f32> = (0..NR).map(|j| val(j + 3)).collect();
            macro_rules! compare {
                ($($r:literal)*) => {$(
                    for cols in [NR, 20] {
                        let [mut amx, mut reg] = [[0f32; 12 * NR]; 2];
                        for (c, amx_kernel) in [(&mut amx, true), (&mut reg, false)] {
                            let out = TileOut::F32 { c: c.as_mut_ptr(), ldc: NR, accumulate: false };
                            let a = PairsIn::rows(&a, lda);
                            // SAFETY: AMX and AVX512-BF16 (checked); a holds
                            // 12 rows of k2 pairs lda apart, the panel k2
                            // pair rows, c a 12 × NR tile.
                            unsafe {
                                match amx_kernel {
                                    true => super::super::avx512::tile_amx::<$r>(a, k2, &panel, &bias[..cols], None, out),
                                    false => super::super::avx512::tile_bf16::<$r>(a, k2, &panel, &bias[..cols], None, out),
                                }
                            }
                        }
                        for (i, (x, y)) in amx.iter().zip(&reg).enumerate() {
                            let (r, j) = (i / NR, i % NR);
                            let tol = 1e-6 * (2 * k2) as f32;
                            match r < $r && j < cols {
                                true => assert!((x - y).abs() <= tol, "{}-row tile, k2 {k2}, ({r}, {j}): {x} vs {y}", $r),
                                false => assert_eq!((*x, *y), (0.0, 0.0), "written outside the tile"),
                            }
                        }
                    }
                )*};
            }
            compare!(1 2 3 4 5 6 7 8 9 10 11 12);
            // 16-row AMX tiles, and two at once (16 + R rows, each stored
            // as its own): against register tiles of 12 and 4 rows, and
            // two single AMX tiles (the same sums, bit for bit).
            let a32: Vec<u32> = (0..32 * lda)
                .map(|i| round_bits(val(3 * i)) | round_bits(val(3 * i + 1)) << 16)
                .collect();
            let rows = |r0: usize| PairsIn::rows(&a32[r0 * lda..], lda);
            let out = |c: &mut [f32; 32 * NR], r0: usize| TileOut::F32 {
                c: c[r0 * NR..].as_mut_ptr(),
                ldc: NR,
                accumulate: false,
            };
            let tol = 1e-6 * (2 * k2) as f32;
            let [mut amx, mut reg] = [[0f32; 32 * NR]; 2];
            // SAFETY: AMX and AVX512-BF16 (checked); a32 holds 32 rows of
            // k2 pairs lda apart, the panel k2 pair rows, each output the
            // tiles' rows of NR.
            unsafe {
                super::super::avx512::tile_amx::<16>(
                    rows(0),
                    k2,
                    &panel,
                    &bias,
                    None,
                    out(&mut amx, 0),
                );
                super::super::avx512::tile_bf16::<12>(
                    rows(0),
                    k2,
                    &panel,
                    &bias,
                    None,
                    out(&mut reg, 0),
                );
                super::super::avx512::tile_bf16::<4>(
                    rows(12),
                    k2,
                    &panel,
                    &bias,
                    None,
                    out(&mut reg, 12),
                );
            }
            for (i, (x, y)) in amx.iter().zip(&reg).enumerate() {
                assert!(
                    (x - y).abs() <= tol,
                    "16-row tile, k2 {k2}, {i}: {x} vs {y}"
                );
            }
            macro_rules! compare2 {
                ($($r:literal)*) => {$(
                    let [mut two, mut one] = [[0f32; 32 * NR]; 2];
                    // SAFETY: as above.
                    unsafe {
                        let outs = (out(&mut two, 0), out(&mut two, 16));
                        super::super::avx512::tile_amx2::<$r>(rows(0), k2, &panel, &bias, None, outs);
                        super::super::avx512::tile_amx::<16>(rows(0), k2, &panel, &bias, None, out(&mut one, 0));
                        super::super::avx512::tile_amx::<$r>(rows(16), k2, &panel, &bias, None, out(&mut one, 16));
                    }
                    assert_eq!(bits(&two), bits(&one), "16 + {} rows, k2 {k2}", $r);
                    assert!(two[(16 + $r) * NR..].iter().all(|&x| x == 0.0), "written outside the tiles");
                )*};
            }
            compare2!(1 5 15 16);
        }
    }

    /// The bf16 multiply equals an f64 sum of the bf16-rounded operands
    /// (up to fp32 accumulation) for shapes with partial panels, odd `k`,
    /// short tiles and more than one task.
    #[test]
    fn bf16_products_equal_the_rounded_operands_sum() {
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        for (m, k, n) in [(1, 1, 1), (5, 7, 33), (13, 64, 32), (200, 385, 70)] {
            let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let bias: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let packed = PackedBf16::new(&w, k, n);
            let mut y = vec![0f32; m * n];
            packed.matmul(&x, &bias, &mut y, m, &mut Vec::new(), None);
            // The scalar loop (CPUs without AVX512-BF16) gives the same.
            let mut scalar = vec![0f32; m * n];
            packed.matmul_on(false, &x, &bias, &mut scalar, m, &mut Vec::new(), None);
            let r = |v: f32| f64::from(from_bf16(to_bf16(v)));
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|t| r(x[i * k + t]) * r(w[t * n + j]))
                        .sum::<f64>()
                        + f64::from(bias[j]);
                    let got = f64::from(y[i * n + j]);
                    let other = f64::from(scalar[i * n + j]);
                    assert!(
                        (other - want).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * want.abs(),
                        "scalar ({i}, {j}): {other} vs {want}"
                    );
                    assert!(
                        (got - want).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * want.abs(),
                        "[{m}, {k}] x [{k}, {n}] at ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Strided operands (transposed either side) multiply as their
    /// row-major copies, on the SIMD and the scalar tiles; the output is
    /// overwritten, or with a bias and `accumulate` added to. One set of
    /// buffers serves every product, larger ones first, so stale values
    /// (a wider partial panel's columns among them) must not leak in.
    #[test]
    fn strided_products_equal_the_rounded_operands_sum() {
        let val = |i: usize| ((i as f32) * 0.618).sin();
        let mut buffers = ProductBuffers {
            pairs: Vec::new(),
            panels: Vec::new(),
        };
        // Odd and even k: a transposed right operand with even k is packed
        // 16 × 16 blocks at a time (full and partial ones here). A
        // transposed left operand is interleaved in blocks of a tile's rows
        // (m not a multiple of MR_BF16 here, and one block per task below).
        for (m, n, k) in [
            (130, 70, 129),
            (1, 1, 1),
            (7, 33, 5),
            (24, 45, 70),
            (3, 2, 2),
            (40, 70, 129),
            (130, 20, 37),
            // On AMX, transposed rows of 512 words are padded
            // (transposed_stride).
            (40, 20, 1024),
        ] {
            // a as its transpose's storage [k, m], b row-major [k, n].
            let at: Vec<f32> = (0..k * m).map(val).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i + 999)).collect();
            // b's transpose's storage [n, k]; a row-major copy of a.
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let a: Vec<f32> = (0..m * k).map(|i| at[(i % k) * m + i / k]).collect();
            let bias: Vec<f32> = (0..n).map(|j| val(j + 5000)).collect();
            let start: Vec<f32> = (0..m * n).map(|i| val(i + 7000)).collect();
            let layouts = [
                (Strided::transposed(&at, m), Strided::rows(&b, n)),
                (Strided::rows(&a, k), Strided::transposed(&bt, k)),
            ];
            let outputs = [
                Sums::default(),
                Sums {
                    bias: Some(&bias),
                    accumulate: true,
                },
            ];
            for (simd, fresh) in [features().bf16, false]
                .into_iter()
                .flat_map(|simd| [(simd, false), (simd, true)])
            {
                for ((sa, sb), sums) in layouts.iter().flat_map(|l| outputs.map(|o| (*l, o))) {
                    let mut c = start.clone();
                    // Buffers kept from larger products, or new ones sized
                    // for this product alone.
                    let mut new = ProductBuffers {
                        pairs: Vec::new(),
                        panels: Vec::new(),
                    };
                    let buffers = if fresh { &mut new } else { &mut buffers };
                    product_bf16_on(
                        simd,
                        (m, n, k),
                        Left::Strided(sa),
                        Right::F32(sb),
                        &mut c,
                        Store::Sums(sums),
                        buffers,
                    );
                    let r = |v: f32| f64::from(from_bf16(to_bf16(v)));
                    for i in 0..m {
                        for j in 0..n {
                            let mut want: f64 =
                                (0..k).map(|t| r(at[t * m + i]) * r(b[t * n + j])).sum();
                            if sums.accumulate {
                                want += f64::from(bias[j]) + f64::from(start[i * n + j]);
                            }
                            let got = f64::from(c[i * n + j]);
                            assert!(
                                (got - want).abs() <= 1e-5 * (k as f64).sqrt(),
                                "simd {simd} [{m}, {k}] x [{k}, {n}] ({}) at ({i}, {j}): {got} vs {want}",
                                sums.accumulate
                            );
                        }
                    }
                }
            }
        }
    }

    /// A left operand whose rows lie further apart than their length is
    /// read in place, and the serial product (a parallel task's, into rows
    /// `ldc` apart, scaled) gives the parallel product's bits, leaving the
    /// columns between its rows alone; with `accumulate` it adds. The
    /// first case's left operand is larger than L2, so its parallel tasks
    /// go block of rows by block.
    #[test]
    fn serial_and_strided_products_equal_the_parallel_contiguous_ones() {
        let val = |i: usize| ((i as f32) * 0.731).cos();
        const _: () = assert!(1030 * 520 / 2 * 4 > super::super::LEFT_IN_L2);
        for (m, n, k) in [
            (1030, 70, 520),
            (130, 70, 129),
            (7, 33, 5),
            (24, 45, 64),
            (1, 1, 1),
        ] {
            let wide = k + 3;
            let a_wide: Vec<f32> = (0..m * wide).map(val).collect();
            let a: Vec<f32> = (0..m * k).map(|i| a_wide[(i / k) * wide + i % k]).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i + 333)).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let mut want = vec![0f32; m * n];
            product_bf16(
                (m, n, k),
                Strided::rows(&a, k),
                Strided::rows(&b, n),
                &mut want,
                Sums::default(),
            );
            let strided = Strided {
                data: &a_wide,
                rs: wide,
                cs: 1,
            };
            let mut got = vec![0f32; m * n];
            product_bf16(
                (m, n, k),
                strided,
                Strided::transposed(&bt, k),
                &mut got,
                Sums::default(),
            );
            assert_eq!(got, want, "[{m}, {k}] x [{k}, {n}] with rows {wide} apart");
            let ldc = n + 5;
            let start: Vec<f32> = (0..m * ldc).map(|i| val(i + 9000)).collect();
            let [c, added] = [(false, 0.5), (true, 1.0)].map(|(accumulate, scale)| {
                let mut c = start.clone();
                let dst = (c.as_mut_ptr(), ldc);
                // SAFETY: c holds m rows of ldc ≥ n values.
                unsafe {
                    product_bf16_serial(
                        (m, n, k),
                        strided,
                        Strided::rows(&b, n),
                        dst,
                        accumulate,
                        scale,
                    )
                };
                c
            });
            for i in 0..m {
                for j in 0..ldc {
                    let at = i * ldc + j;
                    if j < n {
                        assert_eq!(c[at], 0.5 * want[i * n + j], "serial ({i}, {j})");
                        assert_eq!(
                            added[at],
                            start[at] + want[i * n + j],
                            "accumulated ({i}, {j})"
                        );
                    } else {
                        assert_eq!(
                            (c[at], added[at]),
                            (start[at], start[at]),
                            "outside ({i}, {j})"
                        );
                    }
                }
            }
        }
    }

    /// A weight gradient whose `dy` comes as bf16 pairs (rounded where it
    /// was made) has the bits of the one that rounds the fp32 `dy` itself:
    /// the interleave from pairs (AVX-512 over 48 columns, the scalar loop
    /// for the rest) equals the one from fp32, with odd widths and an odd
    /// number of rows.
    #[test]
    fn products_of_transposed_pairs_equal_those_of_the_fp32_transpose() {
        let val = |i: usize| ((i as f32) * 0.613).sin();
        for (n, rows, k) in [(101, 37, 50), (61, 8, 33), (3, 1, 5)] {
            let dy: Vec<f32> = (0..rows * n).map(val).collect();
            let x: Vec<f32> = (0..rows * k).map(|i| val(i + 77)).collect();
            let n2 = n.div_ceil(2);
            let mut pairs = vec![0u32; rows * n2];
            for (row, out) in dy.chunks_exact(n).zip(pairs.chunks_exact_mut(n2)) {
                round_row(row, out);
            }
            let start: Vec<f32> = (0..n * k).map(|i| val(i + 5000)).collect();
            let sums = Sums {
                bias: None,
                accumulate: true,
            };
            let mut want = start.clone();
            let a = Strided::transposed(&dy, n);
            product_bf16((n, k, rows), a, Strided::rows(&x, k), &mut want, sums);
            let mut got = start.clone();
            let b = Strided::rows(&x, k);
            product_bf16_transposed_pairs((n, k, rows), &pairs, b, &mut got, sums);
            assert_eq!(got, want, "dyᵀ [{n}, {rows}] · x [{rows}, {k}]");
            assert_ne!(got, start);
        }
    }

    /// A weight gradient whose output gradient and input both come as bf16
    /// pairs (as the passes that made them stored them) has the bits of
    /// the one that rounds and packs the fp32 operands itself: full and
    /// partial panels, odd widths and an odd number of rows.
    #[test]
    fn products_of_both_pairs_equal_those_of_the_fp32_operands() {
        let val = |i: usize| ((i as f32) * 0.419).cos();
        for (n, rows, k) in [(19, 45, 75), (12, 8, 64), (1, 1, 1)] {
            let dy: Vec<f32> = (0..rows * n).map(val).collect();
            let x: Vec<f32> = (0..rows * k).map(|i| val(i + 91)).collect();
            let k2 = k.div_ceil(2);
            let mut pairs = vec![0u32; rows * k2];
            for (row, out) in x.chunks_exact(k).zip(pairs.chunks_exact_mut(k2)) {
                round_row(row, out);
            }
            let start: Vec<f32> = (0..n * k).map(|i| val(i + 3000)).collect();
            let sums = Sums {
                bias: None,
                accumulate: true,
            };
            let a = Strided::transposed(&dy, n);
            let mut want = start.clone();
            product_bf16((n, k, rows), a, Strided::rows(&x, k), &mut want, sums);
            let n2 = n.div_ceil(2);
            let mut dy_pairs = vec![0u32; rows * n2];
            for (row, out) in dy.chunks_exact(n).zip(dy_pairs.chunks_exact_mut(n2)) {
                round_row(row, out);
            }
            let mut got = start.clone();
            product_bf16_both_pairs((n, k, rows), &dy_pairs, &pairs, &mut got, sums);
            assert_eq!(got, want, "dyᵀ [{n}, {rows}] · x [{rows}, {k}]");
            assert_ne!(got, start);
        }
    }

    /// Products into new, unzeroed buffers (NaN-filled in these debug
    /// builds, so a value left unwritten shows) equal the products into
    /// zeroed ones, bit for bit: odd widths, partial panels and tiles, and
    /// the pairs of the activation beside the sums.
    #[test]
    fn products_into_new_buffers_write_every_value() {
        use crate::fast::kernels::Act;
        let val = |i: usize| ((i as f32) * 0.523).sin();
        for (m, n, k) in [(1, 1, 1), (13, 70, 33), (30, 33, 64)] {
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let w: Vec<f32> = (0..n * k).map(|i| val(i + 500)).collect();
            let bias: Vec<f32> = (0..n).map(|i| val(i + 77)).collect();
            let (a, b) = (Strided::rows(&x, k), Strided::transposed(&w, k));
            let sums = Sums {
                bias: Some(&bias),
                accumulate: false,
            };
            let mut want = vec![0f32; m * n];
            product_bf16((m, n, k), a, b, &mut want, sums);
            let got = product_bf16_new((m, n, k), a, b, Some(&bias));
            assert_eq!(as_words(&got), as_words(&want), "[{m}, {n}, {k}]");
            let (slopes, pairs, panels) = product_bf16_act(
                (m, n, k),
                LeftIn::F32(a),
                Right::F32(b),
                (&bias, Act::GeluErf),
            );
            assert_eq!(panels.len() * 2, panels_len(m, n), "[{m}, {n}, {k}] panels");
            let mut raw = vec![0f32; m * n];
            product_bf16((m, n, k), a, b, &mut raw, Sums::default());
            let n2 = n.div_ceil(2);
            let mut act: Vec<f32> = raw
                .iter()
                .zip(bias.iter().cycle())
                .map(|(v, b)| v + b)
                .collect();
            let want_slopes: Vec<f32> = act.iter().map(|z| act_grad(*z, Act::GeluErf)).collect();
            assert_eq!(
                as_words(&slopes),
                as_words(&want_slopes),
                "[{m}, {n}, {k}] slopes"
            );
            crate::fast::kernels::activate_body(&mut act, Act::GeluErf);
            let mut rounded = vec![0u32; m * n2];
            for (row, out) in act.chunks_exact(n).zip(rounded.chunks_exact_mut(n2)) {
                round_row(row, out);
            }
            assert_eq!(as_words(&pairs), &rounded[..], "[{m}, {n}, {k}] pairs");
            // FFN-out's product on those pairs, into a new buffer.
            let w2: Vec<f32> = (0..5 * n).map(|i| val(i + 900)).collect();
            let b2 = Strided::transposed(&w2, n);
            let y = product_bf16_pairs_new((m, 5, n), &rounded, Right::F32(b2), &[0.5; 5]);
            let mut want = vec![0f32; m * 5];
            let sums = Sums {
                bias: Some(&[0.5; 5]),
                accumulate: false,
            };
            product_bf16_pairs_right((m, 5, n), &rounded, Right::F32(b2), &mut want, sums);
            assert_eq!(as_words(&y), as_words(&want), "[{m}, 5, {n}] from pairs");
        }
    }

    /// Two multiplies chained through bf16 pairs stored by the first
    /// one's tiles give the bits of the fp32 chain (the second rounds the
    /// first's fp32 output itself), with an activation, odd widths and
    /// partial panels and tiles.
    #[test]
    fn pairs_out_of_the_store_equal_rounding_the_fp32_output() {
        let val = |i: usize| ((i as f32) * 0.377).sin();
        for (m, k, mid, n) in [(1, 4, 2, 3), (13, 40, 37, 9), (30, 64, 70, 33)] {
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let w1 = PackedBf16::new(
                &(0..k * mid).map(|i| val(i + 100)).collect::<Vec<_>>(),
                k,
                mid,
            );
            let w2 = PackedBf16::new(
                &(0..mid * n).map(|i| val(i + 900)).collect::<Vec<_>>(),
                mid,
                n,
            );
            let b1: Vec<f32> = (0..mid).map(|i| val(i + 5000) * 0.1).collect();
            let b2: Vec<f32> = (0..n).map(|i| val(i + 6000)).collect();
            let act = Some(Act::GeluErf);
            let (mut h, mut want, mut scratch) =
                (vec![0f32; m * mid], vec![0f32; m * n], Vec::new());
            w1.matmul(&x, &b1, &mut h, m, &mut scratch, act);
            w2.matmul(&h, &b2, &mut want, m, &mut scratch, None);
            // Stale values in the pairs buffer must not leak in.
            let mut pairs = vec![u32::MAX; 3];
            w1.matmul_to_pairs(&x, &b1, &mut pairs, m, &mut scratch, act);
            let mut got = vec![0f32; m * n];
            w2.matmul_pairs(&pairs[..m * mid.div_ceil(2)], &b2, &mut got, m, None);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "[{m}, {k}] -> {mid} -> {n}");
        }
    }

    /// A training FFN's two products: the first stores the activation's
    /// slopes and its output's bf16 pairs from the same tiles, the second
    /// reads those pairs; both equal the products on fp32 operands rounded
    /// apart, bit for bit, on AVX512-BF16 (where the CPU has it) and the
    /// scalar loop, for strided (transposed) weights, odd widths and
    /// partial tiles. Backward, the second's input gradient times the
    /// slopes (from the tiles' registers) gives the pairs of that product
    /// stored, multiplied and rounded apart, bit for bit, and the bias
    /// gradient its column sums.
    #[test]
    fn stored_pairs_feed_the_next_product_as_rounding_apart_does() {
        let val = |i: usize| ((i as f32) * 0.377).sin();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let sims = if features().bf16 {
            vec![false, true]
        } else {
            vec![false]
        };
        for simd in sims {
            for (m, k, mid, n) in [
                (1, 4, 3, 2),
                (13, 40, 37, 9),
                (30, 64, 70, 33),
                (200, 24, 40, 9),
                // A padded middle (pair_stride): rows of 1,024 + 16 words.
                (26, 6, 2048, 5),
                // On AMX, the middle's transpose has rows of 512 words,
                // padded (transposed_stride).
                (1024, 6, 40, 5),
            ] {
                let x: Vec<f32> = (0..m * k).map(val).collect();
                // nn.Linear weights [out, in], read transposed.
                let w1: Vec<f32> = (0..mid * k).map(|i| val(i + 100)).collect();
                let w2: Vec<f32> = (0..n * mid).map(|i| val(i + 900)).collect();
                let b1: Vec<f32> = (0..mid).map(|i| val(i + 5000) * 0.1).collect();
                let mut buffers = ProductBuffers::default();
                let mut run = |a: Left, b: Strided, c: &mut [f32], store: Store, (m, n, k)| {
                    product_bf16_on(simd, (m, n, k), a, Right::F32(b), c, store, &mut buffers)
                };
                let w1_t = Strided::transposed(&w1, k);
                let mut want_f = vec![0f32; m * mid];
                let none = Store::Sums(Sums::default());
                run(
                    Left::Strided(Strided::rows(&x, k)),
                    w1_t,
                    &mut want_f,
                    none,
                    (m, mid, k),
                );
                // The padding words (none but at 2,048) stay as they were:
                // no product may read them.
                let (mid2, ldp) = (mid.div_ceil(2), pair_stride(mid));
                let (mut f, mut pairs) = (vec![f32::NAN; m * mid], vec![u32::MAX; m * ldp]);
                // Garbage where the tiles must write every word.
                let mut panels = vec![u16::MAX; panels_len(m, mid)];
                let store = Store::Both {
                    bias: &b1,
                    act: Act::GeluErf,
                    pairs: SharedPairs(pairs.as_mut_ptr()),
                    ldp,
                    panels: SharedPairs(panels.as_mut_ptr().cast()),
                };
                run(
                    Left::Strided(Strided::rows(&x, k)),
                    w1_t,
                    &mut f,
                    store,
                    (m, mid, k),
                );
                let mut h = want_f.clone();
                let mut slopes = vec![0f32; m * mid];
                for (row, slopes) in h.chunks_exact_mut(mid).zip(slopes.chunks_exact_mut(mid)) {
                    row.iter_mut().zip(&b1).for_each(|(v, b)| *v += b);
                    for (g, z) in slopes.iter_mut().zip(&*row) {
                        *g = act_grad(*z, Act::GeluErf);
                    }
                    activate_body(row, Act::GeluErf);
                }
                assert_eq!(
                    bits(&f),
                    bits(&slopes),
                    "slopes, [{m}, {k}] -> {mid}, simd {simd}"
                );
                let mut g_pairs = vec![0u32; m * mid2];
                round_rows(false, &h, m, mid, mid2, &mut g_pairs);
                let dense = |p: &[u32]| {
                    let rows = p.chunks_exact(ldp).map(|r| &r[..mid2]);
                    rows.flatten().copied().collect::<Vec<_>>()
                };
                assert_eq!(
                    dense(&pairs),
                    g_pairs,
                    "pairs, [{m}, {k}] -> {mid}, simd {simd}"
                );
                let w2_t = Strided::transposed(&w2, mid);
                let (mut want, mut got) = (vec![0f32; m * n], vec![f32::NAN; m * n]);
                run(
                    Left::Strided(Strided::rows(&h, mid)),
                    w2_t,
                    &mut want,
                    none,
                    (m, n, mid),
                );
                run(Left::Pairs(&pairs), w2_t, &mut got, none, (m, n, mid));
                assert_eq!(bits(&got), bits(&want), "{mid} -> {n}, simd {simd}");
                // Backward: the output gradient dy [m, n] as pairs, the
                // activation's output gradient dy · w2 [m, mid].
                let dy: Vec<f32> = (0..m * n).map(|i| val(i + 7000)).collect();
                let mut dy_pairs = vec![0u32; m * n.div_ceil(2)];
                round_rows(false, &dy, m, n, n.div_ceil(2), &mut dy_pairs);
                let w2_rows = Strided::rows(&w2, mid);
                let mut dg = vec![0f32; m * mid];
                run(Left::Pairs(&dy_pairs), w2_rows, &mut dg, none, (m, mid, n));
                let dz: Vec<f32> = dg.iter().zip(&slopes).map(|(g, s)| g * s).collect();
                let mut want_pairs = vec![0u32; m * mid2];
                // Rounded as the tiles round (vcvtne2ps2bf16 flushes
                // subnormal inputs to 0; the scalar loop does not).
                round_rows(simd, &dz, m, mid, mid2, &mut want_pairs);
                let start: Vec<f32> = (0..mid).map(|j| val(j + 9000)).collect();
                let mut dbias = start.clone();
                let dims = (m, mid, n);
                let w2_rows = Right::F32(w2_rows);
                let (got, blocks) =
                    act_grad_on(simd, dims, &dy_pairs, w2_rows, &slopes, &mut dbias);
                let got = as_words(&got);
                assert_eq!(got.len(), m * ldp, "act grad rows, simd {simd}");
                assert_eq!(dense(got), want_pairs, "act grad, simd {simd}");
                let padding = got.chunks_exact(ldp).flat_map(|r| &r[mid2..]);
                assert!(padding.into_iter().all(|&w| w == 0), "act grad padding");
                // The products after read the padded rows as the dense ones:
                // FFN-out's weight gradient dyᵀ · g (g the right operand),
                // FFN-in's dzᵀ · x (dz the left operand, transposed) and
                // its input gradient dz · w1.
                let mut products = |a: Left, b: Right, (m, n, k)| {
                    let mut c = vec![0f32; m * n];
                    product_bf16_on(simd, (m, n, k), a, b, &mut c, none, &mut buffers);
                    bits(&c)
                };
                let dy_t = Left::TransposedPairs(&dy_pairs);
                let want_dw = products(dy_t, Right::Pairs(&g_pairs), (n, mid, m));
                assert_eq!(
                    products(dy_t, Right::Pairs(&pairs), (n, mid, m)),
                    want_dw,
                    "FFN-out weight gradient, simd {simd}"
                );
                // The tiles' panels of g are those packing its pairs
                // makes (an odd m's last pair row half zeros, a partial
                // last panel's columns zeros), and the weight gradient
                // reading them unpacked has the same bits.
                let mut packed = Vec::new();
                pack_panels_reusing(Right::Pairs(&g_pairs), m, mid, &mut packed, false);
                assert!(panels == packed, "g's panels, [{m}] -> {mid}, simd {simd}");
                assert_eq!(
                    products(dy_t, Right::Packed(&panels), (n, mid, m)),
                    want_dw,
                    "FFN-out weight gradient from the panels, simd {simd}"
                );
                let x_rows = Right::F32(Strided::rows(&x, k));
                let want_dw = products(Left::TransposedPairs(&want_pairs), x_rows, (mid, k, m));
                assert_eq!(
                    products(Left::TransposedPairs(got), x_rows, (mid, k, m)),
                    want_dw,
                    "FFN-in weight gradient, simd {simd}"
                );
                // The tiles' transpose of dz is what interleaving its
                // pairs makes (an odd m's last step's high halves zeros),
                // and the weight gradient reading it has the same bits.
                let mut interleaved = Vec::new();
                let src = Source::Pairs {
                    data: &want_pairs,
                    row: mid2,
                };
                interleave_rows(src, m, mid, &mut interleaved, false);
                let blocks = as_words(&blocks);
                let m2 = m.div_ceil(2);
                assert_eq!(blocks.len(), transposed_len(mid, m2));
                for (b, (got, want)) in blocks
                    .chunks_exact(MR_BF16)
                    .zip(interleaved.chunks_exact(MR_BF16))
                    .enumerate()
                {
                    // The last block's rows past mid are padding.
                    let rows = (mid - b / m2 * MR_BF16).min(MR_BF16);
                    assert_eq!(got[..rows], want[..rows], "dz's transpose, simd {simd}");
                }
                assert_eq!(
                    products(Left::Interleaved(blocks), x_rows, (mid, k, m)),
                    want_dw,
                    "FFN-in weight gradient from the transpose, simd {simd}"
                );
                let w1_rows = Right::F32(Strided::rows(&w1, k));
                assert_eq!(
                    products(Left::Pairs(got), w1_rows, (m, k, mid)),
                    products(Left::Pairs(&want_pairs), w1_rows, (m, k, mid)),
                    "FFN-in input gradient, simd {simd}"
                );
                for (j, (got, start)) in dbias.iter().zip(&start).enumerate() {
                    let want: f64 =
                        f64::from(*start) + (0..m).map(|r| f64::from(dz[r * mid + j])).sum::<f64>();
                    let scale: f64 = (0..m).map(|r| f64::from(dz[r * mid + j]).abs()).sum();
                    assert!(
                        (f64::from(*got) - want).abs() <= 1e-6 * (scale + 1.0),
                        "bias gradient {j}: {got} vs {want}, simd {simd}"
                    );
                }
            }
        }
    }

    /// A weight packed block of rows by block (in reverse, as threads may
    /// finish them) has the panels of packing it whole for both products,
    /// and products reading them the bits of products packing the fp32
    /// weight: partial panels, odd widths and row counts, blocks of one
    /// and of two panels' rows.
    #[test]
    fn weight_panels_packed_by_rows_equal_packing_whole() {
        let val = |i: usize| ((i as f32) * 0.711).sin();
        for (n, k, block) in [
            (70, 33, NR),
            (64, 512, NR),
            (31, 7, NR),
            (1, 1, NR),
            (97, 64, 2 * NR),
        ] {
            let w: Vec<f32> = (0..n * k).map(val).collect();
            let mut panels = WeightPanels::new(n, k);
            let writer = panels.writer();
            for r0 in (0..n).step_by(block).rev() {
                let r1 = (r0 + block).min(n);
                writer.pack_rows(r0, &w[r0 * k..r1 * k]);
            }
            let (Right::Packed(fwd), Right::Packed(bwd)) = (panels.forward(), panels.backward())
            else {
                unreachable!("weight panels are packed operands")
            };
            assert_eq!(
                fwd,
                &pack_panels(Strided::transposed(&w, k), k, n)[..],
                "[{n}, {k}]"
            );
            assert_eq!(
                bwd,
                &pack_panels(Strided::rows(&w, k), n, k)[..],
                "[{n}, {k}]ᵀ"
            );
            let m = 13;
            let x: Vec<f32> = (0..m * k).map(|i| val(i + 400)).collect();
            let dy: Vec<f32> = (0..m * n).map(|i| val(i + 900)).collect();
            let mut buffers = ProductBuffers::default();
            let mut product = |a: Strided, b: Right, (m, n, k)| {
                let mut c = vec![0f32; m * n];
                let (a, none) = (Left::Strided(a), Store::Sums(Sums::default()));
                product_bf16_on(features().bf16, (m, n, k), a, b, &mut c, none, &mut buffers);
                bits(&c)
            };
            let (x_rows, dy_rows) = (Strided::rows(&x, k), Strided::rows(&dy, n));
            assert_eq!(
                product(x_rows, panels.forward(), (m, n, k)),
                product(x_rows, Right::F32(Strided::transposed(&w, k)), (m, n, k)),
                "x · wᵀ, [{n}, {k}]"
            );
            assert_eq!(
                product(dy_rows, panels.backward(), (m, k, n)),
                product(dy_rows, Right::F32(Strided::rows(&w, k)), (m, k, n)),
                "dy · w, [{n}, {k}]"
            );
        }
    }

    /// The packing loops' rounding is `half`'s, bit for bit.
    #[test]
    fn bit_rounding_equals_half() {
        let mut specials = vec![
            0.0f32,
            -0.0,
            1.0 + 1.0 / 256.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-40,
        ];
        specials.extend((0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
        for x in specials {
            if x.is_nan() {
                assert!(from_bf16(round_bits(x) as u16).is_nan());
                continue;
            }
            assert_eq!(round_bits(x) as u16, to_bf16(x), "{x:e}");
        }
    }

    /// The vector rounding pass gives the scalar one's bits, for row
    /// lengths around its 32-value steps (odd ones too).
    #[test]
    fn vector_rounding_equals_scalar() {
        if !features().bf16 {
            return;
        }
        for k in [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 384, 1537] {
            let x: Vec<f32> = (0..3 * k)
                .map(|i| ((i as f32) * 0.7318).sin() * 10f32.powi(i as i32 % 7 - 3))
                .collect();
            let (mut simd, mut scalar) = (Vec::new(), Vec::new());
            round_rows(true, &x, 3, k, k.div_ceil(2), &mut simd);
            round_rows(false, &x, 3, k, k.div_ceil(2), &mut scalar);
            assert_eq!(simd, scalar, "k = {k}");
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        // 1 + 2^-8 lies halfway between two bf16 values: it goes to the
        // even one (1.0); just above halfway rounds up.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(
            from_bf16(to_bf16(1.0 + 1.0 / 256.0 + 1.0 / 65536.0)),
            1.0 + 1.0 / 128.0
        );
        assert_eq!(from_bf16(to_bf16(-3.5)), -3.5);
    }
}
