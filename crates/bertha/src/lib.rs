//! bertha: BERT, end to end.
//!
//! The crate follows the path of a text through a model:
//! [`config`] → [`tokenizer`] → [`weights`] → [`model`] (embeddings,
//! attention, layer, encoder, pooler) → [`pooling`] → [`tasks`].
//! Every stage matches Hugging Face transformers numerically; the tests
//! under `tests/` prove it against reference outputs made by transformers.

pub mod config;
pub mod cpu_mode;
pub mod data;
pub mod error;
pub mod input;
pub mod kernels;
pub mod matmul;
pub mod metrics;
pub mod model;
pub mod pooling;
pub mod rng;
#[cfg(feature = "show")]
pub mod show;
pub mod tasks;
pub mod tokenizer;
pub mod training;
pub mod weights;

pub use config::{
    Activation, AlbertOptions, BertConfig, DebertaOptions, Family, NormPosition, ProblemType,
};
pub use error::{Error, Result};
pub use model::{
    BertForTask, BertHead, BertInput, BertModel, BertOutput, ForwardOptions, HeadInit, HeadKind,
    HeadLabels, HeadOptions, HeadOutput, TaskOutput,
};
pub use pooling::Pooling;
pub use tasks::{EmbedOptions, Embedder};
pub use tokenizer::{Encoded, Tokenizer};
pub use weights::Weights;

/// The tensor types of our API, re-exported so users need not pin candle.
pub use candle_core::{DType, Device, Tensor};
