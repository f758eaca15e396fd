//! `encoder.layer.N`: attention block then feed-forward block.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::attention::{BertAttention, LayerPass};
use crate::config::{Activation, BertConfig, NormPosition};
use crate::model::nn::{Dense, Dropout, LayerNorm};

/// `intermediate`: the FFN's expansion and non-linearity.
#[derive(Debug, Clone)]
pub struct BertIntermediate {
    pub(crate) dense: Dense,
    act: Activation,
}

impl BertIntermediate {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Self::load_at(vb.pp("dense"), cfg)
    }

    /// `dense` rooted at the expansion's linear layer, wherever the family
    /// keeps it.
    pub fn load_at(dense: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Ok(Self {
            dense: Dense::load(
                dense,
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg.initializer_range,
            )?,
            act: cfg.hidden_act,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.dense.forward_act(x, self.act)
    }
}

/// `output`: the FFN's projection back, dropout, residual, LayerNorm.
#[derive(Debug, Clone)]
pub struct BertOutputBlock {
    pub(crate) dense: Dense,
    pub(crate) layer_norm: LayerNorm,
    dropout: Dropout,
}

impl BertOutputBlock {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Self::load_at(vb.pp("dense"), vb.pp("LayerNorm"), cfg)
    }

    /// The projection and the LayerNorm wherever the family keeps them.
    pub fn load_at(dense: VarBuilder, layer_norm: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Ok(Self {
            dense: Dense::load(
                dense,
                cfg.intermediate_size,
                cfg.hidden_size,
                cfg.initializer_range,
            )?,
            layer_norm: LayerNorm::load(layer_norm, cfg.hidden_size, cfg.layer_norm_eps)?,
            dropout: Dropout::new(cfg.hidden_dropout_prob),
        })
    }
}

#[derive(Debug, Clone)]
pub struct BertLayer {
    pub(crate) attention: BertAttention,
    pub(crate) intermediate: BertIntermediate,
    pub(crate) output: BertOutputBlock,
    norm_position: NormPosition,
}

impl BertLayer {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Ok(Self {
            attention: BertAttention::load(vb.pp("attention"), cfg)?,
            intermediate: BertIntermediate::load(vb.pp("intermediate"), cfg)?,
            output: BertOutputBlock::load(vb.pp("output"), cfg)?,
            norm_position: cfg.norm_position,
        })
    }

    /// A post-LN layer from blocks a family loaded under its own names.
    pub fn post_ln(
        attention: BertAttention,
        intermediate: BertIntermediate,
        output: BertOutputBlock,
    ) -> Self {
        Self {
            attention,
            intermediate,
            output,
            norm_position: NormPosition::Post,
        }
    }

    /// Returns the layer's output and its attention probabilities.
    pub fn forward(&self, x: &Tensor, pass: LayerPass) -> Result<(Tensor, Tensor)> {
        let train = pass.train;
        let (h, probs) = self.attention.forward(x, pass)?;
        let out = &self.output;
        let y = match self.norm_position {
            NormPosition::Post => {
                let f = out.dense.forward(&self.intermediate.forward(&h)?)?;
                out.layer_norm
                    .forward(&(out.dropout.forward(&f, train)? + &h)?)?
            }
            NormPosition::Pre => {
                let f = out
                    .dense
                    .forward(&self.intermediate.forward(&out.layer_norm.forward(&h)?)?)?;
                (out.dropout.forward(&f, train)? + &h)?
            }
        };
        Ok((y, probs))
    }
}
