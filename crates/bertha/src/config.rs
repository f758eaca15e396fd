//! `config.json` of a BERT checkpoint, read with transformers' defaults.
//!
//! Every field is read on its own so that a wrong type or an unsupported
//! value is reported with the field's name. Options that would change the
//! model's numbers but that bertha does not implement are errors, never
//! silently ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The feed-forward non-linearity (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact, erf-based GELU.
    Gelu,
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    /// `relu`.
    Relu,
}

impl Activation {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Some(Self::GeluTanh),
            "relu" => Some(Self::Relu),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Gelu => "gelu",
            Self::GeluTanh => "gelu_new",
            Self::Relu => "relu",
        }
    }
}

/// How a sequence-classification head computes its loss (`problem_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemType {
    /// One label per text: cross-entropy over softmax.
    SingleLabelClassification,
    /// Any number of labels per text: binary cross-entropy over sigmoids.
    MultiLabelClassification,
    /// Real-valued targets: mean squared error.
    Regression,
}

impl ProblemType {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "single_label_classification" => Some(Self::SingleLabelClassification),
            "multi_label_classification" => Some(Self::MultiLabelClassification),
            "regression" => Some(Self::Regression),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::SingleLabelClassification => "single_label_classification",
            Self::MultiLabelClassification => "multi_label_classification",
            Self::Regression => "regression",
        }
    }
}

/// Where each block's LayerNorm sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPosition {
    /// BERT: `x = LN(x + sublayer(x))`.
    Post,
    /// The seed's mini BERT: `x = x + sublayer(LN(x))`.
    Pre,
}

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
    DistilBert,
    /// `albert`: factorised embeddings and cross-layer sharing.
    Albert(AlbertOptions),
    /// `deberta-v2`: disentangled relative-position attention.
    DebertaV2(DebertaOptions),
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
            Self::DistilBert => "distilbert",
            Self::Albert(_) => "albert",
            Self::DebertaV2(_) => "deberta-v2",
        }
    }

    /// transformers' `base_model_prefix`: where head checkpoints keep the
    /// encoder (`bert.`, `roberta.`, ...).
    pub fn prefix(&self) -> &'static str {
        match self {
            Self::Bert => "bert",
            Self::Roberta => "roberta",
            Self::DistilBert => "distilbert",
            Self::Albert(_) => "albert",
            Self::DebertaV2(_) => "deberta",
        }
    }

    /// The start of transformers' class names (`RobertaForMaskedLM`).
    pub fn class_prefix(&self) -> &'static str {
        match self {
            Self::Bert => "Bert",
            Self::Roberta => "Roberta",
            Self::DistilBert => "DistilBert",
            Self::Albert(_) => "Albert",
            Self::DebertaV2(_) => "DebertaV2",
        }
    }

    pub fn is_bert(&self) -> bool {
        matches!(self, Self::Bert)
    }
}

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
pub const SUPPORTED_MODEL_TYPES: &[&str] =
    &["bert", "roberta", "distilbert", "albert", "deberta-v2"];

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
        // DistilBERT spells the common keys its own way.
        let key = |bert: &'static str| -> &'static str {
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
            "distilbert" => Family::DistilBert,
            "albert" => Family::Albert(AlbertOptions {
                embedding_size: r.get("embedding_size", 128)?,
                num_hidden_groups: r.get("num_hidden_groups", 1)?,
                inner_group_num: r.get("inner_group_num", 1)?,
            }),
            "deberta-v2" => Family::DebertaV2(Self::read_deberta(
                &r,
                hidden_size,
                max_position_embeddings,
                &read_act,
            )?),
            _ => Family::Bert,
        };
        let classifier_dropout = match &family {
            Family::Albert(_) => r.get("classifier_dropout_prob", Some(0.1))?,
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
                r.get("layer_norm_eps", d.layer_norm_eps)?
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

    /// The width of the word embeddings (ALBERT's and DeBERTa's
    /// `embedding_size`; `hidden_size` for the others).
    pub fn embedding_size(&self) -> usize {
        match &self.family {
            Family::Albert(a) => a.embedding_size,
            Family::DebertaV2(o) => o.embedding_size,
            _ => self.hidden_size,
        }
    }

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
        if let Some(p) = self.classifier_dropout {
            if !(0.0..1.0).contains(&p) {
                return Err(Error::config(
                    origin,
                    "classifier_dropout",
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
            Family::DistilBert => {
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
            Family::DebertaV2(o) => {
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

/// Reads single fields, naming the field on a type error.
struct FieldReader<'a> {
    map: &'a Map<String, Value>,
    origin: &'a Path,
}

impl FieldReader<'_> {
    fn get<T: DeserializeOwned>(&self, field: &str, default: T) -> Result<T> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                Error::config(PathBuf::from(self.origin), field, format!("{e} (got {v})"))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<BertConfig> {
        BertConfig::from_json_str(json, Path::new("config.json"))
    }

    #[test]
    fn empty_object_gives_transformers_defaults() {
        assert_eq!(parse("{}").unwrap(), BertConfig::default());
    }

    #[test]
    fn unknown_model_type_names_the_field() {
        let err = parse(r#"{"model_type": "gpt2"}"#).unwrap_err().to_string();
        assert!(err.contains("model_type") && err.contains("gpt2"), "{err}");
    }

    #[test]
    fn unsupported_options_name_the_field() {
        for (json, field) in [
            (
                r#"{"position_embedding_type": "relative_key"}"#,
                "position_embedding_type",
            ),
            (r#"{"is_decoder": true}"#, "is_decoder"),
            (r#"{"hidden_act": "mish"}"#, "hidden_act"),
            (
                r#"{"hidden_size": 10, "num_attention_heads": 3}"#,
                "num_attention_heads",
            ),
            (r#"{"hidden_size": "big"}"#, "hidden_size"),
            (r#"{"norm_position": "middle"}"#, "norm_position"),
        ] {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains(field), "{json}: {err}");
        }
    }

    #[test]
    fn mini_bert_round_trips_through_json() {
        let cfg = BertConfig::mini_bert_seed();
        let json = cfg.to_json().to_string();
        assert_eq!(parse(&json).unwrap(), cfg);
    }

    #[test]
    fn head_options_are_read_and_checked() {
        let cfg = parse(
            r#"{"problem_type": "multi_label_classification", "classifier_dropout": 0.3, "num_labels": 3}"#,
        )
        .unwrap();
        assert_eq!(
            cfg.problem_type,
            Some(ProblemType::MultiLabelClassification)
        );
        assert_eq!(cfg.classifier_dropout, Some(0.3));
        assert_eq!(cfg.num_labels(), 3);
        assert_eq!(cfg.label_name(2), "LABEL_2");
        let back = parse(&cfg.to_json().to_string()).unwrap();
        assert_eq!(back.problem_type, cfg.problem_type);
        assert_eq!(back.classifier_dropout, cfg.classifier_dropout);
        assert_eq!(back.id2label, cfg.id2label);
        for (json, field) in [
            (r#"{"problem_type": "ranking"}"#, "problem_type"),
            (r#"{"classifier_dropout": 1.5}"#, "classifier_dropout"),
            (r#"{"id2label": {"0": "A", "2": "C"}}"#, "id2label"),
        ] {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains(field), "{json}: {err}");
        }
        assert_eq!(parse("{}").unwrap().num_labels(), 2);
    }

    #[test]
    fn family_configs_read_their_own_keys_and_round_trip() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny");
        for name in [
            "roberta-mlm",
            "distilbert-mlm",
            "albert-mlm",
            "deberta-v2-mlm",
        ] {
            let cfg = BertConfig::from_file(&dir.join(name).join("config.json")).unwrap();
            assert_eq!(cfg.hidden_size, 32, "{name}");
            assert_eq!(cfg.num_attention_heads, 4, "{name}");
            assert_eq!(cfg.intermediate_size, 37, "{name}");
            let back = parse(&cfg.to_json().to_string()).unwrap();
            assert_eq!(back, cfg, "{name}");
        }
        let distil = parse(r#"{"model_type": "distilbert", "dim": 64, "n_layers": 3, "n_heads": 2, "hidden_dim": 99, "activation": "relu"}"#).unwrap();
        assert_eq!(
            (
                distil.hidden_size,
                distil.num_hidden_layers,
                distil.num_attention_heads,
                distil.intermediate_size
            ),
            (64, 3, 2, 99)
        );
        assert_eq!(distil.hidden_act, Activation::Relu);
        assert_eq!(distil.type_vocab_size, 0);
        let roberta =
            parse(r#"{"model_type": "roberta", "max_position_embeddings": 514}"#).unwrap();
        assert_eq!(roberta.pad_token_id, 1);
        assert_eq!(roberta.max_sequence_length(), 512);
        let albert = parse(r#"{"model_type": "albert"}"#).unwrap();
        assert_eq!(albert.hidden_act, Activation::GeluTanh);
        assert_eq!(albert.embedding_size(), 128);
        let deberta = parse(r#"{"model_type": "deberta-v2", "relative_attention": true, "pos_att_type": "p2c|c2p", "position_buckets": 256, "hidden_size": 64, "num_attention_heads": 4}"#).unwrap();
        let Family::DebertaV2(o) = &deberta.family else {
            panic!("not deberta")
        };
        assert!(o.c2p && o.p2c && !o.share_att_key);
        assert_eq!((o.att_span(), o.max_relative_positions), (256, 512));
        for (json, field) in [
            (
                r#"{"model_type": "distilbert", "activation": "swish"}"#,
                "activation",
            ),
            (r#"{"model_type": "distilbert", "dim": "wide"}"#, "dim"),
            (
                r#"{"model_type": "albert", "num_hidden_groups": 0}"#,
                "num_hidden_groups",
            ),
            (
                r#"{"model_type": "deberta-v2", "pos_att_type": ["p2p"]}"#,
                "pos_att_type",
            ),
            (
                r#"{"model_type": "deberta-v2", "conv_kernel_size": 3}"#,
                "conv_kernel_size",
            ),
            (
                r#"{"model_type": "roberta", "max_position_embeddings": 2}"#,
                "max_position_embeddings",
            ),
        ] {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains(field), "{json}: {err}");
        }
    }

    #[test]
    fn id2label_keys_become_integers() {
        let cfg = parse(r#"{"id2label": {"0": "NEG", "1": "POS"}}"#).unwrap();
        assert_eq!(cfg.id2label.get(&1).map(String::as_str), Some("POS"));
    }
}
