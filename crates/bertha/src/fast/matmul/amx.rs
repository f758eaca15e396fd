//! bf16 tile products on AMX (Intel's Advanced Matrix Extensions): one
//! `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16
//! fp32 sums, 8,192 multiply-adds, where `vdpbf16ps` does 32. The operands
//! are already in the tiles' layout: a left tile's rows are rows of bf16
//! pairs (`PairsIn::rows`), a right tile is 16 pair rows of 16 columns of a
//! weight panel (pair row `i`, column `j` the word `w[2i, j] | w[2i+1, j]
//! << 16`, the panel's layout). So [`sums`] reads both in place.
//!
//! Written as inline assembly: Rust's AMX intrinsics are unstable.

use std::arch::asm;
use std::cell::Cell;

use super::NR;

/// `ldtilecfg`'s 64-byte operand (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile register.
    colsb: [u16; 16],
    /// Rows of each tile register.
    rows: [u8; 16],
}

/// Pairs per left tile row (64 bytes): a tile step.
const STEP: usize = 16;

thread_local! {
    /// The row counts of the two left tiles this thread's tile registers
    /// are configured for, `r0 | r1 << 8` (0: not yet).
    static CONFIGURED: Cell<u16> = const { Cell::new(0) };
}

/// Configures this thread's tiles for left tiles of `r0` and `r1` rows (0:
/// none), unless they are: `tmm0`, `tmm1` the first's sums (`r0` × 16
/// fp32), `tmm2`, `tmm3` the second's, `tmm4`, `tmm5` the left tiles (× 16
/// pairs), `tmm6`, `tmm7` the right (16 pair rows × 16).
///
/// # Safety
/// The CPU must have AMX and the OS must have granted it
/// (`features().amx`).
unsafe fn configure(r0: usize, r1: usize) {
    debug_assert!((1..=16).contains(&r0) && r1 <= 16);
    let key = (r0 | r1 << 8) as u16;
    if CONFIGURED.get() == key {
        return;
    }
    let mut config = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let (r0, r1) = (r0 as u8, r1 as u8);
    config.rows[..8].copy_from_slice(&[r0, r0, r1, r1, r0, r1, 16, 16]);
    for (colsb, rows) in config.colsb.iter_mut().zip(config.rows) {
        // An unused tile has neither rows nor columns.
        *colsb = if rows > 0 { 64 } else { 0 };
    }
    // SAFETY: the caller's contract; the operand is a valid palette-1
    // configuration (64 bytes, aligned).
    unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
    CONFIGURED.set(key);
}

/// `out[r · NR + j] = Σ_i a[r · lda + i] · panel[i, j]` over `k2` pairs, for
/// rows `r < R0 + R1` and the panel's [`NR`] columns: products of bf16
/// pairs summed in fp32, in one left tile of `R0` rows (≤ 16) or, with
/// `R1` > 0, two (the second of rows `R0..R0 + R1`), which then share each
/// step's loads of the right operand.
///
/// # Safety
/// The CPU must have AMX, granted (`features().amx`); `a` must address
/// `R0 + R1` rows of `k2` words `lda` apart, `panel` `k2` pair rows of
/// [`NR`] words, `out` `R0 + R1` × [`NR`] values no one else reads or
/// writes meanwhile.
#[inline]
pub(super) unsafe fn sums<const R0: usize, const R1: usize>(
    a: *const u32,
    lda: usize,
    k2: usize,
    panel: *const u32,
    out: *mut f32,
) {
    const { assert!(R0 >= 1 && R0 <= 16 && R1 <= 16 && NR == 32) };
    // One step: the sums of both left tiles at `a` (rows `sa` bytes
    // apart) with the right tiles at `b` (rows `sb` bytes apart).
    macro_rules! step {
        ($a:expr, $sa:expr, $b:expr, $sb:expr) => {
            let (a, sa, b, sb): (*const u32, usize, *const u32, usize) = ($a, $sa, $b, $sb);
            asm!(
                "tileloadd tmm6, [{b0} + {sb} * 1]",
                "tileloadd tmm7, [{b1} + {sb} * 1]",
                "tileloadd tmm4, [{a0} + {sa} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                a0 = in(reg) a,
                sa = in(reg) sa,
                b0 = in(reg) b,
                b1 = in(reg) b.add(STEP),
                sb = in(reg) sb,
                options(nostack, readonly),
            );
            if R1 > 0 {
                asm!(
                    "tileloadd tmm5, [{a1} + {sa} * 1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a1 = in(reg) a.byte_add(R0 * sa),
                    sa = in(reg) sa,
                    options(nostack, readonly),
                );
            }
        };
    }
    // SAFETY: the caller's contract for every access below: full steps
    // read pairs i..i + 16 < k2 of the rows and pair rows i..i + 16 of
    // the panel; the last, partial step reads zero-padded copies.
    unsafe {
        configure(R0, R1);
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        if R1 > 0 {
            asm!("tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        }
        let full = k2 / STEP * STEP;
        for i in (0..full).step_by(STEP) {
            step!(a.add(i), lda * 4, panel.add(i * NR), NR * 4);
        }
        if full < k2 {
            let rest = k2 - full;
            let mut left = [0u32; 32 * STEP];
            let mut right = [0u32; STEP * NR];
            for r in 0..R0 + R1 {
                let from = a.add(r * lda + full);
                std::ptr::copy_nonoverlapping(from, left[r * STEP..].as_mut_ptr(), rest);
            }
            std::ptr::copy_nonoverlapping(panel.add(full * NR), right.as_mut_ptr(), rest * NR);
            step!(left.as_ptr(), STEP * 4, right.as_ptr(), NR * 4);
        }
        let s = NR * 4;
        asm!(
            "tilestored [{c0} + {s} * 1], tmm0",
            "tilestored [{c1} + {s} * 1], tmm1",
            c0 = in(reg) out,
            c1 = in(reg) out.add(STEP),
            s = in(reg) s,
            options(nostack),
        );
        if R1 > 0 {
            let out = out.add(R0 * NR);
            asm!(
                "tilestored [{c0} + {s} * 1], tmm2",
                "tilestored [{c1} + {s} * 1], tmm3",
                c0 = in(reg) out,
                c1 = in(reg) out.add(STEP),
                s = in(reg) s,
                options(nostack),
            );
        }
    }
}

/// `iters` rounds of four independent `tdpbf16ps` on tiles of 16 × 16
/// sums from operands of ones, no memory in the loop: the rate
/// `instruction_peak_gops` reports for bf16 where the products run on AMX
/// (4 · 16 · 16 · 32 multiply-adds a round). Returns a sum the caller
/// keeps, so the loop is not dropped.
///
/// # Safety
/// The CPU must have AMX, granted (`features().amx`).
pub(crate) unsafe fn peak_chains(iters: usize) -> u32 {
    // bf16 pairs of ones (0x3f80) for both operands.
    let ones = [0x3f80_3f80u32; 16 * STEP];
    let mut sums = [0f32; 16 * 16];
    // SAFETY: the caller's contract; the operands are 16 rows of 64
    // bytes, the output 16 rows of 16 fp32.
    unsafe {
        configure(16, 16);
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{a} + {s} * 1]",
            "tileloadd tmm5, [{a} + {s} * 1]",
            "tileloadd tmm6, [{a} + {s} * 1]",
            "tileloadd tmm7, [{a} + {s} * 1]",
            a = in(reg) ones.as_ptr(),
            s = in(reg) STEP * 4,
            options(nostack, readonly),
        );
        for _ in 0..iters {
            asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem),
            );
        }
        asm!(
            "tilestored [{c} + {s} * 1], tmm0",
            c = in(reg) sums.as_mut_ptr(),
            s = in(reg) 16usize * 4,
            options(nostack),
        );
    }
    sums[0] as u32
}
