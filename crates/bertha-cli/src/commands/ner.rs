//! `bertha ner`

use anyhow::Result;
use bertha::tasks::{Aggregation, TokenClassifier};

use super::{device, PerTextArgs, PrecisionArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    io: PerTextArgs,

    #[command(flatten)]
    precision: PrecisionArgs,

    /// none (one entry per token), simple (B-/I- tags grouped), or first,
    /// average, max (sub-words merged into words, then grouped).
    #[arg(long, default_value = "none")]
    aggregation: String,
}

/// One line per text: its entities, with character `start`/`end`. Texts
/// run many at a time (see [`TokenClassifier::entities_many`]).
pub fn run(a: Args) -> Result<()> {
    let aggregation: Aggregation = a.aggregation.parse()?;
    let ner = TokenClassifier::from_dir_with(
        &a.io.model.resolve()?,
        &device()?,
        &a.precision.pipeline(),
    )?;
    a.io.for_each_chunk(
        32,
        |texts| ner.entities_many(texts, aggregation),
        |text| ner.entities(text, aggregation),
    )
}
