//! The masked-LM prediction head every family shares, under each family's
//! tensor names.

use candle_core::{DType, Module, Result as CResult, Tensor};
use candle_nn::{Init, VarBuilder};

use super::loss::{cross_entropy_with_ignore, label_values, IGNORE_INDEX};
use crate::config::{Activation, BertConfig};
use crate::error::{Error, Result};
use crate::model::family::{layout, MlmNames};
use crate::model::nn::{activate, Dense, LayerNorm};

/// `cls.predictions`: dense → activation → LayerNorm → decoder (tied to
/// the word embeddings unless the checkpoint has its own) + bias.
#[derive(Debug, Clone)]
pub struct BertLMPredictionHead {
    pub(crate) dense: Dense,
    pub(crate) act: Activation,
    pub(crate) layer_norm: LayerNorm,
    pub(crate) decoder: Dense,
}

impl BertLMPredictionHead {
    /// `vb` is rooted at `cls.predictions`; `word_embeddings` [V, D] is the
    /// encoder's matrix, used when the decoder is tied.
    pub fn load(vb: VarBuilder, config: &BertConfig, word_embeddings: &Tensor) -> CResult<Self> {
        let names = MlmNames::bert(config);
        Self::load_named(vb, &names, config, word_embeddings)
    }

    /// The family's MLM head (`cls.predictions`, `lm_head`, `vocab_*`,
    /// `predictions`), `root` at the checkpoint root.
    pub fn load_for(
        root: VarBuilder,
        config: &BertConfig,
        word_embeddings: &Tensor,
    ) -> CResult<Self> {
        let names = layout(&config.family).mlm_names(config);
        let vb = match names.root.trim_end_matches('.') {
            "" => root,
            r => root.pp(r),
        };
        Self::load_named(vb, &names, config, word_embeddings)
    }

    fn load_named(
        vb: VarBuilder,
        names: &MlmNames,
        config: &BertConfig,
        word_embeddings: &Tensor,
    ) -> CResult<Self> {
        let (d, v, e) = (config.hidden_size, config.vocab_size, names.width);
        let std = config.initializer_range;
        let biases = names.biases;
        let dense = Dense::load_with_bias(vb.pp(names.dense), (d, e), std, biases.dense)?;
        let layer_norm = LayerNorm::load_with_bias(vb.pp(names.norm), e, names.eps, biases.norm)?;
        let decoder_weight = format!("{}.weight", names.decoder);
        let weight = if vb.contains_tensor(&decoder_weight) || !config.tie_word_embeddings {
            vb.pp(names.decoder).get_with_hints(
                (v, e),
                "weight",
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            )?
        } else {
            word_embeddings.clone()
        };
        // The bias is `{root}bias` (tied to `decoder.bias`); some old
        // checkpoints carry only the latter.
        let decoder_bias = format!("{}.bias", names.decoder);
        let bias = if !biases.decoder {
            None
        } else if !vb.contains_tensor(names.bias) && vb.contains_tensor(&decoder_bias) {
            Some(vb.get_with_hints(v, &decoder_bias, Init::Const(0.0))?)
        } else {
            Some(vb.get_with_hints(v, names.bias, Init::Const(0.0))?)
        };
        Ok(Self {
            dense,
            act: names.act,
            layer_norm,
            decoder: Dense::new(weight, bias),
        })
    }

    /// [B, T, D] → [B, T, V]
    pub fn forward(&self, hidden: &Tensor) -> CResult<Tensor> {
        let x = activate(&self.dense.forward(hidden)?, self.act)?;
        let x = self.layer_norm.forward(&x)?;
        self.decoder.forward(&x)
    }

    /// The decoder matrix [V, D] (the word embeddings when tied).
    pub fn decoder_weight(&self) -> &Tensor {
        self.decoder.weight()
    }

    /// Logits [N, V] of the N labelled positions of `hidden` [B, T, D]
    /// (row-major: batch, then position) and their mean cross-entropy
    /// against `labels` [B, T] (-100 elsewhere): the loss of the full
    /// logits at a fraction of the decoder's cost. With no labelled
    /// position the logits are [0, V] and there is no loss.
    pub(super) fn labelled_rows(
        &self,
        hidden: &Tensor,
        labels: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let labels =
            labels.ok_or_else(|| Error::Input("labelled_rows_only needs the MLM labels".into()))?;
        let (b, t, d) = hidden.dims3()?;
        if labels.elem_count() != b * t {
            return Err(Error::Input(format!(
                "labels: expected [{b}, {t}] labels, got a tensor of shape {:?}",
                labels.dims()
            )));
        }
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (i, y) in label_values(labels, "labels")?.into_iter().enumerate() {
            if y != IGNORE_INDEX {
                rows.push(i as u32);
                targets.push(y);
            }
        }
        if rows.is_empty() {
            let v = self.decoder.weight().dim(0)?;
            return Ok((Tensor::zeros((0, v), DType::F32, hidden.device())?, None));
        }
        let n = rows.len();
        let idx = Tensor::from_vec(rows, n, hidden.device())?;
        let picked = hidden.reshape((b * t, d))?.index_select(&idx, 0)?;
        let logits = self.forward(&picked)?;
        let loss = cross_entropy_with_ignore(&logits, &targets, IGNORE_INDEX, "labels")?;
        Ok((logits, Some(loss)))
    }
}
