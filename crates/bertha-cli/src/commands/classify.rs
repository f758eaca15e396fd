//! `bertha classify`

use anyhow::Result;
use bertha::tasks::{Classifier, ScoreFunction};

use super::{device, PerTextArgs, PrecisionArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    io: PerTextArgs,

    #[command(flatten)]
    precision: PrecisionArgs,

    /// Second text of a sentence pair, the same for every text.
    #[arg(long)]
    pair: Option<String>,

    /// The N best labels (default 1).
    #[arg(long, conflicts_with = "all_scores")]
    top_k: Option<usize>,

    /// Every label's score, best first.
    #[arg(long)]
    all_scores: bool,

    /// How logits become scores: softmax, sigmoid or none (raw logits);
    /// transformers' `function_to_apply` (default: the model's, as the
    /// text-classification pipeline chooses it).
    #[arg(long)]
    function: Option<ScoreFunction>,
}

/// One line per text: `[{label, score}, ...]`, best first.
pub fn run(a: Args) -> Result<()> {
    let cl =
        Classifier::from_dir_with(&a.io.model.resolve()?, &device()?, &a.precision.pipeline())?;
    let top_k = if a.all_scores {
        None
    } else {
        Some(a.top_k.unwrap_or(1))
    };
    let function = a.function.unwrap_or(cl.function());
    a.io.for_each_text(|text| cl.classify_with(text, a.pair.as_deref(), top_k, function))
}
