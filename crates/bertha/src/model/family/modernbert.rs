//! ModernBERT (`model_type` `modernbert`), as transformers'
//! `modeling_modernbert.py`: word embeddings and a LayerNorm (no
//! positions, no token types), pre-norm layers with fused `Wqkv`, NeoX
//! rotary positions and GeGLU, attention global in some layers and a
//! sliding window in the others, a `final_norm`; heads that run
//! `head` (dense → activation → norm) before their output layer.
//!
//! Its layers share nothing with BERT's, so they are their own modules
//! ([`layers`]), plugged into [`BertEncoder`] as a
//! [`LayerStack`](crate::model::bert::LayerStack); the embeddings are
//! BERT's word-only embeddings under ModernBERT's names.
//!
//! Weight names (transformers' `base_model_prefix` is `model`):
//! `model.embeddings.{tok_embeddings,norm}`,
//! `model.layers.N.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,mlp.Wi,mlp.Wo}`
//! (no `attn_norm` in layer 0), `model.final_norm`; heads: `head.dense`,
//! `head.norm`, then `decoder` (MLM, tied to `tok_embeddings`, own bias)
//! or `classifier`. Biases exist only where the config's `*_bias` says.

pub(crate) mod layers;
pub(crate) mod rotary;

use std::sync::Arc;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Embedding, Init, VarBuilder};

use super::{Layout, MlmBiases, MlmNames};
use crate::config::{Activation, BertConfig, ModernBertOptions};
use crate::model::bert::{BertEmbeddings, BertEncoder};
use crate::model::nn::{activate, Dense, Dropout, LayerNorm};

use self::layers::ModernBertEncoder;

pub(super) struct ModernBert<'a>(pub(super) &'a ModernBertOptions);

impl Layout for ModernBert<'_> {
    /// `embeddings.tok_embeddings` and `embeddings.norm`.
    fn load_embeddings(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEmbeddings> {
        let vb = vb.pp("embeddings");
        let d = cfg.hidden_size;
        let weight = vb.pp("tok_embeddings").get_with_hints(
            (cfg.vocab_size, d),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: cfg.initializer_range,
            },
        )?;
        let norm =
            LayerNorm::load_with_bias(vb.pp("norm"), d, cfg.layer_norm_eps, self.0.norm_bias)?;
        Ok(BertEmbeddings::words_only(
            Embedding::new(weight, d),
            Some(norm),
            Dropout::new(self.0.embedding_dropout),
            cfg.pad_token_id,
        ))
    }

    /// `layers.N` and `final_norm`, run by ModernBERT's own stack.
    fn load_encoder(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEncoder> {
        Ok(BertEncoder::from_stack(Arc::new(ModernBertEncoder::load(
            vb, cfg, self.0,
        )?)))
    }

    /// `head.{dense,norm}` and `decoder` at the checkpoint root.
    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        MlmNames {
            root: "",
            dense: "head.dense",
            norm: "head.norm",
            decoder: "decoder",
            bias: "decoder.bias",
            act: self.0.classifier_activation,
            biases: MlmBiases {
                dense: self.0.classifier_bias,
                norm: self.0.norm_bias,
                decoder: self.0.decoder_bias,
            },
            ..MlmNames::bert(cfg)
        }
    }

    fn sequence_classifier(&self) -> [&'static str; 2] {
        ["head.dense.weight", "classifier.weight"]
    }

    /// The pooled vector comes from the encoder's own pooling (cls or
    /// mean), not a pooler module.
    fn classifier_reads_pooler(&self) -> bool {
        false
    }

    /// ModernBertForMultipleChoice pools as its sequence classifier does.
    fn multiple_choice_reads_pooler(&self) -> bool {
        false
    }

    fn fresh_prefixes(&self) -> &'static [&'static str] {
        &["head.", "decoder."]
    }

    /// ModernBertForQuestionAnswering: `head` on every token → `drop`
    /// (`classifier_dropout`) → `classifier` with two outputs.
    fn qa_dropout(&self, cfg: &BertConfig) -> f64 {
        cfg.classifier_dropout.unwrap_or(cfg.hidden_dropout_prob)
    }

    fn qa_outputs(&self) -> &'static str {
        "classifier"
    }

    /// `head` before every classifier (sequence: after pooling; token:
    /// on every token).
    fn classifier_head(
        &self,
        root: &VarBuilder,
        cfg: &BertConfig,
    ) -> Result<Option<PredictionHead>> {
        PredictionHead::load(root.pp("head"), cfg, self.0).map(Some)
    }
}

/// `head`: dense → activation → LayerNorm, the part every ModernBERT head
/// runs before its output layer.
#[derive(Debug, Clone)]
pub struct PredictionHead {
    pub(crate) dense: Dense,
    pub(crate) act: Activation,
    pub(crate) norm: LayerNorm,
}

impl PredictionHead {
    pub fn load(vb: VarBuilder, cfg: &BertConfig, o: &ModernBertOptions) -> Result<Self> {
        let d = cfg.hidden_size;
        Ok(Self {
            dense: Dense::load_with_bias(
                vb.pp("dense"),
                (d, d),
                cfg.initializer_range,
                o.classifier_bias,
            )?,
            act: o.classifier_activation,
            norm: LayerNorm::load_with_bias(vb.pp("norm"), d, cfg.layer_norm_eps, o.norm_bias)?,
        })
    }

    /// [.., D] → [.., D].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.norm
            .forward(&activate(&self.dense.forward(x)?, self.act)?)
    }
}
