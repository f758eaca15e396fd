//! The checks between `config.json` fields that serde cannot make.

use std::path::Path;

use super::{BertConfig, Family};
use crate::error::{Error, Result};

impl BertConfig {
    /// Checks the relations between fields that serde cannot.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(Error::config(origin, field, "must be greater than 0"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(Error::config(
                origin,
                "num_attention_heads",
                format!(
                    "hidden_size {} is not a multiple of num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            ));
        }
        if self.layer_norm_eps.is_nan() || self.layer_norm_eps <= 0.0 {
            return Err(Error::config(
                origin,
                "layer_norm_eps",
                "must be greater than 0",
            ));
        }
        for (field, p) in [
            ("hidden_dropout_prob", self.hidden_dropout_prob),
            (
                "attention_probs_dropout_prob",
                self.attention_probs_dropout_prob,
            ),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(Error::config(
                    origin,
                    field,
                    format!("{p} is not in [0, 1)"),
                ));
            }
        }
        let family_rate = match &self.family {
            Family::DistilBert(o) => Some(("qa_dropout", o.qa_dropout)),
            _ => None,
        };
        let classifier = self.classifier_dropout.map(|p| ("classifier_dropout", p));
        for (field, p) in classifier.into_iter().chain(family_rate) {
            if !(0.0..1.0).contains(&p) {
                return Err(Error::config(
                    origin,
                    field,
                    format!("{p} is not in [0, 1)"),
                ));
            }
        }
        if let Some((&last, _)) = self.id2label.last_key_value() {
            if last + 1 != self.id2label.len() {
                let missing = (0..=last)
                    .find(|i| !self.id2label.contains_key(i))
                    .unwrap_or(0);
                return Err(Error::config(
                    origin,
                    "id2label",
                    format!(
                        "label ids must be 0..{}, but id {missing} has no label",
                        self.id2label.len()
                    ),
                ));
            }
        }
        if self.family.model_type() != self.model_type {
            return Err(Error::config(
                origin,
                "model_type",
                format!(
                    "`{}` does not match the family options ({})",
                    self.model_type,
                    self.family.model_type()
                ),
            ));
        }
        match &self.family {
            Family::Albert(a) => {
                for (field, value) in [
                    ("embedding_size", a.embedding_size),
                    ("num_hidden_groups", a.num_hidden_groups),
                    ("inner_group_num", a.inner_group_num),
                ] {
                    if value == 0 {
                        return Err(Error::config(origin, field, "must be greater than 0"));
                    }
                }
            }
            Family::Electra(o) if o.embedding_size == 0 => {
                return Err(Error::config(
                    origin,
                    "embedding_size",
                    "must be greater than 0",
                ));
            }
            Family::DebertaV2(o) => {
                if o.embedding_size == 0 {
                    return Err(Error::config(
                        origin,
                        "embedding_size",
                        "must be greater than 0",
                    ));
                }
                if o.relative_attention && o.att_span() == 0 {
                    return Err(Error::config(
                        origin,
                        "max_relative_positions",
                        "relative attention needs a positive span",
                    ));
                }
                if o.position_buckets == 1 {
                    return Err(Error::config(
                        origin,
                        "position_buckets",
                        "must be at least 2 (or absent)",
                    ));
                }
            }
            Family::ModernBert(o) => o.validate(self, origin)?,
            Family::Roberta if self.max_sequence_length() == 0 => {
                return Err(Error::config(
                    origin,
                    "max_position_embeddings",
                    format!(
                        "{} leaves no positions after RoBERTa's offset of pad_token_id + 1 = {}",
                        self.max_position_embeddings,
                        self.pad_token_id + 1
                    ),
                ));
            }
            _ => {}
        }
        if self.pad_token_id as usize >= self.vocab_size {
            return Err(Error::config(
                origin,
                "pad_token_id",
                format!(
                    "{} is not below vocab_size {}",
                    self.pad_token_id, self.vocab_size
                ),
            ));
        }
        Ok(())
    }
}
