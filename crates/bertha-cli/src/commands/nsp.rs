//! `bertha nsp`

use std::path::PathBuf;

use anyhow::Result;
use bertha::tasks::NextSentence;

use super::{device, PrecisionArgs};
use crate::model_dir::ModelArgs;
use crate::output::JsonLines;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    #[command(flatten)]
    precision: PrecisionArgs,

    /// The first sentence.
    text_a: String,

    /// The sentence that may or may not follow it.
    text_b: String,

    /// Write the JSON here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

/// One line: `{is_next, not_next}`, the probabilities that TEXT_B follows
/// TEXT_A or not.
pub fn run(a: Args) -> Result<()> {
    let dir = a.model.resolve()?;
    let nsp = NextSentence::from_dir_with(&dir, &device()?, &a.precision.pipeline())?;
    let score = nsp.predict(&a.text_a, &a.text_b)?;
    let mut out = JsonLines::open(a.output.as_deref())?;
    out.write(&score)?;
    out.finish()
}
