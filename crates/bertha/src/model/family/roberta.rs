//! RoBERTa (`model_type` `roberta`): BERT's layers under BERT's names,
//! with positions counted from `pad_token_id + 1` over the non-padding
//! tokens, no token types in practice, the MLM head under `lm_head` and
//! its own classification head (`classifier.dense`, `classifier.out_proj`).

use super::{FirstTokenHead, Layout, MlmNames};
use crate::config::{Activation, BertConfig};
use crate::model::bert::{EmbeddingLayout, PositionIds};

pub(super) struct Roberta;

impl Layout for Roberta {
    fn embeddings(&self, cfg: &BertConfig) -> EmbeddingLayout {
        EmbeddingLayout {
            position_ids: PositionIds::FromPadding {
                padding_idx: cfg.pad_token_id,
            },
            ignore_token_types: cfg.type_vocab_size <= 1,
            ..EmbeddingLayout::default()
        }
    }

    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        MlmNames {
            root: "lm_head.",
            dense: "dense",
            norm: "layer_norm",
            // RobertaLMHead applies the exact GELU whatever hidden_act says.
            act: Activation::Gelu,
            ..MlmNames::bert(cfg)
        }
    }

    fn sequence_classifier(&self) -> [&'static str; 2] {
        ["classifier.dense.weight", "classifier.out_proj.weight"]
    }

    fn classifier_reads_pooler(&self) -> bool {
        false
    }

    /// RobertaClassificationHead: dropout → `classifier.dense` → tanh →
    /// dropout → `classifier.out_proj`, on the first token.
    fn first_token_head(&self, _cfg: &BertConfig) -> Option<FirstTokenHead> {
        Some(FirstTokenHead {
            dense: "classifier.dense",
            act: Activation::Tanh,
            dropout: None,
            out: "classifier.out_proj",
        })
    }
}
