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
