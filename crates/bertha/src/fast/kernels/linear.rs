//! `linear`: a product with a bias on the gemm crate (the fp32 layout
//! of CPUs without the packed multiplies' tiles), and the parallelism
//! gemm calls are given.

use gemm::Parallelism;
use rayon::prelude::*;

use super::ROWS_PER_TASK;

pub(crate) fn parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

/// `y[m, n] = x[m, k] · w[k, n] + bias[n]` with `w` stored row-major
/// [k, n] (a transposed `nn.Linear` weight).
pub fn linear(x: &[f32], w_t: &[f32], bias: &[f32], y: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k, "linear: input is not [{m}, {k}]");
    assert_eq!(w_t.len(), k * n, "linear: weight is not [{k}, {n}]");
    assert_eq!(bias.len(), n, "linear: bias is not [{n}]");
    assert_eq!(y.len(), m * n, "linear: output is not [{m}, {n}]");
    if m == 0 {
        return;
    }
    // The bias goes in first and gemm accumulates onto it.
    y.par_chunks_mut(n * ROWS_PER_TASK)
        .for_each(|rows| rows.chunks_mut(n).for_each(|r| r.copy_from_slice(bias)));
    // SAFETY: the slices have the asserted sizes and the strides below
    // address exactly those row-major layouts.
    unsafe {
        crate::fast::matmul::gemm_f32(
            (m, n, k),
            (y.as_mut_ptr(), 1, n as isize, true),
            (x.as_ptr(), 1, k as isize),
            (w_t.as_ptr(), 1, n as isize),
            1.0,
            1.0,
            parallelism(),
        );
    }
}
