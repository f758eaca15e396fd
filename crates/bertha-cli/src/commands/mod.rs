pub mod attention;
pub mod bench;
pub mod classify;
pub mod curves;
pub mod embed;
pub mod embed_map;
pub mod evaluate;
pub mod fill_mask;
pub mod finetune;
pub mod finetune_embedding;
pub mod finetune_rerank;
pub mod mine_negatives;
pub mod ner;
pub mod nsp;
pub mod pairs;
pub mod predict;
pub mod prepare_corpus;
pub mod pretrain;
pub mod qa;
pub mod quantize;
pub mod rerank;
pub mod serve;
pub mod similarity;
pub mod tokenize;

use std::path::PathBuf;

use anyhow::Result;
use bertha::{EmbedOptions, Embedder, EncodeOptions, Pooling};

use crate::model_dir::ModelArgs;
use crate::output::JsonLines;
use crate::texts::TextArgs;

/// The most texts [`PerTextArgs::for_each_chunk`] holds in flight: their
/// lines are written once the whole chunk is done.
const MOST_TEXTS_AT_ONCE: usize = 4096;

/// What every per-text command takes: the model, the texts and where the
/// JSON lines go.
#[derive(clap::Args, Debug)]
pub struct PerTextArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    #[command(flatten)]
    pub texts: TextArgs,

    /// Write JSON Lines here instead of stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
}

impl PerTextArgs {
    /// Writes `each(text)` as one line per text; an error names the text
    /// by its 1-based number.
    pub fn for_each_text<T: serde::Serialize>(
        &self,
        mut each: impl FnMut(&str) -> bertha::Result<T>,
    ) -> Result<()> {
        let texts = self.texts.read()?;
        let mut out = JsonLines::open(self.output.as_deref())?;
        for (i, text) in texts.iter().enumerate() {
            let line = each(text).map_err(|e| anyhow::anyhow!("text {}: {e}", i + 1))?;
            out.write(&line)?;
        }
        out.finish()
    }

    /// As [`PerTextArgs::for_each_text`], for a model that runs many texts
    /// at once: `many` gets the texts in chunks, the first of `first` texts
    /// and each next twice the last up to [`MOST_TEXTS_AT_ONCE`] (the first
    /// lines come out soon), and gives one line a text, in order. A chunk
    /// that fails is run again a text at a time (`one`), so the error still
    /// names its text.
    pub fn for_each_chunk<T: serde::Serialize>(
        &self,
        first: usize,
        mut many: impl FnMut(&[String]) -> bertha::Result<Vec<T>>,
        mut one: impl FnMut(&str) -> bertha::Result<T>,
    ) -> Result<()> {
        let texts = self.texts.read()?;
        let mut out = JsonLines::open(self.output.as_deref())?;
        let (mut start, mut size) = (0, first.max(1));
        while start < texts.len() {
            let chunk = &texts[start..texts.len().min(start + size)];
            let lines = match many(chunk) {
                Ok(lines) => lines,
                Err(e) => {
                    for (i, text) in chunk.iter().enumerate() {
                        one(text).map_err(|e| anyhow::anyhow!("text {}: {e}", start + i + 1))?;
                    }
                    anyhow::bail!("texts {}-{}: {e}", start + 1, start + chunk.len());
                }
            };
            for line in &lines {
                out.write(line)?;
            }
            start += chunk.len();
            size = (size * 2).min(MOST_TEXTS_AT_ONCE.max(first));
        }
        out.finish()
    }
}

/// Options shared by every command that runs the model.
#[derive(clap::Args, Debug, Clone)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// cls, mean, max, mean_sqrt_len, pooler, none or splade (sparse
    /// vectors from the MLM head) (default: the folder's
    /// sentence-transformers pooling, else mean).
    #[arg(long)]
    pub pooling: Option<String>,

    /// L2-normalise embeddings (default: as the folder's modules.json says).
    #[arg(long, conflicts_with = "no_normalize")]
    pub normalize: bool,

    /// Do not normalise, even if the folder's modules.json says so.
    #[arg(long)]
    pub no_normalize: bool,

    /// Truncate texts to this many tokens (default: sentence-transformers'
    /// max_seq_length, else max_position_embeddings).
    #[arg(long)]
    pub max_length: Option<usize>,

    /// Texts per forward pass.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,

    #[command(flatten)]
    pub precision: PrecisionArgs,

    /// int8 calibration texts, one per line (default: built-in English
    /// sentences); also recalibrates a `bertha quantize` folder.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
}

/// The encoder's number format, for every command that runs a model.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct PrecisionArgs {
    /// Number format of the matrix multiplies: `f32` (exact); `bf16`
    /// (bf16 weights and multiply inputs, fp32 sums, where AVX512-BF16 or
    /// aarch64's BF16 beats fp32; fp32 with a notice elsewhere); `int8` (all four
    /// encoder linears: int8 weights per output column and channel group,
    /// activations per token and channel group, calibrated SmoothQuant
    /// factors; exact integer sums on AVX-512 VNNI, AVX-VNNI, AVX2 or NEON
    /// dotprod, scalar loops elsewhere). Task heads stay fp32; bf16 and int8 need the CPU and a
    /// family but DeBERTa-v2. A `bertha quantize` folder runs its stored
    /// weights when this names its precision. `--quantize` is the older
    /// name.
    #[arg(long, alias = "quantize", default_value = "f32")]
    pub precision: bertha::fast::Precision,
}

impl PrecisionArgs {
    /// The options of a task pipeline.
    pub fn pipeline(&self) -> bertha::tasks::PipelineOptions {
        bertha::tasks::PipelineOptions {
            precision: self.precision,
            ..Default::default()
        }
    }
}

/// What `embed` and `similarity` take: the embedding options, the texts
/// and where the output goes.
#[derive(clap::Args, Debug)]
pub struct EmbedTextArgs {
    #[command(flatten)]
    pub embed: EmbedArgs,

    #[command(flatten)]
    pub texts: TextArgs,

    /// Prepend this prompt of the folder's `prompts` to every text
    /// (default: the folder's `default_prompt_name`, if it has one).
    #[arg(long, conflicts_with = "prompt")]
    pub prompt_name: Option<String>,

    /// Prepend this text to every text (a prompt not in the folder).
    #[arg(long)]
    pub prompt: Option<String>,

    /// Keep the first N dimensions of each embedding (Matryoshka), then
    /// L2-normalise again when normalising.
    #[arg(long, value_name = "N")]
    pub dimensions: Option<usize>,

    /// Write the output here instead of stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
}

impl EmbedTextArgs {
    /// The prompt and dimensions asked for.
    pub fn encode_options(&self) -> EncodeOptions {
        EncodeOptions {
            prompt_name: self.prompt_name.clone(),
            prompt: self.prompt.clone(),
            dimensions: self.dimensions,
        }
    }
}

impl EmbedArgs {
    pub fn load(&self) -> Result<Embedder> {
        let dir = self.model.resolve()?;
        let pooling = self
            .pooling
            .as_deref()
            .map(str::parse::<Pooling>)
            .transpose()?;
        let normalize = if self.normalize {
            Some(true)
        } else if self.no_normalize {
            Some(false)
        } else {
            None
        };
        let opts = EmbedOptions {
            pooling,
            normalize,
            max_length: self.max_length,
            precision: self.precision.precision,
            calibration: self.calibration.clone(),
        };
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1");
        }
        Ok(Embedder::from_dir(&dir, &device()?, &opts)?)
    }
}

/// The CUDA device when built with `--features cuda` and one is present,
/// else the CPU.
pub fn device() -> Result<bertha::Device> {
    Ok(bertha::Device::cuda_if_available(0)?)
}
