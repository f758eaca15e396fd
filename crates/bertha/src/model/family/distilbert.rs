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

use super::{FirstTokenHead, Layout, MlmNames};
use crate::config::{Activation, BertConfig, DistilBertOptions, NormPosition};
use crate::model::bert::{
    BertAttention, BertEncoder, BertIntermediate, BertLayer, BertOutputBlock, BertSelfAttention,
};

pub(super) struct DistilBert<'a>(pub(super) &'a DistilBertOptions);

impl Layout for DistilBert<'_> {
    /// `transformer.layer.N`.
    fn load_encoder(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEncoder> {
        let vb = vb.pp("transformer");
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| load_layer(vb.pp(format!("layer.{i}")), cfg))
            .collect::<Result<_>>()?;
        Ok(BertEncoder::from_layers(layers))
    }

    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        MlmNames {
            root: "",
            dense: "vocab_transform",
            norm: "vocab_layer_norm",
            decoder: "vocab_projector",
            bias: "vocab_projector.bias",
            eps: 1e-12,
            ..MlmNames::bert(cfg)
        }
    }

    fn sequence_classifier(&self) -> [&'static str; 2] {
        ["pre_classifier.weight", "classifier.weight"]
    }

    fn classifier_reads_pooler(&self) -> bool {
        false
    }

    /// DistilBertForSequenceClassification: `pre_classifier` → ReLU
    /// (whatever `activation` says) → dropout (`seq_classif_dropout`) →
    /// `classifier`, on the first token, with no dropout before
    /// `pre_classifier`.
    fn first_token_head(&self, _cfg: &BertConfig) -> Option<FirstTokenHead> {
        Some(FirstTokenHead {
            dense: "pre_classifier",
            act: Activation::Relu,
            dropout: Some(0.0),
            out: "classifier",
        })
    }

    fn multiple_choice_reads_pooler(&self) -> bool {
        false
    }

    /// DistilBertForMultipleChoice: its sequence classifier's layers,
    /// with one output per choice.
    fn multiple_choice_head(&self, cfg: &BertConfig) -> Option<FirstTokenHead> {
        self.first_token_head(cfg)
    }

    /// DistilBertForQuestionAnswering drops the hidden states before
    /// `qa_outputs`.
    fn qa_dropout(&self, _cfg: &BertConfig) -> f64 {
        self.0.qa_dropout
    }
}

/// `transformer.layer.N`, as a BERT layer (the same computation).
fn load_layer(vb: VarBuilder, cfg: &BertConfig) -> Result<BertLayer> {
    let att = vb.pp("attention");
    let self_attention =
        BertSelfAttention::load_named(att.clone(), cfg, ["q_lin", "k_lin", "v_lin"])?;
    let ffn = vb.pp("ffn");
    Ok(BertLayer::post_ln(
        BertAttention::from_parts(
            self_attention,
            att.pp("out_lin"),
            vb.pp("sa_layer_norm"),
            cfg,
            (0.0, NormPosition::Post),
        )?,
        BertIntermediate::load_at(ffn.pp("lin1"), cfg)?,
        BertOutputBlock::load_at(ffn.pp("lin2"), vb.pp("output_layer_norm"), cfg)?,
    ))
}
