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
    /// AVX-512 F + VL + DQ + BW: the 512-bit versions of the row loops
    /// (DQ: 64-bit multiplies, for dropout's hash).
    pub avx512_rows: bool,
    /// AVX-512 F + BW: the packed fp32 tile kernel and the activation
    /// quantizer.
    pub avx512_bw: bool,
    /// AVX-512 VNNI (with F + BW): int8 products by `vpdpbusd`.
    pub vnni: bool,
    /// AVX-VNNI (with AVX2 + FMA): `vpdpbusd` on 256-bit registers, VEX
    /// encoded, on CPUs without AVX-512 (Intel clients since Alder Lake)
    /// and on AMD Zen 5. int8 products use it where AVX-512 VNNI is
    /// absent or masked by `BERTHA_ISA=avx2`. Off with `BERTHA_AVX_VNNI=0`,
    /// so such a CPU can run and time AVX2's 16-bit products too.
    pub avx_vnni: bool,
    /// AVX512-BF16 (with F + BW): bf16 pair products by `vdpbf16ps`; on
    /// aarch64 the BF16 extension (with NEON): `bfdot`.
    pub bf16: bool,
    /// AMX-BF16 tiles (with AVX512-BF16, which the tiles' epilogues use),
    /// granted by the OS: bf16 products by `tdpbf16ps`, 16 × 16 × 32 per
    /// instruction. Off with `BERTHA_AMX=0`.
    pub amx: bool,
    /// aarch64 Advanced SIMD (every aarch64 CPU): the NEON fp32 tiles.
    pub neon: bool,
    /// aarch64 dot products (with NEON): int8 products by `sdot`.
    pub dotprod: bool,
}

/// The CPU's features, detected on the first call and lowered to the
/// instruction set `BERTHA_ISA` asks for (see [`Isa`]).
pub(crate) fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let detected = detect();
        match requested_isa() {
            Some(isa) => detected.lowered_to(isa),
            None => detected,
        }
    })
}

/// The instruction sets the kernels are written for, lowest first on each
/// architecture. `BERTHA_ISA=scalar|avx2|avx512|neon` makes the process run
/// as a CPU with at most that one would: an AVX-512 machine then runs, and
/// tests, the AVX2 or the scalar kernels (the bits they give, the bf16
/// fallback to fp32, ...). Only our own kernels follow it: the candle
/// path's matrix products (the gemm crate) still pick the widest the CPU
/// has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust loops (whatever the compiler makes of them for the
    /// target's baseline): the reference every other one is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512 (F, VL, DQ, BW), with VNNI, AVX512-BF16 and AMX where
    /// the CPU has them.
    Avx512,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl Isa {
    /// The name `BERTHA_ISA` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Neon => "neon",
        }
    }

    /// The level `name` names (`BERTHA_ISA`'s values), case-insensitive.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Scalar, Self::Avx2, Self::Avx512, Self::Neon]
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The instruction set the kernels run: the widest the CPU has, or the
/// lower one `BERTHA_ISA` forces.
pub fn isa() -> Isa {
    features().isa()
}

/// Whether `BERTHA_ISA` hides AVX-512 that the CPU has. The gemm crate
/// picks its kernels from the CPU itself (its AVX-512 ones there), so the
/// fast path then calls its AVX2 kernels by name
/// ([`super::matmul::gemm_f32`]): a run forced to AVX2 times AVX2 code.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_masked() -> bool {
    static MASKED: OnceLock<bool> = OnceLock::new();
    *MASKED.get_or_init(|| detect().avx512_bw && !features().avx512_bw)
}

/// What runs, in words for reports (`bertha bench`, the server's `/info`):
/// the instruction set and the extensions the products use, e.g.
/// `avx512+vnni+bf16+amx`.
pub fn describe() -> String {
    features().describe()
}

/// `BERTHA_ISA`, when set. An unknown name, or a level above what the CPU
/// has, is said once (a warning) and changes nothing: the mask can only
/// take features away.
fn requested_isa() -> Option<Isa> {
    let value = std::env::var("BERTHA_ISA").ok()?;
    if value.trim().is_empty() {
        return None;
    }
    let Some(isa) = Isa::parse(&value) else {
        tracing::warn!("BERTHA_ISA={value:?} is not one of scalar, avx2, avx512, neon: ignored");
        return None;
    };
    Some(isa)
}

impl Features {
    /// No extension: the scalar loops (and any CPU but an x86-64 one).
    const NONE: Self = Self {
        avx2_fma: false,
        avx512_rows: false,
        avx512_bw: false,
        vnni: false,
        avx_vnni: false,
        bf16: false,
        amx: false,
        neon: false,
        dotprod: false,
    };

    /// The widest level these features make up.
    fn isa(self) -> Isa {
        if self.avx512_rows && self.avx512_bw {
            Isa::Avx512
        } else if self.avx2_fma {
            Isa::Avx2
        } else if self.neon {
            Isa::Neon
        } else {
            Isa::Scalar
        }
    }

    /// [`describe`] of these features.
    fn describe(self) -> String {
        let f = self;
        let mut s = f.isa().name().to_string();
        for (on, name) in [
            (f.vnni, "vnni"),
            // Only where the int8 products use it: AVX-512 VNNI comes first.
            (f.avx_vnni && !f.vnni, "avxvnni"),
            (f.bf16, "bf16"),
            (f.amx, "amx"),
            (f.dotprod, "dotprod"),
        ] {
            if on {
                s.push('+');
                s.push_str(name);
            }
        }
        s
    }

    /// These features with everything above `isa` taken away. A level the
    /// CPU does not have (or another architecture's) leaves them as they
    /// are, with a warning.
    fn lowered_to(self, isa: Isa) -> Self {
        let none = Self::NONE;
        match isa {
            Isa::Scalar => none,
            _ if isa > self.isa() || (isa == Isa::Neon) != cfg!(target_arch = "aarch64") => {
                tracing::warn!(
                    "BERTHA_ISA={isa} asks for more than this CPU has ({}): ignored",
                    self.isa()
                );
                self
            }
            // AVX-VNNI is VEX encoded, part of what an AVX2 CPU may have.
            Isa::Avx2 => Self {
                avx2_fma: self.avx2_fma,
                avx_vnni: self.avx_vnni,
                ..none
            },
            Isa::Avx512 | Isa::Neon => self,
        }
    }
}

/// The features the CPU has.
fn detect() -> Features {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        let avx512_bw = has!("avx512f") && has!("avx512bw");
        let avx2_fma = has!("avx2") && has!("fma");
        Features {
            avx2_fma,
            avx_vnni: avx2_fma
                && has!("avxvnni")
                && std::env::var_os("BERTHA_AVX_VNNI").is_none_or(|v| v != "0"),
            avx512_rows: avx512_bw && has!("avx512vl") && has!("avx512dq"),
            avx512_bw,
            vnni: avx512_bw && has!("avx512vnni"),
            bf16: avx512_bw && has!("avx512bf16"),
            amx: avx512_bw && has!("avx512bf16") && amx_granted(),
            ..Features::NONE
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        let neon = has!("neon");
        Features {
            neon,
            dotprod: neon && has!("dotprod"),
            bf16: neon && has!("bf16"),
            ..Features::NONE
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    Features::NONE
}

/// Whether the CPU has AMX-BF16 tiles and Linux lets this process use them
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: the tile data,
/// 8 KiB of state per thread, is saved on context switches only for
/// processes that asked), unless `BERTHA_AMX=0`.
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    if std::env::var_os("BERTHA_AMX").is_some_and(|v| v == "0") {
        return false;
    }
    // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID leaf 7 exists on every CPU with AVX-512 (checked first).
    let edx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.edx;
    if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with this request only changes which state
        // the kernel saves for this process; it fails where AMX is off.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The widest instruction set the row loops are compiled for that the CPU
/// has; the loops are compiled for each and picked at run time, so one
/// binary is fast on AVX-512 machines and still runs on any x86-64.
// Only x86-64 has more than the baseline, and only it picks (the
// multiversion macro).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        let f = features();
        if f.avx512_rows {
            return Simd::Avx512;
        }
        if f.avx2_fma {
            return Simd::Avx2;
        }
    }
    Simd::Baseline
}

/// True when int8 products run on VNNI instructions, AVX-512 VNNI or
/// AVX-VNNI (else AVX2's 16-bit products, NEON's `sdot` or a scalar loop
/// compute the same integers).
pub fn has_vnni() -> bool {
    let f = features();
    f.vnni || f.avx_vnni
}

/// True when bf16 products run on AMX tiles (Intel's `tdpbf16ps`).
pub fn has_amx() -> bool {
    features().amx
}

/// True when `--precision bf16` runs bf16 products: the CPU has them
/// (AVX512-BF16, AMX, or NEON's `bfdot`) and they are faster than its
/// fp32 ones ([`bf16_speed`]). Else bf16 runs in fp32, with a notice
/// ([`no_bf16_reason`]): a scalar loop computes bf16 products far slower,
/// and `vdpbf16ps` on Intel Xeons whose AMX the hypervisor hides runs at
/// ~0.4 of the fp32 `vfmadd` rate (~0.7 of fp32's speed in whole models).
/// The kernels themselves (and their tests) still use the instructions
/// wherever the CPU has them.
pub fn has_bf16() -> bool {
    features().bf16 && bf16_speed().is_none_or(Bf16Speed::pays)
}

/// One core's rates of AVX512-BF16's `vdpbf16ps` and of AVX-512's fp32
/// `vfmadd`, in G ops/s (a multiply-add counts 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bf16Speed {
    pub bf16_gops: f64,
    pub f32_gops: f64,
}

impl Bf16Speed {
    /// bf16 is worth its rounding only where its products are at least
    /// as fast as fp32's: twice as fast on AMD Zen 4 / 5, 0.4× on an Intel
    /// Xeon without AMX; none is known near 1, where timing noise could
    /// flip the choice.
    pub fn pays(self) -> bool {
        self.bf16_gops >= self.f32_gops
    }
}

/// The rates [`has_bf16`] chooses by, timed once per process (25–65 ms, on
/// the calling thread): `None` where nothing is timed because the choice
/// is clear (no AVX512-BF16; AMX, whose tiles ran ~15 times the fp32
/// rate; aarch64, where `bfdot` does two products per lane for `fmla`'s
/// one).
pub fn bf16_speed() -> Option<Bf16Speed> {
    static SPEED: OnceLock<Option<Bf16Speed>> = OnceLock::new();
    *SPEED.get_or_init(time_bf16_speed)
}

#[cfg(target_arch = "x86_64")]
fn time_bf16_speed() -> Option<Bf16Speed> {
    let f = features();
    if !f.bf16 || f.amx {
        return None;
    }
    // The chains of `instruction_peak_gops`, a tenth as long, on this
    // thread only: G ops/s of one run.
    let fma = peak_kernel(super::Precision::F32)?;
    let dot = peak_kernel(super::Precision::Bf16)?;
    let rate = |(kernel, ops_per_iter, iters): PeakKernel| {
        let iters = iters / 10;
        let start = std::time::Instant::now();
        // SAFETY: `peak_kernel` checked that the CPU has the kernel's
        // instructions.
        std::hint::black_box(unsafe { kernel(iters) });
        iters as f64 * ops_per_iter / start.elapsed().as_secs_f64() / 1e9
    };
    // Alternating, best of 5 each: a moment of load on this core slows
    // one run, not one side.
    let (mut f32_gops, mut bf16_gops) = (0f64, 0f64);
    for _ in 0..5 {
        f32_gops = f32_gops.max(rate(fma));
        bf16_gops = bf16_gops.max(rate(dot));
    }
    Some(Bf16Speed {
        bf16_gops,
        f32_gops,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn time_bf16_speed() -> Option<Bf16Speed> {
    None
}

/// Why bf16 runs in fp32 on this CPU, for the notice (when [`has_bf16`]
/// is false).
pub fn no_bf16_reason() -> String {
    match bf16_speed() {
        Some(s) if !s.pays() => format!(
            "this CPU's bf16 products (vdpbf16ps, {:.0} G ops/s a core) are slower than its fp32 ones ({:.0} G ops/s)",
            s.bf16_gops, s.f32_gops
        ),
        _ => "this CPU has no bf16 products (AVX512-BF16, or BF16 on aarch64)".to_string(),
    }
}

/// Defines `fn $name` that runs `$body` (an `#[inline(always)]` function)
/// compiled for the best instruction set available.
macro_rules! multiversion {
    ($($vis:vis fn $name:ident = $body:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {$(
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
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

/// The rate, in G ops/s (a multiply-add counts 2), of the CPU's widest
/// multiply-add for `precision` on every thread of rayon's pool at once:
/// fp32 `vfmadd` (16 per instruction, 8 on AVX2), bf16 `vdpbf16ps` (32) or, on AMX,
/// `tdpbf16ps` (8,192, four independent tiles), or int8
/// `vpdpbusd` (64, or 32 with AVX-VNNI); NEON's fp32 `fmla` (4 per instruction, 16 chains),
/// 12 independent chains per thread on x86 so that throughput, not
/// latency, bounds it (best of 3 runs of ~30 ms). The ceiling each
/// precision's benchmark figures can be read against; `None` where the
/// CPU lacks the instruction.
pub fn instruction_peak_gops(precision: super::Precision) -> Option<f64> {
    let (kernel, ops_per_iter, iters) = peak_kernel(precision)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        // SAFETY: the CPU has the kernel's instructions (checked by
        // `peak_kernel`).
        let sums = rayon::broadcast(|_| unsafe { kernel(iters) });
        std::hint::black_box(sums);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let threads = rayon::current_num_threads() as f64;
    Some(threads * iters as f64 * ops_per_iter / best / 1e9)
}

/// Rounds per run of [`instruction_peak_gops`]: ~30 ms of each instruction.
const PEAK_ITERS: usize = 10_000_000;

/// A peak kernel the CPU has for `precision`: the chains, the operations
/// one round of them does, and the rounds to run.
type PeakKernel = (unsafe fn(usize) -> u32, f64, usize);

#[cfg(target_arch = "x86_64")]
fn peak_kernel(precision: super::Precision) -> Option<PeakKernel> {
    use super::Precision;
    let f = features();
    Some(match precision {
        Precision::F32 if f.avx512_bw => (peak::fma_chains, 12.0 * 16.0 * 2.0, PEAK_ITERS),
        Precision::F32 if f.avx2_fma => {
            (super::matmul::avx2_fma_chains, 12.0 * 8.0 * 2.0, PEAK_ITERS)
        }
        // A round of AMX's four tile products takes ~16 rounds of the
        // others' 12.
        Precision::Bf16 if f.amx => (
            super::matmul::amx_peak_chains,
            4.0 * 8192.0 * 2.0,
            PEAK_ITERS / 16,
        ),
        Precision::Bf16 if f.bf16 => (peak::bf16_chains, 12.0 * 32.0 * 2.0, PEAK_ITERS),
        Precision::Int8 if f.vnni => (peak::int8_chains, 12.0 * 64.0 * 2.0, PEAK_ITERS),
        Precision::Int8 if f.avx_vnni => (
            super::matmul::avx_vnni_chains,
            12.0 * 32.0 * 2.0,
            PEAK_ITERS,
        ),
        _ => return None,
    })
}

#[cfg(target_arch = "aarch64")]
fn peak_kernel(precision: super::Precision) -> Option<PeakKernel> {
    let f = features();
    match precision {
        super::Precision::F32 if f.neon => {
            Some((super::matmul::neon_fma_chains, 16.0 * 4.0 * 2.0, PEAK_ITERS))
        }
        _ => None,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn peak_kernel(_: super::Precision) -> Option<PeakKernel> {
    None
}

/// The chains [`instruction_peak_gops`] times: `iters` rounds of one
/// multiply-add on each of 12 accumulators (values that stay finite and
/// normal), folded into a number the caller keeps.
#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    /// Every lane of the fp32 chains summed: a result the compiler cannot
    /// drop the chains from.
    #[target_feature(enable = "avx512f")]
    unsafe fn lane_total(acc: &[__m512; 12]) -> u32 {
        let sum = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, a| _mm512_add_ps(s, *a));
        _mm512_reduce_add_ps(sum) as u32
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma_chains(iters: usize) -> u32 {
        let (b, c) = (_mm512_set1_ps(1.0), _mm512_set1_ps(0.5));
        let mut acc = [_mm512_setzero_ps(); 12];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, b, c);
            }
        }
        lane_total(&acc)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn bf16_chains(iters: usize) -> u32 {
        // Pairs of bf16 ones (0x3f80): each round adds 2 per lane.
        let ones: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3f80_3f80));
        let mut acc = [_mm512_setzero_ps(); 12];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, ones, ones);
            }
        }
        lane_total(&acc)
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn int8_chains(iters: usize) -> u32 {
        let (a8, b8) = (
            _mm512_set1_epi32(0x0101_0101),
            _mm512_set1_epi32(0x0102_0304),
        );
        let mut acc = [_mm512_setzero_si512(); 12];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbusd_epi32(*a, a8, b8);
            }
        }
        let sum = acc
            .iter()
            .fold(_mm512_setzero_si512(), |s, a| _mm512_add_epi32(s, *a));
        _mm512_reduce_add_epi32(sum) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    const ALL: Features = Features {
        avx2_fma: true,
        avx512_rows: true,
        avx512_bw: true,
        vnni: true,
        avx_vnni: true,
        bf16: true,
        amx: true,
        neon: false,
        dotprod: false,
    };

    #[test]
    fn isa_names_parse_back() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX2 "), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse4"), None);
        assert_eq!(Isa::parse(""), None);
    }

    /// The mask only takes features away: scalar leaves none, avx2 only
    /// AVX2 + FMA and AVX-VNNI (no AVX-512 extension survives it), avx512
    /// all, and a level above what the CPU has changes nothing.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_mask_lowers_and_never_raises() {
        let scalar = ALL.lowered_to(Isa::Scalar);
        assert_eq!(scalar.isa(), Isa::Scalar);
        assert!(
            !(scalar.avx2_fma
                || scalar.avx_vnni
                || scalar.avx512_bw
                || scalar.vnni
                || scalar.bf16
                || scalar.amx)
        );
        let avx2 = ALL.lowered_to(Isa::Avx2);
        assert_eq!(avx2.isa(), Isa::Avx2);
        assert!(avx2.avx2_fma && avx2.avx_vnni);
        assert!(!(avx2.avx512_rows || avx2.avx512_bw || avx2.vnni || avx2.bf16 || avx2.amx));
        assert_eq!(ALL.lowered_to(Isa::Avx512), ALL);
        // An AVX2-only CPU asked for AVX-512 (or NEON) stays AVX2.
        let zen3 = Features {
            avx2_fma: true,
            ..Features::NONE
        };
        assert_eq!(zen3.lowered_to(Isa::Avx512), zen3);
        assert_eq!(zen3.lowered_to(Isa::Neon), zen3);
        assert_eq!(zen3.lowered_to(Isa::Avx2), zen3);
    }

    /// Reports name the extensions the products use: AVX-VNNI only where
    /// AVX-512 VNNI does not take the int8 products.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn descriptions_name_what_the_products_use() {
        assert_eq!(ALL.describe(), "avx512+vnni+bf16+amx");
        assert_eq!(ALL.lowered_to(Isa::Avx2).describe(), "avx2+avxvnni");
        let zen3 = Features {
            avx2_fma: true,
            ..Features::NONE
        };
        assert_eq!(zen3.describe(), "avx2");
        assert_eq!(ALL.lowered_to(Isa::Scalar).describe(), "scalar");
    }

    /// An aarch64 CPU's features are the NEON level; scalar takes them
    /// all away, and NEON (its own level) leaves them.
    #[test]
    fn neon_features_make_the_neon_level() {
        let graviton = Features {
            neon: true,
            dotprod: true,
            ..Features::NONE
        };
        assert_eq!(graviton.isa(), Isa::Neon);
        assert_eq!(graviton.lowered_to(Isa::Scalar), Features::NONE);
        assert_eq!(graviton.lowered_to(Isa::Neon), graviton);
    }

    /// bf16 runs where the CPU has its products and, where they were
    /// timed, they beat fp32's; the notice names the rates then.
    #[test]
    fn bf16_runs_only_where_its_products_pay() {
        let f = features();
        eprintln!("bf16 speed: {:?}; bf16 runs: {}", bf16_speed(), has_bf16());
        match bf16_speed() {
            Some(s) => {
                assert!(f.bf16 && !f.amx, "{f:?}");
                assert!(s.bf16_gops > 0.0 && s.f32_gops.is_finite(), "{s:?}");
                assert_eq!(has_bf16(), s.pays(), "{s:?}");
                if !s.pays() {
                    assert!(no_bf16_reason().contains("slower than its fp32"));
                }
            }
            None => {
                assert_eq!(has_bf16(), f.bf16, "{f:?}");
                if !f.bf16 {
                    assert!(no_bf16_reason().contains("no bf16 products"));
                }
            }
        }
        let speed = |bf16_gops, f32_gops| Bf16Speed {
            bf16_gops,
            f32_gops,
        };
        assert!(speed(690.0, 345.0).pays());
        assert!(speed(345.0, 345.0).pays());
        assert!(!speed(145.0, 345.0).pays());
    }
}
