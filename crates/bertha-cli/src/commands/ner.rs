//! `bertha ner`

use std::path::PathBuf;

use anyhow::Result;
use bertha::tasks::{Aggregation, TokenClassifier};

use super::device;
use crate::model_dir::ModelArgs;
use crate::output::JsonLines;
use crate::texts::TextArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    #[command(flatten)]
    texts: TextArgs,

    /// none (one entry per token), simple (B-/I- tags grouped), or first,
    /// average, max (sub-words merged into words, then grouped).
    #[arg(long, default_value = "none")]
    aggregation: String,

    /// Write JSON Lines here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

/// One line per text: its entities, with character `start`/`end`.
pub fn run(a: Args) -> Result<()> {
    let aggregation: Aggregation = a.aggregation.parse()?;
    let dir = a.model.resolve()?;
    let ner = TokenClassifier::from_dir(&dir, &device()?)?;
    let texts = a.texts.read()?;
    let mut out = JsonLines::open(a.output.as_deref())?;
    for (i, text) in texts.iter().enumerate() {
        let entities = ner
            .entities(text, aggregation)
            .map_err(|e| anyhow::anyhow!("text {}: {e}", i + 1))?;
        out.write(&entities)?;
    }
    out.finish()
}
