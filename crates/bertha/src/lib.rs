//! bertha: BERT, end to end.
//!
//! The crate follows the path of a text through a model:
//! [`config`] → [`io`] (the model folder, its tokenizer and weights, the
//! user's texts) → [`model`] (the generic BERT, one file per family member,
//! the task heads behind [`BertHead`]) → [`pooling`] (and [`splade`]'s
//! sparse vectors from the MLM head) → [`tasks`] (the
//! pipelines, and fine-tuned checkpoints in use). [`fast`] runs the same
//! encoder on packed sequences for CPU inference.
//!
//! Training: [`data`] (pre-training corpora and masking, the fine-tuning
//! readers and model inputs) → [`training`] (one loop, the
//! [`Trainer`](training::Trainer), for every
//! [`Objective`](training::Objective): MLM (+NSP) pre-training,
//! classification, NER and QA fine-tuning), scored with [`metrics`];
//! every random draw comes from [`rng`]'s seeded streams.
//!
//! Every stage matches Hugging Face transformers numerically; the tests
//! under `tests/` prove it against reference outputs made by transformers.

pub mod config;
pub mod data;
pub mod error;
pub mod fast;
pub mod io;
pub mod metrics;
pub mod model;
pub mod pooling;
pub mod rng;
#[cfg(feature = "show")]
pub mod show;
pub mod splade;
pub mod tasks;
pub mod training;

pub use config::{
    Activation, AlbertOptions, BertConfig, DebertaOptions, Family, NormPosition, ProblemType,
};
pub use error::{Error, Result};
pub use fast::{PackedBert, Precision};
pub use io::tokenizer::{Encoded, Tokenizer};
pub use io::weights::Weights;
pub use io::{ModelDir, SentenceTransformerSpec};
pub use model::{
    BertForTask, BertHead, BertInput, BertModel, BertOutput, ForwardOptions, HeadInit, HeadKind,
    HeadLabels, HeadOptions, HeadOutput, TaskOutput,
};
pub use pooling::Pooling;
pub use splade::{SparseValue, SparseVector, SpladeActivation, SpladeOptions, SpladeStrategy};
pub use tasks::{EmbedOptions, Embedder, EncodeOptions};

/// The tensor types of our API, re-exported so users need not pin candle.
pub use candle_core::{DType, Device, Tensor};

/// The book's library page (`docs/library.md`), compiled under `cargo test`
/// only: its examples run as doctests, so the documented API cannot drift
/// from the crate.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryPageExamples;
