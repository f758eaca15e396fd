//! What the CPU can do, detected once, and the process-wide CPU modes the
//! fast path and training want.
//!
//! Every kernel of [`crate::fast`] asks `features()` which instruction set
//! to use; the detection runs on the first call and is cached, so no hot
//! loop repeats `is_x86_feature_detected!`.

use std::sync::OnceLock;

/// The instruction-set extensions the kernels choose between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Features {
    /// AVX2 with FMA: the 256-bit versions of the row loops.
    pub avx2_fma: bool,
    /// AVX-512 F + VL: the 512-bit versions of the row loops.
    pub avx512_vl: bool,
    /// AVX-512 F + BW: the packed fp32 tile kernel and the activation
    /// quantizer.
    pub avx512_bw: bool,
    /// AVX-512 VNNI (with F + BW): int8 products by `vpdpbusd`.
    pub vnni: bool,
    /// AVX512-BF16 (with F + BW): bf16 pair products by `vdpbf16ps`.
    pub bf16: bool,
}

/// The CPU's features, detected on the first call.
pub(crate) fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

fn detect() -> Features {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        let avx512_bw = has!("avx512f") && has!("avx512bw");
        Features {
            avx2_fma: has!("avx2") && has!("fma"),
            avx512_vl: has!("avx512f") && has!("avx512vl"),
            avx512_bw,
            vnni: avx512_bw && has!("avx512vnni"),
            bf16: avx512_bw && has!("avx512bf16"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Features {
        avx2_fma: false,
        avx512_vl: false,
        avx512_bw: false,
        vnni: false,
        bf16: false,
    }
}

/// The widest instruction set the row loops are compiled for that the CPU
/// has; the loops are compiled for each and picked at run time, so one
/// binary is fast on AVX-512 machines and still runs on any x86-64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

pub(crate) fn simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        let f = features();
        if f.avx512_vl {
            return Simd::Avx512;
        }
        if f.avx2_fma {
            return Simd::Avx2;
        }
    }
    Simd::Baseline
}

/// True when int8 products run on VNNI instructions (else a scalar loop
/// computes the same integers, slowly).
pub fn has_vnni() -> bool {
    features().vnni
}

/// True when bf16 products run on AVX512-BF16 instructions (else a scalar
/// loop computes them, far slower: bf16 then falls back to fp32).
pub fn has_bf16() -> bool {
    features().bf16
}

/// Defines `fn $name` that runs `$body` (an `#[inline(always)]` function)
/// compiled for the best instruction set available.
macro_rules! multiversion {
    ($(fn $name:ident = $body:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) { $body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) { $body($($arg),*) }
                match $crate::fast::cpu::simd() {
                    // SAFETY: simd() checked that the CPU has these features.
                    $crate::fast::cpu::Simd::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::fast::cpu::Simd::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::fast::cpu::Simd::Baseline => {}
                }
            }
            $body($($arg),*)
        }
    )*};
}
pub(crate) use multiversion;

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
