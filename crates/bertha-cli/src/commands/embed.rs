//! `bertha embed`

use anyhow::Result;
use bertha::Pooling;
use serde_json::json;

pub use super::EmbedTextArgs as Args;
use crate::output::JsonLines;
use crate::texts::{progress_bar, report_truncation};

pub fn run(a: Args) -> Result<()> {
    let embedder = a.embed.load()?;
    let texts = a.texts.read()?;
    let opts = a.encode_options();
    let encodings = embedder.encode_texts(&texts, &opts)?;
    let bar = progress_bar(texts.len());
    let mut progress = |done: usize| bar.set_position(done as u64);
    let mut out = JsonLines::open(a.output.as_deref())?;
    if embedder.pooling() == Pooling::None {
        let rows = embedder.embed_tokens_encoded(&encodings, a.embed.batch_size, &mut progress)?;
        bar.finish_and_clear();
        report_truncation(&encodings, embedder.tokenizer().max_length());
        for r in &rows {
            out.write(r)?;
        }
    } else {
        let rows =
            embedder.embed_encoded_with(&encodings, &opts, a.embed.batch_size, &mut progress)?;
        bar.finish_and_clear();
        report_truncation(&encodings, embedder.tokenizer().max_length());
        for r in &rows {
            out.write(&json!({ "embedding": r }))?;
        }
    }
    out.finish()
}
