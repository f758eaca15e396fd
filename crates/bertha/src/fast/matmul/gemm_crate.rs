//! The fast path's products on the gemm crate, held to the instruction
//! set the kernels run. The gemm crate picks its kernels from the CPU
//! itself (its AVX-512 ones on a CPU that has them), so under
//! `BERTHA_ISA=avx2` on such a CPU [`gemm_f32`] calls its AVX2 + FMA kernels
//! by name, as a CPU without AVX-512 runs them: a forced AVX2 run then
//! times AVX2 code only (before, weight gradients and `bertha bench`'s
//! matrix-multiply peak ran AVX-512 in AVX2 runs).

use gemm::Parallelism;

/// `dst = alpha · dst (when read_dst) + beta · lhs · rhs`, `gemm::gemm`'s
/// arguments without the conjugations (real numbers).
///
/// # Safety
/// As `gemm::gemm`: `lhs`, `rhs` and `dst` address `m × k`, `k × n` and
/// `m × n` elements through their (non-negative) strides, and nothing
/// else writes `dst` meanwhile.
pub(crate) unsafe fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    (dst, dst_cs, dst_rs, read_dst): (*mut f32, isize, isize, bool),
    (lhs, lhs_cs, lhs_rs): (*const f32, isize, isize),
    (rhs, rhs_cs, rhs_rs): (*const f32, isize, isize),
    alpha: f32,
    beta: f32,
    parallelism: Parallelism,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::fast::cpu::avx512_masked() && crate::fast::cpu::features().avx2_fma {
        // SAFETY: the caller's contract; the CPU has AVX2 and FMA.
        return unsafe {
            fma::gemm(
                (m, n, k),
                (dst, dst_cs, dst_rs, read_dst),
                (lhs, lhs_cs, lhs_rs),
                (rhs, rhs_cs, rhs_rs),
                (alpha, beta),
                parallelism,
            )
        };
    }
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            read_dst,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            alpha,
            beta,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// The gemm crate's f32 products on its AVX2 + FMA micro-kernels: what
/// `gemm::gemm` runs on a CPU without AVX-512 (its `fma` module, private
/// there, rebuilt from the public parts of gemm-common and gemm-f32 0.19).
#[cfg(target_arch = "x86_64")]
mod fma {
    use gemm::Parallelism;
    use gemm_common::simd::{MixedSimd, V3};
    use gemm_f32::microkernel::fma::f32::{H_M, H_N, H_UKR, MR_DIV_N, NR, UKR};

    /// f32 lanes of a ymm register (the `fma` module's `N`).
    const N: usize = 8;

    /// # Safety
    /// As [`super::gemm_f32`], on a CPU with AVX2 and FMA.
    pub(super) unsafe fn gemm(
        (m, n, k): (usize, usize, usize),
        (dst, dst_cs, dst_rs, read_dst): (*mut f32, isize, isize, bool),
        (lhs, lhs_cs, lhs_rs): (*const f32, isize, isize),
        (rhs, rhs_cs, rhs_rs): (*const f32, isize, isize),
        (alpha, beta): (f32, f32),
        parallelism: Parallelism,
    ) {
        debug_assert!([dst_cs, dst_rs, lhs_cs, lhs_rs, rhs_cs, rhs_rs]
            .iter()
            .all(|&s| s >= 0));
        let simd = <V3 as MixedSimd<f32, f32, f32, f32>>::try_new()
            .expect("the caller checked AVX2 and FMA");
        // `gemm::gemm`'s own first step: a row-major destination is made
        // as its transpose, `dstᵀ = rhsᵀ · lhsᵀ` (the micro-kernels want
        // columns).
        let ((m, n), (dst_cs, dst_rs), (lhs, lhs_cs, lhs_rs), (rhs, rhs_cs, rhs_rs)) =
            if dst_cs.abs() < dst_rs.abs() {
                (
                    (n, m),
                    (dst_rs, dst_cs),
                    (rhs, rhs_rs, rhs_cs),
                    (lhs, lhs_rs, lhs_cs),
                )
            } else {
                (
                    (m, n),
                    (dst_cs, dst_rs),
                    (lhs, lhs_cs, lhs_rs),
                    (rhs, rhs_cs, rhs_rs),
                )
            };
        // SAFETY: the caller's contract, with the strides transposed
        // together with the operands.
        unsafe {
            gemm_common::gemm::gemm_basic_generic::<
                _,
                f32,
                N,
                { MR_DIV_N * N },
                NR,
                MR_DIV_N,
                H_M,
                H_N,
            >(
                simd,
                m,
                n,
                k,
                dst,
                dst_cs,
                dst_rs,
                read_dst,
                lhs,
                lhs_cs,
                lhs_rs,
                rhs,
                rhs_cs,
                rhs_rs,
                alpha,
                beta,
                false,
                false,
                false,
                |a, b, c| a * b + c,
                &UKR,
                &H_UKR,
                false,
                parallelism,
            )
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::tests::data;

    /// The rebuilt AVX2 + FMA path against sums in f64, on the operand
    /// layouts the fast path gives it: row-major `a` and `b`, a transposed
    /// `a` (weight gradients' `dyᵀ`), a transposed `b` (attention's `Kᵀ`),
    /// a destination read and added to, and shapes off the tiles' sizes.
    #[test]
    fn fma_products_equal_their_sums() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        for (m, n, k) in [(1, 1, 1), (7, 13, 5), (37, 70, 129), (96, 33, 300)] {
            for (a_t, b_t, read) in [
                (false, false, false),
                (true, false, true),
                (false, true, false),
            ] {
                let (a, b) = (data(m * k, 1), data(k * n, 2));
                let mut dst = data(m * n, 3);
                let before = dst.clone();
                // a[r, i] at a_rs · r + a_cs · i.
                let (a_cs, a_rs) = if a_t { (m, 1) } else { (1, k) };
                let (b_cs, b_rs) = if b_t { (k, 1) } else { (1, n) };
                let (alpha, beta) = (if read { 1.0 } else { 0.0 }, 0.5);
                // SAFETY: the AVX2 and FMA check above; the vectors hold
                // the m × k, k × n and m × n elements the strides address.
                unsafe {
                    super::fma::gemm(
                        (m, n, k),
                        (dst.as_mut_ptr(), 1, n as isize, read),
                        (a.as_ptr(), a_cs as isize, a_rs as isize),
                        (b.as_ptr(), b_cs as isize, b_rs as isize),
                        (alpha, beta),
                        gemm::Parallelism::None,
                    )
                };
                for r in 0..m {
                    for c in 0..n {
                        let sum: f64 = (0..k)
                            .map(|i| {
                                f64::from(a[r * a_rs + i * a_cs])
                                    * f64::from(b[i * b_rs + c * b_cs])
                            })
                            .sum();
                        let want =
                            f64::from(alpha) * f64::from(before[r * n + c]) + f64::from(beta) * sum;
                        let got = f64::from(dst[r * n + c]);
                        assert!(
                            (got - want).abs() <= 1e-5 * (k as f64).sqrt().max(1.0),
                            "{m}x{n}x{k} a_t {a_t} b_t {b_t} read {read}: [{r}, {c}] {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
