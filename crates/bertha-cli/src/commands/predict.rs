//! `bertha predict`: a fine-tuned checkpoint's predictions for a data file:
//! JSON Lines for classification (`{"label", "score"}` per example) and NER
//! (`{"words", "tags"}` per sentence), SQuAD's official predictions file
//! (`{"question id": "answer", ...}`) for QA, and `{"choice", "score"}` per
//! example for multiple choice (the chosen ending's index from 0, and its
//! softmax over the example's endings).

use std::path::PathBuf;

use anyhow::Result;
use bertha::data::{Task, TaskData};
use bertha::tasks::Predictions;

use super::evaluate::CheckpointArgs;
use crate::output::JsonLines;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// classification, ner, qa or multiple-choice.
    #[arg(long)]
    task: Task,

    #[command(flatten)]
    checkpoint: CheckpointArgs,

    /// Write the predictions here instead of stdout (the file appears only
    /// once complete).
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct Tagged<'a> {
    words: &'a [String],
    tags: &'a [String],
}

pub fn run(a: Args) -> Result<()> {
    let c = &a.checkpoint;
    let model = c.load(a.task)?;
    let data = model.read_unlabelled(&c.data, &c.data_args.options())?;
    let predictions = model.predict(&data)?;
    let mut out = JsonLines::open(a.output.as_deref())?;
    match (&predictions, &data) {
        (Predictions::Classification(p), _) => {
            for row in p {
                out.write(row)?;
            }
        }
        (Predictions::Ner(p), TaskData::Ner(d)) => {
            for (tags, s) in p.iter().zip(&d.sentences) {
                out.write(&Tagged {
                    words: &s.words,
                    tags,
                })?;
            }
        }
        (Predictions::MultipleChoice(p), _) => {
            for row in p {
                out.write(row)?;
            }
        }
        (Predictions::Qa(p), _) => {
            let by_id: serde_json::Map<String, serde_json::Value> = p
                .iter()
                .map(|q| (q.id.clone(), q.text.clone().into()))
                .collect();
            out.write(&serde_json::Value::Object(by_id))?;
        }
        _ => anyhow::bail!("internal: predictions do not match the data"),
    }
    out.finish()
}
