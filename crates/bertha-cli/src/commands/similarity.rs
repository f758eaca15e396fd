//! `bertha similarity`

use anyhow::{bail, Result};
use bertha::tasks::cosine_similarity_matrix;
use serde_json::json;

pub use super::EmbedTextArgs as Args;
use crate::output::JsonLines;
use crate::texts::report_truncation;

/// Prints one JSON object: `{"texts": [...], "similarity": [[...], ...]}`.
pub fn run(a: Args) -> Result<()> {
    let embedder = a.embed.load()?;
    if embedder.pooling() == bertha::Pooling::None {
        bail!("similarity needs one vector per text: choose a pooling other than `none`");
    }
    let texts = a.texts.read()?;
    if texts.len() < 2 {
        bail!("similarity needs at least two texts, got {}", texts.len());
    }
    let opts = a.encode_options();
    let encodings = embedder.encode_texts(&texts, &opts)?;
    report_truncation(&encodings, embedder.tokenizer().max_length());
    let vectors =
        embedder.embed_encoded_with(&encodings, &opts, a.embed.batch_size, &mut |_| {})?;
    let matrix = cosine_similarity_matrix(&vectors);
    let mut out = JsonLines::open(a.output.as_deref())?;
    out.write(&json!({ "texts": texts, "similarity": matrix }))?;
    out.finish()
}
