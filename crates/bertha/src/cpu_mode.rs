//! The CPU's floating-point mode for training and inference (set by the
//! CLI and the server at start, never by a library constructor).

/// Sets flush-to-zero and denormals-are-zero (x86-64 MXCSR) on this
/// thread and on rayon's worker threads, where the matrix multiplies run.
/// The backward pass of a pre-trained encoder yields subnormal gradients
/// (GELU's derivative far from 0, products of small factors), and every
/// AVX FMA touching one takes a microcode assist: a MiniLM training step
/// ran 10× slower (backward 21.5 s → 2.2 s on a 32-sentence batch). Only
/// values below 1.2e-38 change, to 0. Elsewhere a no-op.
pub fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(deprecated)]
        fn set() {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            // SAFETY: only the FTZ (bit 15) and DAZ (bit 6) modes change;
            // every x86-64 CPU has both.
            unsafe { _mm_setcsr(_mm_getcsr() | 0x8040) }
        }
        set();
        rayon::broadcast(|_| set());
    }
}
