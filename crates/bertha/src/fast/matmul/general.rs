//! fp32 products of two strided operands, `dst (+)= scale · a · b`: the
//! training step's products (`x · Wᵀ`, `dy · W`, `dyᵀ · x`, attention's
//! per-head products), whose operands change on every call.
//!
//! Blocked as Goto and BLIS block a gemm (the loops of BLIS's
//! `bli_gemm_ker_var2`, the 6 × 16 tile of MLAS's `SgemmKernelFma3`): a
//! block of `b`'s columns, all `k` rows of them, is packed into strips of
//! the tile's width and kept in L3 ([`B_BLOCK_FLOATS`]); each task takes
//! up to [`MC`] rows of `a` and walks `k` in blocks of [`KC`], so that a strip's
//! block (16 KiB) stays in L1 while every row strip of the task passes
//! over it, and the task's block of `a` stays in L2. Row-major `a` is read
//! where it lies; a transposed `a` (a weight gradient's `dyᵀ`) is packed
//! into row strips by the one task that reads those rows ([`takes`] leaves
//! to the gemm crate the products where several tasks would pack them).
//!
//! On the training products of `examples/train_products` (EPYC Zen 3, two
//! threads, `COMPUTE=f32`) the forward and input-gradient products run
//! 5–20 % ahead of the gemm crate, and the decoder's weight gradient 25 %;
//! a `mini` MLM step gained 4–9 % (a noisy shared machine).
//!
//! Each output's sum runs over `k` in the same order, block after block,
//! however many threads share the work: results are the same bits on any
//! thread count.
//!
//! The tiles exist for AVX2 + FMA ([`super::avx2::tile_packed`]); the
//! callers keep the gemm crate where [`has_general_tiles`] is false
//! (AVX-512, whose gemm kernels are 512 bits wide, and aarch64 for now).

use std::cell::Cell;

use rayon::prelude::*;

use super::{features, Operand, SharedOut};
use crate::fast::aligned::Aligned;

/// Rows of a register tile.
const MR: usize = 6;
/// Columns of a register tile.
const NR: usize = 16;
/// Inputs (`k`) per block: a strip of `b` (`KC × NR`, 16 KiB) stays in
/// L1 while every row strip of the block's `a` passes over it.
const KC: usize = 256;
/// Rows of `a` per task at most: `MC × KC` (192 KiB) stays in L2.
const MC: usize = 192;
/// Floats of `b` packed per block of columns (2 MiB: it stays in L3
/// while every row block of `a` streams its strips through L1): all of
/// `k` by as many columns as fit, and at least [`MIN_NC`].
const B_BLOCK_FLOATS: usize = 1 << 19;
/// Columns per block of `b` at least: each block reads `a` again.
const MIN_NC: usize = 256;
/// Floats of `b` packed per block of columns where the tasks pack `a`
/// (8 MiB, a quarter of a Zen 3 or Zen 4 L3).
const PACKED_A_B_BLOCK_FLOATS: usize = 1 << 21;
/// Rows per task at least where the tasks pack `a`: four register tiles.
const MIN_PACKED_ROWS: usize = 4 * MR;
/// Parallel tasks per thread, at least: with fewer, a thread that draws
/// one more than the others leaves the rest idle for a long share.
const TASKS_PER_THREAD: usize = 3;

/// Whether [`product`] runs on register tiles on this CPU (AVX2 + FMA
/// without AVX-512, or `BERTHA_ISA=avx2`).
pub(crate) fn has_general_tiles() -> bool {
    let f = features();
    f.avx2_fma && !f.avx512_bw
}

impl Operand {
    /// Element `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` lies inside the matrix.
    #[inline(always)]
    unsafe fn at(self, r: usize, c: usize) -> f32 {
        *self.ptr.offset(r as isize * self.rs + c as isize * self.cs)
    }
}

/// The destination: row `r` starts at `ptr + r · rs`.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    rs: usize,
}

// SAFETY: tasks write disjoint tiles of it.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Element `(r, c)`'s address. Through a method, so that closures
    /// capture the `Sync` wrapper and not the bare pointer field.
    fn at(self, r: usize, c: usize) -> *mut f32 {
        self.ptr.wrapping_add(r * self.rs + c)
    }
}

thread_local! {
    /// Each thread's packed block of `a`, kept between calls (taken out
    /// while in use, so a nested call makes its own).
    static A_BLOCK: Cell<Option<Aligned<f32>>> = const { Cell::new(None) };
    /// The calling thread's packed block of `b`.
    static B_BLOCK: Cell<Option<Aligned<f32>>> = const { Cell::new(None) };
}

/// Runs `f` with the thread's buffer in `slot`, at least `len` long.
fn with_buffer<R>(
    slot: &'static std::thread::LocalKey<Cell<Option<Aligned<f32>>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let mut buf = slot
        .with(Cell::take)
        .filter(|b| b.len() >= len)
        .unwrap_or_else(|| Aligned::zeroed(len));
    let out = f(&mut buf[..len]);
    slot.with(|s| s.set(Some(buf)));
    out
}

/// Runs `f` over `0..count`, on the rayon pool when `threads` > 1.
fn run(threads: usize, count: usize, f: impl Fn(usize) + Sync + Send) {
    if threads > 1 && count > 1 {
        (0..count).into_par_iter().for_each(f);
    } else {
        (0..count).for_each(f);
    }
}

/// Where the register tiles read `a` from.
#[derive(Clone, Copy)]
enum ASource {
    /// In place: row-major, rows `rs` apart (a last strip short of
    /// [`MR`] rows packed by its task).
    Rows,
    /// Packed by each task, block by block.
    Block,
}

/// How [`product`] splits a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    /// Columns per block of `b`.
    nc_max: usize,
    /// Column ranges per row block.
    chunks: usize,
    /// Rows of `a` per task (the last block may have fewer).
    mc: usize,
}

/// How [`product`] splits a product: columns per block of `b` (as many as
/// keep the packed block within L3), rows per task (even blocks of at most
/// [`MC`]: with a ragged last block, 614 rows made tasks of 192 and 38, and
/// a thread that drew the short one sat idle) and column ranges per row
/// block (so that a short `m` still gives every thread several tasks).
///
/// A transposed `a` (a weight gradient's `dyᵀ`, whose rows each task packs
/// itself) is split by rows only, tasks shrinking to [`MIN_PACKED_ROWS`]
/// until every thread has several, and its block of `b` may be larger
/// ([`PACKED_A_B_BLOCK_FLOATS`]): every extra block of columns or range of
/// them packs the same rows of `a` again. On EPYC Zen 4 under
/// `BERTHA_ISA=avx2`, alternating with the split before in one process
/// (which left these products to the gemm crate), the weight gradients of
/// `small`'s qkv and `mini`'s qkv read 13–20 % faster, out and ffn-in
/// 2–15 %, the rest level.
fn plan((m, n, k): (usize, usize, usize), threads: usize, transposed_a: bool) -> Plan {
    if transposed_a && threads > 1 {
        let mc = m
            .div_ceil(TASKS_PER_THREAD * threads)
            .next_multiple_of(MR)
            .clamp(MIN_PACKED_ROWS, MC);
        if m.div_ceil(mc) >= threads {
            let nc_max = columns_per_block(PACKED_A_B_BLOCK_FLOATS, k);
            return Plan {
                nc_max,
                chunks: 1,
                mc,
            };
        }
    }
    let nc_max = columns_per_block(B_BLOCK_FLOATS, k);
    let mc = m
        .div_ceil(m.div_ceil(MC).max(1))
        .next_multiple_of(MR)
        .max(MR);
    let chunks = if threads > 1 {
        (TASKS_PER_THREAD * threads)
            .div_ceil(m.div_ceil(mc).max(1))
            .clamp(1, nc_max.min(n).div_ceil(NR))
    } else {
        1
    };
    Plan { nc_max, chunks, mc }
}

/// Columns of `b` (whole strips, at least [`MIN_NC`]) whose `k` rows fit
/// in a packed block of `block_floats`.
fn columns_per_block(block_floats: usize, k: usize) -> usize {
    (block_floats / k.max(1)).max(MIN_NC) / NR * NR
}

fn threads(parallel: bool) -> usize {
    if parallel {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// Whether [`product`] should take this product: the tiles exist here,
/// and `a` is row-major or its rows are packed by one task each. A
/// transposed `a` (a weight gradient's `dyᵀ`) that several tasks would
/// pack again (several blocks of columns or ranges of them) stays with the
/// gemm crate: packed once, whole, it cost more than the tiles saved
/// (a 512 × 512 weight gradient over 4,096 rows, 16 % of its time in
/// packing).
pub(crate) fn takes((m, n, k): (usize, usize, usize), a: Operand, parallel: bool) -> bool {
    if !has_general_tiles() {
        return false;
    }
    let p = plan((m, n, k), threads(parallel), a.cs != 1);
    a.cs == 1 || (n <= p.nc_max && p.chunks == 1)
}

/// `dst[m, n] = (accumulate ? dst : 0) + scale · a[m, k] · b[k, n]`, rows
/// of `dst` `dst_rs` apart; in parallel on the rayon pool when `parallel`.
/// With `accumulate` off, `dst` is only written (it may be a new buffer).
///
/// # Safety
/// [`has_general_tiles`] is true; `a`, `b` and `dst` address `m × k`,
/// `k × n` and `m × n` elements through their strides; nothing else
/// writes `a` or `b`, or reads or writes `dst`, meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: Operand,
    b: Operand,
    scale: f32,
    parallel: bool,
) {
    debug_assert!(has_general_tiles());
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let threads = threads(parallel);
    let out = Out {
        ptr: dst,
        rs: dst_rs,
    };
    let p = plan((m, n, k), threads, a.cs != 1);
    // Row-major rows of a are read where they lie; a transposed a is
    // packed by the task that reads it, block by block.
    let source = if a.cs == 1 {
        ASource::Rows
    } else {
        ASource::Block
    };
    for jc in (0..n).step_by(p.nc_max) {
        let nc = p.nc_max.min(n - jc);
        // SAFETY: the caller's contract.
        unsafe {
            column_block(
                a,
                b,
                source,
                (m, k),
                (jc, nc),
                (out, accumulate, scale),
                (threads, p),
            )
        };
    }
}

/// Columns `jc..jc + nc` of the product: `b`'s block packed, then the
/// tasks over it.
///
/// # Safety
/// As [`product`]'s.
#[allow(clippy::too_many_arguments)]
unsafe fn column_block(
    a: Operand,
    b: Operand,
    source: ASource,
    (m, k): (usize, usize),
    (jc, nc): (usize, usize),
    (out, accumulate, scale): (Out, bool, f32),
    (threads, p): (usize, Plan),
) {
    let strips = nc.div_ceil(NR);
    // b's block packed whole, strip by strip (all k rows of each), then
    // every task walks the k blocks itself: two parallel regions per block
    // of columns, however long k is.
    with_buffer(&B_BLOCK, strips * k * NR, |packed_b| {
        let at = SharedOut(packed_b.as_mut_ptr());
        run(threads, strips, |s| {
            // SAFETY: strip s is its own part of the buffer; all rows and
            // its columns of b lie inside b.
            unsafe {
                let strip = std::slice::from_raw_parts_mut(at.at(s * k * NR), k * NR);
                pack_b(b, (0, k), jc + s * NR, NR.min(nc - s * NR), strip)
            }
        });
        let b = Strips { data: packed_b, k };
        let tiles = Tiles {
            a,
            source,
            b,
            out,
            mode: (accumulate, scale),
        };
        // SAFETY: the caller's contract.
        unsafe { tiles.run((m, k), (jc, nc), (threads, p)) };
    });
}

/// `b` packed as [`column_block`] packs it: strip `s` holds its [`NR`]
/// columns for all `k` rows.
#[derive(Clone, Copy)]
struct Strips<'a> {
    data: &'a [f32],
    k: usize,
}

impl Strips<'_> {
    /// Strip `s`'s rows from `pc` on: their first value and row stride.
    fn at(self, s: usize, pc: usize) -> (*const f32, usize) {
        (self.data[(s * self.k + pc) * NR..].as_ptr(), NR)
    }
}

/// Everything the register tiles of one block of columns need.
#[derive(Clone, Copy)]
struct Tiles<'a> {
    a: Operand,
    source: ASource,
    b: Strips<'a>,
    out: Out,
    /// Added to what `out` holds (else written), and the sums' scale.
    mode: (bool, f32),
}

impl Tiles<'_> {
    /// The tasks (row block × range of strips) over columns `jc..jc + nc`.
    ///
    /// # Safety
    /// As [`product`]'s, for `a`, `out` and the shapes given.
    unsafe fn run(
        self,
        (m, k): (usize, usize),
        (jc, nc): (usize, usize),
        (threads, p): (usize, Plan),
    ) {
        let (strips, mc) = (nc.div_ceil(NR), p.mc);
        let chunks = p.chunks.min(strips);
        let strips_per_chunk = strips.div_ceil(chunks);
        run(threads, m.div_ceil(mc) * chunks, |t| {
            let (block, chunk) = (t / chunks, t % chunks);
            let first = chunk * strips_per_chunk;
            let last = strips.min(first + strips_per_chunk);
            if first < last {
                let ic = block * mc;
                // SAFETY: the caller's contract; this task's rows and
                // strips are its alone.
                unsafe { self.task((ic, mc.min(m - ic)), k, (jc, nc), first..last) };
            }
        });
    }

    /// Rows `ic..ic + mc` × strips `strips` of the output.
    ///
    /// # Safety
    /// As [`Tiles::run`]'s; no other task writes these rows and strips.
    unsafe fn task(
        self,
        (ic, mc): (usize, usize),
        k: usize,
        (jc, nc): (usize, usize),
        strips: std::ops::Range<usize>,
    ) {
        let (a, out) = (self.a, self.out);
        let (accumulate, scale) = self.mode;
        // Rows read in place need packing only for a last short strip.
        let packed_rows = match self.source {
            ASource::Rows => mc % MR,
            ASource::Block => mc,
        };
        let packed_from = mc - packed_rows;
        let len = packed_rows.div_ceil(MR) * MR * KC.min(k);
        with_buffer(&A_BLOCK, len, |packed_a| {
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                let add = accumulate || pc > 0;
                let packed_a = &mut packed_a[..packed_rows.div_ceil(MR) * MR * kc];
                // SAFETY: rows ic.., columns pc..pc+kc of a lie inside it.
                unsafe { pack_a(a, (ic + packed_from, packed_rows), (pc, kc), packed_a) };
                for s in strips.clone() {
                    let b = self.b.at(s, pc);
                    let (j, cols) = (jc + s * NR, NR.min(nc - s * NR));
                    for r0 in (0..mc).step_by(MR) {
                        let i = ic + r0;
                        let input = match self.source {
                            // SAFETY: rows i..i+MR, columns pc.. of a lie
                            // inside it.
                            ASource::Rows if r0 < packed_from => unsafe {
                                let at = a.ptr.offset(i as isize * a.rs + pc as isize);
                                (at, a.rs as usize, 1)
                            },
                            _ => {
                                let t = (r0 - packed_from) / MR;
                                (packed_a[t * MR * kc..].as_ptr(), 1, MR)
                            }
                        };
                        // SAFETY: the CPU has AVX2 + FMA (the caller's
                        // contract); rows i.., columns j.. of dst are this
                        // task's alone; strip s has kc rows from pc.
                        unsafe {
                            super::avx2::tile_packed(
                                kc,
                                input,
                                b,
                                (out.at(i, j), out.rs),
                                (MR.min(mc - r0), cols),
                                (add, scale),
                            )
                        };
                    }
                }
            }
        });
    }
}

/// Packs rows `pc..pc + kc` and columns `j..j + cols` of `b` as one strip:
/// `kc` rows of [`NR`] values, zeros past `cols`.
///
/// # Safety
/// Those rows and columns lie inside `b`; the CPU has AVX2.
unsafe fn pack_b(b: Operand, (pc, kc): (usize, usize), j: usize, cols: usize, strip: &mut [f32]) {
    debug_assert_eq!(strip.len(), kc * NR);
    if cols < NR {
        strip.fill(0.0);
    }
    if b.cs == 1 {
        let row_at = |i: usize| b.ptr.wrapping_offset((pc + i) as isize * b.rs + j as isize);
        for (i, row) in strip.chunks_exact_mut(NR).enumerate() {
            // One line from each row, rows far apart: prefetched, as in
            // pack_a (without, 9 % of a weight gradient waited on them).
            if i + PACK_AHEAD < kc {
                prefetch(row_at(i + PACK_AHEAD));
                prefetch(row_at(i + PACK_AHEAD).wrapping_add(cols - 1));
            }
            let src = std::slice::from_raw_parts(row_at(i), cols);
            if let (Ok(src), Ok(row)) = (
                <&[f32; NR]>::try_from(src),
                <&mut [f32; NR]>::try_from(&mut *row),
            ) {
                // A fixed-size copy: moves, not a call to memmove.
                *row = *src;
            } else {
                row[..cols].copy_from_slice(src);
            }
        }
        return;
    }
    // A transposed b (a forward product's weight, rs == 1 for nn.Linear's
    // [out, in]): 8 × 8 blocks transposed in registers, the rest one by one.
    let (whole_c, whole_i) = if b.rs == 1 {
        (cols / 8 * 8, kc / 8 * 8)
    } else {
        (0, 0)
    };
    for c0 in (0..whole_c).step_by(8) {
        for i0 in (0..whole_i).step_by(8) {
            let src = b.ptr.offset((pc + i0) as isize + (j + c0) as isize * b.cs);
            let dst = strip.as_mut_ptr().add(i0 * NR + c0);
            super::avx2::transpose8(src, b.cs as usize, dst, NR);
        }
    }
    for c in 0..cols {
        let from = if c < whole_c { whole_i } else { 0 };
        for i in from..kc {
            strip[i * NR + c] = b.at(pc + i, j + c);
        }
    }
}

/// Packs rows `ic..ic + mc` and columns `pc..pc + kc` of `a` as row strips
/// of [`MR`]: strip `t` holds `kc` columns of `MR` values, zeros past the
/// last row.
///
/// # Safety
/// Those rows and columns lie inside `a`.
unsafe fn pack_a(a: Operand, (ic, mc): (usize, usize), (pc, kc): (usize, usize), out: &mut [f32]) {
    let strips = mc.div_ceil(MR);
    debug_assert_eq!(out.len(), strips * MR * kc);
    if mc == 0 {
        return;
    }
    if mc % MR != 0 {
        out[(strips - 1) * MR * kc..].fill(0.0);
    }
    if a.rs == 1 {
        // A transposed a (a weight gradient's dyᵀ): input i of all the
        // block's rows is one contiguous run, read once for every strip.
        // (Strip by strip, each strip would read 24 bytes from each of
        // `kc` rows a power of two apart, all in one cache set.)
        let run_at = |i: usize| {
            a.ptr
                .wrapping_offset(ic as isize + (pc + i) as isize * a.cs)
        };
        for i in 0..kc {
            // The runs lie a row of dy apart, too far for the hardware's
            // prefetchers: without these, each line waited on L3 (13 % of
            // a weight gradient's time).
            if i + PACK_AHEAD < kc {
                let ahead = run_at(i + PACK_AHEAD);
                for line in (0..mc).step_by(16) {
                    prefetch(ahead.wrapping_add(line));
                }
                prefetch(ahead.wrapping_add(mc - 1));
            }
            let (src, dst) = (run_at(i), out.as_mut_ptr().add(i * MR));
            let whole = mc / MR;
            for t in 0..whole {
                // A fixed-size copy: moves, not a call to memcpy.
                std::ptr::copy_nonoverlapping(src.add(t * MR), dst.add(t * kc * MR), MR);
            }
            let rest = mc - whole * MR;
            if rest > 0 {
                std::ptr::copy_nonoverlapping(src.add(whole * MR), dst.add(whole * kc * MR), rest);
            }
        }
        return;
    }
    for (t, strip) in out.chunks_exact_mut(MR * kc).enumerate() {
        let r0 = ic + t * MR;
        let rows = MR.min(mc - t * MR);
        for (i, column) in strip.chunks_exact_mut(MR).enumerate() {
            for (r, v) in column[..rows].iter_mut().enumerate() {
                *v = a.at(r0 + r, pc + i);
            }
        }
    }
}

/// Rows ahead that [`pack_a`] prefetches a transposed operand's runs.
const PACK_AHEAD: usize = 8;

/// Asks for the cache line holding `p` (never faults).
#[inline(always)]
fn prefetch(p: *const f32) {
    // SAFETY: a prefetch only hints; any address is allowed.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::matmul::tests::data;

    /// `scale · a · b` in f64, for `a` `[m, k]` and `b` `[k, n]` row-major.
    fn reference(a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize), scale: f32) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                let dot: f64 = (0..k)
                    .map(|i| f64::from(a[r * k + i]) * f64::from(b[i * n + c]))
                    .sum();
                y[r * n + c] = dot * f64::from(scale);
            }
        }
        y
    }

    fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut t = vec![0f32; v.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = v[r * cols + c];
            }
        }
        t
    }

    /// The splits: even row blocks; a transposed `a` by rows only while
    /// every thread gets a task, else as a row-major one (which `takes`
    /// then leaves to the gemm crate).
    #[test]
    fn plans_split_rows_evenly_and_pack_each_row_once() {
        let p = |m, n, k, t| plan((m, n, k), 2, t);
        // The decoder's forward: four blocks of 156, 156, 156 and 146 rows,
        // not 192, 192, 192 and 38; two column ranges each.
        let want = Plan {
            nc_max: 1024,
            chunks: 2,
            mc: 156,
        };
        assert_eq!(p(614, 30522, 512, false), want);
        assert_eq!(p(4096, 512, 512, false).mc, 192);
        assert_eq!(p(5, 17, 3, false).mc, 6);
        // No rows: a plan all the same (no division by zero).
        assert_eq!(p(0, 17, 3, false).mc, MR);
        assert_eq!(p(0, 17, 3, true).mc, MR);
        // small's qkv weight gradient: 8 tasks of 192 rows over one block
        // of all 512 columns (8 MiB of b).
        let want = Plan {
            nc_max: 512,
            chunks: 1,
            mc: 192,
        };
        assert_eq!(p(1536, 512, 4096, true), want);
        // out's (512 rows): 6 tasks of 90 rows and fewer.
        assert_eq!(p(512, 512, 4096, true).mc, 90);
        // Two rows (a classifier's weight gradient): one task would leave
        // a thread idle.
        assert!(p(2, 512, 4096, true).chunks > 1);
        // One thread: as a row-major a.
        assert_eq!(plan((512, 512, 4096), 1, true).chunks, 1);
        assert_eq!(plan((512, 512, 4096), 1, true).nc_max, 256);
    }

    /// Every layout of both operands, ragged edges, several blocks of
    /// each loop, overwritten and accumulated, serial and parallel: against
    /// the f64 definition.
    #[test]
    fn products_of_strided_operands_match_the_definition() {
        if !has_general_tiles() {
            return;
        }
        for &(m, n, k) in &[
            (1, 1, 1),
            (5, 17, 3),
            (13, 31, 300),
            (97, 40, 513),
            (200, 4100, 7),
        ] {
            let (a, b) = (data(m * k, 1), data(k * n, 2));
            let (a_t, b_t) = (transpose(&a, m, k), transpose(&b, k, n));
            let want = reference(&a, &b, (m, n, k), 0.5);
            let start = data(m * n, 3);
            let a_views = [
                Operand {
                    ptr: a.as_ptr(),
                    rs: k as isize,
                    cs: 1,
                },
                Operand {
                    ptr: a_t.as_ptr(),
                    rs: 1,
                    cs: m as isize,
                },
            ];
            let b_views = [
                Operand {
                    ptr: b.as_ptr(),
                    rs: n as isize,
                    cs: 1,
                },
                Operand {
                    ptr: b_t.as_ptr(),
                    rs: 1,
                    cs: k as isize,
                },
            ];
            for (av, bv) in a_views
                .iter()
                .flat_map(|a| b_views.iter().map(move |b| (a, b)))
            {
                for (accumulate, parallel) in [(false, true), (true, false), (true, true)] {
                    // Rows 3 apart beyond n: a destination with a row stride.
                    let rs = n + 3;
                    let mut dst = vec![f32::NAN; m * rs];
                    if accumulate {
                        for r in 0..m {
                            dst[r * rs..r * rs + n].copy_from_slice(&start[r * n..(r + 1) * n]);
                        }
                    }
                    // SAFETY: the views and dst cover the shapes.
                    unsafe {
                        product(
                            (m, n, k),
                            dst.as_mut_ptr(),
                            rs,
                            accumulate,
                            *av,
                            *bv,
                            0.5,
                            parallel,
                        )
                    };
                    for r in 0..m {
                        for c in 0..n {
                            let base = if accumulate {
                                f64::from(start[r * n + c])
                            } else {
                                0.0
                            };
                            let (got, want) = (dst[r * rs + c], base + want[r * n + c]);
                            let tol = 1e-5 * (k as f64).sqrt() + 1e-6 * want.abs();
                            assert!(
                                (f64::from(got) - want).abs() <= tol,
                                "{m}x{n}x{k} acc {accumulate} ({r}, {c}): {got} vs {want}"
                            );
                        }
                        // The padding columns were not written.
                        assert!(dst[r * rs + n..r * rs + rs].iter().all(|v| v.is_nan()));
                    }
                }
            }
        }
    }

    /// Serial and parallel runs give the same bits.
    #[test]
    fn thread_count_does_not_change_the_bits() {
        if !has_general_tiles() {
            return;
        }
        let (m, n, k) = (300, 70, 600);
        let (a, b) = (data(m * k, 4), data(k * n, 5));
        let run = |parallel| {
            let mut dst = vec![0f32; m * n];
            let av = Operand {
                ptr: a.as_ptr(),
                rs: k as isize,
                cs: 1,
            };
            let bv = Operand {
                ptr: b.as_ptr(),
                rs: n as isize,
                cs: 1,
            };
            // SAFETY: the views and dst cover the shapes.
            unsafe { product((m, n, k), dst.as_mut_ptr(), n, false, av, bv, 1.0, parallel) };
            dst.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(false), run(true));
    }
}
