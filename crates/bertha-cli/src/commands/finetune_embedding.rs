//! `bertha finetune --task embedding`: trains a sentence-embedding model
//! (a bi-encoder, as sentence-transformers does) on pairs, triplets with
//! hard negatives or scored pairs, scoring an STS or retrieval dev file,
//! and writes a sentence-transformers folder.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use bertha::data::{EmbeddingData, PairLayout};
use bertha::training::{EmbeddingLoss, EmbeddingOptions, EmbeddingTrainer, LossKind};

use super::finetune::Args;
use super::pairs::PairArgs;
use crate::training;

/// The options of `--task embedding`.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Embedding training (--task embedding)")]
pub struct EmbeddingArgs {
    /// mnrl, mnrl-symmetric, cached-mnrl, cosent or cosine-mse (default:
    /// mnrl for text columns, cosent for scored pairs). --task rerank: bce
    /// (default), mnrl, lambda or listnet.
    #[arg(long)]
    pub(crate) loss: Option<String>,

    /// MatryoshkaLoss around the loss: the leading dimensions to train,
    /// e.g. 384,256,128,64.
    #[arg(long, value_delimiter = ',', value_name = "DIMS")]
    matryoshka: Vec<usize>,

    /// The similarity scale of mnrl and cosent (rerank's mnrl: 10).
    #[arg(long)]
    pub(crate) scale: Option<f64>,

    /// cached-mnrl: texts per encoder pass (memory is bounded by it, not by
    /// the batch size).
    #[arg(long)]
    mini_batch_size: Option<usize>,

    /// A prompt prepended at training and saved in the model folder:
    /// NAME=TEXT, NAME `query` (the first column), `document` (the others)
    /// or a column name; repeatable.
    #[arg(long = "prompt", value_name = "NAME=TEXT")]
    prompts: Vec<String>,

    /// Pooling of token states (default: the folder's, else mean).
    #[arg(long)]
    pooling: Option<bertha::pooling::Pooling>,

    /// Whether a batch may hold two rows sharing a text (default: not for
    /// the mnrl losses, where a duplicate is a false negative).
    #[arg(long, value_name = "BOOL")]
    no_duplicates: Option<bool>,

    #[command(flatten)]
    pairs: PairArgs,
}

impl EmbeddingArgs {
    /// The flags given, for refusing them with other tasks.
    pub fn given(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut on = |set: bool, name| {
            if set {
                v.push(name);
            }
        };
        on(self.loss.is_some(), "--loss");
        on(!self.matryoshka.is_empty(), "--matryoshka");
        on(self.scale.is_some(), "--scale");
        on(self.mini_batch_size.is_some(), "--mini-batch-size");
        on(!self.prompts.is_empty(), "--prompt");
        on(self.pooling.is_some(), "--pooling");
        on(self.no_duplicates.is_some(), "--no-duplicates");
        v.extend(self.pairs.given());
        v
    }

    fn prompts(&self) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for p in &self.prompts {
            let Some((name, text)) = p.split_once('=') else {
                bail!("--prompt {p:?}: expected NAME=TEXT, e.g. query=\"query: \"");
            };
            if name.is_empty() {
                bail!("--prompt {p:?}: the name is empty");
            }
            if out.insert(name.to_string(), text.to_string()).is_some() {
                bail!("--prompt {name}: given twice");
            }
        }
        Ok(out)
    }
}

/// The run, on this process's share of every batch (process 0 reports).
pub fn run(a: Args, processes: &training::Processes) -> Result<()> {
    let say = processes.rank() == 0;
    let e = &a.embedding;
    let model_dir = a.model.resolve()?;
    let config = bertha::BertConfig::from_file(&model_dir.join("config.json"))?;
    let max_length = a
        .max_length
        .unwrap_or_else(|| 128.min(config.max_sequence_length()));
    let mut read = e.pairs.options();
    // --skip-bad-rows is the data flags' (shared with classification).
    read.skip_bad_rows = a.data.skip_bad_rows;
    let train = EmbeddingData::read(&a.train, &read)?;
    let dev = a
        .dev
        .as_deref()
        .map(|p| EmbeddingData::read(p, &read))
        .transpose()?;
    let kind = match e.loss.as_deref() {
        Some(name) => name.parse::<LossKind>()?,
        None => match train.layout {
            PairLayout::Scored => LossKind::Cosent,
            PairLayout::Texts => LossKind::Mnrl,
        },
    };
    let mut loss = EmbeddingLoss::new(kind);
    if let Some(s) = e.scale {
        loss.scale = s;
    }
    if !e.matryoshka.is_empty() {
        loss.matryoshka = Some(e.matryoshka.clone());
    }
    let mut opts = EmbeddingOptions::new(loss, a.options(max_length));
    if let Some(m) = e.mini_batch_size {
        opts.mini_batch_size = m;
    }
    opts.pooling = e.pooling;
    opts.prompts = e.prompts()?;
    opts.no_duplicates = e.no_duplicates;

    let t0 = std::time::Instant::now();
    let describe = |d: &EmbeddingData| {
        let skipped = match d.bad_rows.len() {
            0 => String::new(),
            n => format!(" ({n} malformed rows skipped)"),
        };
        format!("{} rows of {}{skipped}", d.len(), d.columns.join(", "))
    };
    let data_line = format!(
        "data: {}{} ({:.1} s)",
        describe(&train),
        dev.as_ref()
            .map(|d| format!("; dev {}", describe(d)))
            .unwrap_or_default(),
        t0.elapsed().as_secs_f64()
    );
    let mut trainer = EmbeddingTrainer::new(&model_dir, train, dev, opts)
        .with_context(|| format!("preparing to train {}", model_dir.display()))?;
    if say {
        eprintln!("{data_line}");
    }
    processes.attach(&mut trainer)?;
    training::resume(&mut trainer, a.run.resume.as_deref())?;
    if say {
        eprintln!(
            "model: {} layers, hidden {}, {} parameters; loss {kind}; {} steps of {} on the {}",
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
