//! Sentence and token embeddings, like sentence-transformers' `encode`
//! and TEI's `/embed` and `/embed_all`, with their prompts and Matryoshka
//! `dimensions`; and SPLADE's sparse vectors (pooling `splade`), like
//! sentence-transformers' SparseEncoder and TEI's `/embed_sparse`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::fast::{PackedBert, PackedStates, Precision};
use crate::io::quantized::{self, PackedCheckpoint};
use crate::io::st_folder::{known_names, SentenceTransformerSpec};
use crate::io::tokenizer::{Encoded, Tokenizer};
use crate::io::ModelDir;
use crate::model::{BertForMaskedLM, BertHead, BertInput, BertModel, ForwardOptions};
use crate::model::{HeadInit, HeadKind};
use crate::pooling::{self, Pooling};
use crate::splade::{SparseVector, SpladeHead, SpladeOptions};

/// Overrides of what the model folder prescribes.
#[derive(Debug, Clone, Default)]
pub struct EmbedOptions {
    pub pooling: Option<Pooling>,
    pub normalize: Option<bool>,
    pub max_length: Option<usize>,
    /// Number format of the CPU fast path (`Int8`: faster, approximate).
    /// A folder written by `bertha quantize` runs its stored weights when
    /// this is the precision it was written for (another reduced precision
    /// is refused; `F32` runs the folder's fp32 weights).
    pub precision: Precision,
    /// int8 calibration texts, one per line (default: built-in English
    /// sentences). Given, it also overrides a quantised folder's stored
    /// int8 weights: they are calibrated again at load.
    pub calibration: Option<PathBuf>,
}

/// What one embedding call asks beyond its texts: sentence-transformers'
/// `encode(prompt_name=, prompt=, truncate_dim=)`, TEI's `prompt_name` and
/// `dimensions`. With neither prompt given, the folder's
/// `default_prompt_name` applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// One of the folder's `prompts`, prepended to every text.
    pub prompt_name: Option<String>,
    /// A prompt given as text (excludes `prompt_name`).
    pub prompt: Option<String>,
    /// Matryoshka truncation: keep the first `dimensions` values, then
    /// L2-normalise again when the embedder normalises.
    pub dimensions: Option<usize>,
}

/// The prompt of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    /// Leading tokens pooling leaves out: `[CLS]` and the prompt's own
    /// when the folder's Pooling has `include_prompt: false`, else 0.
    pub pool_start: usize,
}

/// One vector per token of one text (pooling `none`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenEmbeddings {
    pub tokens: Vec<String>,
    pub embeddings: Vec<Vec<f32>>,
}

pub struct Embedder {
    model: BertModel,
    /// The packed CPU fast path (absent on other devices).
    packed: Option<PackedBert>,
    precision: Precision,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    /// The folder's prompts, name → text.
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
    /// Whether a prompt's tokens are pooled with the text's.
    include_prompt: bool,
    max_batch_tokens: usize,
    /// The MLM head and SPLADE settings (pooling `splade` only).
    splade: Option<SpladeHead>,
    /// int8 calibration texts (`None`: the built-in set).
    calibration: Option<Vec<String>>,
    /// A quantised folder's packed file and the hash of its config.json:
    /// loaded instead of packing when the precision asked is the file's.
    packed_file: Option<(PathBuf, String)>,
}

/// Default cap on the tokens of one batch: bounds memory for long texts
/// (the FFN buffer is tokens × intermediate_size floats).
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 16384;

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

    /// Calibrates int8 on `texts` instead of the built-in set (from the
    /// next [`Embedder::set_precision`] on); at least one text.
    pub fn set_calibration(&mut self, texts: Vec<String>) -> Result<()> {
        if texts.iter().all(|t| t.trim().is_empty()) {
            return Err(Error::option(
                "calibration",
                "has no texts: give at least one non-empty text",
            ));
        }
        self.calibration = Some(texts);
        Ok(())
    }

    /// Sets the prompts a call can name, and the one used when a call
    /// names none (it must be one of them).
    pub fn set_prompts(
        &mut self,
        prompts: BTreeMap<String, String>,
        default_prompt_name: Option<String>,
    ) -> Result<()> {
        if let Some(name) = &default_prompt_name {
            if !prompts.contains_key(name) {
                return Err(Error::option(
                    "default_prompt_name",
                    format!(
                        "`{name}` is not one of the prompts ({})",
                        known_names(&prompts)
                    ),
                ));
            }
        }
        self.prompts = prompts;
        self.default_prompt_name = default_prompt_name;
        Ok(())
    }

    /// Whether a prompt's tokens are pooled with the text's
    /// (sentence-transformers' `include_prompt`, true by default).
    pub fn set_include_prompt(&mut self, include: bool) {
        self.include_prompt = include;
    }

    pub fn prompts(&self) -> &BTreeMap<String, String> {
        &self.prompts
    }

    pub fn default_prompt_name(&self) -> Option<&str> {
        self.default_prompt_name.as_deref()
    }

    pub fn include_prompt(&self) -> bool {
        self.include_prompt
    }

    /// The prompt of a call, resolved as sentence-transformers does:
    /// `prompt`, else the prompt `prompt_name` names, else the default
    /// prompt; `None` when there is none (an empty prompt is none). The
    /// prompt must leave the text at least one token of the max length.
    pub fn prompt(&self, opts: &EncodeOptions) -> Result<Option<Prompt>> {
        let text = match (&opts.prompt, &opts.prompt_name) {
            (Some(_), Some(_)) => {
                return Err(Error::option(
                    "prompt",
                    "and prompt_name cannot both be given: choose one",
                ))
            }
            (Some(text), None) => text.clone(),
            (None, Some(name)) => self.prompts.get(name).cloned().ok_or_else(|| {
                Error::option(
                    "prompt_name",
                    format!(
                        "`{name}` is not one of this model's prompts ({})",
                        known_names(&self.prompts)
                    ),
                )
            })?,
            (None, None) => match &self.default_prompt_name {
                Some(name) => self.prompts.get(name).cloned().unwrap_or_default(),
                None => return Ok(None),
            },
        };
        if text.is_empty() {
            return Ok(None);
        }
        let enc = self
            .tokenizer
            .inner()
            .encode(text.as_str(), true)
            .map_err(|e| Error::Tokenizer(format!("encoding the prompt: {e}")))?;
        let (tokens, max) = (enc.len(), self.tokenizer.max_length());
        if tokens >= max {
            return Err(Error::option(
                "prompt",
                format!(
                    "`{text}` takes {}{tokens} tokens with [CLS] and [SEP]: the max length {max} \
                     leaves none for the text",
                    if enc.get_overflowing().is_empty() {
                        ""
                    } else {
                        "over "
                    }
                ),
            ));
        }
        // sentence-transformers counts the prompt's tokens without the
        // trailing [SEP], so [CLS] is among those left out.
        let pool_start = if self.include_prompt {
            0
        } else {
            tokens - usize::from(enc.get_special_tokens_mask().last() == Some(&1))
        };
        Ok(Some(Prompt { text, pool_start }))
    }

    /// Checks a Matryoshka size: 1 to the embedding size, pooled vectors
    /// only.
    pub fn check_dimensions(&self, dimensions: Option<usize>) -> Result<()> {
        let Some(d) = dimensions else {
            return Ok(());
        };
        if self.pooling == Pooling::None {
            return Err(Error::option(
                "dimensions",
                "applies to pooled vectors, and pooling `none` gives token vectors",
            ));
        }
        let size = self.dimension();
        if d == 0 || d > size {
            return Err(Error::option(
                "dimensions",
                format!("{d} is out of range: this model's embeddings have {size} dimensions (choose 1 to {size})"),
            ));
        }
        Ok(())
    }

    /// Tokenizes `texts` for a call: checks `opts`, then prepends the
    /// call's prompt to each text.
    pub fn encode_texts<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EncodeOptions,
    ) -> Result<Vec<Encoded>> {
        self.check_dimensions(opts.dimensions)?;
        match self.prompt(opts)? {
            None => self.tokenizer.encode_batch(texts),
            Some(p) => {
                let prompted: Vec<String> = texts
                    .iter()
                    .map(|t| format!("{}{}", p.text, t.as_ref()))
                    .collect();
                self.tokenizer.encode_batch(&prompted)
            }
        }
    }

    /// Turns the packed CPU fast path off (the candle modules then run
    /// every batch) or back on. Both give the same numbers; tests compare.
    pub fn set_fast_path(&mut self, on: bool) -> Result<()> {
        self.packed = if on {
            self.packed_model(self.precision)?
        } else {
            None
        };
        Ok(())
    }

    /// Sets the number format of the fast path. `Int8` needs the fast
    /// path (a BERT or a ModernBERT on the CPU); other models and devices
    /// refuse it.
    ///
    /// A quantised folder must hold `precision` (else an error naming its
    /// file and field) whatever this CPU then runs: bf16 without
    /// AVX512-BF16 runs in fp32, with a notice, as everywhere.
    pub fn set_precision(&mut self, precision: Precision) -> Result<()> {
        if precision != Precision::F32 {
            if let Some((file, hash)) = &self.packed_file {
                PackedCheckpoint::check(file, precision.name(), hash)?;
            }
        }
        let runs = super::precision::runnable(precision);
        let packed = self.pack(runs)?;
        if packed.is_none() && precision != Precision::F32 {
            return Err(super::precision::fast_path_refused(precision, &self.model));
        }
        self.packed = packed;
        self.precision = runs;
        Ok(())
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The fast path in `precision` as this CPU runs it (bf16 without
    /// AVX512-BF16: fp32, with a notice).
    fn packed_model(&self, precision: Precision) -> Result<Option<PackedBert>> {
        self.pack(super::precision::runnable(precision))
    }

    /// The fast path packed in `precision` (bf16 whatever the CPU): a
    /// quantised folder's stored weights when they are in `precision`;
    /// else packed here, int8 calibrated on the calibration texts (by
    /// default a built-in set of English sentences).
    fn pack(&self, precision: Precision) -> Result<Option<PackedBert>> {
        match (precision, &self.packed_file) {
            (Precision::F32, _) | (_, None) => super::precision::pack(
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

    /// Whether a pass runs its last layer at one row per text: the fast
    /// path with `[CLS]` pooling or the pooler.
    pub fn reads_one_row(&self) -> bool {
        self.packed.is_some()
            && self.splade.is_none()
            && matches!(self.pooling, Pooling::Cls | Pooling::Pooler)
    }

    pub fn uses_fast_path(&self) -> bool {
        self.packed.is_some()
    }

    /// Caps the tokens of one batch (texts still run `batch_size` at most).
    pub fn set_max_batch_tokens(&mut self, tokens: usize) {
        self.max_batch_tokens = tokens.max(1);
    }

    pub fn model(&self) -> &BertModel {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The length of a pooled vector: the hidden size, or the vocabulary
    /// size for SPLADE.
    pub fn dimension(&self) -> usize {
        match &self.splade {
            Some(head) => head.vocab_size(),
            None => self.model.config().hidden_size,
        }
    }

    /// Whether this embedder makes sparse vectors (pooling `splade`).
    pub fn is_sparse(&self) -> bool {
        self.splade.is_some()
    }

    /// The SPLADE settings (pooling `splade` only).
    pub fn splade_options(&self) -> Option<SpladeOptions> {
        self.splade.as_ref().map(SpladeHead::options)
    }

    /// Changes the SPLADE settings; an error unless pooling is `splade`.
    pub fn set_splade_options(&mut self, options: SpladeOptions) -> Result<()> {
        self.splade_head_mut()?.set_options(options);
        Ok(())
    }

    /// Caps the tokens whose MLM logits (a vocabulary's worth of floats
    /// each) are held at once; `0` is the default (32 MB of logits). The
    /// vectors do not depend on it. An error unless pooling is `splade`.
    pub fn set_splade_chunk_tokens(&mut self, tokens: usize) -> Result<()> {
        self.splade_head_mut()?.set_chunk_tokens(tokens);
        Ok(())
    }

    fn splade_head_mut(&mut self) -> Result<&mut SpladeHead> {
        let pooling = self.pooling.name();
        self.splade.as_mut().ok_or_else(|| {
            Error::Input(format!(
                "this embedder pools `{pooling}`, not `splade`: it has no SPLADE settings"
            ))
        })
    }

    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// One vector per text, in input order. Texts are sorted by length and
    /// run `batch_size` at a time so that little work goes to padding.
    /// `progress` is called with the number of texts finished so far.
    pub fn embed<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        self.embed_with(texts, &EncodeOptions::default(), batch_size, progress)
    }

    /// As [`Embedder::embed`], with a call's prompt and dimensions.
    pub fn embed_with<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EncodeOptions,
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        if self.pooling == Pooling::None {
            return Err(Error::Input(
                "pooling `none` gives token vectors: use embed_tokens".into(),
            ));
        }
        let encodings = self.encode_texts(texts, opts)?;
        self.embed_encoded_with(&encodings, opts, batch_size, progress)
    }

    /// As [`Embedder::embed`], on texts already tokenized (no prompt is
    /// added: see [`Embedder::embed_encoded_with`]).
    pub fn embed_encoded(
        &self,
        encodings: &[Encoded],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        self.embed_encoded_from(encodings, &vec![0; encodings.len()], batch_size, progress)
    }

    /// Embeds what [`Embedder::encode_texts`] made of the texts for the
    /// same `opts`: pools past the prompt when the folder says so, then
    /// truncates to `opts.dimensions`.
    pub fn embed_encoded_with(
        &self,
        encodings: &[Encoded],
        opts: &EncodeOptions,
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        self.check_dimensions(opts.dimensions)?;
        let start = self.prompt(opts)?.map_or(0, |p| p.pool_start);
        let mut rows = self.embed_encoded_from(
            encodings,
            &vec![start; encodings.len()],
            batch_size,
            progress,
        )?;
        if let Some(d) = opts.dimensions {
            for r in &mut rows {
                r.truncate(d);
                if self.normalize {
                    pooling::normalize_in_place(r);
                }
            }
        }
        Ok(rows)
    }

    /// As [`Embedder::embed_encoded`], pooling text `i` from its token
    /// `pool_start[i]` on (a prompt's tokens left out; [`Prompt::pool_start`]).
    /// At least the last token is pooled.
    pub fn embed_encoded_from(
        &self,
        encodings: &[Encoded],
        pool_start: &[usize],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        self.in_pooled_batches(
            encodings,
            pool_start,
            batch_size,
            progress,
            |encs, starts| self.run_pooled(encs, starts),
        )
    }

    /// [`Embedder::in_batches`] of texts pooled from their token
    /// `pool_start[i]` on: `run` gets each batch's encodings and starts.
    fn in_pooled_batches<T>(
        &self,
        encodings: &[Encoded],
        pool_start: &[usize],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
        run: impl Fn(&[&Encoded], &[usize]) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        if pool_start.len() != encodings.len() {
            return Err(Error::Input(format!(
                "{} pool starts for {} texts",
                pool_start.len(),
                encodings.len()
            )));
        }
        self.in_batches(encodings, batch_size, progress, |batch| {
            let encs: Vec<&Encoded> = batch.iter().map(|&i| &encodings[i]).collect();
            let starts: Vec<usize> = batch.iter().map(|&i| pool_start[i]).collect();
            run(&encs, &starts)
        })
    }

    /// Runs `run` on length-sorted batches of `encodings` and returns its
    /// rows in input order; `progress` sees the texts done after each batch.
    fn in_batches<T>(
        &self,
        encodings: &[Encoded],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
        mut run: impl FnMut(&[usize]) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None)
            .take(encodings.len())
            .collect();
        let mut done = 0;
        for batch in length_sorted_batches(encodings, batch_size, self.max_batch_tokens) {
            let rows = run(&batch)?;
            for (row, i) in rows.into_iter().zip(batch.iter()) {
                out[*i] = Some(row);
            }
            done += batch.len();
            progress(done);
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every index is in one batch"))
            .collect())
    }

    /// The packed fast path's token states of `encs`, when it is on: every
    /// row, or with `rows` row `rows[i]` of text `i` only (one row each).
    fn packed_states(
        &self,
        encs: &[&Encoded],
        rows: Option<&[usize]>,
    ) -> Result<Option<PackedStates>> {
        let Some(packed) = &self.packed else {
            return Ok(None);
        };
        let seqs: Vec<(&[u32], &[u32])> = encs
            .iter()
            .map(|e| (&e.input_ids[..], &e.token_type_ids[..]))
            .collect();
        Ok(Some(match rows {
            Some(rows) => packed.forward_at(&seqs, rows)?,
            None => packed.forward(&seqs)?,
        }))
    }

    /// Pooled vectors of `encs`, text `i` pooled from token `starts[i]`.
    fn run_pooled(&self, encs: &[&Encoded], starts: &[usize]) -> Result<Vec<Vec<f32>>> {
        if self.splade.is_some() {
            let mut rows = vec![Vec::new(); encs.len()];
            self.run_splade(encs, starts, &mut |i, mut row| {
                if self.normalize {
                    pooling::normalize_in_place(&mut row);
                }
                rows[i] = row;
                Ok(())
            })?;
            return Ok(rows);
        }
        let from = |i: usize, tokens: usize| starts[i].min(tokens.saturating_sub(1));
        // [CLS] pooling and the pooler read one row per text: the last
        // layer runs at those rows only.
        let one_row: Option<Vec<usize>> = match self.pooling {
            Pooling::Cls if encs.iter().all(|e| !e.input_ids.is_empty()) => Some(
                encs.iter()
                    .enumerate()
                    .map(|(i, e)| from(i, e.input_ids.len()))
                    .collect(),
            ),
            Pooling::Pooler if encs.iter().all(|e| !e.input_ids.is_empty()) => {
                Some(vec![0; encs.len()])
            }
            _ => None,
        };
        if let Some(states) = self.packed_states(encs, one_row.as_deref())? {
            let d = states.hidden;
            let mut rows = match (&self.packed, self.pooling) {
                (Some(packed), Pooling::Pooler) => packed
                    .pool(&states)?
                    .ok_or_else(|| Error::Input("this model has no pooler".into()))?,
                _ => (0..states.len())
                    .map(|s| {
                        let seq = states.sequence(s);
                        pooling::pool_rows(&seq[from(s, seq.len() / d) * d..], d, self.pooling)
                    })
                    .collect(),
            };
            if self.normalize {
                rows.iter_mut().for_each(|r| pooling::normalize_in_place(r));
            }
            return Ok(rows);
        }
        let (input, out) = self.forward(encs)?;
        let mask = input
            .attention_mask
            .as_ref()
            .expect("from_ids always sets a mask");
        let mut pooled = if self.pooling == Pooling::Pooler || starts.iter().all(|&s| s == 0) {
            pooling::pool(
                &out.last_hidden_state,
                mask,
                self.pooling,
                out.pooler_output.as_ref(),
            )?
        } else {
            // Each text's states past its start, pooled alone.
            let rows = encs
                .iter()
                .enumerate()
                .map(|(r, e)| {
                    let s = from(r, e.len());
                    let states = out
                        .last_hidden_state
                        .get(r)?
                        .narrow(0, s, e.len() - s)?
                        .unsqueeze(0)?;
                    let all = Tensor::ones((1, e.len() - s), states.dtype(), states.device())?;
                    pooling::pool(&states, &all, self.pooling, None)
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&rows, 0)?
        };
        if self.normalize {
            pooled = pooling::normalize(&pooled)?;
        }
        Ok(pooled.to_vec2::<f32>()?)
    }

    /// Sparse vectors of `encs`, text `i` pooled from token `starts[i]`.
    fn run_sparse(&self, encs: &[&Encoded], starts: &[usize]) -> Result<Vec<SparseVector>> {
        let mut rows = vec![SparseVector::default(); encs.len()];
        self.run_splade(encs, starts, &mut |i, mut row| {
            if self.normalize {
                pooling::normalize_in_place(&mut row);
            }
            rows[i] = SparseVector::from_dense(&row);
            Ok(())
        })?;
        Ok(rows)
    }

    /// The SPLADE vector of each of `encs` (from token `starts[i]` on),
    /// handed to `emit` one at a time: the encoder's states of the real
    /// tokens through the MLM head, a bounded number of tokens at a time.
    fn run_splade(
        &self,
        encs: &[&Encoded],
        starts: &[usize],
        emit: &mut dyn FnMut(usize, Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        let head = self
            .splade
            .as_ref()
            .ok_or_else(|| Error::Input("pooling `splade` needs the MLM head".into()))?;
        let from = |i: usize, tokens: usize| starts[i].min(tokens.saturating_sub(1));
        let texts: Vec<Tensor> = if let Some(states) = self.packed_states(encs, None)? {
            let d = states.hidden;
            (0..states.len())
                .map(|s| {
                    let seq = states.sequence(s);
                    let n = seq.len() / d.max(1);
                    let f = from(s, n);
                    Tensor::from_slice(&seq[f * d..n * d], (n - f, d), self.model.device())
                })
                .collect::<candle_core::Result<_>>()?
        } else {
            let (_, out) = self.forward(encs)?;
            encs.iter()
                .enumerate()
                .map(|(r, e)| {
                    let f = from(r, e.len());
                    out.last_hidden_state.get(r)?.narrow(0, f, e.len() - f)
                })
                .collect::<candle_core::Result<_>>()?
        };
        head.pool(&texts, emit)
    }

    /// One sparse vector per text (pooling `splade`), in input order: the
    /// nonzero entries of the vocabulary-sized SPLADE vector, as
    /// sentence-transformers' SparseEncoder and TEI's `/embed_sparse`.
    /// Texts run as in [`Embedder::embed`].
    pub fn embed_sparse<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.embed_sparse_with(texts, &EncodeOptions::default(), batch_size, progress)
    }

    /// As [`Embedder::embed_sparse`], with a call's prompt (`dimensions`
    /// is refused: a sparse vector's entries are vocabulary ids).
    pub fn embed_sparse_with<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EncodeOptions,
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.check_sparse(opts)?;
        let encodings = self.encode_texts(texts, opts)?;
        self.embed_sparse_encoded_with(&encodings, opts, batch_size, progress)
    }

    /// Sparse vectors of what [`Embedder::encode_texts`] made of the texts
    /// for the same `opts` (pooled past the prompt when the folder says so).
    pub fn embed_sparse_encoded_with(
        &self,
        encodings: &[Encoded],
        opts: &EncodeOptions,
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.check_sparse(opts)?;
        let start = self.prompt(opts)?.map_or(0, |p| p.pool_start);
        self.embed_sparse_encoded_from(
            encodings,
            &vec![start; encodings.len()],
            batch_size,
            progress,
        )
    }

    /// Sparse vectors of texts already tokenized, text `i` pooled from its
    /// token `pool_start[i]` on (0: every token), in input order. Batches
    /// are length-sorted and capped as [`Embedder::embed_encoded_from`]'s,
    /// and only one batch's dense vectors are held at once.
    pub fn embed_sparse_encoded_from(
        &self,
        encodings: &[Encoded],
        pool_start: &[usize],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.check_sparse(&EncodeOptions::default())?;
        self.in_pooled_batches(
            encodings,
            pool_start,
            batch_size,
            progress,
            |encs, starts| self.run_sparse(encs, starts),
        )
    }

    /// Sparse vectors need pooling `splade`, and take no `dimensions`.
    fn check_sparse(&self, opts: &EncodeOptions) -> Result<()> {
        if self.splade.is_none() {
            return Err(Error::Input(format!(
                "sparse vectors need pooling `splade` (this embedder pools `{}`)",
                self.pooling.name()
            )));
        }
        if opts.dimensions.is_some() {
            return Err(Error::option(
                "dimensions",
                "applies to dense vectors: a SPLADE vector's entries are vocabulary ids, kept whole",
            ));
        }
        Ok(())
    }

    fn forward(&self, encs: &[&Encoded]) -> Result<(BertInput, crate::model::BertOutput)> {
        let ids: Vec<Vec<u32>> = encs.iter().map(|e| e.input_ids.clone()).collect();
        let types: Vec<Vec<u32>> = encs.iter().map(|e| e.token_type_ids.clone()).collect();
        let input =
            BertInput::from_ids(&ids, &types, self.tokenizer.pad_id(), self.model.device())?;
        let out = self.model.forward(&input, ForwardOptions::default())?;
        Ok((input, out))
    }

    /// One vector per token for each text (TEI's `/embed_all`), in input
    /// order; normalised per token when normalisation is on.
    pub fn embed_tokens<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenEmbeddings>> {
        let encodings = self.encode_texts(texts, &EncodeOptions::default())?;
        self.embed_tokens_encoded(&encodings, batch_size, progress)
    }

    /// As [`Embedder::embed_tokens`], on texts already tokenized.
    pub fn embed_tokens_encoded(
        &self,
        encodings: &[Encoded],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenEmbeddings>> {
        self.in_batches(encodings, batch_size, progress, |batch| {
            self.run_tokens(&batch.iter().map(|&i| &encodings[i]).collect::<Vec<_>>())
        })
    }

    fn run_tokens(&self, encs: &[&Encoded]) -> Result<Vec<TokenEmbeddings>> {
        if let Some(states) = self.packed_states(encs, None)? {
            return Ok(encs
                .iter()
                .enumerate()
                .map(|(s, e)| {
                    let mut vectors: Vec<Vec<f32>> = states
                        .sequence(s)
                        .chunks(states.hidden)
                        .map(<[f32]>::to_vec)
                        .collect();
                    if self.normalize {
                        vectors
                            .iter_mut()
                            .for_each(|v| pooling::normalize_in_place(v));
                    }
                    TokenEmbeddings {
                        tokens: e.tokens.clone(),
                        embeddings: vectors,
                    }
                })
                .collect());
        }
        let (_, res) = self.forward(encs)?;
        encs.iter()
            .enumerate()
            .map(|(row, e)| {
                let mut states: Tensor = res.last_hidden_state.get(row)?.narrow(0, 0, e.len())?;
                if self.normalize {
                    states = pooling::normalize(&states)?;
                }
                Ok(TokenEmbeddings {
                    tokens: e.tokens.clone(),
                    embeddings: states.to_vec2::<f32>()?,
                })
            })
            .collect()
    }
}

/// The encoder and MLM head of a checkpoint, for pooling `splade`; a
/// checkpoint without the head is an error naming the missing tensor.
fn load_mlm_head(
    weights: crate::io::weights::Weights,
    config: BertConfig,
    device: &Device,
) -> Result<BertForMaskedLM> {
    if let Some(missing) = HeadKind::MaskedLM.missing_tensor(&weights, &config) {
        let saved_as = if config.architectures.is_empty() {
            "config.json names no architecture".to_string()
        } else {
            format!("saved as {}", config.architectures.join(", "))
        };
        return Err(Error::Weights {
            path: weights.origin().to_path_buf(),
            reason: format!(
                "pooling `splade` reads the masked-LM head ({}), and this checkpoint has none: \
                 missing tensor `{missing}` ({saved_as}). Use a SPLADE or masked-LM checkpoint, \
                 or another pooling",
                HeadKind::MaskedLM.class_name(&config.family)
            ),
        });
    }
    BertForMaskedLM::from_weights(weights, config, HeadInit::FromCheckpoint, device)
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

fn check_max_length(max_length: usize, config: &BertConfig) -> Result<()> {
    if max_length > config.max_position_embeddings {
        return Err(Error::Input(format!(
            "max length {max_length} is longer than the model's max_position_embeddings ({})",
            config.max_position_embeddings
        )));
    }
    Ok(())
}

/// Indices of `encodings`, longest first, cut into batches of at most
/// `batch_size` texts and at most `max_tokens` tokens (a text longer than
/// the cap runs alone).
pub fn length_sorted_batches(
    encodings: &[Encoded],
    batch_size: usize,
    max_tokens: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..encodings.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(encodings[i].len()));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut tokens = 0;
    for i in order {
        let n = encodings[i].len();
        if !current.is_empty() && (current.len() >= batch_size.max(1) || tokens + n > max_tokens) {
            batches.push(std::mem::take(&mut current));
            tokens = 0;
        }
        current.push(i);
        tokens += n;
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Cosine similarity of every pair of rows.
pub fn cosine_similarity_matrix(vectors: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let norms: Vec<f64> = vectors
        .iter()
        .map(|v| {
            v.iter()
                .map(|x| f64::from(*x) * f64::from(*x))
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    vectors
        .iter()
        .enumerate()
        .map(|(i, a)| {
            vectors
                .iter()
                .enumerate()
                .map(|(j, b)| {
                    let dot: f64 = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| f64::from(*x) * f64::from(*y))
                        .sum();
                    (dot / (norms[i] * norms[j]).max(1e-12)) as f32
                })
                .collect()
        })
        .collect()
}

/// Floating-point operations of one encoder pass over texts of these
/// token counts (multiply-adds count 2): the projections and FFN per
/// token, and attention's two products per text, on real tokens only.
/// With `one_row` (the fast path's last layer at one row per text, for
/// `[CLS]` pooling and the pooler), that layer's Q/K/V count on every
/// token and the rest on one row per text.
pub fn encoder_flops(config: &BertConfig, lengths: &[usize], one_row: bool) -> f64 {
    let d = config.hidden_size as f64;
    let f = config.intermediate_size as f64;
    let layers = config.num_hidden_layers as f64;
    let per_token = 2.0 * (3.0 * d * d + d * d + 2.0 * d * f);
    let tokens: f64 = lengths.iter().map(|&n| n as f64).sum();
    let attention: f64 = lengths.iter().map(|&n| 4.0 * (n as f64).powi(2) * d).sum();
    if !one_row || config.num_hidden_layers == 0 {
        return layers * (per_token * tokens + attention);
    }
    let texts = lengths.len() as f64;
    let last = 2.0 * 3.0 * d * d * tokens
        + texts * 2.0 * (d * d + 2.0 * d * f)
        + lengths.iter().map(|&n| 4.0 * n as f64 * d).sum::<f64>();
    (layers - 1.0) * (per_token * tokens + attention) + last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_work_counts_the_last_layer_at_one_row_per_text() {
        let mut config = BertConfig::mini_bert_seed();
        config.num_hidden_layers = 2;
        let (d, f) = (config.hidden_size as f64, config.intermediate_size as f64);
        let lengths = [3, 5];
        let whole = encoder_flops(&config, &lengths, false);
        let layer = 2.0 * (4.0 * d * d + 2.0 * d * f) * 8.0 + 4.0 * (9.0 + 25.0) * d;
        assert_eq!(whole, 2.0 * layer);
        // Last layer: Q/K/V on all 8 tokens, the rest on 2 rows, each
        // row's attention over its text's keys.
        let last = 2.0 * 3.0 * d * d * 8.0 + 2.0 * 2.0 * (d * d + 2.0 * d * f) + 4.0 * 8.0 * d;
        assert_eq!(encoder_flops(&config, &lengths, true), layer + last);
    }
}
