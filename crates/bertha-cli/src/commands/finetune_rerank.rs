//! `bertha finetune --task rerank`: trains a cross-encoder (a reranker, as
//! sentence-transformers' CrossEncoder) on labelled pairs, (query,
//! positive, negative…) tuples or JSONL lists, with a ranking loss,
//! scoring a dev file of candidate lists (MRR@10, NDCG@10, MAP); writes a
//! sentence-transformers CrossEncoder folder.

use anyhow::{Context, Result};
use bertha::training::{RerankLoss, RerankOptions, RerankTrainer};

use super::finetune::Args;
use crate::training;

/// The options of `--task rerank` (the loss is `--loss`, mnrl's scale
/// `--scale`).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Reranker training (--task rerank)")]
pub struct RerankArgs {
    /// bce: the weight of the positive class's term (sentence-transformers'
    /// `pos_weight`; e.g. the negatives per positive).
    #[arg(long)]
    pos_weight: Option<f64>,
}

impl RerankArgs {
    /// The flags given, for refusing them with other tasks.
    pub fn given(&self) -> Vec<&'static str> {
        if self.pos_weight.is_some() {
            vec!["--pos-weight"]
        } else {
            Vec::new()
        }
    }
}

/// The run, on this process's share of every batch (process 0 reports).
pub fn run(a: Args, processes: &training::Processes) -> Result<()> {
    let say = processes.rank() == 0;
    let e = &a.embedding;
    if let Some(flag) = e
        .given()
        .into_iter()
        .find(|f| !matches!(*f, "--loss" | "--scale"))
    {
        anyhow::bail!("{flag} applies to --task embedding only");
    }
    let mut loss: RerankLoss = e.loss.as_deref().unwrap_or("bce").parse()?;
    match &mut loss {
        RerankLoss::Bce { pos_weight } => *pos_weight = a.rerank.pos_weight,
        RerankLoss::Mnrl { scale } => *scale = e.scale.unwrap_or(*scale),
        _ => {}
    }
    if a.rerank.pos_weight.is_some() && !matches!(loss, RerankLoss::Bce { .. }) {
        anyhow::bail!("--pos-weight applies to --loss bce only");
    }
    if e.scale.is_some() && !matches!(loss, RerankLoss::Mnrl { .. }) {
        anyhow::bail!("--scale applies to --loss mnrl only");
    }
    let model_dir = a.model.resolve()?;
    let config = bertha::BertConfig::from_file(&model_dir.join("config.json"))?;
    let max_length = a
        .max_length
        .unwrap_or_else(|| 128.min(config.max_sequence_length()));
    let opts = RerankOptions {
        loss,
        train: a.options(max_length),
    };
    let t0 = std::time::Instant::now();
    let mut trainer = RerankTrainer::new(&model_dir, &a.train, a.dev.as_deref(), opts)
        .with_context(|| format!("preparing to train a reranker from {}", model_dir.display()))?;
    if say {
        eprintln!(
            "data: {} training units for loss {} ({:.1} s)",
            trainer.train_units(),
            loss.name(),
            t0.elapsed().as_secs_f64()
        );
    }
    processes.attach(&mut trainer)?;
    training::resume(&mut trainer, a.run.resume.as_deref())?;
    if say {
        eprintln!(
            "model: {} layers, hidden {}, {} parameters, one output; {} steps of {} on the {}",
            trainer.config().num_hidden_layers,
            trainer.config().hidden_size,
            trainer.params().num_values(),
            trainer.total_steps(),
            a.batch_size,
            if trainer.on_fast_path() {
                "fast path"
            } else {
                "candle modules"
            }
        );
    }
    training::run(&mut trainer, &training::FINETUNE_WORDING)?;
    if say {
        training::report_done(&a.out);
    }
    Ok(())
}
