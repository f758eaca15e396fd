//! ELECTRA's `summary_*` keys: how `ElectraSequenceSummary` (the
//! `sequence_summary` module of `ElectraForMultipleChoice`) makes one
//! vector of a sequence's states.
//!
//! The keys are kept as `config.json` spells them and interpreted only
//! when the multiple-choice head is built ([`SummaryOptions::resolve`]),
//! as transformers does: a value the module cannot run (`attn`) does not
//! stop an ELECTRA sequence classifier from loading.

use std::path::Path;

use serde_json::{Map, Value};

use super::read::FieldReader;
use super::Activation;
use crate::error::{Error, Result};

/// The `summary_*` keys, with `ElectraConfig`'s defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryOptions {
    /// `summary_type`: `first` (ELECTRA's default), `last`, `mean`,
    /// `cls_index`, `attn`.
    pub summary_type: String,
    /// `summary_use_proj`: a linear layer (`sequence_summary.summary`)
    /// after the token is picked.
    pub use_proj: bool,
    /// `summary_proj_to_labels`: the layer maps to `num_labels` features
    /// instead of `hidden_size` (absent from `ElectraConfig`: false).
    pub proj_to_labels: bool,
    /// `summary_activation`: a transformers activation name; empty (or
    /// `null`, transformers 4's spelling) for none.
    pub activation: String,
    /// `summary_first_dropout`, before the layer (absent: none).
    pub first_dropout: f64,
    /// `summary_last_dropout`, after the activation.
    pub last_dropout: f64,
}

impl Default for SummaryOptions {
    /// `ElectraConfig`'s.
    fn default() -> Self {
        Self {
            summary_type: "first".into(),
            use_proj: true,
            proj_to_labels: false,
            activation: "gelu".into(),
            first_dropout: 0.0,
            last_dropout: 0.1,
        }
    }
}

/// Which state of a sequence the summary reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryToken {
    /// The first token's (`first`).
    First,
    /// The last row's, padding or not (`last`; `cls_index` without an
    /// index, as `ElectraForMultipleChoice` calls it).
    Last,
    /// The mean over every row, padding included (`mean`).
    Mean,
}

/// The summary module the keys build: pick a state, dropout
/// (`first_dropout`), the optional linear layer, the optional activation,
/// then dropout (`last_dropout`) before the classifier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SummarySpec {
    pub token: SummaryToken,
    /// `sequence_summary.summary`, `hidden_size` → `hidden_size`.
    pub projection: bool,
    pub activation: Option<Activation>,
    /// 0 for none (transformers applies none for rates ≤ 0).
    pub first_dropout: f64,
    pub last_dropout: f64,
}

impl SummaryOptions {
    pub(super) fn read(r: &FieldReader) -> Result<Self> {
        let d = Self::default();
        let activation = match r.map.get("summary_activation") {
            // transformers 4 wrote `None` for no activation.
            Some(Value::Null) => String::new(),
            _ => r.get("summary_activation", d.activation)?,
        };
        Ok(Self {
            summary_type: r.get("summary_type", d.summary_type)?,
            use_proj: r.get("summary_use_proj", d.use_proj)?,
            proj_to_labels: r.get("summary_proj_to_labels", d.proj_to_labels)?,
            activation,
            first_dropout: r.get("summary_first_dropout", d.first_dropout)?,
            last_dropout: r.get("summary_last_dropout", d.last_dropout)?,
        })
    }

    /// The keys, as `ElectraConfig` writes them (the two it lacks only
    /// when they change something).
    pub(super) fn write(&self, m: &mut Map<String, Value>) {
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("summary_type", self.summary_type.clone().into());
        put("summary_use_proj", self.use_proj.into());
        put("summary_activation", self.activation.clone().into());
        put("summary_last_dropout", self.last_dropout.into());
        if self.first_dropout != 0.0 {
            put("summary_first_dropout", self.first_dropout.into());
        }
        if self.proj_to_labels {
            put("summary_proj_to_labels", true.into());
        }
    }

    /// The module `ElectraForMultipleChoice` builds from the keys, for a
    /// model `hidden_size` wide with `num_labels` labels; an error naming
    /// the key (in `origin`) that it cannot run.
    pub fn resolve(
        &self,
        hidden_size: usize,
        num_labels: usize,
        origin: &Path,
    ) -> Result<SummarySpec> {
        let bad = |field: &str, reason: String| Error::config(origin, field, reason);
        let token = match self.summary_type.as_str() {
            "first" => SummaryToken::First,
            "last" | "cls_index" => SummaryToken::Last,
            "mean" => SummaryToken::Mean,
            "attn" => {
                return Err(bad(
                    "summary_type",
                    "`attn` is not supported (transformers does not implement it either)".into(),
                ))
            }
            other => {
                return Err(bad(
                    "summary_type",
                    format!("`{other}` is not one of `first`, `last`, `mean`, `cls_index`"),
                ))
            }
        };
        if self.use_proj && self.proj_to_labels && num_labels > 0 && num_labels != hidden_size {
            return Err(bad(
                "summary_proj_to_labels",
                format!(
                    "true maps the summary to num_labels ({num_labels}) features, but \
                     ElectraForMultipleChoice's classifier reads hidden_size ({hidden_size})"
                ),
            ));
        }
        // `hidden_act`'s names, and the others transformers' activation
        // table gives a summary.
        let activation = match self.activation.as_str() {
            "" | "linear" => None,
            "gelu_python" => Some(Activation::Gelu),
            "tanh" => Some(Activation::Tanh),
            other => Some(Activation::parse(other).ok_or_else(|| {
                bad(
                    "summary_activation",
                    format!(
                        "`{other}` is not supported (supported: gelu, gelu_new, \
                         gelu_pytorch_tanh, relu, tanh, linear, or none)"
                    ),
                )
            })?),
        };
        let rate = |field: &str, p: f64| -> Result<f64> {
            if p.is_nan() || p >= 1.0 {
                return Err(bad(field, format!("{p} is not below 1")));
            }
            Ok(p.max(0.0))
        };
        Ok(SummarySpec {
            token,
            projection: self.use_proj,
            activation,
            first_dropout: rate("summary_first_dropout", self.first_dropout)?,
            last_dropout: rate("summary_last_dropout", self.last_dropout)?,
        })
    }
}
