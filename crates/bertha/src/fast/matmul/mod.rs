//! Matrix multiplies against weights packed once, at load time.
//!
//! A general gemm repacks its right-hand side on every call: for the
//! inference fast path that means copying every weight matrix of the model
//! on every forward pass, which dominates at small batches (a sentence at
//! batch 1 is ~25 rows against 10 M weights). Here the weights are laid out
//! once in column panels the micro-kernel streams straight through:
//!
//! - [`PackedF32`]: fp32, panels of [`NR`] columns, each `k` rows of `NR`
//!   floats; the AVX-512 kernel keeps a 12 × 32 tile of the output in
//!   registers. Where the AVX2 tile runs (6 × 16), each panel is stored as
//!   its two halves of 16 columns, so a half tile reads its weights in
//!   sequence.
//! - [`PackedI8`]: int8 weights with one scale per output column and
//!   group of input channels, for `--precision int8`. Activations are
//!   quantized on the fly, per row and group of input channels
//!   ([`int8::QGROUP`] by default), to unsigned bytes between the
//!   group's minimum and maximum (asymmetric: a one-sided range keeps all
//!   256 levels), after dividing each input channel
//!   by a smoothing factor that was multiplied into the weights instead
//!   (SmoothQuant: channels with large activations would otherwise set the
//!   row's scale for all). Products run on AVX-512 VNNI (`vpdpbusd`, four
//!   8-bit products per 32-bit lane); the integer sums are exact, so the
//!   scalar fallback computes the same integers.
//!
//! Both run in parallel over (column panel, row block) tasks on the rayon
//! pool and write `y = x · W + bias` row-major.

mod bf16;

pub(crate) use bf16::{
    as_f32, as_f32_mut, as_halves, as_words, as_words_mut, interleave_transposed, pack_panels_into,
    pack_row_pairs, pack_transposed_pairs, product_bf16_act, product_bf16_act_grad,
    product_bf16_both_pairs, product_bf16_interleaved, product_bf16_new, product_bf16_pairs_new,
    product_bf16_pairs_right, product_bf16_right, product_bf16_serial, product_bf16_to_pairs_new,
    product_bf16_transposed_pairs_packed, product_pairs_serial, product_pairs_serial_to_pairs,
    round_row, round_rows_serial, tile_bf16, Dst, LeftIn, LeftPairs, PanelWriter, Right,
    WeightPanels, BF16_TILE_ROWS,
};
pub use bf16::{product_bf16, product_bf16_transposed_pairs, PackedBf16, Strided, Sums};

#[cfg(target_arch = "x86_64")]
pub(crate) use general::{product as product_general, takes as takes_product};

mod gemm_crate;
pub(crate) use gemm_crate::gemm_f32;

mod int8;
pub use int8::{GroupQuant, I8Scheme, PackedI8, QuantScratch};
// For the kernels below (each instruction set's file).
#[cfg(target_arch = "x86_64")]
use int8::group_quant;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use int8::{group_quads, I8Tile};

use rayon::prelude::*;

use super::aligned::Aligned;
use super::cpu::features;
use super::kernels::{activate_body, Act};

/// A matrix operand: its first element, row stride and column stride.
/// Only read: the products that take one promise that nothing writes it
/// meanwhile.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

impl From<Strided<'_>> for Operand {
    fn from(s: Strided<'_>) -> Self {
        Self {
            ptr: s.data.as_ptr(),
            rs: s.rs as isize,
            cs: s.cs as isize,
        }
    }
}

impl Operand {
    /// Row-major `data` with rows `stride` apart.
    pub fn rows(data: &[f32], stride: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            rs: stride as isize,
            cs: 1,
        }
    }

    /// The transpose of row-major `data` with rows `stride` apart.
    pub fn transposed(data: &[f32], stride: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            rs: 1,
            cs: stride as isize,
        }
    }
}

// SAFETY: an Operand only reads, and the products taking one guarantee
// that nothing writes it meanwhile.
unsafe impl Send for Operand {}
unsafe impl Sync for Operand {}

/// Output columns per panel: two 16-float AVX-512 registers.
pub const NR: usize = 32;
/// Output rows per fp32 register tile: 12 × 2 accumulators leave room
/// for the two weight vectors and a broadcast in AVX-512's 32 registers.
const MR_F32: usize = 12;
/// The most rows one [`tile_f32`] call takes.
pub(crate) const F32_TILE_ROWS: usize = MR_F32;

/// Whether [`tile_f32`] runs on register tiles here, AVX-512, AVX2 or
/// NEON (else a scalar loop, which callers with their own fallback should not
/// use).
pub(crate) fn has_f32_tiles() -> bool {
    let f = features();
    f.avx512_bw || f.avx2_fma || f.neon
}

/// Rows per parallel task (a multiple of both tile heights): a task reuses
/// one weight panel over these.
const ROWS_PER_TASK: usize = 96;

/// The rows of [`tile_f32`]'s register tiles on this CPU's kernels.
fn f32_tile_rows() -> usize {
    #[cfg(target_arch = "x86_64")]
    if !features().avx512_bw && features().avx2_fma {
        return avx2::MR;
    }
    #[cfg(target_arch = "aarch64")]
    if features().neon {
        return neon::MR;
    }
    MR_F32
}

/// `rows` cut into the fewest tiles of at most `most` rows, as even as
/// they can be: (first row, rows) of each. 25 rows in tiles of 12 are 9,
/// 8 and 8, not 12, 12 and 1. A tile of fewer than four rows waits on its
/// FMA chains (two to four accumulators, each one FMA a step, four cycles
/// apart) instead of filling the FMA units, so 12 + 12 + 1 rows cost
/// 12 + 12 + 4 cycles a step against 9 + 8 + 8. At batch 1 (one
/// sentence, 10 to 40 rows) that was 0.75 of the kernel's rate at 13 rows
/// and 0.83 at 25, against 0.92 at 12 and 24.
pub(crate) fn even_tiles(
    rows: std::ops::Range<usize>,
    most: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let count = rows.len().div_ceil(most.max(1));
    let (base, extra) = match count {
        0 => (0, 0),
        c => (rows.len() / c, rows.len() % c),
    };
    (0..count).map(move |t| {
        (
            rows.start + t * base + t.min(extra),
            base + usize::from(t < extra),
        )
    })
}

/// fp32 weights `[k, n]`: in column panels for the AVX-512, AVX2 and NEON
/// tile kernels; row-major for the gemm crate where none of them runs
/// (`BERTHA_ISA=scalar`, other architectures): its kernels beat a
/// portable tile loop by far.
#[derive(Debug, Clone)]
pub struct PackedF32 {
    layout: F32Layout,
    k: usize,
    n: usize,
}

#[derive(Debug, Clone)]
enum F32Layout {
    /// Panel `p` holds columns `p·NR..`, `k` rows of `NR` floats (zero
    /// padded past `n`).
    Panels(Aligned<f32>),
    /// As `Panels`, each panel in halves: its first `NR / 2` columns (`k`
    /// rows of `NR / 2`), then the rest. The AVX2 tile takes a half at a
    /// time and so reads it in sequence ([`avx2::tile_f32`]).
    HalfPanels(Aligned<f32>),
    /// Row-major `[k, n]`, multiplied by the gemm crate.
    RowMajor(Vec<f32>),
}

impl PackedF32 {
    /// Packs `w_t`, row-major `[k, n]` (a transposed `nn.Linear` weight).
    pub fn new(w_t: &[f32], k: usize, n: usize) -> Self {
        Self::with_panels(w_t, k, n, has_f32_tiles())
    }

    fn with_panels(w_t: &[f32], k: usize, n: usize, panels: bool) -> Self {
        assert_eq!(w_t.len(), k * n, "PackedF32: weight is not [{k}, {n}]");
        if !panels {
            return Self {
                layout: F32Layout::RowMajor(w_t.to_vec()),
                k,
                n,
            };
        }
        let halves = halves_tiles();
        let mut panels = Aligned::zeroed(n.div_ceil(NR) * k * NR);
        for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
            for row in 0..k {
                for (j, col) in (p * NR..n.min((p + 1) * NR)).enumerate() {
                    panel[panel_index(row, j, k, halves)] = w_t[row * n + col];
                }
            }
        }
        let layout = match halves {
            true => F32Layout::HalfPanels(panels),
            false => F32Layout::Panels(panels),
        };
        Self { layout, k, n }
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    pub fn out_dim(&self) -> usize {
        self.n
    }

    /// The weights back as row-major `[k, n]`.
    pub fn unpack(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let (panels, halves) = match &self.layout {
            F32Layout::RowMajor(w_t) => return w_t.clone(),
            F32Layout::Panels(p) => (p, false),
            F32Layout::HalfPanels(p) => (p, true),
        };
        let mut w_t = vec![0f32; k * n];
        for (p, panel) in panels.chunks_exact(k * NR).enumerate() {
            for row in 0..k {
                for (j, col) in (p * NR..n.min((p + 1) * NR)).enumerate() {
                    w_t[row * n + col] = panel[panel_index(row, j, k, halves)];
                }
            }
        }
        w_t
    }

    /// `y[m, n] = act(x[m, k] · W + bias)` (the activation applied while
    /// the tile is still in cache, when given).
    pub fn matmul(&self, x: &[f32], bias: &[f32], y: &mut [f32], m: usize, act: Option<Act>) {
        let (k, n) = (self.k, self.n);
        check_shapes(x, bias, y, m, k, n);
        let (panels, halves) = match &self.layout {
            F32Layout::RowMajor(w_t) => {
                crate::fast::kernels::linear(x, w_t, bias, y, m, k, n);
                if let Some(act) = act {
                    y.par_chunks_mut(n * ROWS_PER_TASK)
                        .for_each(|rows| activate_body(rows, act));
                }
                return;
            }
            F32Layout::Panels(p) => (p, false),
            F32Layout::HalfPanels(p) => (p, true),
        };
        let out = SharedOut(y.as_mut_ptr());
        for_each_task(m, n, std::mem::size_of_val(x), |p, rows| {
            let panel = &panels[p * k * NR..(p + 1) * k * NR];
            let cols = NR.min(n - p * NR);
            let bias = &bias[p * NR..p * NR + cols];
            for (r0, mr) in even_tiles(rows, f32_tile_rows()) {
                let a = &x[r0 * k..(r0 + mr) * k];
                // Rows r0..r0+mr, columns p·NR..p·NR+cols of y lie inside
                // y (shapes checked) and belong to this task only.
                let c = out.at(r0 * n + p * NR);
                // SAFETY: as just said; a panel is in halves only where
                // the AVX2 tile runs (AVX2 and FMA).
                unsafe {
                    match halves {
                        #[cfg(target_arch = "x86_64")]
                        true => avx2_tiles(a, k, mr, (panel, true), c, n, cols, bias, act),
                        _ => tile_f32(a, k, mr, panel, c, n, cols, bias, act),
                    }
                }
            }
        });
    }
}

/// Whether [`PackedF32`]'s panels are in halves here: where the AVX2
/// tile runs (x86-64 without AVX-512).
fn halves_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    if !features().avx512_bw && features().avx2_fma {
        return true;
    }
    false
}

/// Where weight `(row, j)` of a panel (column `j` < [`NR`] of it) lies in
/// the panel, in rows of `NR` or in halves.
fn panel_index(row: usize, j: usize, k: usize, halves: bool) -> usize {
    const HALF: usize = NR / 2;
    match halves {
        true => (j / HALF) * k * HALF + row * HALF + j % HALF,
        false => row * NR + j,
    }
}

fn check_shapes(x: &[f32], bias: &[f32], y: &[f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k, "matmul: input is not [{m}, {k}]");
    assert_eq!(bias.len(), n, "matmul: bias is not [{n}]");
    assert_eq!(y.len(), m * n, "matmul: output is not [{m}, {n}]");
}

/// The output pointer, shared by tasks that write disjoint tiles.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: every task writes only its own (panel, row block) tile.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Through a method, so closures capture the `Sync` wrapper and not
    /// the bare pointer field.
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// A left operand up to this size (bytes) stays in a core's L2 cache
/// (1 MiB on this EPYC) while the tiles of one column panel read it.
const LEFT_IN_L2: usize = 1 << 20;

/// Runs `f(panel, rows)` for every column panel and block of rows, in
/// parallel, for a product whose left operand takes `left_bytes`. A left
/// operand that fits in L2 goes panel by panel (the tasks of one panel
/// adjacent: a thread keeps reusing it, and re-reads the left operand
/// from L2); a larger one block of rows by block (the tasks of one block
/// adjacent: the block stays in L2 while every panel passes over it).
/// Panel by panel, a larger one was read from L3 or memory once per
/// panel: the decoder's weight gradient (37 MB of `dYᵀ`, 16 panels) took
/// 69 ms instead of 51 (`examples/train_products`).
fn for_each_task(
    m: usize,
    n: usize,
    left_bytes: usize,
    f: impl Fn(usize, std::ops::Range<usize>) + Sync,
) {
    let n_panels = n.div_ceil(NR);
    let n_blocks = m.div_ceil(ROWS_PER_TASK);
    let by_rows = left_bytes > LEFT_IN_L2;
    let task = |t: usize| {
        let (p, b) = match by_rows {
            true => (t % n_panels, t / n_panels),
            false => (t / n_blocks, t % n_blocks),
        };
        f(p, b * ROWS_PER_TASK..m.min((b + 1) * ROWS_PER_TASK));
    };
    if rayon::current_num_threads() <= 1 || n_panels * n_blocks == 1 {
        (0..n_panels * n_blocks).for_each(task);
    } else {
        (0..n_panels * n_blocks).into_par_iter().for_each(task);
    }
}

/// `dst[c · dst_stride + r] = src[r · src_stride + c]` for `r < 16`,
/// `c < cols` (≤ 16), reading rows `r < rows` (≤ 16) and writing 0 for the
/// rest: a block of a matrix transposed into a column panel.
pub(crate) fn transpose16(
    src: &[f32],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
) {
    assert!(
        rows <= 16 && cols <= 16,
        "transpose16: block larger than 16 × 16"
    );
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        src.len() >= (rows - 1) * src_stride + cols,
        "transpose16: source too short"
    );
    assert!(
        dst.len() >= (cols - 1) * dst_stride + 16,
        "transpose16: destination too short"
    );
    #[cfg(target_arch = "x86_64")]
    if features().avx512_bw {
        // SAFETY: the CPU has AVX-512F (checked); the sizes are asserted.
        unsafe {
            avx512::transpose16(
                src.as_ptr(),
                src_stride,
                rows,
                cols,
                dst.as_mut_ptr(),
                dst_stride,
            )
        };
        return;
    }
    for c in 0..cols {
        for r in 0..16 {
            dst[c * dst_stride + r] = if r < rows {
                src[r * src_stride + c]
            } else {
                0.0
            };
        }
    }
}

/// One output tile: `c[r, j] = Σ_i a[r, i] · panel[i, j] + bias[j]` for
/// `r < mr`, `j < cols`; `c` has row stride `ldc`.
///
/// # Safety
/// `c` must address an `mr` × `cols` tile (row stride `ldc`) that no one
/// else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_f32(
    a: &[f32],
    k: usize,
    mr: usize,
    panel: &[f32],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    #[cfg(target_arch = "x86_64")]
    if features().avx512_bw {
        macro_rules! dispatch {
            ($($n:literal)*) => {
                match mr {
                    // SAFETY: the CPU has AVX-512F (checked); the slices
                    // hold mr rows of k and k rows of NR.
                    $($n => unsafe { avx512::tile_f32::<$n>(a, k, panel, c, ldc, cols, bias, act) },)*
                    _ => unreachable!("tiles have 1..=MR_F32 rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if features().avx2_fma {
        // SAFETY: the CPU has AVX2 and FMA (checked); the caller's promise.
        unsafe { avx2_tiles(a, k, mr, (panel, false), c, ldc, cols, bias, act) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if features().neon {
        for (r0, rows) in even_tiles(0..mr, neon::MR) {
            let (a, c) = (&a[r0 * k..(r0 + rows) * k], c.add(r0 * ldc));
            // SAFETY: the CPU has NEON (checked); the slices hold `rows`
            // rows of k and k rows of NR; rows r0.. of the caller's tile.
            unsafe {
                match rows {
                    1 => neon::tile_f32::<1>(a, k, panel, c, ldc, cols, bias, act),
                    2 => neon::tile_f32::<2>(a, k, panel, c, ldc, cols, bias, act),
                    3 => neon::tile_f32::<3>(a, k, panel, c, ldc, cols, bias, act),
                    _ => neon::tile_f32::<4>(a, k, panel, c, ldc, cols, bias, act),
                }
            }
        }
        return;
    }
    for r in 0..mr {
        let mut acc = [0f32; NR];
        for (i, brow) in panel.chunks_exact(NR).enumerate() {
            let av = a[r * k + i];
            for (s, b) in acc.iter_mut().zip(brow) {
                *s += av * b;
            }
        }
        // SAFETY: row r < mr, columns < cols of the caller's tile.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), cols) };
        for ((y, a), b) in row.iter_mut().zip(acc).zip(bias) {
            *y = a + b;
        }
        if let Some(act) = act {
            activate_body(row, act);
        }
    }
}

/// `mr` rows of [`tile_f32`] on the AVX2 tiles, on a panel in rows of
/// [`NR`] or in halves (`panel.1`).
///
/// # Safety
/// As [`tile_f32`]; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_tiles(
    a: &[f32],
    k: usize,
    mr: usize,
    (panel, halves): (&[f32], bool),
    c: *mut f32,
    ldc: usize,
    cols: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    for (r0, rows) in even_tiles(0..mr, avx2::MR) {
        let (a, c) = (&a[r0 * k..(r0 + rows) * k], c.add(r0 * ldc));
        macro_rules! dispatch {
            ($($n:literal)*) => {
                match (rows, halves) {
                    // SAFETY: the CPU has AVX2 and FMA (the caller's
                    // promise); the slices hold `rows` rows of k and k
                    // rows of NR; rows r0.. of the caller's tile.
                    $(($n, false) => unsafe { avx2::tile_f32::<$n, false>(a, k, panel, c, ldc, cols, bias, act) },
                    ($n, true) => unsafe { avx2::tile_f32::<$n, true>(a, k, panel, c, ldc, cols, bias, act) },)*
                    _ => unreachable!("AVX2 tiles have 1..=6 rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6);
    }
}

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod general;
#[cfg(target_arch = "x86_64")]
pub(crate) use amx::peak_chains as amx_peak_chains;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::fma_chains as avx2_fma_chains;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::vnni_chains as avx_vnni_chains;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
pub(crate) use neon::fma_chains as neon_fma_chains;

#[cfg(test)]
mod tests;
