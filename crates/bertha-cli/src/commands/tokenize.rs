//! `bertha tokenize`

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::PerTextArgs;
use crate::output::JsonLines;
use crate::texts::report_truncation;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    io: PerTextArgs,

    /// Second text of a sentence pair (used with every text).
    #[arg(long, conflicts_with = "pair_input")]
    pair: Option<String>,

    /// Second texts of sentence pairs, one per line, matched to the texts by line.
    #[arg(long)]
    pair_input: Option<PathBuf>,

    /// Truncate to this many tokens (default: as `embed`).
    #[arg(long)]
    max_length: Option<usize>,
}

pub fn run(a: Args) -> Result<()> {
    let dir = a.io.model.open()?;
    let max_length = match a.max_length {
        Some(n) => n,
        None if dir.has_config() => dir.default_max_length(&dir.config()?)?,
        None => 512,
    };
    let tokenizer = dir.tokenizer(max_length)?;
    let texts = a.io.texts.read()?;
    let encodings = match (&a.pair, &a.pair_input) {
        (Some(p), _) => {
            let pairs: Vec<(&str, &str)> = texts.iter().map(|t| (t.as_str(), p.as_str())).collect();
            tokenizer.encode_pair_batch(&pairs)?
        }
        (None, Some(path)) => {
            let seconds = bertha::io::texts::read_lines_from_file(path)?;
            if seconds.len() != texts.len() {
                bail!(
                    "{} has {} lines but there are {} texts; pairs are matched line by line",
                    path.display(),
                    seconds.len(),
                    texts.len()
                );
            }
            let pairs: Vec<(&str, &str)> = texts
                .iter()
                .map(String::as_str)
                .zip(seconds.iter().map(String::as_str))
                .collect();
            tokenizer.encode_pair_batch(&pairs)?
        }
        (None, None) => tokenizer.encode_batch(&texts)?,
    };
    report_truncation(&encodings, tokenizer.max_length());
    let mut out = JsonLines::open(a.io.output.as_deref())?;
    for e in &encodings {
        out.write(e)?;
    }
    out.finish()
}
