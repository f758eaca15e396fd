//! `bertha classify`

use std::path::PathBuf;

use anyhow::Result;
use bertha::tasks::Classifier;

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

    /// Second text of a sentence pair, the same for every text.
    #[arg(long)]
    pair: Option<String>,

    /// The N best labels (default 1).
    #[arg(long, conflicts_with = "all_scores")]
    top_k: Option<usize>,

    /// Every label's score, best first.
    #[arg(long)]
    all_scores: bool,

    /// Write JSON Lines here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

/// One line per text: `[{label, score}, ...]`, best first.
pub fn run(a: Args) -> Result<()> {
    let dir = a.model.resolve()?;
    let cl = Classifier::from_dir(&dir, &device()?)?;
    let texts = a.texts.read()?;
    let top_k = if a.all_scores {
        None
    } else {
        Some(a.top_k.unwrap_or(1))
    };
    let mut out = JsonLines::open(a.output.as_deref())?;
    for (i, text) in texts.iter().enumerate() {
        let scores = cl
            .classify(text, a.pair.as_deref(), top_k)
            .map_err(|e| anyhow::anyhow!("text {}: {e}", i + 1))?;
        out.write(&scores)?;
    }
    out.finish()
}
