//! `attention`: bidirectional multi-head self-attention with the padding
//! mask, and its output projection with the residual connection.
//!
//! A family that adds its own attention scores (relative positions, say)
//! plugs in a [`ScoreBias`]; this file knows none of them.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::config::{BertConfig, NormPosition};
use crate::model::nn::{Dense, Dropout, LayerNorm};
use crate::model::ops;

/// What every layer of one forward pass shares.
#[derive(Clone, Copy, Default)]
pub struct LayerPass<'a> {
    /// Additive `[B, 1, 1, T]`: 0 to attend, a large negative number at
    /// padding.
    pub mask: Option<&'a Tensor>,
    /// What the encoder's [`PassContext`](super::PassContext) made for
    /// this pass, for the family's [`ScoreBias`].
    pub context: Option<&'a dyn Any>,
    /// Whether dropout is on.
    pub train: bool,
}

/// Scores a family adds to one layer's content scores `Q·Kᵀ`.
pub trait ScoreBias: Debug + Send + Sync {
    /// The content scores are divided by sqrt(head_dim · scale_factor).
    fn scale_factor(&self) -> usize;

    /// Scores `[B, H, T, T]` to add to the layer's scaled content scores.
    fn bias(&self, scores: &ScoreInput) -> Result<Option<Tensor>>;
}

/// What a [`ScoreBias`] reads.
pub struct ScoreInput<'a> {
    /// The layer's self-attention (its projections).
    pub attn: &'a BertSelfAttention,
    /// The layer's queries and keys `[B, H, T, hd]`.
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    /// What the encoder's [`PassContext`](super::PassContext) made for
    /// this pass.
    pub context: &'a dyn Any,
    pub train: bool,
}

/// `attention.self`: Q, K, V projections and scaled dot-product attention.
#[derive(Debug, Clone)]
pub struct BertSelfAttention {
    pub(crate) query: Dense,
    pub(crate) key: Dense,
    pub(crate) value: Dense,
    num_heads: usize,
    head_dim: usize,
    dropout: Dropout,
    /// A family's extra scores (relative positions, say).
    pub(crate) score_bias: Option<Arc<dyn ScoreBias>>,
}

impl BertSelfAttention {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Self::load_named(vb, cfg, ["query", "key", "value"])
    }

    /// As [`load`](Self::load), with the projections under other names
    /// (`[query, key, value]`).
    pub fn load_named(vb: VarBuilder, cfg: &BertConfig, names: [&str; 3]) -> Result<Self> {
        let d = cfg.hidden_size;
        let std = cfg.initializer_range;
        let [q, k, v] = names;
        Ok(Self {
            query: Dense::load(vb.pp(q), d, d, std)?,
            key: Dense::load(vb.pp(k), d, d, std)?,
            value: Dense::load(vb.pp(v), d, d, std)?,
            num_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim(),
            dropout: Dropout::new(cfg.attention_probs_dropout_prob),
            score_bias: None,
        })
    }

    /// `x` `[B, T, D]`. Returns the context `[B, T, D]` and the attention
    /// probabilities `[B, H, T, T]`.
    pub fn forward(&self, x: &Tensor, pass: LayerPass) -> Result<(Tensor, Tensor)> {
        let (b, t, d) = x.dims3()?;
        let split = |y: Tensor| -> Result<Tensor> {
            y.reshape((b, t, self.num_heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.query.forward(x)?)?;
        let k = split(self.key.forward(x)?)?;
        let v = split(self.value.forward(x)?)?;
        let scale_factor = self.score_bias.as_ref().map_or(1, |s| s.scale_factor());
        let scale = 1.0 / ((self.head_dim * scale_factor) as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?;
        if let (Some(extra), Some(context)) = (&self.score_bias, pass.context) {
            let input = ScoreInput {
                attn: self,
                q: &q,
                k: &k,
                context,
                train: pass.train,
            };
            if let Some(bias) = extra.bias(&input)? {
                scores = (scores + bias)?;
            }
        }
        if let Some(mask) = pass.mask {
            scores = scores.broadcast_add(mask)?;
        }
        // The softmax with a backward pass (these modules train; inference
        // goes through the packed path): fused on the CPU.
        let probs = ops::softmax_last_dim(&scores)?;
        let dropped = self.dropout.forward(&probs, pass.train)?;
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
    dropout: Dropout,
    norm_position: NormPosition,
}

impl BertAttention {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Self::from_parts(
            BertSelfAttention::load(vb.pp("self"), cfg)?,
            vb.pp("output.dense"),
            vb.pp("output.LayerNorm"),
            cfg,
            (cfg.hidden_dropout_prob, cfg.norm_position),
        )
    }

    /// The block around `self_attention`, its output projection and
    /// LayerNorm loaded from wherever the family keeps them, with the
    /// output dropout and the LayerNorm's place.
    pub fn from_parts(
        self_attention: BertSelfAttention,
        dense: VarBuilder,
        layer_norm: VarBuilder,
        cfg: &BertConfig,
        (dropout, norm_position): (f64, NormPosition),
    ) -> Result<Self> {
        let d = cfg.hidden_size;
        Ok(Self {
            self_attention,
            dense: Dense::load(dense, d, d, cfg.initializer_range)?,
            layer_norm: LayerNorm::load(layer_norm, d, cfg.layer_norm_eps)?,
            dropout: Dropout::new(dropout),
            norm_position,
        })
    }

    /// The dropout on the output projection, before the residual (none in
    /// DistilBERT).
    pub(crate) fn output_dropout(&self) -> Dropout {
        self.dropout
    }

    /// Returns the block's output and the attention probabilities.
    pub fn forward(&self, x: &Tensor, pass: LayerPass) -> Result<(Tensor, Tensor)> {
        let train = pass.train;
        match self.norm_position {
            NormPosition::Post => {
                let (ctx, probs) = self.self_attention.forward(x, pass)?;
                let h = self.dropout.forward(&self.dense.forward(&ctx)?, train)?;
                Ok((self.layer_norm.forward(&(h + x)?)?, probs))
            }
            NormPosition::Pre => {
                let normed = self.layer_norm.forward(x)?;
                let (ctx, probs) = self.self_attention.forward(&normed, pass)?;
                let h = self.dropout.forward(&self.dense.forward(&ctx)?, train)?;
                Ok(((h + x)?, probs))
            }
        }
    }
}
