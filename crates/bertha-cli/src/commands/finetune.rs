//! `bertha finetune`: trains a task head (classification, NER, QA) and the
//! encoder under it on a training file, or a sentence-embedding model
//! (`--task embedding`, see [`super::finetune_embedding`]) or a reranker
//! (`--task rerank`, see [`super::finetune_rerank`]), scoring a dev
//! file every epoch, with a progress bar, metrics JSON Lines, loss / metric
//! curves, resumable checkpoints and early stopping.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context, Result};
use bertha::data::{DataOptions, Task};
use bertha::training::{FinetuneOptions, Finetuner};

use crate::model_dir::ModelArgs;
use crate::training;

/// Data-file options shared by finetune, evaluate and predict.
#[derive(clap::Args, Debug, Clone)]
pub struct DataArgs {
    /// Classification: the text column (default: found by name, e.g.
    /// `sentence`, or the pair `sentence1`/`sentence2`).
    #[arg(long)]
    pub text_column: Option<String>,

    /// Classification: the second text of a pair.
    #[arg(long)]
    pub pair_column: Option<String>,

    /// Classification: the label column (default: `label`).
    #[arg(long)]
    pub label_column: Option<String>,

    /// Skip malformed rows (reported on stderr) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_rows: bool,
}

impl DataArgs {
    pub fn options(&self) -> DataOptions {
        DataOptions {
            text_column: self.text_column.clone(),
            pair_column: self.pair_column.clone(),
            label_column: self.label_column.clone(),
            skip_bad_rows: self.skip_bad_rows,
        }
    }
}

/// What `finetune` trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinetuneTask {
    /// A task head on the encoder.
    Head(Task),
    /// A sentence-embedding model (a bi-encoder).
    Embedding,
    /// A cross-encoder reranker.
    Rerank,
}

impl FromStr for FinetuneTask {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "embedding" => Ok(Self::Embedding),
            "rerank" => Ok(Self::Rerank),
            other => Task::from_str(other).map(Self::Head).map_err(|_| {
                format!(
                    "unknown task `{other}` (expected classification, ner, qa, multiple-choice, embedding or rerank)"
                )
            }),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// classification (TSV/CSV/JSONL, texts or pairs), ner (CoNLL), qa (SQuAD
    /// JSON), multiple-choice (SWAG's columns sent1, sent2, ending0…, label:
    /// TSV/CSV/JSONL), embedding (pairs, triplets or scored pairs:
    /// TSV/CSV/JSONL) or
    /// rerank (a cross-encoder: labelled pairs, (query, positive,
    /// negative…) tuples or JSONL lists).
    #[arg(long)]
    pub(crate) task: FinetuneTask,

    #[command(flatten)]
    pub(crate) model: ModelArgs,

    /// The training file.
    #[arg(long)]
    pub(crate) train: PathBuf,

    /// The dev file, scored at every epoch's end (and every --eval-every steps).
    #[arg(long)]
    pub(crate) dev: Option<PathBuf>,

    /// The output folder: metrics.jsonl, loss.png, metric.png, checkpoint-N/,
    /// best/ (with --early-stop) and the final model.
    #[arg(long)]
    pub(crate) out: PathBuf,

    /// Passes over the training set (a fraction stops part-way).
    #[arg(long, default_value_t = 3.0)]
    pub(crate) epochs: f64,

    #[arg(long, default_value_t = 5e-5)]
    pub(crate) lr: f64,

    #[arg(long, default_value_t = 32)]
    pub(crate) batch_size: usize,

    /// Micro-batches of --batch-size per optimiser step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub(crate) grad_accum: usize,

    /// Examples per forward pass when evaluating.
    #[arg(long, default_value_t = 64)]
    pub(crate) eval_batch_size: usize,

    /// Tokens per input (default: 128; 384 for qa; at most the model's limit).
    #[arg(long)]
    pub(crate) max_length: Option<usize>,

    /// QA: context tokens shared by consecutive windows (default:
    /// min(128, max length / 2)).
    #[arg(long)]
    pub(crate) doc_stride: Option<usize>,

    /// QA: the longest answer, in tokens.
    #[arg(long, default_value_t = 30)]
    pub(crate) max_answer_length: usize,

    /// Fraction of the steps spent warming the rate up from 0 (then linear decay to 0).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) warmup_ratio: f64,

    /// AdamW's decoupled weight decay (none on biases and LayerNorm weights).
    #[arg(long, default_value_t = 0.01)]
    pub(crate) weight_decay: f64,

    /// Clip the global gradient norm (0 turns clipping off; a negative
    /// norm is refused, not taken as off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) max_grad_norm: f64,

    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,

    /// Also evaluate every N steps.
    #[arg(long)]
    pub(crate) eval_every: Option<u64>,

    /// Also write a resumable checkpoint every N steps.
    #[arg(long)]
    pub(crate) save_every: Option<u64>,

    /// Keep only the newest N checkpoint-N folders.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) save_total_limit: usize,

    /// Stop after PATIENCE evaluations without a better dev score; the best
    /// model becomes the final one.
    #[arg(long, value_name = "PATIENCE")]
    pub(crate) early_stop: Option<usize>,

    /// Train on N examples drawn with the seed (quick runs on a slice).
    #[arg(long, value_name = "N")]
    pub(crate) max_train: Option<usize>,

    /// Batch training inputs of similar length (transformers'
    /// `group_by_length`: shuffled, then sorted within groups of 50 batches),
    /// so that less of each batch is padding.
    #[arg(long)]
    pub(crate) group_by_length: bool,

    /// What runs the training steps: `fast` (packed tokens, fused kernels:
    /// the classification, NER, QA and multiple-choice heads of BERT,
    /// RoBERTa, DistilBERT, ALBERT, ELECTRA and ModernBERT, on the CPU),
    /// `candle` (any family, head or device) or `auto` (fast where it
    /// covers the model and head).
    #[arg(long, default_value = "auto", value_name = "auto|fast|candle")]
    pub(crate) engine: bertha::training::Engine,

    /// The number format of the matrix products: f32, or bf16 (bf16
    /// products with fp32 sums where AVX512-BF16 or aarch64's BF16 beats fp32, fp32 with
    /// a notice elsewhere in the encoder's linear layers; weights,
    /// AdamW, LayerNorm, softmax, the head and the loss stay fp32; needs the
    /// fast engine).
    #[arg(long, default_value = "f32", value_name = "f32|bf16")]
    pub(crate) precision: bertha::fast::train::Compute,

    #[command(flatten)]
    pub(crate) run: training::RunArgs,

    #[command(flatten)]
    pub(crate) data: DataArgs,

    #[command(flatten)]
    pub(crate) embedding: super::finetune_embedding::EmbeddingArgs,

    #[command(flatten)]
    pub(crate) rerank: super::finetune_rerank::RerankArgs,
}

impl Args {
    /// The loop's options (`max_length` resolved by the task).
    pub(crate) fn options(&self, max_length: usize) -> FinetuneOptions {
        let a = self;
        FinetuneOptions {
            epochs: a.epochs,
            lr: a.lr,
            batch_size: a.batch_size,
            grad_accum: a.grad_accum,
            eval_batch_size: a.eval_batch_size,
            max_length,
            doc_stride: a.doc_stride.unwrap_or((max_length / 2).min(128)),
            max_answer_length: a.max_answer_length,
            warmup_ratio: a.warmup_ratio,
            weight_decay: a.weight_decay,
            max_grad_norm: (a.max_grad_norm != 0.0).then_some(a.max_grad_norm),
            seed: a.seed,
            eval_every: a.eval_every,
            save_every: a.save_every,
            save_total_limit: Some(a.save_total_limit),
            early_stop: a.early_stop,
            max_train: a.max_train,
            group_by_length: a.group_by_length,
            out: a.out.clone(),
            overwrite: a.run.overwrite,
            allow_changes: a.run.allow_changes.clone(),
            engine: a.engine,
            precision: a.precision,
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    let processes = training::Processes::start(&a.run)?;
    processes.settle(train(a, &processes))
}

/// The run, on this process's share of every batch.
fn train(a: Args, processes: &training::Processes) -> Result<()> {
    // Process 0 alone reports.
    let say = processes.rank() == 0;
    let task = match a.task {
        FinetuneTask::Head(t) => t,
        FinetuneTask::Embedding => return super::finetune_embedding::run(a, processes),
        FinetuneTask::Rerank => return super::finetune_rerank::run(a, processes),
    };
    if let Some(flag) = a.embedding.given().first() {
        let tasks = match *flag {
            "--loss" | "--scale" => "embedding or rerank",
            _ => "embedding",
        };
        anyhow::bail!("{flag} applies to --task {tasks} only");
    }
    if let Some(flag) = a.rerank.given().first() {
        anyhow::bail!("{flag} applies to --task rerank only");
    }
    let model_dir = a.model.resolve()?;
    let config = bertha::BertConfig::from_file(&model_dir.join("config.json"))?;
    // The lengths left unset by the library's rule (as `bertha.train`).
    let opts = a
        .options(0)
        .with_lengths(task, &config, a.max_length, a.doc_stride);
    let max_length = opts.max_length;
    let t0 = std::time::Instant::now();
    let mut trainer = Finetuner::new(
        task,
        &model_dir,
        &a.train,
        a.dev.as_deref(),
        &a.data.options(),
        opts,
    )
    .with_context(|| format!("preparing to fine-tune {}", model_dir.display()))?;
    let (examples, inputs) = trainer.train_size();
    let labels = if trainer.labels().is_empty() {
        String::new()
    } else {
        format!(", labels {}", trainer.labels().names().join(" "))
    };
    if say {
        eprintln!(
            "data: {examples} training examples → {inputs} inputs of ≤{max_length} tokens{}{labels} ({:.1} s)",
            trainer
                .dev_size()
                .map(|n| format!(", {n} dev examples"))
                .unwrap_or_default(),
            t0.elapsed().as_secs_f64()
        );
    }
    processes.attach(&mut trainer)?;
    training::resume(&mut trainer, a.run.resume.as_deref())?;
    if say {
        eprintln!(
            "model: {} ({} layers, hidden {}, {} parameters); {} steps of {} ({} per epoch) on the {}",
            trainer.config().architectures.join(", "),
            trainer.config().num_hidden_layers,
            trainer.config().hidden_size,
            trainer.params().num_values(),
            trainer.total_steps(),
            a.batch_size,
            trainer.steps_per_epoch(),
            if trainer.on_fast_path() {
                "fast path"
            } else {
                "candle modules"
            }
        );
    }

    training::run(&mut trainer, &training::FINETUNE_WORDING)?;
    if let Some(best) = trainer
        .evals()
        .iter()
        .max_by(|x, y| x.main().total_cmp(&y.main()))
    {
        if say {
            eprintln!(
                "best dev {}: {:.4} at step {}",
                best.metric,
                best.main(),
                best.step
            );
        }
    }
    if say {
        training::report_done(&a.out);
    }
    Ok(())
}
