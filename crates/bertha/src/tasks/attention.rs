//! Attention maps: what each head of each layer attends to, for one text,
//! from any family member's encoder (the attention probabilities that
//! transformers returns with `output_attentions=True`).

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::io::tokenizer::{default_max_length, Tokenizer};
use crate::io::ModelDir;
use crate::model::{BertInput, BertModel, ForwardOptions};

/// The attention probabilities of one text.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttentionMaps {
    /// The tokens, special tokens included (the rows and columns).
    pub tokens: Vec<String>,
    /// `[layer][head][query][key]`; each query row sums to 1.
    pub attentions: Vec<Vec<Vec<Vec<f32>>>>,
}

impl AttentionMaps {
    pub fn num_layers(&self) -> usize {
        self.attentions.len()
    }

    pub fn num_heads(&self) -> usize {
        self.attentions.first().map_or(0, Vec::len)
    }

    /// One head's `[query][key]` matrix; out-of-range indices are errors
    /// naming the valid range.
    pub fn head(&self, layer: usize, head: usize) -> Result<&Vec<Vec<f32>>> {
        let l = self.attentions.get(layer).ok_or_else(|| {
            Error::Input(format!(
                "layer {layer} does not exist: the model has layers 0..{}",
                self.num_layers()
            ))
        })?;
        l.get(head).ok_or_else(|| {
            Error::Input(format!(
                "head {head} does not exist: the model has heads 0..{}",
                l.len()
            ))
        })
    }

    /// The first token's (`[CLS]` / `<s>`) attention row averaged over the
    /// heads, for every layer: `[layer][key]`.
    pub fn cls_across_layers(&self) -> Vec<Vec<f32>> {
        self.attentions
            .iter()
            .map(|heads| {
                let n = heads.len().max(1) as f32;
                let t = heads.first().and_then(|h| h.first()).map_or(0, Vec::len);
                (0..t)
                    .map(|k| heads.iter().map(|h| h[0][k]).sum::<f32>() / n)
                    .collect()
            })
            .collect()
    }
}

/// An encoder with its tokenizer, returning attention maps.
pub struct AttentionModel {
    model: BertModel,
    tokenizer: Tokenizer,
}

impl AttentionModel {
    /// Loads the encoder of a model folder (any head's checkpoint, or a
    /// bare encoder) and its tokenizer.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        let model = BertModel::from_dir(dir, device)?;
        let max_length = default_max_length(dir, model.config())?;
        let tokenizer = ModelDir::open(dir)?.model_tokenizer(model.config(), max_length)?;
        Ok(Self { model, tokenizer })
    }

    pub fn new(model: BertModel, tokenizer: Tokenizer) -> Self {
        Self { model, tokenizer }
    }

    pub fn model(&self) -> &BertModel {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The maps of one text (truncated to the model's window).
    pub fn attend(&self, text: &str) -> Result<AttentionMaps> {
        if text.trim().is_empty() {
            return Err(Error::Input("the text is empty".into()));
        }
        let enc = self.tokenizer.encode(text)?;
        if enc.truncated {
            tracing::warn!(
                "the text was truncated to {} tokens",
                self.tokenizer.max_length()
            );
        }
        self.attend_ids(&enc.input_ids, Some(&enc.token_type_ids), enc.tokens)
    }

    /// The maps of one sequence of token ids; `tokens` label them.
    pub fn attend_ids(
        &self,
        ids: &[u32],
        type_ids: Option<&[u32]>,
        tokens: Vec<String>,
    ) -> Result<AttentionMaps> {
        if ids.is_empty() {
            return Err(Error::Input("no tokens to attend over".into()));
        }
        if tokens.len() != ids.len() {
            return Err(Error::Input(format!(
                "{} token labels for {} ids",
                tokens.len(),
                ids.len()
            )));
        }
        let vocab = self.model.config().vocab_size;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(Error::Input(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        let dev = self.model.device();
        let n = ids.len();
        let input = BertInput {
            input_ids: Tensor::from_vec(ids.to_vec(), (1, n), dev)?,
            token_type_ids: match type_ids {
                Some(t) if t.len() == n => Some(Tensor::from_vec(t.to_vec(), (1, n), dev)?),
                _ => None,
            },
            attention_mask: None,
        };
        let out = self.model.forward(
            &input,
            ForwardOptions {
                output_attentions: true,
                ..ForwardOptions::default()
            },
        )?;
        let attentions = out
            .attentions
            .unwrap_or_default()
            .iter()
            .map(|a| Ok(a.get(0)?.to_vec3::<f32>()?))
            .collect::<Result<Vec<_>>>()?;
        Ok(AttentionMaps { tokens, attentions })
    }
}
