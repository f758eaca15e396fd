//! `config.json` of a BERT checkpoint, read with transformers' defaults.
//!
//! Every field is read on its own so that a wrong type or an unsupported
//! value is reported with the field's name. Options that would change the
//! model's numbers but that bertha does not implement are errors, never
//! silently ignored.
//!
//! [`keys`](self) holds the common keys' value types, `family` the
//! per-family options, `read` / `write` the JSON, `validate` the checks
//! between fields.

mod family;
mod keys;
mod modernbert;
mod read;
mod summary;
#[cfg(test)]
mod tests;
mod validate;
mod write;

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;

pub use family::{AlbertOptions, DebertaOptions, DistilBertOptions, ElectraOptions, Family};
pub use keys::{Activation, NormPosition, ProblemType};
pub use modernbert::{AttentionKind, ClassifierPooling, ModernBertOptions};
pub use summary::{SummaryOptions, SummarySpec, SummaryToken};

/// A BERT configuration. Field names and defaults follow transformers'
/// `BertConfig`; `norm_position`, `embedding_layer_norm`,
/// `final_layer_norm` and `add_pooling_layer` are bertha's spelling for the
/// pre-LN variant (see the README).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub model_type: String,
    /// The family member, with its own options.
    pub family: Family,
    pub architectures: Vec<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub max_position_embeddings: usize,
    /// 0 means the model has no token-type embeddings.
    pub type_vocab_size: usize,
    pub initializer_range: f64,
    pub layer_norm_eps: f64,
    pub pad_token_id: u32,
    pub tie_word_embeddings: bool,
    pub norm_position: NormPosition,
    pub embedding_layer_norm: bool,
    pub final_layer_norm: bool,
    pub add_pooling_layer: bool,
    pub id2label: BTreeMap<usize, String>,
    /// How sequence classification is trained; `None` lets the head infer it
    /// from the number of labels and the labels' type, as transformers does.
    pub problem_type: Option<ProblemType>,
    /// Dropout before a classification head; `None` means `hidden_dropout_prob`.
    pub classifier_dropout: Option<f64>,
}

impl Default for BertConfig {
    /// bert-base-uncased.
    fn default() -> Self {
        Self {
            model_type: "bert".into(),
            family: Family::Bert,
            architectures: Vec::new(),
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: Activation::Gelu,
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            initializer_range: 0.02,
            layer_norm_eps: 1e-12,
            pad_token_id: 0,
            tie_word_embeddings: true,
            norm_position: NormPosition::Post,
            embedding_layer_norm: true,
            final_layer_norm: false,
            add_pooling_layer: true,
            id2label: BTreeMap::new(),
            problem_type: None,
            classifier_dropout: None,
        }
    }
}

/// Model types this build can run.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "bert",
    "roberta",
    "distilbert",
    "albert",
    "deberta-v2",
    "electra",
    "modernbert",
];

impl BertConfig {
    /// The longest input the model takes: `max_position_embeddings`, less
    /// RoBERTa's `pad_token_id + 1` offset.
    pub fn max_sequence_length(&self) -> usize {
        match self.family {
            Family::Roberta => self
                .max_position_embeddings
                .saturating_sub(self.pad_token_id as usize + 1),
            _ => self.max_position_embeddings,
        }
    }

    /// The width of the word embeddings (ALBERT's, DeBERTa's and ELECTRA's
    /// `embedding_size`; `hidden_size` for the others).
    pub fn embedding_size(&self) -> usize {
        match &self.family {
            Family::Albert(a) => a.embedding_size,
            Family::DebertaV2(o) => o.embedding_size,
            Family::Electra(o) => o.embedding_size,
            _ => self.hidden_size,
        }
    }

    /// ELECTRA's `sequence_summary` (its multiple-choice head's sentence
    /// module) as the `summary_*` keys build it, `origin` naming the
    /// config in errors; `None` for the other families.
    pub fn sequence_summary(&self, origin: &Path) -> Result<Option<SummarySpec>> {
        match &self.family {
            Family::Electra(o) => o
                .summary
                .resolve(self.hidden_size, self.num_labels(), origin)
                .map(Some),
            _ => Ok(None),
        }
    }

    /// The number of classes of a classification head: `id2label`'s size,
    /// else transformers' default of 2.
    pub fn num_labels(&self) -> usize {
        if self.id2label.is_empty() {
            2
        } else {
            self.id2label.len()
        }
    }

    /// The name of class `id`: `id2label`'s, else transformers' `LABEL_{id}`.
    pub fn label_name(&self, id: usize) -> String {
        match self.id2label.get(&id) {
            Some(name) => name.clone(),
            None => format!("LABEL_{id}"),
        }
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The seed's "mini BERT": pre-LN blocks, ReLU, learned positions, no
    /// token types, no embedding LayerNorm, no final LayerNorm, no pooler
    /// (V=16, D=8, H=2, d_ff=16, L=2, T=4, eps 1e-6).
    pub fn mini_bert_seed() -> Self {
        Self {
            architectures: vec!["BertModel".into()],
            vocab_size: 16,
            hidden_size: 8,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 16,
            hidden_act: Activation::Relu,
            hidden_dropout_prob: 0.0,
            attention_probs_dropout_prob: 0.0,
            max_position_embeddings: 4,
            type_vocab_size: 0,
            layer_norm_eps: 1e-6,
            norm_position: NormPosition::Pre,
            embedding_layer_norm: false,
            final_layer_norm: false,
            add_pooling_layer: false,
            ..Self::default()
        }
    }
}
