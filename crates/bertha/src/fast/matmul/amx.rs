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
    /// The left tiles' row count this thread's tile registers are
    /// configured for (0: not yet).
    static CONFIGURED: Cell<u8> = const { Cell::new(0) };
}

/// Configures this thread's tiles for `rows`-row left operands, unless
/// they are: `tmm0`, `tmm1` the sums (`rows` × 16 fp32), `tmm2` the left
/// (`rows` × 16 pairs), `tmm3`, `tmm4` the right (16 pair rows × 16).
///
/// # Safety
/// The CPU must have AMX and the OS must have granted it
/// (`features().amx`).
unsafe fn configure(rows: usize) {
    debug_assert!((1..=16).contains(&rows));
    let rows = rows as u8;
    if CONFIGURED.get() == rows {
        return;
    }
    let mut config = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    config.colsb[..5].fill(64);
    config.rows[..5].copy_from_slice(&[rows, rows, rows, 16, 16]);
    // SAFETY: the caller's contract; the operand is a valid palette-1
    // configuration (64 bytes, aligned).
    unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
    CONFIGURED.set(rows);
}

/// `out[r · NR + j] = Σ_i a[r · lda + i] · panel[i, j]` over `k2` pairs, for
/// rows `r < R` (≤ 16) and the panel's [`NR`] columns: products of bf16
/// pairs summed in fp32.
///
/// # Safety
/// The CPU must have AMX, granted (`features().amx`); `a` must address `R`
/// rows of `k2` words `lda` apart, `panel` `k2` pair rows of [`NR`] words,
/// `out` `R` × [`NR`] values no one else reads or writes meanwhile.
#[inline]
pub(super) unsafe fn sums<const R: usize>(
    a: *const u32,
    lda: usize,
    k2: usize,
    panel: *const u32,
    out: *mut f32,
) {
    const { assert!(R >= 1 && R <= 16 && NR == 32) };
    // SAFETY: the caller's contract for every access below: full steps
    // read pairs i..i + 16 < k2 of R rows and pair rows i..i + 16 of the
    // panel; the last, partial step reads zero-padded copies.
    unsafe {
        configure(R);
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        let full = k2 / STEP * STEP;
        let (a_stride, b_stride) = (lda * 4, NR * 4);
        for i in (0..full).step_by(STEP) {
            let b = panel.add(i * NR);
            asm!(
                "tileloadd tmm2, [{a} + {sa} * 1]",
                "tileloadd tmm3, [{b0} + {sb} * 1]",
                "tileloadd tmm4, [{b1} + {sb} * 1]",
                "tdpbf16ps tmm0, tmm2, tmm3",
                "tdpbf16ps tmm1, tmm2, tmm4",
                a = in(reg) a.add(i),
                sa = in(reg) a_stride,
                b0 = in(reg) b,
                b1 = in(reg) b.add(STEP),
                sb = in(reg) b_stride,
                options(nostack, readonly),
            );
        }
        if full < k2 {
            let rest = k2 - full;
            let mut left = [0u32; 16 * STEP];
            let mut right = [0u32; STEP * NR];
            for r in 0..R {
                std::ptr::copy_nonoverlapping(
                    a.add(r * lda + full),
                    left[r * STEP..].as_mut_ptr(),
                    rest,
                );
            }
            std::ptr::copy_nonoverlapping(panel.add(full * NR), right.as_mut_ptr(), rest * NR);
            asm!(
                "tileloadd tmm2, [{a} + {sa} * 1]",
                "tileloadd tmm3, [{b0} + {sb} * 1]",
                "tileloadd tmm4, [{b1} + {sb} * 1]",
                "tdpbf16ps tmm0, tmm2, tmm3",
                "tdpbf16ps tmm1, tmm2, tmm4",
                a = in(reg) left.as_ptr(),
                sa = in(reg) STEP * 4,
                b0 = in(reg) right.as_ptr(),
                b1 = in(reg) right.as_ptr().add(STEP),
                sb = in(reg) b_stride,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{c0} + {s} * 1], tmm0",
            "tilestored [{c1} + {s} * 1], tmm1",
            c0 = in(reg) out,
            c1 = in(reg) out.add(STEP),
            s = in(reg) NR * 4,
            options(nostack),
        );
    }
}
