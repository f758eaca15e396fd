//! CPU kernels for the inference fast path, on plain `f32` slices; the
//! training ops (`model::ops`) share the row loops and the multiversioning.
//!
//! candle runs each elementwise op as its own pass (single-threaded or
//! through a spinning barrier pool) and allocates its result; here the
//! work after each matrix multiply is fused into one pass over the rows,
//! parallel over rows with rayon (the pool gemm uses too), writing into
//! buffers the caller reuses.

mod activations;
mod attention;
mod lanes;
mod layer_norm;
mod linear;
mod rates;
mod softmax;
#[cfg(test)]
pub(super) mod tests;

pub(crate) use activations::{
    activate_body, erf_and_gauss, gelu_erf, gelu_tanh, gelu_tanh_inner, tanh,
};
pub use activations::{fast_exp, Act};
pub use attention::{attention_at_rows, packed_attention};
pub(super) use attention::{AttentionJob, Scratch};
pub(crate) use lanes::{lane_dot_centered, lane_sum};
pub use layer_norm::{add_in_place, add_layer_norm, layer_norm_into};
pub(crate) use layer_norm::{finish_norm_pairs, row_stats};
pub use linear::linear;
pub(crate) use linear::parallelism;
pub use rates::{linear_gops, matmul_gflops};
pub(crate) use softmax::softmax_row;

// Only named by a doc link (the 16-lane erf in `matmul::avx512`); in a
// build it would be an unused import.
#[cfg(doc)]
pub(crate) use activations::erf;

pub(crate) use super::cpu::multiversion;

/// Rows per rayon task: big enough that scheduling is noise (the
/// training ops also sum weight gradients in blocks of this many rows).
pub(crate) const ROWS_PER_TASK: usize = 16;
