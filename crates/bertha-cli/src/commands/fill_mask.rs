//! `bertha fill-mask`

use anyhow::Result;
use bertha::tasks::FillMask;

use super::{device, PerTextArgs, PrecisionArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    io: PerTextArgs,

    #[command(flatten)]
    precision: PrecisionArgs,

    /// Candidates per mask.
    #[arg(long, default_value_t = 5)]
    top_k: usize,
}

/// A text's line: its one mask's candidates, or a list per mask.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum OneOrEach<T> {
    One(T),
    Each(Vec<T>),
}

/// One line per text: the candidates `[{score, token, token_str, sequence}]`
/// for its mask, or one such list per mask when it has several.
pub fn run(a: Args) -> Result<()> {
    let fm = FillMask::from_dir_with(&a.io.model.resolve()?, &device()?, &a.precision.pipeline())?;
    a.io.for_each_text(|text| {
        let mut masks = fm.fill(text, a.top_k)?;
        Ok(if masks.len() == 1 {
            OneOrEach::One(masks.remove(0))
        } else {
            OneOrEach::Each(masks)
        })
    })
}
