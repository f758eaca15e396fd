//! Sentence and token embeddings, like sentence-transformers' `encode`
//! and TEI's `/embed` and `/embed_all`, with their prompts and Matryoshka
//! `dimensions`; and SPLADE's sparse vectors (pooling `splade`), like
//! sentence-transformers' SparseEncoder and TEI's `/embed_sparse`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::fast::{PackedBert, PackedStates, Precision};
use crate::io::quantized::PackedCheckpoint;
use crate::io::st_folder::known_names;
use crate::io::tokenizer::{Encoded, Tokenizer};
use crate::model::{BertInput, BertModel, ForwardOptions};
use crate::pooling::{self, Pooling};
use crate::splade::SpladeHead;
use crate::tasks::side_by_side;

mod batches;
mod load;
mod sparse;
mod tokens;

pub use batches::{encoder_flops, length_sorted_batches};
pub use load::read_calibration;
pub use tokens::TokenEmbeddings;

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
    /// path (on the CPU, every family but DeBERTa-v2); other models and
    /// devices refuse it.
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
    fn in_pooled_batches<T: Send>(
        &self,
        encodings: &[Encoded],
        pool_start: &[usize],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
        run: impl Fn(&[&Encoded], &[usize]) -> Result<Vec<T>> + Sync,
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
    /// On the packed path, called from outside the thread pool, batches
    /// run side by side ([`side_by_side::run_batches`]): the same rows, sooner.
    fn in_batches<T: Send>(
        &self,
        encodings: &[Encoded],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
        run: impl Fn(&[usize]) -> Result<Vec<T>> + Sync,
    ) -> Result<Vec<T>> {
        let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None)
            .take(encodings.len())
            .collect();
        let mut done = 0;
        let tokens: usize = encodings.iter().map(Encoded::len).sum();
        let (concurrent, batch_size) =
            side_by_side::plan(self.packed.is_some(), batch_size, encodings.len(), tokens);
        let batches = length_sorted_batches(encodings, batch_size, self.max_batch_tokens);
        side_by_side::run_batches(&batches, concurrent, run, |batch, rows| {
            for (row, i) in rows.into_iter().zip(batch) {
                out[*i] = Some(row);
            }
            done += batch.len();
            progress(done);
        })?;
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

    fn forward(&self, encs: &[&Encoded]) -> Result<(BertInput, crate::model::BertOutput)> {
        let ids: Vec<Vec<u32>> = encs.iter().map(|e| e.input_ids.clone()).collect();
        let types: Vec<Vec<u32>> = encs.iter().map(|e| e.token_type_ids.clone()).collect();
        let input =
            BertInput::from_ids(&ids, &types, self.tokenizer.pad_id(), self.model.device())?;
        let out = self.model.forward(&input, ForwardOptions::default())?;
        Ok((input, out))
    }
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
