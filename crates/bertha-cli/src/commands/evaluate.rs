//! `bertha evaluate`: the task's metrics of a fine-tuned checkpoint on a
//! labelled file, as one JSON line.

use std::path::PathBuf;

use anyhow::Result;
use bertha::data::Task;
use bertha::tasks::{FinetunedModel, InferenceOptions};

use super::device;
use super::finetune::DataArgs;
use crate::model_dir::ModelArgs;

/// Options shared by evaluate and predict.
#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    /// classification, ner or qa.
    #[arg(long)]
    pub task: Task,

    #[command(flatten)]
    pub model: ModelArgs,

    /// The data file (the training file's format).
    #[arg(long)]
    pub data: PathBuf,

    /// Examples per forward pass.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,

    /// Tokens per input (default: what the model was trained with, from its
    /// training_args.json; else 128, 384 for qa).
    #[arg(long)]
    pub max_length: Option<usize>,

    /// QA: context tokens shared by consecutive windows (default: as trained).
    #[arg(long)]
    pub doc_stride: Option<usize>,

    /// QA: the longest answer, in tokens (default: as trained, else 30).
    #[arg(long)]
    pub max_answer_length: Option<usize>,

    #[command(flatten)]
    pub data_args: DataArgs,
}

impl CheckpointArgs {
    pub fn load(&self) -> Result<FinetunedModel> {
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1");
        }
        let dir = self.model.resolve()?;
        let opts = InferenceOptions {
            max_length: self.max_length,
            doc_stride: self.doc_stride,
            max_answer_length: self.max_answer_length,
            batch_size: Some(self.batch_size),
        };
        Ok(FinetunedModel::from_dir(
            self.task,
            &dir,
            &opts,
            &device()?,
        )?)
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    checkpoint: CheckpointArgs,
}

/// `{"task", "model", "data", "examples", "eval_loss", "metric", <scores>}`.
pub fn run(a: Args) -> Result<()> {
    let c = &a.checkpoint;
    let model = c.load()?;
    let data = model.read_labelled(&c.data, &c.data_args.options())?;
    let ev = model.evaluate(&data)?;
    let mut line = serde_json::Map::new();
    line.insert("task".into(), c.task.to_string().into());
    line.insert(
        "model".into(),
        c.model.resolve()?.display().to_string().into(),
    );
    line.insert("data".into(), c.data.display().to_string().into());
    line.insert("examples".into(), ev.examples.into());
    if let Some(l) = ev.loss {
        line.insert("eval_loss".into(), l.into());
    }
    line.insert("metric".into(), c.task.main_metric().into());
    for (k, v) in &ev.scores {
        line.insert(k.clone(), (*v).into());
    }
    println!("{}", serde_json::Value::Object(line));
    Ok(())
}
