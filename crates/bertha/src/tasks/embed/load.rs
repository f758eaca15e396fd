//! Making an [`Embedder`]: from a model folder (its sentence-transformers
//! settings) or from a model in memory, and its fast path packed in a
//! precision, from a quantised folder's stored weights when it has them.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::Device;

use super::sparse::load_mlm_head;
use super::{EmbedOptions, Embedder, DEFAULT_MAX_BATCH_TOKENS};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::fast::{PackedBert, Precision};
use crate::io::quantized::{self, PackedCheckpoint};
use crate::io::st_folder::SentenceTransformerSpec;
use crate::io::tokenizer::Tokenizer;
use crate::io::ModelDir;
use crate::model::{BertForMaskedLM, BertHead, BertModel};
use crate::pooling::Pooling;
use crate::splade::{SpladeHead, SpladeOptions};

impl Embedder {
    /// Loads model, tokenizer and pooling from a model folder. Without
    /// overrides, a sentence-transformers folder uses its own pooling,
    /// normalisation, `max_seq_length` and prompts (a SparseEncoder
    /// folder, SPLADE with its SpladePooling settings); a plain checkpoint
    /// uses mean pooling without normalisation and `max_position_embeddings`.
    /// Pooling `none` is not normalised unless `opts.normalize` says so.
    /// Pooling `splade` loads the checkpoint's MLM head too, and is an
    /// error naming the missing tensor when it has none.
    pub fn from_dir(dir: &Path, device: &Device, opts: &EmbedOptions) -> Result<Self> {
        let folder = ModelDir::open(dir)?;
        let spec = SentenceTransformerSpec::from_dir(dir)?;
        let pooling = opts
            .pooling
            .or(spec.as_ref().map(|s| s.pooling))
            .unwrap_or(Pooling::Mean);
        let (config, weights) = folder.config_and_weights()?;
        let (model, splade) = if pooling == Pooling::Splade {
            let head = load_mlm_head(weights, config, device)?;
            let options = spec.as_ref().and_then(|s| s.splade).unwrap_or_default();
            let splade = SpladeHead::new(head.predictions().clone(), options);
            (head.bert().clone(), Some(splade))
        } else {
            (BertModel::from_weights(weights, config, device)?, None)
        };
        let max_length = match opts.max_length {
            Some(n) => n,
            None => folder.default_max_length(model.config())?,
        };
        check_max_length(max_length, model.config())?;
        let tokenizer = folder.model_tokenizer(model.config(), max_length)?;
        // A Normalize module acts on sentence vectors: token vectors
        // (pooling `none`) stay the raw last hidden state unless asked, as
        // sentence-transformers' `token_embeddings` and TEI's `/embed_all`.
        let normalize = match (opts.normalize, pooling) {
            (Some(asked), _) => asked,
            (None, Pooling::None) => false,
            (None, _) => spec.as_ref().is_some_and(|s| s.normalize),
        };
        // A reduced precision packs below (set_precision): not twice.
        let pack_f32 = opts.precision == Precision::F32;
        let mut embedder = Self::build(model, tokenizer, pooling, normalize, splade, pack_f32)?;
        if let Some(spec) = spec {
            embedder.set_prompts(spec.prompts, spec.default_prompt_name)?;
            embedder.include_prompt = spec.include_prompt;
        }
        if let Some(path) = &opts.calibration {
            embedder.set_calibration(read_calibration(path)?)?;
        }
        if let Some(file) = quantized::packed_file(dir) {
            if opts.calibration.is_some() {
                tracing::info!(
                    "{}: not used, int8 is calibrated again on the --calibration texts",
                    file.display()
                );
            } else {
                let hash = quantized::config_hash(&folder.config_path())?;
                embedder.packed_file = Some((file, hash));
            }
        }
        if opts.precision != Precision::F32 {
            embedder.set_precision(opts.precision)?;
        }
        Ok(embedder)
    }

    /// An embedder of `model`'s token states. Pooling `splade` needs the
    /// MLM head: see [`Embedder::new_splade`].
    pub fn new(
        model: BertModel,
        tokenizer: Tokenizer,
        pooling: Pooling,
        normalize: bool,
    ) -> Result<Self> {
        Self::build(model, tokenizer, pooling, normalize, None, true)
    }

    /// A SPLADE embedder: `head`'s encoder and MLM head, pooled as
    /// `options` says. Vectors are normalised only when `normalize` is set
    /// (SPLADE models do not normalise).
    pub fn new_splade(
        head: BertForMaskedLM,
        tokenizer: Tokenizer,
        options: SpladeOptions,
        normalize: bool,
    ) -> Result<Self> {
        let splade = SpladeHead::new(head.predictions().clone(), options);
        Self::build(
            head.bert().clone(),
            tokenizer,
            Pooling::Splade,
            normalize,
            Some(splade),
            true,
        )
    }

    /// The embedder, with the fp32 fast path packed when `pack_f32` (a
    /// caller that sets another precision next packs once, then).
    fn build(
        model: BertModel,
        tokenizer: Tokenizer,
        pooling: Pooling,
        normalize: bool,
        splade: Option<SpladeHead>,
        pack_f32: bool,
    ) -> Result<Self> {
        if pooling == Pooling::Splade && splade.is_none() {
            return Err(Error::Input(
                "pooling `splade` needs the model's MLM head: load with Embedder::from_dir \
                 or Embedder::new_splade"
                    .into(),
            ));
        }
        let splade = if pooling == Pooling::Splade {
            splade
        } else {
            None
        };
        if pooling == Pooling::Pooler && !model.has_pooler() {
            return Err(Error::Input(
                "pooling `pooler` needs a model with pooler weights".into(),
            ));
        }
        let packed = if pack_f32 {
            PackedBert::from_model(&model)?
        } else {
            None
        };
        Ok(Self {
            model,
            packed,
            precision: Precision::F32,
            tokenizer,
            pooling,
            normalize,
            prompts: BTreeMap::new(),
            default_prompt_name: None,
            include_prompt: true,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            splade,
            calibration: None,
            packed_file: None,
        })
    }

    /// The fast path in `precision` as this CPU runs it (bf16 without
    /// AVX512-BF16: fp32, with a notice).
    pub(super) fn packed_model(&self, precision: Precision) -> Result<Option<PackedBert>> {
        self.pack(crate::tasks::precision::runnable(precision))
    }

    /// The fast path packed in `precision` (bf16 whatever the CPU): a
    /// quantised folder's stored weights when they are in `precision`;
    /// else packed here, int8 calibrated on the calibration texts (by
    /// default a built-in set of English sentences).
    pub(super) fn pack(&self, precision: Precision) -> Result<Option<PackedBert>> {
        match (precision, &self.packed_file) {
            (Precision::F32, _) | (_, None) => crate::tasks::precision::pack(
                &self.model,
                &self.tokenizer,
                precision,
                self.calibration.as_deref(),
            ),
            (_, Some((file, hash))) => {
                let Some(mut packed) = PackedBert::from_model(&self.model)? else {
                    return Ok(None);
                };
                let stored = PackedCheckpoint::read(file, precision.name(), hash)?;
                packed.load_packed(&stored.linears, file)?;
                Ok(Some(packed))
            }
        }
    }

    /// Writes the quantised folder `out`: a copy of the model folder
    /// `src` (this embedder's) with its fast path packed in `precision`
    /// (int8 calibrated as [`Embedder::set_calibration`] says), so that
    /// loading it skips calibration and packing. `calibration` names the
    /// calibration texts in the file's metadata.
    pub fn write_quantized(
        &self,
        src: &Path,
        out: &Path,
        precision: Precision,
        calibration: &str,
    ) -> Result<()> {
        if precision == Precision::F32 {
            return Err(Error::option(
                "precision",
                "f32 has nothing to pack: choose int8 or bf16",
            ));
        }
        if let Some(file) = quantized::packed_file(src) {
            return Err(Error::ModelDir {
                path: src.to_path_buf(),
                reason: format!(
                    "already quantised ({} is there): quantize the original folder",
                    file.display()
                ),
            });
        }
        let Some(packed) = self.pack(precision)? else {
            return Err(Error::Input(format!(
                "{precision:?} runs only on the CPU fast path, which this model ({:?} on {:?}) \
                 does not take",
                self.model.config().family,
                self.model.device()
            )));
        };
        let checkpoint = PackedCheckpoint {
            precision: precision.name().to_string(),
            config_hash: quantized::config_hash(&ModelDir::open(src)?.config_path())?,
            calibration: calibration.to_string(),
            linears: packed.packed_linears(),
        };
        quantized::write_folder(src, out, &checkpoint)
    }
}

/// The non-blank lines of a calibration file; an error naming the file
/// when it is missing, not UTF-8 or has no text.
pub fn read_calibration(path: &Path) -> Result<Vec<String>> {
    let texts: Vec<String> = crate::io::texts::read_lines_from_file(path)?
        .into_iter()
        .filter(|t| !t.trim().is_empty())
        .collect();
    if texts.is_empty() {
        return Err(Error::Input(format!(
            "{}: no calibration texts (expected one text per line)",
            path.display()
        )));
    }
    Ok(texts)
}

/// RoBERTa's positions start past its padding index, so its limit is
/// `max_position_embeddings - pad_token_id - 1` (514 gives 512): checked
/// here at load, not when the first long text reaches the model.
fn check_max_length(max_length: usize, config: &BertConfig) -> Result<()> {
    if max_length > config.max_sequence_length() {
        return Err(Error::Input(format!(
            "max length {max_length} is longer than the model's limit of {} tokens (max_position_embeddings {})",
            config.max_sequence_length(),
            config.max_position_embeddings
        )));
    }
    Ok(())
}
