//! Which member of the BERT family a config describes, with the options
//! only that member has.

use super::{Activation, ModernBertOptions, SummaryOptions};

/// Which member of the BERT family a config describes (`model_type`),
/// with the options only that member has.
#[derive(Debug, Clone, PartialEq)]
pub enum Family {
    /// `bert`.
    Bert,
    /// `roberta`: positions counted from `pad_token_id + 1` over the
    /// non-padding tokens, no token types in practice.
    Roberta,
    /// `distilbert`: no token types, no pooler, its own weight names.
    DistilBert(DistilBertOptions),
    /// `albert`: factorised embeddings and cross-layer sharing.
    Albert(AlbertOptions),
    /// `deberta-v2`: disentangled relative-position attention.
    DebertaV2(DebertaOptions),
    /// `electra`: BERT's encoder on embeddings `embedding_size` wide,
    /// projected to `hidden_size` by `embeddings_project` when they differ.
    Electra(ElectraOptions),
    /// `modernbert`: rotary positions, local/global attention, GeGLU,
    /// pre-norm blocks (its own layers: `model::family::modernbert`).
    ModernBert(ModernBertOptions),
}

/// DistilBERT's own `config.json` keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DistilBertOptions {
    /// The dropout before `qa_outputs` (BERT's QA head has none).
    pub qa_dropout: f64,
}

/// ELECTRA's own `config.json` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct ElectraOptions {
    /// Width of the word, position and type embeddings.
    pub embedding_size: usize,
    /// The `summary_*` keys of its multiple-choice head.
    pub summary: SummaryOptions,
}

/// ALBERT's own `config.json` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlbertOptions {
    /// Width of the word embeddings, projected to `hidden_size` by
    /// `encoder.embedding_hidden_mapping_in`.
    pub embedding_size: usize,
    /// Number of distinct layer groups the `num_hidden_layers` steps share.
    pub num_hidden_groups: usize,
    /// Layers inside each group, run one after another at every step.
    pub inner_group_num: usize,
}

/// DeBERTa-v2's own `config.json` keys, resolved as transformers does.
#[derive(Debug, Clone, PartialEq)]
pub struct DebertaOptions {
    /// Width of the word embeddings (`embed_proj` maps it to `hidden_size`).
    pub embedding_size: usize,
    pub relative_attention: bool,
    /// `max_relative_positions`, with values below 1 meaning
    /// `max_position_embeddings`.
    pub max_relative_positions: usize,
    /// `position_buckets`; 0 when absent or not positive (no log buckets).
    pub position_buckets: usize,
    /// `pos_att_type` contains `c2p` (content → position).
    pub c2p: bool,
    /// `pos_att_type` contains `p2c` (position → content).
    pub p2c: bool,
    /// Positions projected with the content query/key projections.
    pub share_att_key: bool,
    /// `norm_rel_ebd` contains `layer_norm`.
    pub norm_rel_ebd: bool,
    /// Absolute position embeddings added to the input.
    pub position_biased_input: bool,
    pub pooler_hidden_act: Activation,
    pub pooler_dropout: f64,
    /// `legacy`: the MLM head under `cls.predictions` (else
    /// `lm_predictions.lm_head`).
    pub legacy: bool,
}

impl DebertaOptions {
    /// The span of relative positions (the rel-embedding table has twice
    /// as many rows).
    pub fn att_span(&self) -> usize {
        if self.position_buckets > 0 {
            self.position_buckets
        } else {
            self.max_relative_positions
        }
    }
}

impl Family {
    /// The `model_type` strings, in `SUPPORTED_MODEL_TYPES` order.
    pub fn model_type(&self) -> &'static str {
        match self {
            Self::Bert => "bert",
            Self::Roberta => "roberta",
            Self::DistilBert(_) => "distilbert",
            Self::Albert(_) => "albert",
            Self::DebertaV2(_) => "deberta-v2",
            Self::Electra(_) => "electra",
            Self::ModernBert(_) => "modernbert",
        }
    }

    /// transformers' `base_model_prefix`: where head checkpoints keep the
    /// encoder (`bert.`, `roberta.`, ...).
    pub fn prefix(&self) -> &'static str {
        match self {
            Self::Bert => "bert",
            Self::Roberta => "roberta",
            Self::DistilBert(_) => "distilbert",
            Self::Albert(_) => "albert",
            Self::DebertaV2(_) => "deberta",
            Self::Electra(_) => "electra",
            Self::ModernBert(_) => "model",
        }
    }

    /// The start of transformers' class names (`RobertaForMaskedLM`).
    pub fn class_prefix(&self) -> &'static str {
        match self {
            Self::Bert => "Bert",
            Self::Roberta => "Roberta",
            Self::DistilBert(_) => "DistilBert",
            Self::Albert(_) => "Albert",
            Self::DebertaV2(_) => "DebertaV2",
            Self::Electra(_) => "Electra",
            Self::ModernBert(_) => "ModernBert",
        }
    }

    pub fn is_bert(&self) -> bool {
        matches!(self, Self::Bert)
    }
}
