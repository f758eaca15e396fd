//! What users do with an encoder: one module per task.

pub mod embed;

pub use embed::{cosine_similarity_matrix, EmbedOptions, Embedder, TokenEmbeddings};
