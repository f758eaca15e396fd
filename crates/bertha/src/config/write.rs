//! Writing a config back as transformers-style `config.json`.

use serde_json::{Map, Value};

use super::{BertConfig, Family, NormPosition};

impl BertConfig {
    /// The config as transformers-style JSON (plus bertha's extension keys
    /// when they differ from BERT's), for writing checkpoints.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("model_type", self.model_type.clone().into());
        let arch = if self.architectures.is_empty() {
            vec!["BertModel".to_string()]
        } else {
            self.architectures.clone()
        };
        put("architectures", arch.into());
        put("vocab_size", self.vocab_size.into());
        put("hidden_size", self.hidden_size.into());
        put("num_hidden_layers", self.num_hidden_layers.into());
        put("num_attention_heads", self.num_attention_heads.into());
        put("intermediate_size", self.intermediate_size.into());
        put("hidden_act", self.hidden_act.name().into());
        put("hidden_dropout_prob", self.hidden_dropout_prob.into());
        put(
            "attention_probs_dropout_prob",
            self.attention_probs_dropout_prob.into(),
        );
        put(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        put("type_vocab_size", self.type_vocab_size.into());
        put("initializer_range", self.initializer_range.into());
        put("layer_norm_eps", self.layer_norm_eps.into());
        put("pad_token_id", self.pad_token_id.into());
        put("position_embedding_type", "absolute".into());
        put("tie_word_embeddings", self.tie_word_embeddings.into());
        if self.norm_position == NormPosition::Pre {
            put("norm_position", "pre".into());
        }
        if !self.embedding_layer_norm {
            put("embedding_layer_norm", false.into());
        }
        if self.final_layer_norm {
            put("final_layer_norm", true.into());
        }
        if !self.add_pooling_layer {
            put("add_pooling_layer", false.into());
        }
        if !self.id2label.is_empty() {
            let labels: Map<String, Value> = self
                .id2label
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(v.clone())))
                .collect();
            let ids: Map<String, Value> = self
                .id2label
                .iter()
                .map(|(k, v)| (v.clone(), Value::from(*k)))
                .collect();
            put("id2label", labels.into());
            put("label2id", ids.into());
        }
        if let Some(p) = self.problem_type {
            put("problem_type", p.name().into());
        }
        if let Some(p) = self.classifier_dropout {
            put("classifier_dropout", p.into());
        }
        match &self.family {
            Family::Bert | Family::Roberta => {}
            Family::DistilBert(o) => {
                m.insert("qa_dropout".into(), o.qa_dropout.into());
                for (bert, distil) in [
                    ("hidden_size", "dim"),
                    ("num_hidden_layers", "n_layers"),
                    ("num_attention_heads", "n_heads"),
                    ("intermediate_size", "hidden_dim"),
                    ("hidden_act", "activation"),
                    ("hidden_dropout_prob", "dropout"),
                    ("attention_probs_dropout_prob", "attention_dropout"),
                    ("classifier_dropout", "seq_classif_dropout"),
                ] {
                    if let Some(v) = m.remove(bert) {
                        m.insert(distil.to_string(), v);
                    }
                }
                m.remove("type_vocab_size");
                m.remove("layer_norm_eps");
            }
            Family::Albert(a) => {
                if let Some(v) = m.remove("classifier_dropout") {
                    m.insert("classifier_dropout_prob".into(), v);
                }
                m.insert("embedding_size".into(), a.embedding_size.into());
                m.insert("num_hidden_groups".into(), a.num_hidden_groups.into());
                m.insert("inner_group_num".into(), a.inner_group_num.into());
            }
            Family::Electra(o) => {
                m.insert("embedding_size".into(), o.embedding_size.into());
                o.summary.write(&mut m);
            }
            Family::ModernBert(o) => o.write(&mut m),
            Family::DebertaV2(o) => {
                if let Some(v) = m.remove("classifier_dropout") {
                    m.insert("cls_dropout".into(), v);
                }
                let mut types = Vec::new();
                if o.p2c {
                    types.push("p2c");
                }
                if o.c2p {
                    types.push("c2p");
                }
                let mut put = |k: &str, v: Value| {
                    m.insert(k.to_string(), v);
                };
                put("embedding_size", o.embedding_size.into());
                put("relative_attention", o.relative_attention.into());
                put("max_relative_positions", o.max_relative_positions.into());
                put(
                    "position_buckets",
                    if o.position_buckets > 0 {
                        Value::from(o.position_buckets)
                    } else {
                        Value::from(-1)
                    },
                );
                put("pos_att_type", types.into());
                put("share_att_key", o.share_att_key.into());
                put(
                    "norm_rel_ebd",
                    if o.norm_rel_ebd { "layer_norm" } else { "none" }.into(),
                );
                put("position_biased_input", o.position_biased_input.into());
                put("pooler_hidden_act", o.pooler_hidden_act.name().into());
                put("pooler_dropout", o.pooler_dropout.into());
                put("legacy", o.legacy.into());
            }
        }
        Value::Object(m)
    }
}
