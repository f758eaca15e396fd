//! `bertha tokenize`

use std::path::PathBuf;

use anyhow::{bail, Result};
use bertha::tokenizer::{default_max_length, Tokenizer};
use bertha::BertConfig;

use crate::model_dir::ModelArgs;
use crate::output::JsonLines;
use crate::texts::{report_truncation, TextArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    #[command(flatten)]
    texts: TextArgs,

    /// Second text of a sentence pair (used with every text).
    #[arg(long, conflicts_with = "pair_input")]
    pair: Option<String>,

    /// Second texts of sentence pairs, one per line, matched to the texts by line.
    #[arg(long)]
    pair_input: Option<PathBuf>,

    /// Truncate to this many tokens (default: as `embed`).
    #[arg(long)]
    max_length: Option<usize>,

    /// Write JSON Lines here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let dir = a.model.resolve()?;
    let config_path = dir.join("config.json");
    let max_length = match a.max_length {
        Some(n) => n,
        None if config_path.is_file() => {
            default_max_length(&dir, &BertConfig::from_file(&config_path)?)?
        }
        None => 512,
    };
    let tokenizer = Tokenizer::from_dir(&dir, max_length)?;
    let texts = a.texts.read()?;
    let encodings = match (&a.pair, &a.pair_input) {
        (Some(p), _) => {
            let pairs: Vec<(&str, &str)> = texts.iter().map(|t| (t.as_str(), p.as_str())).collect();
            tokenizer.encode_pair_batch(&pairs)?
        }
        (None, Some(path)) => {
            let seconds = bertha::input::read_lines_from_file(path)?;
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
    let mut out = JsonLines::open(a.output.as_deref())?;
    for e in &encodings {
        out.write(e)?;
    }
    out.finish()
}
