//! ModernBERT's own `config.json` keys (`model_type` `modernbert`), read
//! in both layouts transformers accepts:
//!
//! - transformers 5's: `layer_types` (one `full_attention` or
//!   `sliding_attention` per layer) and `rope_parameters`
//!   (`{full_attention: {rope_theta}, sliding_attention: {rope_theta}}`);
//! - the released checkpoints': `global_attn_every_n_layers` (layer i is
//!   global iff i % n == 0), `global_rope_theta`, `local_rope_theta`.
//!
//! Where both are present, transformers 5 lets the new keys win, and so
//! do we. A config is written back in transformers 5's layout, with the
//! legacy theta keys beside it so that transformers 4 reads the same
//! model (see [`ModernBertOptions::write`]).
//!
//! ModernBERT also spells four common keys its own way (`hidden_activation`,
//! `norm_eps`, `mlp_dropout`, `attention_dropout`): [`common_key`] maps
//! BERT's names to them.

use std::path::Path;

use serde_json::{Map, Value};

use super::read::FieldReader;
use super::{Activation, BertConfig};
use crate::error::{Error, Result};

/// What one layer's attention sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// `full_attention`: every token, RoPE with the global theta.
    Full,
    /// `sliding_attention`: tokens within `local_attention / 2` positions,
    /// RoPE with the local theta.
    Sliding,
}

impl AttentionKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full_attention",
            Self::Sliding => "sliding_attention",
        }
    }
}

/// How the sequence classifier pools the last hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassifierPooling {
    /// The first token.
    Cls,
    /// The mean over attended tokens.
    Mean,
}

impl ClassifierPooling {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Mean => "mean",
        }
    }
}

/// ModernBERT's own `config.json` keys, resolved as transformers does.
#[derive(Debug, Clone, PartialEq)]
pub struct ModernBertOptions {
    /// One per layer.
    pub layer_types: Vec<AttentionKind>,
    /// The legacy key, kept to write back (transformers 5 writes it too).
    pub global_attn_every_n_layers: usize,
    /// RoPE base of the full-attention layers.
    pub global_rope_theta: f64,
    /// RoPE base of the sliding-window layers.
    pub local_rope_theta: f64,
    /// The whole window: a sliding layer's token sees positions within
    /// `local_attention / 2` of its own.
    pub local_attention: usize,
    /// Biases of every LayerNorm.
    pub norm_bias: bool,
    /// Biases of `Wqkv` and `Wo`.
    pub attention_bias: bool,
    /// Biases of `mlp.Wi` and `mlp.Wo`.
    pub mlp_bias: bool,
    pub embedding_dropout: f64,
    pub classifier_pooling: ClassifierPooling,
    /// The activation of the heads' `head.dense`.
    pub classifier_activation: Activation,
    /// Bias of the heads' `head.dense`.
    pub classifier_bias: bool,
    /// Bias of the MLM `decoder`.
    pub decoder_bias: bool,
    /// transformers' MLM returns logits of the labelled tokens only; the
    /// loss is the same. Kept to write back.
    pub sparse_prediction: bool,
    pub initializer_cutoff_factor: f64,
    /// `cls_token_id`, `sep_token_id`, `bos_token_id`, `eos_token_id`:
    /// no effect on the numbers, kept to write back.
    pub special_ids: [Option<u32>; 4],
}

const SPECIAL_ID_KEYS: [&str; 4] = [
    "cls_token_id",
    "sep_token_id",
    "bos_token_id",
    "eos_token_id",
];

impl ModernBertOptions {
    /// The window half-width: `|i − j| ≤ local_attention / 2`.
    pub fn half_window(&self) -> usize {
        self.local_attention / 2
    }

    /// The RoPE base of layer `i`.
    pub fn rope_theta(&self, i: usize) -> f64 {
        match self.layer_types[i] {
            AttentionKind::Full => self.global_rope_theta,
            AttentionKind::Sliding => self.local_rope_theta,
        }
    }

    /// Reads the keys from `r`; `num_hidden_layers` sizes the legacy
    /// layout's layer pattern.
    pub(super) fn read(r: &FieldReader, num_hidden_layers: usize) -> Result<Self> {
        let origin = r.origin;
        let every: usize = r.get("global_attn_every_n_layers", 3)?;
        if every == 0 {
            return Err(Error::config(
                origin,
                "global_attn_every_n_layers",
                "must be greater than 0",
            ));
        }
        let layer_types = match r.get::<Option<Vec<String>>>("layer_types", None)? {
            Some(names) => read_layer_types(&names, num_hidden_layers, origin)?,
            None => (0..num_hidden_layers)
                .map(|i| match i % every {
                    0 => AttentionKind::Full,
                    _ => AttentionKind::Sliding,
                })
                .collect(),
        };
        let legacy_global: f64 = r.get("global_rope_theta", 160_000.0)?;
        let legacy_local: f64 = r.get("local_rope_theta", 10_000.0)?;
        let rope: Map<String, Value> = r.get("rope_parameters", Map::new())?;
        if r.map.get("rope_scaling").is_some_and(|v| !v.is_null()) {
            return Err(Error::config(
                origin,
                "rope_scaling",
                "RoPE scaling is not supported (only the default RoPE)",
            ));
        }
        let pooling: String = r.get("classifier_pooling", "cls".to_string())?;
        let classifier_pooling = match pooling.as_str() {
            "cls" => ClassifierPooling::Cls,
            "mean" => ClassifierPooling::Mean,
            other => {
                return Err(Error::config(
                    origin,
                    "classifier_pooling",
                    format!("`{other}` is not one of `cls`, `mean`"),
                ))
            }
        };
        let act_name: String = r.get("classifier_activation", "gelu".to_string())?;
        let classifier_activation = Activation::parse(&act_name).ok_or_else(|| {
            Error::config(
                origin,
                "classifier_activation",
                format!("`{act_name}` is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu)"),
            )
        })?;
        let mut special_ids = [None; 4];
        for (slot, key) in special_ids.iter_mut().zip(SPECIAL_ID_KEYS) {
            *slot = r.get::<Option<u32>>(key, None)?;
        }
        Ok(Self {
            layer_types,
            global_attn_every_n_layers: every,
            global_rope_theta: rope_theta(&rope, AttentionKind::Full, legacy_global, origin)?,
            local_rope_theta: rope_theta(&rope, AttentionKind::Sliding, legacy_local, origin)?,
            local_attention: r.get("local_attention", 128)?,
            norm_bias: r.get("norm_bias", false)?,
            attention_bias: r.get("attention_bias", false)?,
            mlp_bias: r.get("mlp_bias", false)?,
            embedding_dropout: r.get("embedding_dropout", 0.0)?,
            classifier_pooling,
            classifier_activation,
            classifier_bias: r.get("classifier_bias", false)?,
            decoder_bias: r.get("decoder_bias", true)?,
            sparse_prediction: r.get("sparse_prediction", false)?,
            initializer_cutoff_factor: r.get("initializer_cutoff_factor", 2.0)?,
            special_ids,
        })
    }

    /// The checks between fields: RoPE needs an even head width, a
    /// positive base; dropout rates in [0, 1).
    pub(super) fn validate(&self, cfg: &BertConfig, origin: &Path) -> Result<()> {
        if !cfg.head_dim().is_multiple_of(2) {
            return Err(Error::config(
                origin,
                "num_attention_heads",
                format!(
                    "head width {} is odd: rotary embeddings need an even one",
                    cfg.head_dim()
                ),
            ));
        }
        for (field, theta) in [
            ("global_rope_theta", self.global_rope_theta),
            ("local_rope_theta", self.local_rope_theta),
        ] {
            if theta.is_nan() || theta <= 0.0 {
                return Err(Error::config(
                    origin,
                    field,
                    format!("{theta} is not a positive RoPE base"),
                ));
            }
        }
        if !(0.0..1.0).contains(&self.embedding_dropout) {
            return Err(Error::config(
                origin,
                "embedding_dropout",
                format!("{} is not in [0, 1)", self.embedding_dropout),
            ));
        }
        if self.layer_types.len() != cfg.num_hidden_layers {
            return Err(Error::config(
                origin,
                "layer_types",
                format!(
                    "{} entries for {} layers",
                    self.layer_types.len(),
                    cfg.num_hidden_layers
                ),
            ));
        }
        Ok(())
    }

    /// Rewrites BERT's keys in `m` (as [`BertConfig::to_json`] puts them)
    /// into ModernBERT's: transformers 5's layout (`layer_types`,
    /// `rope_parameters`, `global_attn_every_n_layers`), plus
    /// `global_rope_theta` / `local_rope_theta`, which transformers 5
    /// ignores beside `rope_parameters` and transformers 4 reads.
    pub(super) fn write(&self, m: &mut Map<String, Value>) {
        for (bert, modern) in COMMON_KEYS {
            if let Some(v) = m.remove(bert) {
                m.insert(modern.to_string(), v);
            }
        }
        // A config without `architectures` is a bare encoder.
        if m.get("architectures") == Some(&serde_json::json!(["BertModel"])) {
            m.insert(
                "architectures".into(),
                serde_json::json!(["ModernBertModel"]),
            );
        }
        // BERT's keys and bertha's pre-LN spelling mean nothing here.
        for k in [
            "type_vocab_size",
            "position_embedding_type",
            "norm_position",
            "final_layer_norm",
            "add_pooling_layer",
        ] {
            m.remove(k);
        }
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        let types: Vec<Value> = self.layer_types.iter().map(|t| t.name().into()).collect();
        put("layer_types", types.into());
        let rope = |theta: f64| serde_json::json!({"rope_theta": theta, "rope_type": "default"});
        put(
            "rope_parameters",
            serde_json::json!({
                "full_attention": rope(self.global_rope_theta),
                "sliding_attention": rope(self.local_rope_theta),
            }),
        );
        put("global_rope_theta", self.global_rope_theta.into());
        put("local_rope_theta", self.local_rope_theta.into());
        put(
            "global_attn_every_n_layers",
            self.global_attn_every_n_layers.into(),
        );
        put("local_attention", self.local_attention.into());
        put("norm_bias", self.norm_bias.into());
        put("attention_bias", self.attention_bias.into());
        put("mlp_bias", self.mlp_bias.into());
        put("embedding_dropout", self.embedding_dropout.into());
        put("classifier_pooling", self.classifier_pooling.name().into());
        put(
            "classifier_activation",
            self.classifier_activation.name().into(),
        );
        put("classifier_bias", self.classifier_bias.into());
        put("decoder_bias", self.decoder_bias.into());
        put("sparse_prediction", self.sparse_prediction.into());
        put(
            "initializer_cutoff_factor",
            self.initializer_cutoff_factor.into(),
        );
        for (id, key) in self.special_ids.iter().zip(SPECIAL_ID_KEYS) {
            if let Some(id) = id {
                put(key, (*id).into());
            }
        }
    }
}

/// BERT's name of a common key → ModernBERT's.
const COMMON_KEYS: [(&str, &str); 4] = [
    ("hidden_act", "hidden_activation"),
    ("layer_norm_eps", "norm_eps"),
    ("hidden_dropout_prob", "mlp_dropout"),
    ("attention_probs_dropout_prob", "attention_dropout"),
];

/// ModernBERT's spelling of a common BERT key.
pub(super) fn common_key(bert: &'static str) -> &'static str {
    COMMON_KEYS
        .iter()
        .find(|(b, _)| *b == bert)
        .map_or(bert, |(_, modern)| modern)
}

impl BertConfig {
    /// A ModernBERT of the given shape with transformers' defaults
    /// otherwise (global attention every third layer, window 128, RoPE
    /// bases 160,000 / 10,000, no biases, GELU), for pre-training from
    /// scratch; `pad_token_id` 0, as bertha's WordPiece vocabularies have
    /// `[PAD]` first.
    pub fn modernbert(
        vocab_size: usize,
        (layers, hidden, heads, intermediate): (usize, usize, usize, usize),
        max_positions: usize,
    ) -> Self {
        let every = 3;
        let options = ModernBertOptions {
            layer_types: (0..layers)
                .map(|i| {
                    if i % every == 0 {
                        AttentionKind::Full
                    } else {
                        AttentionKind::Sliding
                    }
                })
                .collect(),
            global_attn_every_n_layers: every,
            global_rope_theta: 160_000.0,
            local_rope_theta: 10_000.0,
            local_attention: 128,
            norm_bias: false,
            attention_bias: false,
            mlp_bias: false,
            embedding_dropout: 0.0,
            classifier_pooling: ClassifierPooling::Cls,
            classifier_activation: Activation::Gelu,
            classifier_bias: false,
            decoder_bias: true,
            sparse_prediction: false,
            initializer_cutoff_factor: 2.0,
            special_ids: [None; 4],
        };
        Self {
            model_type: "modernbert".into(),
            family: super::Family::ModernBert(options),
            vocab_size,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            intermediate_size: intermediate,
            max_position_embeddings: max_positions,
            pad_token_id: 0,
            ..defaults(Self::default())
        }
    }
}

/// transformers' `ModernBertConfig` defaults for the common keys
/// (ModernBERT-base). BERT's layer-shape keys (`norm_position`,
/// `final_layer_norm`) keep BERT's values: ModernBERT's own layers do not
/// read them.
pub(super) fn defaults(d: BertConfig) -> BertConfig {
    BertConfig {
        vocab_size: 50368,
        hidden_size: 768,
        num_hidden_layers: 22,
        num_attention_heads: 12,
        intermediate_size: 1152,
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        max_position_embeddings: 8192,
        type_vocab_size: 0,
        layer_norm_eps: 1e-5,
        pad_token_id: 50283,
        add_pooling_layer: false,
        classifier_dropout: Some(0.0),
        ..d
    }
}

fn read_layer_types(names: &[String], layers: usize, origin: &Path) -> Result<Vec<AttentionKind>> {
    if names.len() != layers {
        return Err(Error::config(
            origin,
            "layer_types",
            format!("{} entries for num_hidden_layers {layers}", names.len()),
        ));
    }
    names
        .iter()
        .map(|n| match n.as_str() {
            "full_attention" => Ok(AttentionKind::Full),
            "sliding_attention" => Ok(AttentionKind::Sliding),
            other => Err(Error::config(
                origin,
                "layer_types",
                format!("`{other}` is not one of `full_attention`, `sliding_attention`"),
            )),
        })
        .collect()
}

/// `rope_parameters[kind].rope_theta`, else the legacy key's value; only
/// the default RoPE (no scaling) is supported.
fn rope_theta(
    rope: &Map<String, Value>,
    kind: AttentionKind,
    legacy: f64,
    origin: &Path,
) -> Result<f64> {
    let Some(entry) = rope.get(kind.name()).filter(|v| !v.is_null()) else {
        return Ok(legacy);
    };
    let field = format!("rope_parameters.{}", kind.name());
    let Value::Object(entry) = entry else {
        return Err(Error::config(
            origin,
            &field,
            format!("expected an object, got {entry}"),
        ));
    };
    match entry.get("rope_type").and_then(Value::as_str) {
        None | Some("default") => {}
        Some(other) => {
            return Err(Error::config(
                origin,
                &field,
                format!("rope_type `{other}` is not supported (only `default`)"),
            ))
        }
    }
    match entry.get("rope_theta") {
        None | Some(Value::Null) => Ok(legacy),
        Some(v) => v.as_f64().ok_or_else(|| {
            Error::config(
                origin,
                &field,
                format!("rope_theta is not a number (got {v})"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;

    fn parse(json: &str) -> Result<BertConfig> {
        BertConfig::from_json_str(json, Path::new("config.json"))
    }

    fn options(cfg: &BertConfig) -> &ModernBertOptions {
        match &cfg.family {
            Family::ModernBert(o) => o,
            other => panic!("not ModernBERT: {other:?}"),
        }
    }

    #[test]
    fn defaults_are_modernbert_base() {
        let cfg = parse(r#"{"model_type": "modernbert"}"#).unwrap();
        assert_eq!(
            (
                cfg.vocab_size,
                cfg.hidden_size,
                cfg.num_hidden_layers,
                cfg.intermediate_size
            ),
            (50368, 768, 22, 1152)
        );
        assert_eq!(
            (cfg.pad_token_id, cfg.max_position_embeddings),
            (50283, 8192)
        );
        assert_eq!(cfg.layer_norm_eps, 1e-5);
        let o = options(&cfg);
        assert_eq!(
            (o.global_rope_theta, o.local_rope_theta),
            (160_000.0, 10_000.0)
        );
        assert_eq!((o.local_attention, o.half_window()), (128, 64));
        assert_eq!(o.classifier_pooling, ClassifierPooling::Cls);
        assert!(!o.norm_bias && !o.attention_bias && !o.mlp_bias && o.decoder_bias);
        // Global every third layer, from layer 0.
        let full: Vec<usize> = (0..22)
            .filter(|&i| o.layer_types[i] == AttentionKind::Full)
            .collect();
        assert_eq!(full, vec![0, 3, 6, 9, 12, 15, 18, 21]);
        assert_eq!(o.rope_theta(3), 160_000.0);
        assert_eq!(o.rope_theta(4), 10_000.0);
        assert_eq!(
            cfg.to_json()["architectures"],
            serde_json::json!(["ModernBertModel"])
        );
    }

    #[test]
    fn common_keys_use_modernbert_names() {
        let cfg = parse(
            r#"{"model_type": "modernbert", "architectures": ["ModernBertModel"],
                "hidden_activation": "gelu_pytorch_tanh", "norm_eps": 1e-6,
                "mlp_dropout": 0.1, "attention_dropout": 0.2, "num_hidden_layers": 4}"#,
        )
        .unwrap();
        assert_eq!(cfg.hidden_act, Activation::GeluTanh);
        assert_eq!(cfg.layer_norm_eps, 1e-6);
        assert_eq!(
            (cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob),
            (0.1, 0.2)
        );
        let json = cfg.to_json();
        for key in [
            "hidden_activation",
            "norm_eps",
            "mlp_dropout",
            "attention_dropout",
            "layer_types",
        ] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        for key in [
            "hidden_act",
            "layer_norm_eps",
            "type_vocab_size",
            "norm_position",
        ] {
            assert!(json.get(key).is_none(), "{key} written: {json}");
        }
        assert_eq!(parse(&json.to_string()).unwrap(), cfg);
    }

    /// transformers 5's keys win over the legacy ones when both are given.
    #[test]
    fn new_layout_wins_over_the_legacy_keys() {
        let cfg = parse(
            r#"{"model_type": "modernbert", "num_hidden_layers": 3, "global_attn_every_n_layers": 3,
                "layer_types": ["sliding_attention", "full_attention", "full_attention"],
                "global_rope_theta": 1.0, "local_rope_theta": 2.0,
                "rope_parameters": {"full_attention": {"rope_theta": 5.0, "rope_type": "default"},
                                    "sliding_attention": {"rope_theta": 7.0}}}"#,
        )
        .unwrap();
        let o = options(&cfg);
        use AttentionKind::{Full, Sliding};
        assert_eq!(o.layer_types, vec![Sliding, Full, Full]);
        assert_eq!((o.global_rope_theta, o.local_rope_theta), (5.0, 7.0));
        let legacy = parse(r#"{"model_type": "modernbert", "num_hidden_layers": 5, "global_attn_every_n_layers": 2}"#).unwrap();
        assert_eq!(
            options(&legacy).layer_types,
            vec![Full, Sliding, Full, Sliding, Full]
        );
    }

    /// The pre-training shape is a valid config that round-trips.
    #[test]
    fn a_shaped_modernbert_is_valid_and_round_trips() {
        let cfg = BertConfig::modernbert(1000, (4, 256, 4, 384), 512);
        cfg.validate(Path::new("preset")).unwrap();
        assert_eq!(
            parse(&cfg.to_json().to_string()).unwrap(),
            BertConfig {
                architectures: vec!["ModernBertModel".into()],
                ..cfg.clone()
            }
        );
        let full: Vec<bool> = options(&cfg)
            .layer_types
            .iter()
            .map(|t| *t == AttentionKind::Full)
            .collect();
        assert_eq!(full, vec![true, false, false, true]);
    }

    #[test]
    fn bad_values_name_their_field() {
        for (json, field) in [
            (r#"{"classifier_pooling": "max"}"#, "classifier_pooling"),
            (
                r#"{"classifier_activation": "swish"}"#,
                "classifier_activation",
            ),
            (r#"{"hidden_activation": "silu"}"#, "hidden_activation"),
            (
                r#"{"global_attn_every_n_layers": 0}"#,
                "global_attn_every_n_layers",
            ),
            (
                r#"{"num_hidden_layers": 2, "layer_types": ["full_attention"]}"#,
                "layer_types",
            ),
            (
                r#"{"num_hidden_layers": 1, "layer_types": ["chunked_attention"]}"#,
                "layer_types",
            ),
            (
                r#"{"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}}"#,
                "rope_parameters.full_attention",
            ),
            (
                r#"{"rope_parameters": {"sliding_attention": {"rope_theta": "big"}}}"#,
                "rope_parameters.sliding_attention",
            ),
            (
                r#"{"rope_scaling": {"type": "linear", "factor": 2.0}}"#,
                "rope_scaling",
            ),
            (r#"{"local_rope_theta": -1.0}"#, "local_rope_theta"),
            (
                r#"{"hidden_size": 36, "num_attention_heads": 4}"#,
                "num_attention_heads",
            ),
            (r#"{"embedding_dropout": 1.0}"#, "embedding_dropout"),
            (r#"{"norm_bias": "yes"}"#, "norm_bias"),
        ] {
            let json = json.replacen('{', r#"{"model_type": "modernbert", "#, 1);
            let err = parse(&json).unwrap_err().to_string();
            assert!(err.contains(field), "{json}: {err}");
        }
    }
}
