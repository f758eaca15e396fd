//! Building the training encoder from a model: what the fast path
//! covers (BERT and the families that share its layers, and ModernBERT),
//! and the parameters it reads in place.

use super::super::attention::Heads;
use super::super::products::Compute;
use super::super::Param;
use super::layer::{Layer, QkvParams};
use super::{Encoder, Linear, Norm};
use crate::config::{AttentionKind, Family, ModernBertOptions, NormPosition};
use crate::error::Result;
use crate::fast::bert_layout::bert_layout;
use crate::model::family::modernbert::layers::ModernBertEncoder;
use crate::model::{BertModel, Dropout};

impl<'a> Encoder<'a> {
    /// The encoder of `model`, when the fast path covers it: BERT itself
    /// (absolute positions, no family extras), RoBERTa's (BERT's, with
    /// positions counted from the padding id and no token types),
    /// DistilBERT's (BERT's under its own names, without token types and
    /// without dropout on the attention's output), ELECTRA's (BERT's, with
    /// its embeddings projected when narrower) or ALBERT's (embeddings
    /// projected, layers shared across steps) or ModernBERT's
    /// ([`Encoder::of_modernbert`]), on the CPU, with biases (but
    /// ModernBERT's) and dropout rates below 1.
    pub fn of(model: &'a BertModel) -> Result<Option<Self>> {
        let cfg = model.config();
        if let Family::ModernBert(o) = &cfg.family {
            return Self::of_modernbert(model, o);
        }
        let Some(layout) = bert_layout(model).filter(|_| model.device().is_cpu()) else {
            return Ok(None);
        };
        let projection = match layout.projection.map(Linear::of).transpose()? {
            Some(None) => return Ok(None),
            p => p.flatten(),
        };
        let emb = &model.embeddings;
        if cfg.hidden_dropout_prob >= 1.0 || cfg.attention_probs_dropout_prob >= 1.0 {
            return Ok(None);
        }
        let attn_out_dropout = match model.encoder.layers.first() {
            Some(l) => l.attention.output_dropout(),
            None => Dropout::new(cfg.hidden_dropout_prob),
        };
        let same_rate = |l: &crate::model::BertLayer| {
            l.attention.output_dropout().rate() == attn_out_dropout.rate()
        };
        if attn_out_dropout.rate() >= 1.0 || !model.encoder.layers.iter().all(same_rate) {
            return Ok(None);
        }
        let mut layers = Vec::with_capacity(model.encoder.layers.len());
        for l in &model.encoder.layers {
            let sa = &l.attention.self_attention;
            let (Some(q), Some(k), Some(v), Some(attn_out), Some(ffn_in), Some(ffn_out)) = (
                Linear::of(&sa.query)?,
                Linear::of(&sa.key)?,
                Linear::of(&sa.value)?,
                Linear::of(&l.attention.dense)?,
                Linear::of(&l.intermediate.dense)?,
                Linear::of(&l.output.dense)?,
            ) else {
                return Ok(None);
            };
            layers.push(Layer {
                qkv: QkvParams::new(vec![q, k, v]),
                attn_out,
                attn_norm: Some(Norm::of(&l.attention.layer_norm)?),
                ffn_in,
                ffn_out,
                ffn_norm: Norm::of(&l.output.layer_norm)?,
                glu: false,
                rotary: None,
                window: None,
            });
        }
        Ok(Some(Self {
            hidden: cfg.hidden_size,
            embed_width: cfg.embedding_size(),
            heads: Heads {
                count: cfg.num_attention_heads,
                dim: cfg.head_dim(),
            },
            act: cfg.hidden_act.into(),
            norm_position: cfg.norm_position,
            max_positions: cfg.max_position_embeddings,
            pad_id: emb.padding_idx,
            positions_from: layout.positions_from,
            ignore_types: emb.ignore_token_types,
            word: Param::of(emb.word_embeddings.embeddings())?,
            position: Some(Param::of(layout.position.embeddings())?),
            token_type: emb
                .token_type_embeddings
                .as_ref()
                .map(|t| Param::of(t.embeddings()))
                .transpose()?,
            embed_norm: emb.layer_norm.as_ref().map(Norm::of).transpose()?,
            projection,
            layers,
            order: layout.order,
            final_norm: model
                .encoder
                .final_layer_norm
                .as_ref()
                .map(Norm::of)
                .transpose()?,
            thetas: Vec::new(),
            embed_dropout: emb.dropout,
            hidden_dropout: Dropout::new(cfg.hidden_dropout_prob),
            attention_dropout: Dropout::new(cfg.attention_probs_dropout_prob),
            attn_out_dropout,
            compute: Compute::F32,
        }))
    }

    /// ModernBERT's encoder: word embeddings and their norm, pre-norm
    /// layers (layer 0 without `attn_norm`) with a fused `Wqkv`, rotary
    /// Q and K (the global or local base), the sliding layers' window and
    /// GeGLU, biases where the config has them, and `final_norm`. Dropout
    /// as transformers draws it: the embeddings', then per layer the
    /// attention probabilities', `Wo`'s output (the same rate) and the
    /// gated product's (`mlp_dropout`).
    fn of_modernbert(model: &'a BertModel, o: &ModernBertOptions) -> Result<Option<Self>> {
        let cfg = model.config();
        let stack = model
            .encoder
            .stack()
            .and_then(|s| s.as_any())
            .and_then(|a| a.downcast_ref::<ModernBertEncoder>());
        let emb = &model.embeddings;
        let plain_embeddings = emb.position_embeddings.is_none()
            && emb.token_type_embeddings.is_none()
            && emb.projection.is_none()
            && !emb.mask_padding;
        let rates = [
            emb.dropout.rate(),
            cfg.hidden_dropout_prob,
            cfg.attention_probs_dropout_prob,
        ];
        let (Some(stack), true, true) = (
            stack,
            model.device().is_cpu() && plain_embeddings,
            rates.iter().all(|&r| r < 1.0),
        ) else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(stack.layers.len());
        for l in &stack.layers {
            let sliding = l.kind == AttentionKind::Sliding;
            layers.push(Layer {
                qkv: QkvParams::new(vec![Linear::with_any_bias(&l.attn.wqkv)?]),
                attn_out: Linear::with_any_bias(&l.attn.wo)?,
                attn_norm: l.attn_norm.as_ref().map(Norm::of).transpose()?,
                ffn_in: Linear::with_any_bias(&l.mlp.wi)?,
                ffn_out: Linear::with_any_bias(&l.mlp.wo)?,
                ffn_norm: Norm::of(&l.mlp_norm)?,
                glu: true,
                rotary: Some(usize::from(sliding)),
                window: sliding.then(|| o.half_window()),
            });
        }
        let order = (0..layers.len()).collect();
        let attention = Dropout::new(cfg.attention_probs_dropout_prob);
        Ok(Some(Self {
            hidden: cfg.hidden_size,
            embed_width: cfg.hidden_size,
            heads: Heads {
                count: cfg.num_attention_heads,
                dim: cfg.head_dim(),
            },
            act: cfg.hidden_act.into(),
            norm_position: NormPosition::Pre,
            max_positions: cfg.max_position_embeddings,
            pad_id: emb.padding_idx,
            positions_from: None,
            ignore_types: true,
            word: Param::of(emb.word_embeddings.embeddings())?,
            position: None,
            token_type: None,
            embed_norm: emb.layer_norm.as_ref().map(Norm::of).transpose()?,
            projection: None,
            layers,
            order,
            final_norm: Some(Norm::of(&stack.final_norm)?),
            thetas: vec![o.global_rope_theta, o.local_rope_theta],
            embed_dropout: emb.dropout,
            hidden_dropout: Dropout::new(cfg.hidden_dropout_prob),
            attention_dropout: attention,
            attn_out_dropout: attention,
            compute: Compute::F32,
        }))
    }
}
