//! The CPU fast path: the BERT-layer families (BERT, RoBERTa, DistilBERT,
//! ELECTRA, ALBERT; [`bert_layout`]) and ModernBERT on packed sequences
//! ([`PackedBert`] for inference, [`train`] for training) with fused kernels and matrix multiplies against
//! weights packed once.
//!
//! Everything here is crate-private except what a caller chooses or
//! measures: the packed model, its [`Precision`], the CPU-mode switch
//! [`cpu::flush_denormals`] and the matrix-multiply probe
//! [`matmul_gflops`]. The training ops (`model::ops`) share the row loops
//! of `kernels`.

mod aligned;
mod band;
pub(crate) mod bert_layout;
pub(crate) mod buffers;
pub mod cpu;
pub(crate) mod kernels;
pub(crate) mod matmul;
mod modernbert;
mod packed;
mod precision;
mod rope;
mod site;
pub mod train;

pub use cpu::{flush_denormals, instruction_peak_gops};
pub use kernels::{linear_gops, matmul_gflops};
pub use packed::{PackedBert, PackedStates};
pub use precision::Precision;

/// Runs `f` on a worker of rayon's pool when called from outside it.
///
/// A parallel loop started from a thread outside the pool queues its job,
/// wakes the workers and puts the caller to sleep until they finish: a
/// futex wake and sleep for each of a forward pass's ~50 products, which
/// at batch 1 (one sentence, ~80 µs a product) cost a fifth of the time.
/// From a worker, the loops split in place and the caller works too.
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() || rayon::current_num_threads() <= 1 {
        f()
    } else {
        rayon::scope(|_| f())
    }
}
