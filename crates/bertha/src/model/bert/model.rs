//! `BertModel`: embeddings → encoder → (pooler), as transformers' class of
//! the same name.

use std::path::Path;

use candle_core::{DType, Device, Result as CResult, Tensor};

use super::embeddings::BertEmbeddings;
use super::encoder::BertEncoder;
use super::pooler::BertPooler;
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::{strip_backtrace, SeededInit, Weights};

/// A batch of token ids, each [batch, seq] u32.
#[derive(Debug, Clone)]
pub struct BertInput {
    pub input_ids: Tensor,
    pub token_type_ids: Option<Tensor>,
    /// 1 for real tokens, 0 for padding; `None` means no padding.
    pub attention_mask: Option<Tensor>,
}

impl BertInput {
    /// Builds tensors from per-sequence ids, right-padding to the longest
    /// sequence with `pad_id` and masking the padding.
    pub fn from_ids(
        ids: &[Vec<u32>],
        type_ids: &[Vec<u32>],
        pad_id: u32,
        device: &Device,
    ) -> CResult<Self> {
        Self::padded_to(ids, type_ids, pad_id, 0, device)
    }

    /// As [`BertInput::from_ids`], padded to at least `len` tokens (e.g.
    /// the length of a whole batch this one is a slice of).
    pub fn padded_to(
        ids: &[Vec<u32>],
        type_ids: &[Vec<u32>],
        pad_id: u32,
        len: usize,
        device: &Device,
    ) -> CResult<Self> {
        let b = ids.len();
        let t = ids.iter().map(Vec::len).max().unwrap_or(0).max(len);
        let mut flat_ids = vec![pad_id; b * t];
        let mut flat_types = vec![0u32; b * t];
        let mut flat_mask = vec![0u32; b * t];
        for (i, seq) in ids.iter().enumerate() {
            flat_ids[i * t..i * t + seq.len()].copy_from_slice(seq);
            for j in 0..seq.len() {
                flat_mask[i * t + j] = 1;
            }
            if let Some(types) = type_ids.get(i) {
                let n = types.len().min(seq.len());
                flat_types[i * t..i * t + n].copy_from_slice(&types[..n]);
            }
        }
        Ok(Self {
            input_ids: Tensor::from_vec(flat_ids, (b, t), device)?,
            token_type_ids: Some(Tensor::from_vec(flat_types, (b, t), device)?),
            attention_mask: Some(Tensor::from_vec(flat_mask, (b, t), device)?),
        })
    }
}

/// What to compute besides the last hidden state.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardOptions {
    pub output_hidden_states: bool,
    pub output_attentions: bool,
    /// Dropout on (training) or off (inference).
    pub train: bool,
}

/// The outputs of transformers' `BertModel`, by the same names.
#[derive(Debug, Clone)]
pub struct BertOutput {
    /// [B, T, D]
    pub last_hidden_state: Tensor,
    /// [B, D]; `None` for models without a pooler.
    pub pooler_output: Option<Tensor>,
    /// L + 1 tensors [B, T, D]: the embeddings, then each layer's output.
    pub hidden_states: Option<Vec<Tensor>>,
    /// L tensors [B, H, T, T].
    pub attentions: Option<Vec<Tensor>>,
}

/// transformers' `BertModel`. Its `load` is in `model::family`, which
/// picks the family's embeddings and encoder.
#[derive(Debug, Clone)]
pub struct BertModel {
    pub(crate) embeddings: BertEmbeddings,
    pub(crate) encoder: BertEncoder,
    pub(crate) pooler: Option<BertPooler>,
    pub(crate) config: BertConfig,
    pub(crate) device: Device,
}

impl BertModel {
    /// Loads `config.json` and the weights of a Hugging Face model folder.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        let (config, weights) = read_model_dir(dir)?;
        Self::from_weights(weights, config, device)
    }

    /// Builds the model from named tensors, with or without the `bert.`
    /// prefix of head checkpoints.
    pub fn from_weights(weights: Weights, config: BertConfig, device: &Device) -> Result<Self> {
        let origin = weights.origin().to_path_buf();
        let prefix = weights.base_prefix(config.family.prefix()).ok_or_else(|| Error::Weights {
            path: origin.clone(),
            reason: format!(
                "missing tensor `embeddings.word_embeddings.weight` (also looked for `{}.embeddings.word_embeddings.weight`)",
                config.family.prefix()
            ),
        })?;
        let dense = crate::model::family::layout(&config.family).pooler_dense();
        let has_pooler = weights.contains(&format!("{prefix}{dense}.weight"));
        if config.add_pooling_layer && !has_pooler {
            tracing::debug!(
                "{} has no pooler weights; pooler_output is unavailable",
                origin.display()
            );
        }
        let vb = weights.var_builder(DType::F32, device);
        let vb = if prefix.is_empty() {
            vb
        } else {
            vb.pp(prefix.trim_end_matches('.'))
        };
        Self::load(vb, config, has_pooler).map_err(|e| Error::Weights {
            path: origin,
            reason: strip_backtrace(&e),
        })
    }

    /// A randomly initialised model (normal(0, initializer_range) weights,
    /// zero biases, unit LayerNorm), the same for the same seed.
    pub fn random(config: BertConfig, seed: u64, device: &Device) -> Result<Self> {
        let vb = SeededInit::new(seed).var_builder(DType::F32, device);
        let pooler = config.add_pooling_layer;
        Ok(Self::load(vb, config, pooler)?)
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `pooler_output` of a last hidden state [B, T, D] and its attention
    /// mask [B, T]: the pooler's, or the family's own sentence vector
    /// (ModernBERT's cls or mean); `None` when the model has neither.
    pub fn pooled(
        &self,
        last: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> CResult<Option<Tensor>> {
        match &self.pooler {
            Some(p) => Ok(Some(p.forward(last)?)),
            None => self.encoder.pool(last, attention_mask),
        }
    }

    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    pub fn embeddings(&self) -> &BertEmbeddings {
        &self.embeddings
    }

    pub fn forward(&self, input: &BertInput, opts: ForwardOptions) -> Result<BertOutput> {
        let (_, t) = input.input_ids.dims2()?;
        if t > self.config.max_sequence_length() {
            return Err(Error::Input(format!(
                "input of {t} tokens is longer than the model's limit of {} (max_position_embeddings {}); truncate it",
                self.config.max_sequence_length(),
                self.config.max_position_embeddings
            )));
        }
        Ok(self.forward_tensors(input, opts)?)
    }

    fn forward_tensors(&self, input: &BertInput, opts: ForwardOptions) -> CResult<BertOutput> {
        let x = self.embeddings.forward_masked(
            &input.input_ids,
            input.token_type_ids.as_ref(),
            input.attention_mask.as_ref(),
            opts.train,
        )?;
        let mask = match &input.attention_mask {
            Some(m) => Some(additive_mask(m)?),
            None => None,
        };
        let enc = self.encoder.forward(
            &x,
            mask.as_ref(),
            opts.output_hidden_states,
            opts.output_attentions,
            opts.train,
        )?;
        let pooler_output = self.pooled(&enc.last_hidden_state, input.attention_mask.as_ref())?;
        Ok(BertOutput {
            last_hidden_state: enc.last_hidden_state,
            pooler_output,
            hidden_states: enc.hidden_states,
            attentions: enc.attentions,
        })
    }
}

/// The `config.json` and weights of a model folder, with an error naming
/// the folder when either is missing.
pub(crate) fn read_model_dir(dir: &Path) -> Result<(BertConfig, Weights)> {
    crate::io::ModelDir::open(dir)?.config_and_weights()
}

/// [B, T] of 1/0 → [B, 1, 1, T] of 0 / f32::MIN, as transformers'
/// eager attention does.
fn additive_mask(mask: &Tensor) -> CResult<Tensor> {
    let (b, t) = mask.dims2()?;
    let m = mask.to_dtype(DType::F32)?;
    let inverted = (m.ones_like()? - m)?;
    (inverted * f64::from(f32::MIN))?.reshape((b, 1, 1, t))
}
