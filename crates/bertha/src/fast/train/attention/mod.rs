//! Self-attention over packed sequences with its backward pass: one task
//! per (sequence, head), each sequence attending over its own tokens only.
//! A sequence may end in padding rows that attend to its tokens but that
//! no row attends to (`keys`: the rows of each sequence that are keys), as
//! in a padded batch.
//!
//! The forward keeps each task's probabilities (before dropout) for the
//! backward, and the dropout mask it draws as bits (one per probability),
//! which the backward applies again without drawing it anew.

mod backward;
mod forward;
mod masks;
mod packing;
mod pairs;
mod qkv;
#[cfg(test)]
mod tests;

pub(crate) use backward::backward;
pub(crate) use forward::forward;
pub(crate) use packing::{mask_words, probability_offsets, Heads, Packing};
pub(crate) use qkv::{Qkv, QkvGrad};
