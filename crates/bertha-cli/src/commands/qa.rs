//! `bertha qa`

use std::path::PathBuf;

use anyhow::Result;
use bertha::tasks::{QaOptions, QuestionAnswerer};

use super::{device, PrecisionArgs};
use crate::model_dir::ModelArgs;
use crate::output::JsonLines;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    #[command(flatten)]
    precision: PrecisionArgs,

    /// The question.
    #[arg(long, short = 'q')]
    question: String,

    /// The text to find the answer in.
    #[arg(long, short = 'c')]
    context: String,

    /// How many answers (distinct spans), best first.
    #[arg(long, default_value_t = 1)]
    top_k: usize,

    /// The longest answer, in tokens.
    #[arg(long, default_value_t = 15)]
    max_answer_len: usize,

    /// Tokens shared by consecutive windows of a long context (default:
    /// min(128, max-seq-len / 2), less when the question leaves less room).
    #[arg(long)]
    doc_stride: Option<usize>,

    /// Tokens per window, question and special tokens included (default:
    /// min(384, the model's max_position_embeddings)).
    #[arg(long)]
    max_seq_len: Option<usize>,

    /// Write the JSON here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

/// One line: `{score, start, end, answer}` (character offsets into the
/// context), or a list of them, best first, with `--top-k` above 1.
pub fn run(a: Args) -> Result<()> {
    let dir = a.model.resolve()?;
    let qa = QuestionAnswerer::from_dir_with(&dir, &device()?, &a.precision.pipeline())?;
    let opts = QaOptions {
        top_k: a.top_k,
        max_answer_len: a.max_answer_len,
        doc_stride: a.doc_stride,
        max_seq_len: a.max_seq_len,
    };
    let answers = qa.answer(&a.question, &a.context, &opts)?;
    let mut out = JsonLines::open(a.output.as_deref())?;
    if a.top_k == 1 {
        let best = answers
            .first()
            .ok_or_else(|| anyhow::anyhow!("no answer span found"))?;
        out.write(best)?;
    } else {
        out.write(&answers)?;
    }
    out.finish()
}
