//! Reading `config.json`: each field on its own, with transformers'
//! defaults per `model_type`, an error naming the field otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{
    modernbert, Activation, AlbertOptions, BertConfig, DebertaOptions, DistilBertOptions,
    ElectraOptions, Family, ModernBertOptions, NormPosition, ProblemType, SummaryOptions,
    SUPPORTED_MODEL_TYPES,
};
use crate::error::{Error, Result};

impl BertConfig {
    /// Reads `config.json` (or any file of that shape).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_str(&text, path)
    }

    /// Parses a config; `origin` names the source in error messages.
    pub fn from_json_str(text: &str, origin: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|source| Error::Json {
            path: origin.to_path_buf(),
            source,
        })?;
        let Value::Object(map) = value else {
            return Err(Error::config(origin, "<root>", "expected a JSON object"));
        };
        Self::from_map(&map, origin)
    }

    fn from_map(map: &Map<String, Value>, origin: &Path) -> Result<Self> {
        let r = FieldReader { map, origin };

        let model_type: String = r.get("model_type", "bert".to_string())?;
        if !SUPPORTED_MODEL_TYPES.contains(&model_type.as_str()) {
            return Err(Error::config(
                origin,
                "model_type",
                format!(
                    "`{model_type}` is not supported (supported: {})",
                    SUPPORTED_MODEL_TYPES.join(", ")
                ),
            ));
        }
        let d = Self::defaults_for(&model_type);
        let distil = model_type == "distilbert";
        let modern = model_type == "modernbert";
        // DistilBERT and ModernBERT spell the common keys their own way.
        let key = |bert: &'static str| -> &'static str {
            if modern {
                return modernbert::common_key(bert);
            }
            if !distil {
                return bert;
            }
            match bert {
                "hidden_size" => "dim",
                "num_hidden_layers" => "n_layers",
                "num_attention_heads" => "n_heads",
                "intermediate_size" => "hidden_dim",
                "hidden_act" => "activation",
                "hidden_dropout_prob" => "dropout",
                "attention_probs_dropout_prob" => "attention_dropout",
                "classifier_dropout" => "seq_classif_dropout",
                other => other,
            }
        };

        // Options that change the computation and that we do not implement.
        let position_embedding_type: String =
            r.get("position_embedding_type", "absolute".to_string())?;
        if position_embedding_type != "absolute" {
            return Err(Error::config(
                origin,
                "position_embedding_type",
                format!("`{position_embedding_type}` is not supported (only `absolute`)"),
            ));
        }
        if r.get("is_decoder", false)? {
            return Err(Error::config(
                origin,
                "is_decoder",
                "decoder (causal) BERT is not supported; bertha runs bidirectional encoders",
            ));
        }
        if r.get("add_cross_attention", false)? {
            return Err(Error::config(
                origin,
                "add_cross_attention",
                "cross-attention is not supported",
            ));
        }

        let read_act = |field: &str, default: Activation| -> Result<Activation> {
            let name: String = r.get(field, default.name().to_string())?;
            Activation::parse(&name).ok_or_else(|| {
                Error::config(
                    origin,
                    field,
                    format!("`{name}` is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu)"),
                )
            })
        };
        let hidden_act = read_act(key("hidden_act"), d.hidden_act)?;

        let norm_name: String = r.get("norm_position", "post".to_string())?;
        let norm_position = match norm_name.as_str() {
            "post" => NormPosition::Post,
            "pre" => NormPosition::Pre,
            other => {
                return Err(Error::config(
                    origin,
                    "norm_position",
                    format!("`{other}` is not one of `post`, `pre`"),
                ))
            }
        };

        let id2label: BTreeMap<String, String> = r.get("id2label", BTreeMap::new())?;
        let id2label: BTreeMap<usize, String> = id2label
            .into_iter()
            .map(|(k, v)| {
                k.parse::<usize>().map(|k| (k, v)).map_err(|_| {
                    Error::config(origin, "id2label", format!("key `{k}` is not an integer"))
                })
            })
            .collect::<Result<_>>()?;

        let problem_type = match r.get::<Option<String>>("problem_type", None)? {
            None => None,
            Some(name) => Some(ProblemType::parse(&name).ok_or_else(|| {
                Error::config(
                    origin,
                    "problem_type",
                    format!(
                        "`{name}` is not one of `single_label_classification`, \
                         `multi_label_classification`, `regression`"
                    ),
                )
            })?),
        };
        // transformers' `num_labels` (without `id2label`) means LABEL_0..LABEL_{n-1}.
        let id2label = match r.get::<Option<usize>>("num_labels", None)? {
            Some(n) if id2label.is_empty() => (0..n).map(|i| (i, format!("LABEL_{i}"))).collect(),
            _ => id2label,
        };

        let hidden_size: usize = r.get(key("hidden_size"), d.hidden_size)?;
        let max_position_embeddings: usize =
            r.get("max_position_embeddings", d.max_position_embeddings)?;
        let family = match model_type.as_str() {
            "roberta" => Family::Roberta,
            "distilbert" => Family::DistilBert(DistilBertOptions {
                qa_dropout: r.get("qa_dropout", 0.1)?,
            }),
            "albert" => Family::Albert(AlbertOptions {
                embedding_size: r.get("embedding_size", 128)?,
                num_hidden_groups: r.get("num_hidden_groups", 1)?,
                inner_group_num: r.get("inner_group_num", 1)?,
            }),
            "modernbert" => Family::ModernBert(ModernBertOptions::read(
                &r,
                r.get(key("num_hidden_layers"), d.num_hidden_layers)?,
            )?),
            "deberta-v2" => Family::DebertaV2(Self::read_deberta(
                &r,
                hidden_size,
                max_position_embeddings,
                &read_act,
            )?),
            "electra" => Family::Electra(ElectraOptions {
                embedding_size: r.get("embedding_size", 128)?,
                summary: SummaryOptions::read(&r)?,
            }),
            _ => Family::Bert,
        };
        let classifier_dropout = match &family {
            Family::Albert(_) => r.get("classifier_dropout_prob", Some(0.1))?,
            // DebertaV2ForSequenceClassification reads `cls_dropout`.
            Family::DebertaV2(_) => r.get("cls_dropout", d.classifier_dropout)?,
            _ => r.get(key("classifier_dropout"), d.classifier_dropout)?,
        };

        let cfg = Self {
            model_type,
            family,
            architectures: r.get("architectures", Vec::new())?,
            vocab_size: r.get("vocab_size", d.vocab_size)?,
            hidden_size,
            num_hidden_layers: r.get(key("num_hidden_layers"), d.num_hidden_layers)?,
            num_attention_heads: r.get(key("num_attention_heads"), d.num_attention_heads)?,
            intermediate_size: r.get(key("intermediate_size"), d.intermediate_size)?,
            hidden_act,
            hidden_dropout_prob: r.get(key("hidden_dropout_prob"), d.hidden_dropout_prob)?,
            attention_probs_dropout_prob: r.get(
                key("attention_probs_dropout_prob"),
                d.attention_probs_dropout_prob,
            )?,
            max_position_embeddings,
            type_vocab_size: if distil {
                0
            } else {
                r.get("type_vocab_size", d.type_vocab_size)?
            },
            initializer_range: r.get("initializer_range", d.initializer_range)?,
            layer_norm_eps: if distil {
                // DistilBERT's LayerNorms use a fixed eps.
                1e-12
            } else {
                r.get(key("layer_norm_eps"), d.layer_norm_eps)?
            },
            pad_token_id: r
                .get::<Option<u32>>("pad_token_id", Some(d.pad_token_id))?
                .unwrap_or(d.pad_token_id),
            tie_word_embeddings: r.get("tie_word_embeddings", d.tie_word_embeddings)?,
            norm_position,
            embedding_layer_norm: r.get("embedding_layer_norm", d.embedding_layer_norm)?,
            final_layer_norm: r.get("final_layer_norm", d.final_layer_norm)?,
            add_pooling_layer: r.get("add_pooling_layer", d.add_pooling_layer)?,
            id2label,
            problem_type,
            classifier_dropout,
        };
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// transformers' defaults for a `model_type` (its `*Config` class).
    fn defaults_for(model_type: &str) -> Self {
        let d = Self::default();
        match model_type {
            "roberta" => Self {
                pad_token_id: 1,
                ..d
            },
            "distilbert" => Self {
                type_vocab_size: 0,
                add_pooling_layer: false,
                classifier_dropout: Some(0.2),
                ..d
            },
            "albert" => Self {
                vocab_size: 30000,
                hidden_size: 4096,
                num_attention_heads: 64,
                intermediate_size: 16384,
                hidden_act: Activation::GeluTanh,
                hidden_dropout_prob: 0.0,
                attention_probs_dropout_prob: 0.0,
                ..d
            },
            // ElectraConfig: ELECTRA-Small's discriminator, and no pooler
            // (its heads read the first token themselves).
            "electra" => Self {
                hidden_size: 256,
                num_attention_heads: 4,
                intermediate_size: 1024,
                add_pooling_layer: false,
                ..d
            },
            "modernbert" => modernbert::defaults(d),
            "deberta-v2" => Self {
                vocab_size: 128100,
                hidden_size: 1536,
                num_hidden_layers: 24,
                num_attention_heads: 24,
                intermediate_size: 6144,
                type_vocab_size: 0,
                layer_norm_eps: 1e-7,
                add_pooling_layer: false,
                ..d
            },
            _ => d,
        }
    }

    fn read_deberta(
        r: &FieldReader,
        hidden_size: usize,
        max_position_embeddings: usize,
        read_act: &dyn Fn(&str, Activation) -> Result<Activation>,
    ) -> Result<DebertaOptions> {
        let origin = r.origin;
        if r.get::<i64>("conv_kernel_size", 0)? > 0 {
            return Err(Error::config(
                origin,
                "conv_kernel_size",
                "DeBERTa's convolution layer is not supported",
            ));
        }
        let heads: usize = r.get("num_attention_heads", 24)?;
        if let Some(size) = r.get::<Option<usize>>("attention_head_size", None)? {
            if heads == 0 || size * heads != hidden_size {
                return Err(Error::config(
                    origin,
                    "attention_head_size",
                    format!("{size} × {heads} heads ≠ hidden_size {hidden_size}: not supported"),
                ));
            }
        }
        // `pos_att_type`: a list, or a string such as "p2c|c2p".
        let types: Vec<String> = match r.map.get("pos_att_type") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => s.split('|').map(|t| t.trim().to_lowercase()).collect(),
            Some(_) => r.get::<Vec<String>>("pos_att_type", Vec::new())?,
        };
        for t in &types {
            if t != "c2p" && t != "p2c" {
                return Err(Error::config(
                    origin,
                    "pos_att_type",
                    format!("`{t}` is not one of `c2p`, `p2c`"),
                ));
            }
        }
        // ContextPooler maps hidden_size to pooler_hidden_size; bertha's
        // classifier reads hidden_size features.
        let pooler: usize = r.get("pooler_hidden_size", hidden_size)?;
        if pooler != hidden_size {
            return Err(Error::config(
                origin,
                "pooler_hidden_size",
                format!("{pooler} differs from hidden_size {hidden_size}, which bertha does not support"),
            ));
        }
        let norm: String = r.get("norm_rel_ebd", "none".to_string())?;
        let max_rel: i64 = r.get("max_relative_positions", -1)?;
        let buckets: i64 = r.get("position_buckets", -1)?;
        Ok(DebertaOptions {
            embedding_size: r.get("embedding_size", hidden_size)?,
            relative_attention: r.get("relative_attention", false)?,
            max_relative_positions: if max_rel < 1 {
                max_position_embeddings
            } else {
                max_rel as usize
            },
            position_buckets: buckets.max(0) as usize,
            c2p: types.iter().any(|t| t == "c2p"),
            p2c: types.iter().any(|t| t == "p2c"),
            share_att_key: r.get("share_att_key", false)?,
            norm_rel_ebd: norm
                .to_lowercase()
                .split('|')
                .any(|t| t.trim() == "layer_norm"),
            position_biased_input: r.get("position_biased_input", true)?,
            pooler_hidden_act: read_act("pooler_hidden_act", Activation::Gelu)?,
            pooler_dropout: r.get("pooler_dropout", 0.0)?,
            legacy: r.get("legacy", true)?,
        })
    }
}

/// Reads single fields, naming the field on a type error.
pub(super) struct FieldReader<'a> {
    pub(super) map: &'a Map<String, Value>,
    pub(super) origin: &'a Path,
}

impl FieldReader<'_> {
    pub(super) fn get<T: DeserializeOwned>(&self, field: &str, default: T) -> Result<T> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                Error::config(PathBuf::from(self.origin), field, format!("{e} (got {v})"))
            }),
        }
    }
}
