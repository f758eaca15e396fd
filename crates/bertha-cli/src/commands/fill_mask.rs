//! `bertha fill-mask`

use std::path::PathBuf;

use anyhow::Result;
use bertha::tasks::FillMask;

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

    /// Candidates per mask.
    #[arg(long, default_value_t = 5)]
    top_k: usize,

    /// Write JSON Lines here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

/// One line per text: the candidates `[{score, token, token_str, sequence}]`
/// for its mask, or one such list per mask when it has several.
pub fn run(a: Args) -> Result<()> {
    let dir = a.model.resolve()?;
    let fm = FillMask::from_dir(&dir, &device()?)?;
    let texts = a.texts.read()?;
    let mut out = JsonLines::open(a.output.as_deref())?;
    for (i, text) in texts.iter().enumerate() {
        let masks = fm
            .fill(text, a.top_k)
            .map_err(|e| anyhow::anyhow!("text {}: {e}", i + 1))?;
        if masks.len() == 1 {
            out.write(&masks[0])?;
        } else {
            out.write(&masks)?;
        }
    }
    out.finish()
}
