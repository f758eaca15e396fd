//! ELECTRA (`model_type` `electra`): BERT's encoder under BERT's names,
//! on embeddings `embedding_size` wide (word, position, type and their
//! LayerNorm), projected to `hidden_size` by `electra.embeddings_project`
//! when the two differ. There is no pooler: every ELECTRA head reads the
//! encoder's last states itself.
//!
//! Heads: the discriminator (`discriminator_predictions.dense` →
//! `hidden_act` → `dense_prediction`, one logit per token: "replaced?"),
//! the generator's MLM head (`generator_predictions.dense` → exact GELU →
//! `generator_predictions.LayerNorm` → `generator_lm_head`, tied to the
//! word embeddings), the classifier (`classifier.dense` → exact GELU →
//! `classifier.out_proj` on the first token), and the multiple-choice
//! head (`sequence_summary` → `classifier`, as the `summary_*` keys say:
//! `model::heads::sequence_summary`), as transformers builds them.

use candle_core::Result;
use candle_nn::VarBuilder;

use super::{FirstTokenHead, Layout, MlmNames};
use crate::config::{Activation, BertConfig, ElectraOptions};
use crate::model::bert::BertEncoder;
use crate::model::nn::Dense;

pub(super) struct Electra<'a>(pub(super) &'a ElectraOptions);

impl Layout for Electra<'_> {
    /// BERT's encoder, after `embeddings_project` when the embeddings are
    /// narrower (or wider) than the hidden size.
    fn load_encoder(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEncoder> {
        let encoder = BertEncoder::load(vb.pp("encoder"), cfg)?;
        if self.0.embedding_size == cfg.hidden_size {
            return Ok(encoder);
        }
        let projection = Dense::load(
            vb.pp("embeddings_project"),
            self.0.embedding_size,
            cfg.hidden_size,
            cfg.initializer_range,
        )?;
        Ok(BertEncoder {
            input_projection: Some(projection),
            ..encoder
        })
    }

    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        MlmNames {
            root: "",
            dense: "generator_predictions.dense",
            norm: "generator_predictions.LayerNorm",
            decoder: "generator_lm_head",
            bias: "generator_lm_head.bias",
            // ElectraGeneratorPredictions applies the exact GELU whatever
            // hidden_act says.
            act: Activation::Gelu,
            width: self.0.embedding_size,
            ..MlmNames::bert(cfg)
        }
    }

    fn sequence_classifier(&self) -> [&'static str; 2] {
        ["classifier.dense.weight", "classifier.out_proj.weight"]
    }

    fn classifier_reads_pooler(&self) -> bool {
        false
    }

    /// ElectraClassificationHead applies the exact GELU whatever
    /// hidden_act says.
    fn first_token_head(&self, _cfg: &BertConfig) -> Option<FirstTokenHead> {
        Some(FirstTokenHead {
            dense: "classifier.dense",
            act: Activation::Gelu,
            dropout: None,
            out: "classifier.out_proj",
        })
    }

    /// ElectraForMultipleChoice sums up each choice with its own
    /// `sequence_summary` module (see `BertConfig::sequence_summary`).
    fn multiple_choice_reads_pooler(&self) -> bool {
        false
    }

    fn fresh_prefixes(&self) -> &'static [&'static str] {
        &[
            "discriminator_predictions.",
            "generator_predictions.",
            "generator_lm_head.",
            "sequence_summary.",
        ]
    }
}
