//! `attention`: bidirectional multi-head self-attention with the padding
//! mask, and its output projection with the residual connection.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::deberta_v2::{Disentangled, RelativeContext};
use super::nn::{Dense, Dropout, LayerNorm};
use super::ops;
use crate::config::{BertConfig, NormPosition};

/// `attention.self`: Q, K, V projections and scaled dot-product attention.
#[derive(Debug, Clone)]
pub struct BertSelfAttention {
    pub(crate) query: Dense,
    pub(crate) key: Dense,
    pub(crate) value: Dense,
    pub(crate) num_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) dropout: Dropout,
    /// DeBERTa's relative-position terms.
    pub(crate) disentangled: Option<Disentangled>,
}

impl BertSelfAttention {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        let d = cfg.hidden_size;
        let std = cfg.initializer_range;
        Ok(Self {
            query: Dense::load(vb.pp("query"), d, d, std)?,
            key: Dense::load(vb.pp("key"), d, d, std)?,
            value: Dense::load(vb.pp("value"), d, d, std)?,
            num_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim(),
            dropout: Dropout::new(cfg.attention_probs_dropout_prob),
            disentangled: None,
        })
    }

    /// `x` [B, T, D]; `mask` is additive [B, 1, 1, T] (0 to attend, a large
    /// negative number at padding). Returns the context [B, T, D] and the
    /// attention probabilities [B, H, T, T].
    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        self.forward_rel(x, mask, None, train)
    }

    /// As [`forward`](Self::forward), with DeBERTa's relative positions.
    pub fn forward_rel(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rel: Option<&RelativeContext>,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let (b, t, d) = x.dims3()?;
        let split = |y: Tensor| -> Result<Tensor> {
            y.reshape((b, t, self.num_heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.query.forward(x)?)?;
        let k = split(self.key.forward(x)?)?;
        let v = split(self.value.forward(x)?)?;
        let scale_factor = self.disentangled.as_ref().map_or(1, |dis| dis.scale_factor);
        let scale = 1.0 / ((self.head_dim * scale_factor) as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?;
        if let (Some(dis), Some(rel)) = (&self.disentangled, rel) {
            if let Some(bias) = dis.bias(self, &q, &k, rel, train)? {
                scores = (scores + bias)?;
            }
        }
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        // The softmax with a backward pass (these modules train; inference
        // goes through the packed path): fused on the CPU.
        let probs = ops::softmax_last_dim(&scores)?;
        let dropped = self.dropout.forward(&probs, train)?;
        let context = dropped.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
        Ok((context, probs))
    }
}

/// `attention`: self-attention, `output.dense`, dropout, residual and
/// `output.LayerNorm` (after the residual in post-LN, before the
/// self-attention in pre-LN).
#[derive(Debug, Clone)]
pub struct BertAttention {
    pub(crate) self_attention: BertSelfAttention,
    pub(crate) dense: Dense,
    pub(crate) layer_norm: LayerNorm,
    pub(crate) dropout: Dropout,
    pub(crate) norm_position: NormPosition,
}

impl BertAttention {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        let d = cfg.hidden_size;
        Ok(Self {
            self_attention: BertSelfAttention::load(vb.pp("self"), cfg)?,
            dense: Dense::load(vb.pp("output.dense"), d, d, cfg.initializer_range)?,
            layer_norm: LayerNorm::load(vb.pp("output.LayerNorm"), d, cfg.layer_norm_eps)?,
            dropout: Dropout::new(cfg.hidden_dropout_prob),
            norm_position: cfg.norm_position,
        })
    }

    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        self.forward_rel(x, mask, None, train)
    }

    pub fn forward_rel(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rel: Option<&RelativeContext>,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        match self.norm_position {
            NormPosition::Post => {
                let (ctx, probs) = self.self_attention.forward_rel(x, mask, rel, train)?;
                let h = self.dropout.forward(&self.dense.forward(&ctx)?, train)?;
                Ok((self.layer_norm.forward(&(h + x)?)?, probs))
            }
            NormPosition::Pre => {
                let normed = self.layer_norm.forward(x)?;
                let (ctx, probs) = self.self_attention.forward_rel(&normed, mask, rel, train)?;
                let h = self.dropout.forward(&self.dense.forward(&ctx)?, train)?;
                Ok(((h + x)?, probs))
            }
        }
    }
}
