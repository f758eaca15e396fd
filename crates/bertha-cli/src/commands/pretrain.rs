//! `bertha pretrain`: masked-LM (+NSP) or ELECTRA pre-training from
//! scratch (or from `--init`) on plain-text corpora, with a progress bar,
//! metrics JSON Lines, a loss curve and checkpoints that `--resume`
//! continues exactly.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bertha::data::{Corpus, CorpusOptions, MaskSplit, Masker, PreparedCorpus, Sequences};
use bertha::training::electra::{as_electra, generator_config, GENERATOR_DIR};
use bertha::training::{
    presets::resolve_config, ElectraPretrainer, ElectraRunOptions, LoopOptions, ModelSetup,
    Objective, PretrainData, PretrainOptions, Pretrainer, RunLength, ScheduleKind, Trainer, Warmup,
};
use bertha::{Tokenizer, Weights};

use crate::model_dir::ModelArgs;
use crate::training::{self, Wording};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Plain-text files or folders (documents are blank-line-separated
    /// blocks; a file without blank lines is one document), or one folder
    /// made by `bertha prepare-corpus` (read from its shards, not tokenized
    /// again).
    #[arg(long, required = true, num_args = 1..)]
    corpus: Vec<PathBuf>,

    /// A preset (tiny, mini, small, base, mini-bert-seed, modernbert-mini,
    /// electra-mini, electra-small) or a config.json. With `--objective
    /// electra`, the discriminator's shape (a BERT preset or config becomes
    /// an ELECTRA one of the same shape).
    #[arg(long, default_value = "mini")]
    config: String,

    /// `mlm`: masked LM (+ NSP with --nsp), as BERT. `electra`: replaced-
    /// token detection, a small generator (MLM) and the discriminator
    /// trained together on every token (ELECTRA, Clark et al. 2020).
    #[arg(long, default_value = "mlm", value_name = "mlm|electra")]
    objective: String,

    /// ELECTRA: the generator's width (hidden size, heads, feed-forward) as
    /// a fraction of the discriminator's, at the same depth.
    #[arg(long, default_value_t = 0.25)]
    generator_size: f64,

    /// ELECTRA: the discriminator loss's weight in the total.
    #[arg(long, default_value_t = 50.0)]
    disc_weight: f64,

    /// The tokenizer: a model folder (tokenizer.json or vocab.txt) or a
    /// vocab.txt file. Default: the --init folder, else the default model's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,

    /// Learn a new WordPiece vocabulary of this many tokens from the corpus
    /// first (into OUT/tokenizer; a resumed run reuses it) instead of
    /// using --tokenizer.
    #[arg(long, value_name = "VOCAB_SIZE", conflicts_with_all = ["tokenizer", "init"])]
    train_tokenizer: Option<usize>,

    /// Start from this checkpoint's weights instead of a random init.
    #[arg(long)]
    init: Option<PathBuf>,

    /// The output folder: metrics.jsonl, loss.png, checkpoint-N/ and the
    /// final model files.
    #[arg(long)]
    out: PathBuf,

    /// Also train next-sentence prediction on sentence pairs.
    #[arg(long)]
    nsp: bool,

    /// Optimiser steps.
    #[arg(long, conflicts_with = "epochs")]
    steps: Option<u64>,

    /// Passes over the corpus (default 1 when --steps is not given).
    #[arg(long)]
    epochs: Option<f64>,

    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,

    /// Micro-batches per optimiser step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,

    #[arg(long, default_value_t = 1e-4)]
    lr: f64,

    /// Warmup: a number of steps, or a fraction of all steps when below 1.
    #[arg(long, default_value = "0.06")]
    warmup: f64,

    /// linear, cosine or constant (after the warmup).
    #[arg(long, default_value = "linear")]
    schedule: String,

    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,

    /// Clip the global gradient norm (0 turns clipping off; a negative
    /// norm is refused, not taken as off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    max_grad_norm: f64,

    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    seq_len: usize,

    #[arg(long, default_value_t = 0.15)]
    mask_prob: f64,

    /// Percentages of chosen tokens replaced by [MASK], by a random token,
    /// and kept. Default: 80,10,10 (MLM); 100,0,0 (ELECTRA: the generator
    /// sees [MASK] at every chosen position).
    #[arg(long)]
    mask_split: Option<String>,

    /// The split that masks the held-out sequences (default: --mask-split).
    /// Runs trained with different splits are compared on one scoring
    /// split, e.g. 80,10,10.
    #[arg(long)]
    eval_mask_split: Option<String>,

    /// Choose whole words (a word and its ## pieces) for masking.
    #[arg(long)]
    whole_word_mask: bool,

    /// Held-out text; default: the last --eval-size sequences of the corpus.
    #[arg(long, num_args = 1..)]
    eval_corpus: Vec<PathBuf>,

    /// Held-out sequences taken from the corpus when --eval-corpus is not given.
    #[arg(long, default_value_t = 256)]
    eval_size: usize,

    /// Evaluate every N steps (and at the end).
    #[arg(long)]
    eval_every: Option<u64>,

    /// Write checkpoint-N every N steps (and at the end).
    #[arg(long)]
    save_every: Option<u64>,

    /// Keep only the newest N checkpoint-N folders (default: all).
    #[arg(long, value_name = "N")]
    save_total_limit: Option<usize>,

    /// Stop after PATIENCE evaluations without a lower held-out MLM loss;
    /// the best model (kept in best/) becomes the final one.
    #[arg(long, value_name = "PATIENCE")]
    early_stop: Option<usize>,

    /// What runs the forward and backward passes: `fast` (packed tokens,
    /// fused kernels: BERT, RoBERTa, DistilBERT, ALBERT and ELECTRA on the
    /// CPU), `candle` (any family or device) or `auto` (fast where it covers
    /// the model).
    #[arg(long, default_value = "auto", value_name = "auto|fast|candle")]
    engine: bertha::training::Engine,

    /// The number format of the matrix products: f32, or bf16 (bf16
    /// products with fp32 sums where AVX512-BF16 or aarch64's BF16 beats fp32, fp32 with
    /// a notice elsewhere; weights, AdamW, LayerNorm, softmax and the
    /// loss stay fp32; needs the fast engine).
    #[arg(long, default_value = "f32", value_name = "f32|bf16")]
    precision: bertha::fast::train::Compute,

    #[command(flatten)]
    run: training::RunArgs,

    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub(crate) fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let t = if path.is_file() {
        let config = path.with_file_name("tokenizer_config.json");
        Tokenizer::from_vocab(path, &config, usize::MAX)?
    } else {
        Tokenizer::from_dir(path, usize::MAX)?
    };
    Ok(t)
}

/// The sequences of `paths`: one prepared corpus folder (read from its
/// shards; made with this tokenizer) or text files (tokenized now); with
/// the corpus's documents and tokens.
fn read_sequences(
    paths: &[PathBuf],
    tokenizer: &Tokenizer,
    tokenizer_source: &Path,
    opts: &CorpusOptions,
) -> Result<(Sequences, usize, usize)> {
    if let [dir] = paths {
        if dir.join(bertha::data::prepared::CORPUS_FILE).is_file() {
            let hash = bertha::data::prepared::tokenizer_hash(tokenizer_source)?;
            let corpus = std::sync::Arc::new(PreparedCorpus::open(dir, Some(hash))?);
            let (documents, tokens) = (corpus.header.documents, corpus.header.tokens);
            let seqs = corpus.sequences(tokenizer, opts)?;
            return Ok((Sequences::Prepared(seqs), documents, tokens));
        }
    }
    let c = Corpus::read(paths, tokenizer, opts)?;
    let (documents, tokens) = (c.documents, c.tokens);
    Ok((Sequences::Memory(c), documents, tokens))
}

pub fn run(a: Args) -> Result<()> {
    let processes = training::Processes::start(&a.run)?;
    processes.settle(train(a, &processes))
}

/// The run, on this process's share of every batch.
fn train(a: Args, processes: &training::Processes) -> Result<()> {
    // Process 0 alone reports.
    let say = processes.rank() == 0;
    let tokenizer_source = match (&a.tokenizer, &a.init, a.train_tokenizer) {
        (_, _, Some(size)) => {
            let dir = a.out.join("tokenizer");
            if a.run.resume.is_some() && dir.join("vocab.txt").is_file() {
                dir
            } else if a
                .corpus
                .iter()
                .any(|c| c.join(bertha::data::prepared::CORPUS_FILE).is_file())
            {
                bail!(
                    "--train-tokenizer learns from text, and --corpus is a prepared corpus: \
                     learn the vocabulary from the text files, then prepare the corpus with it"
                );
            } else if processes.size() > 1 {
                bail!(
                    "--train-tokenizer runs in one process: learn the vocabulary in a one-process \
                     run first and pass its folder as --tokenizer"
                );
            } else {
                let t0 = std::time::Instant::now();
                let dir = bertha::data::vocab::train_wordpiece(&a.corpus, size, &dir)?;
                if say {
                    eprintln!(
                        "tokenizer: learnt a WordPiece vocabulary into {} ({:.1} s)",
                        dir.display(),
                        t0.elapsed().as_secs_f64()
                    );
                }
                dir
            }
        }
        (Some(t), _, None) => t.clone(),
        (None, Some(init), None) => init.clone(),
        (None, None, None) => ModelArgs { model: None }.resolve()?,
    };
    let electra = match a.objective.as_str() {
        "mlm" => false,
        "electra" => true,
        other => bail!("--objective: `{other}` is not one of mlm, electra"),
    };
    if electra && a.nsp {
        bail!("--nsp: ELECTRA pre-training has no next-sentence prediction");
    }
    let tokenizer = load_tokenizer(&tokenizer_source)
        .with_context(|| format!("loading the tokenizer from {}", tokenizer_source.display()))?;
    let vocab_size = tokenizer.vocab_size();
    let mut config = match &a.init {
        Some(dir) => bertha::BertConfig::from_file(&dir.join("config.json"))?,
        None => resolve_config(&a.config, vocab_size, a.seq_len)?,
    };
    // ELECTRA: the discriminator's config, and the generator's (a previous
    // ELECTRA run's own with --init).
    let generator = if electra {
        config = as_electra(&config);
        Some(match &a.init {
            Some(dir) => {
                let path = dir.join(GENERATOR_DIR).join("config.json");
                if !path.is_file() {
                    bail!(
                        "--init {}: no {GENERATOR_DIR}/config.json; ELECTRA continues from a folder an ELECTRA run wrote",
                        dir.display()
                    );
                }
                bertha::BertConfig::from_file(&path)?
            }
            None => generator_config(&config, a.generator_size)?,
        })
    } else {
        None
    };
    if config.vocab_size < vocab_size {
        bail!(
            "the model's vocab_size {} is smaller than the tokenizer's {vocab_size} tokens",
            config.vocab_size
        );
    }
    let init = a.init.as_deref().map(Weights::from_model_dir).transpose()?;

    let corpus_opts = CorpusOptions {
        seq_len: a.seq_len,
        nsp: a.nsp,
        seed: a.seed,
    };
    let t0 = std::time::Instant::now();
    let (mut train, documents, tokens) =
        read_sequences(&a.corpus, &tokenizer, &tokenizer_source, &corpus_opts)?;
    let eval = if a.eval_corpus.is_empty() {
        let n = a.eval_size.min(train.len() / 10);
        train.split_off_last(n)
    } else {
        read_sequences(&a.eval_corpus, &tokenizer, &tokenizer_source, &corpus_opts)?.0
    };
    if say {
        eprintln!(
            "corpus: {} documents, {} tokens → {} training and {} held-out sequences of ≤{} tokens ({:.1} s)",
            documents,
            tokens,
            train.len(),
            eval.len(),
            a.seq_len,
            t0.elapsed().as_secs_f64()
        );
    }

    let per_step = a.batch_size * a.grad_accum;
    let length = match a.steps {
        Some(s) => RunLength::Steps(s),
        None => RunLength::Epochs(a.epochs.unwrap_or(1.0)),
    };
    let warmup = if a.warmup < 1.0 {
        Warmup::Ratio(a.warmup)
    } else {
        Warmup::Steps(a.warmup as u64)
    };

    let default_split = if electra { "100,0,0" } else { "80,10,10" };
    let masker = Masker::for_tokenizer(
        &tokenizer,
        a.mask_prob,
        MaskSplit::parse(a.mask_split.as_deref().unwrap_or(default_split))?,
        a.whole_word_mask,
    )?;
    let eval_masker = match &a.eval_mask_split {
        Some(split) => Some(Masker {
            split: MaskSplit::parse(split).context("--eval-mask-split")?,
            ..masker.clone()
        }),
        None => None,
    };

    let train_opts = LoopOptions {
        batch_size: a.batch_size,
        grad_accum: a.grad_accum,
        length,
        warmup,
        schedule: ScheduleKind::parse(&a.schedule)?,
        lr: a.lr,
        adamw: bertha::training::AdamWConfig {
            weight_decay: a.weight_decay,
            max_grad_norm: (a.max_grad_norm != 0.0).then_some(a.max_grad_norm),
            ..Default::default()
        },
        seed: a.seed,
        // Full windows only; evaluation and checkpoints by steps.
        drop_last: true,
        eval_every: a.eval_every,
        save_every: a.save_every,
        save_total_limit: a.save_total_limit,
        early_stop: a.early_stop,
        overwrite: a.run.overwrite,
        allow_changes: a.run.allow_changes.clone(),
        engine: a.engine,
        precision: a.precision,
        ..LoopOptions::new(&a.out)
    };
    let setup = ModelSetup {
        config,
        init,
        tokenizer_source: tokenizer_source.clone(),
    };
    let data = PretrainData {
        train,
        eval,
        masker,
        eval_masker,
        pad_id: tokenizer.pad_id(),
    };
    match generator {
        Some(generator) => {
            let opts = ElectraRunOptions {
                disc_weight: a.disc_weight,
                train: train_opts,
            };
            let mut trainer = ElectraPretrainer::new(setup, generator, data, opts)?;
            drive(&mut trainer, &a, processes, per_step, &ELECTRA_WORDING)?;
        }
        None => {
            let opts = PretrainOptions {
                nsp: a.nsp,
                train: train_opts,
            };
            let mut trainer = Pretrainer::new(setup, data, opts)?;
            drive(&mut trainer, &a, processes, per_step, &MLM_WORDING)?;
        }
    }
    if say {
        training::report_done(&a.out);
    }
    Ok(())
}

/// Joins the processes, resumes, reports the model and runs the loop.
fn drive<O: Objective>(
    trainer: &mut Trainer<O>,
    a: &Args,
    processes: &training::Processes,
    per_step: usize,
    wording: &Wording,
) -> Result<()> {
    processes.attach(trainer)?;
    training::resume(trainer, a.run.resume.as_deref())?;
    if processes.rank() == 0 {
        eprintln!(
            "model: {} layers, hidden {}, {} parameters; {} steps of {per_step} sequences",
            trainer.config().num_hidden_layers,
            trainer.config().hidden_size,
            trainer.params().num_values(),
            trainer.total_steps()
        );
    }
    training::run(trainer, wording)
}

const MLM_WORDING: Wording = Wording {
    step: |m| {
        format!(
            "loss {:.4} acc {:.3} lr {:.2e} {:.0} tok/s",
            m.loss,
            m.figures.get("mlm_accuracy").copied().unwrap_or(f64::NAN),
            m.lr,
            m.tokens_per_s
        )
    },
    eval: |e| {
        format!(
            "step {}: held-out MLM loss {:.4}, perplexity {:.2}, accuracy {:.3}",
            e.step,
            e.eval_loss,
            e.scores.get("eval_perplexity").copied().unwrap_or(f64::NAN),
            e.scores
                .get("eval_mlm_accuracy")
                .copied()
                .unwrap_or(f64::NAN)
        )
    },
    best: |e| {
        format!(
            "step {}: lowest held-out MLM loss so far ({:.4}), saved to best/",
            e.step,
            e.main()
        )
    },
    no_better: "lower held-out loss",
};

const ELECTRA_WORDING: Wording = Wording {
    step: |m| {
        let f = |k: &str| m.figures.get(k).copied().unwrap_or(f64::NAN);
        format!(
            "loss {:.4} (gen {:.3}, disc {:.4}) disc acc {:.3} lr {:.2e} {:.0} tok/s",
            m.loss,
            f("generator_loss"),
            f("discriminator_loss"),
            f("discriminator_accuracy"),
            m.lr,
            m.tokens_per_s
        )
    },
    eval: |e| {
        let f = |k: &str| e.scores.get(k).copied().unwrap_or(f64::NAN);
        format!(
            "step {}: held-out loss {:.4} (generator {:.4}, discriminator {:.4}), discriminator accuracy {:.3}",
            e.step,
            e.eval_loss,
            f("eval_generator_loss"),
            f("eval_discriminator_loss"),
            f("eval_discriminator_accuracy"),
        )
    },
    best: |e| {
        format!(
            "step {}: lowest held-out ELECTRA loss so far ({:.4}), saved to best/",
            e.step,
            e.main()
        )
    },
    no_better: "lower held-out loss",
};
