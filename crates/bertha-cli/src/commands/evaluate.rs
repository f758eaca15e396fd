//! `bertha evaluate`: the task's metrics, as one JSON line, of a
//! fine-tuned checkpoint on a labelled file (classification, ner, qa,
//! multiple-choice), or of a model's sentence embeddings on pairs (sts:
//! Spearman and Pearson ×100 of cosine similarity against gold scores;
//! retrieval: each anchor's positive ranked among all positives), or of a
//! cross-encoder reranking candidate lists (MRR@10, NDCG@10, MAP).

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Result;
use bertha::data::{EmbeddingData, EmbeddingEval, RerankData, Task};
use bertha::metrics::{fuse_with_list_order, ranking_scores, RANKING_MAIN_METRIC, RRF_K};
use bertha::tasks::{CrossEncoder, CrossEncoderOptions, FinetunedModel, InferenceOptions};
use bertha::training::rerank::score_lists;
use bertha::training::RerankLoss;
use bertha::{EmbedOptions, Embedder};

use super::finetune::DataArgs;
use super::pairs::PairArgs;
use super::{device, PrecisionArgs};
use crate::model_dir::ModelArgs;
use crate::texts::progress_bar;

/// Options shared by evaluate and predict.
#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// The data file (the training file's format; sts and retrieval: see
    /// the column flags).
    #[arg(long)]
    pub data: PathBuf,

    /// Examples per forward pass.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,

    /// Tokens per input (default: what the model was trained with, from its
    /// training_args.json; else 128, 384 for qa; sts and retrieval: the
    /// folder's max_seq_length, else max_position_embeddings).
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

    #[command(flatten)]
    pub precision: PrecisionArgs,
}

impl CheckpointArgs {
    pub fn load(&self, task: Task) -> Result<FinetunedModel> {
        self.check_batch_size()?;
        let dir = self.model.resolve()?;
        let opts = InferenceOptions {
            max_length: self.max_length,
            doc_stride: self.doc_stride,
            max_answer_length: self.max_answer_length,
            batch_size: Some(self.batch_size),
            precision: self.precision.precision,
            ..Default::default()
        };
        Ok(FinetunedModel::from_dir(task, &dir, &opts, &device()?)?)
    }

    fn check_batch_size(&self) -> Result<()> {
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1");
        }
        Ok(())
    }
}

/// What `evaluate --task` names: a fine-tuned head's task or a sentence
/// embedding evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalTask {
    Checkpoint(Task),
    Embedding(EmbeddingEval),
    /// A cross-encoder reranking candidate lists.
    Rerank,
}

impl FromStr for EvalTask {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "rerank" {
            return Ok(Self::Rerank);
        }
        if let Ok(e) = s.parse() {
            return Ok(Self::Embedding(e));
        }
        s.parse().map(Self::Checkpoint).map_err(|_| {
            format!(
                "unknown task `{s}` (expected classification, ner, qa, multiple-choice, sts, retrieval or rerank)"
            )
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// classification, ner, qa or multiple-choice (a fine-tuned checkpoint
    /// and its labelled file), or sts (scored pairs) or retrieval ((anchor, positive) pairs):
    /// the sentence embeddings of any model folder, pooled and normalised
    /// as the folder says, compared by cosine; or rerank: a cross-encoder
    /// reranking candidate lists (labelled pairs grouped by query, tuples,
    /// or JSONL lists): MRR@10, NDCG@10 and MAP, beside the lists' own
    /// order's (`list_order`: the retriever's, for mined lists) and those of
    /// both orders fused by reciprocal rank (`fused_rrf`, k = 60).
    #[arg(long)]
    task: EvalTask,

    #[command(flatten)]
    checkpoint: CheckpointArgs,

    #[command(flatten)]
    pairs: PairArgs,
}

/// `{"task", "model", "data", "examples", "eval_loss", "metric", <scores>}`
/// (sts and retrieval: no loss; retrieval adds `corpus`, the distinct
/// positives).
pub fn run(a: Args) -> Result<()> {
    let c = &a.checkpoint;
    let mut line = serde_json::Map::new();
    line.insert("task".into(), task_name(a.task).into());
    line.insert(
        "model".into(),
        c.model.resolve()?.display().to_string().into(),
    );
    line.insert("data".into(), c.data.display().to_string().into());
    let (main_metric, scores) = match a.task {
        EvalTask::Checkpoint(task) => {
            let model = c.load(task)?;
            let data = model.read_labelled(&c.data, &c.data_args.options())?;
            let ev = model.evaluate(&data)?;
            line.insert("examples".into(), ev.examples.into());
            if let Some(l) = ev.loss {
                line.insert("eval_loss".into(), l.into());
            }
            (task.main_metric(), ev.scores)
        }
        EvalTask::Embedding(task) => {
            let data = EmbeddingData::read(&c.data, &a.pairs.options())?;
            line.insert("examples".into(), data.len().into());
            if task == EmbeddingEval::Retrieval && data.layout == task.layout() {
                let corpus: std::collections::HashSet<&str> = data.column(1).collect();
                line.insert("corpus".into(), corpus.len().into());
            }
            (task.main_metric(), evaluate_embeddings(c, &data, task)?)
        }
        EvalTask::Rerank => {
            c.check_batch_size()?;
            let lists = RerankData::read(&c.data)?.to_lists();
            let opts = CrossEncoderOptions {
                precision: c.precision.precision,
                max_length: c.max_length,
                batch_size: c.batch_size,
                ..CrossEncoderOptions::default()
            };
            let ce = CrossEncoder::from_dir(&c.model.resolve()?, &device()?, &opts)?;
            let t0 = std::time::Instant::now();
            let bce = RerankLoss::Bce { pos_weight: None };
            let scored = score_lists(&ce, &lists, &bce)?;
            let (labels, scores) = (&scored.labels, &scored.scores);
            let pairs: usize = labels.iter().map(Vec::len).sum();
            line.insert("examples".into(), lists.len().into());
            line.insert("pairs".into(), pairs.into());
            line.insert(
                "pairs_per_second".into(),
                (pairs as f64 / t0.elapsed().as_secs_f64()).into(),
            );
            line.insert("eval_loss".into(), scored.loss.into());
            let order: Vec<Vec<f32>> = labels
                .iter()
                .map(|l| (0..l.len()).map(|i| -(i as f32)).collect())
                .collect();
            line.insert(
                "list_order".into(),
                serde_json::to_value(ranking_scores(labels, &order)?)?,
            );
            line.insert(
                "fused_rrf".into(),
                serde_json::to_value(ranking_scores(
                    labels,
                    &fuse_with_list_order(scores, RRF_K),
                )?)?,
            );
            (RANKING_MAIN_METRIC, ranking_scores(labels, scores)?)
        }
    };
    line.insert("metric".into(), main_metric.into());
    for (k, v) in &scores {
        line.insert(k.clone(), (*v).into());
    }
    println!("{}", serde_json::Value::Object(line));
    Ok(())
}

fn task_name(task: EvalTask) -> String {
    match task {
        EvalTask::Checkpoint(t) => t.to_string(),
        EvalTask::Embedding(e) => e.to_string(),
        EvalTask::Rerank => "rerank".into(),
    }
}

/// Encodes `data`'s texts with the model folder's sentence embeddings and
/// scores them.
fn evaluate_embeddings(
    c: &CheckpointArgs,
    data: &EmbeddingData,
    task: EmbeddingEval,
) -> Result<std::collections::BTreeMap<String, f64>> {
    c.check_batch_size()?;
    let opts = EmbedOptions {
        max_length: c.max_length,
        precision: c.precision.precision,
        ..EmbedOptions::default()
    };
    let embedder = Embedder::from_dir(&c.model.resolve()?, &device()?, &opts)?;
    if embedder.pooling() == bertha::Pooling::None {
        anyhow::bail!("the folder's pooling is `none`: {task} needs one vector per text");
    }
    let bar = progress_bar(2 * data.len());
    // The texts of column 0, then of column 1: where each was truncated.
    let (mut column, mut truncated) = (0, Vec::new());
    let scores = data.evaluate(task, |texts| {
        let encodings = embedder.tokenizer().encode_batch(texts)?;
        let first = (column * texts.len()) as u64;
        truncated.extend(
            (0..encodings.len())
                .filter(|&i| encodings[i].truncated)
                .map(|i| (i, column)),
        );
        column += 1;
        embedder.embed_encoded(&encodings, c.batch_size, &mut |n| {
            bar.set_position(first + n as u64)
        })
    })?;
    bar.finish_and_clear();
    if let Some(&(row, col)) = truncated.first() {
        eprintln!(
            "warning: {} of {} texts were truncated to {} tokens (first: line {}, column `{}`); \
             use --max-length to change this",
            truncated.len(),
            2 * data.len(),
            embedder.tokenizer().max_length(),
            data.lines[row],
            data.columns[col]
        );
    }
    Ok(scores)
}
