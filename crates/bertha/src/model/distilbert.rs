//! DistilBERT (`model_type` `distilbert`): BERT's post-LN layers under
//! their own names, with no token types and no pooler.
//!
//! `distilbert.embeddings.{word_embeddings,position_embeddings,LayerNorm}`
//! are BERT's; `distilbert.transformer.layer.N` holds
//! `attention.{q_lin,k_lin,v_lin,out_lin}`, `sa_layer_norm`,
//! `ffn.{lin1,lin2}` and `output_layer_norm`. The MLM head is
//! `vocab_transform` → activation → `vocab_layer_norm` →
//! `vocab_projector` (tied to the word embeddings).

use candle_core::Result;
use candle_nn::VarBuilder;

use super::attention::{BertAttention, BertSelfAttention};
use super::layer::{BertIntermediate, BertLayer, BertOutputBlock};
use super::nn::{Dense, Dropout, LayerNorm};
use crate::config::{BertConfig, NormPosition};

/// `transformer.layer.N`, as a BERT layer (the same computation).
pub fn load_layer(vb: VarBuilder, cfg: &BertConfig) -> Result<BertLayer> {
    let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
    let std = cfg.initializer_range;
    let eps = cfg.layer_norm_eps;
    let att = vb.pp("attention");
    Ok(BertLayer {
        attention: BertAttention {
            self_attention: BertSelfAttention {
                query: Dense::load(att.pp("q_lin"), d, d, std)?,
                key: Dense::load(att.pp("k_lin"), d, d, std)?,
                value: Dense::load(att.pp("v_lin"), d, d, std)?,
                num_heads: cfg.num_attention_heads,
                head_dim: cfg.head_dim(),
                dropout: Dropout::new(cfg.attention_probs_dropout_prob),
                disentangled: None,
            },
            dense: Dense::load(att.pp("out_lin"), d, d, std)?,
            layer_norm: LayerNorm::load(vb.pp("sa_layer_norm"), d, eps)?,
            dropout: Dropout::new(0.0),
            norm_position: NormPosition::Post,
        },
        intermediate: BertIntermediate {
            dense: Dense::load(vb.pp("ffn").pp("lin1"), d, ff, std)?,
            act: cfg.hidden_act,
        },
        output: BertOutputBlock {
            dense: Dense::load(vb.pp("ffn").pp("lin2"), ff, d, std)?,
            layer_norm: LayerNorm::load(vb.pp("output_layer_norm"), d, eps)?,
            dropout: Dropout::new(cfg.hidden_dropout_prob),
        },
        norm_position: NormPosition::Post,
    })
}
