//! `bertha rerank`: a cross-encoder's scores of documents for a query,
//! best first (sentence-transformers' `CrossEncoder.rank`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use bertha::metrics::{fuse_list_with_order, RRF_K};
use bertha::tasks::rerank::rank_scores;
use bertha::tasks::{CrossEncoder, CrossEncoderOptions};

use super::{device, PrecisionArgs};
use crate::model_dir::ModelArgs;
use crate::output::JsonLines;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// The query.
    #[arg(long, short = 'q')]
    query: String,

    /// The documents (or --documents FILE).
    #[arg(value_name = "DOCUMENT")]
    documents: Vec<String>,

    /// A file of documents, one per line.
    #[arg(long, value_name = "FILE", conflicts_with = "documents")]
    documents_file: Option<PathBuf>,

    /// The N best only.
    #[arg(long)]
    top_k: Option<usize>,

    /// Tokens per pair (default: the folder's, else the model's limit).
    #[arg(long)]
    max_length: Option<usize>,

    /// Pairs per forward pass.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,

    /// The raw logits instead of the folder's activation (e.g. sigmoid).
    #[arg(long)]
    raw_scores: bool,

    /// The documents come in a retriever's order, best first: rank them by
    /// reciprocal-rank fusion (k = 60) of that order and the cross-encoder's
    /// (`score` is the fused one, `reranker_score` the cross-encoder's).
    #[arg(long)]
    fuse_with_order: bool,

    #[command(flatten)]
    precision: PrecisionArgs,

    /// Write JSON Lines here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

/// One line per document, best first: `{"corpus_id", "score", "text"}`
/// (and `reranker_score` when fused).
pub fn run(a: Args) -> Result<()> {
    let documents = match &a.documents_file {
        Some(p) => bertha::io::texts::read_lines_from_file(p)?,
        None => a.documents.clone(),
    };
    if documents.is_empty() {
        bail!("no documents to rank: give them as arguments or --documents-file FILE");
    }
    if a.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let opts = CrossEncoderOptions {
        precision: a.precision.precision,
        max_length: a.max_length,
        batch_size: a.batch_size,
        ..CrossEncoderOptions::default()
    };
    let ce = CrossEncoder::from_dir(&a.model.resolve()?, &device()?, &opts)?;
    let pairs: Vec<(&str, &str)> = documents
        .iter()
        .map(|d| (a.query.as_str(), d.as_str()))
        .collect();
    let scores: Vec<f32> = if a.raw_scores {
        ce.logits(&pairs)?
            .into_iter()
            .map(|l| l.last().copied().unwrap_or(f32::NAN))
            .collect()
    } else {
        ce.scores(&pairs)?
    };
    let fused = a
        .fuse_with_order
        .then(|| fuse_list_with_order(&scores, RRF_K));
    let ranked = rank_scores(fused.as_ref().unwrap_or(&scores), a.top_k);
    let mut out = JsonLines::open(a.output.as_deref())?;
    for r in ranked {
        let mut line = serde_json::json!({
            "corpus_id": r.corpus_id,
            "score": r.score,
            "text": documents[r.corpus_id],
        });
        if fused.is_some() {
            line["reranker_score"] = scores[r.corpus_id].into();
        }
        out.write(&line)?;
    }
    out.finish()
}
