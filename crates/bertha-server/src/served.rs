//! The models one server serves (`--model NAME=DIR`, repeatable). TEI
//! serves one model per process; users asked for several, so each model
//! here is a whole [`AppState`] (its weights, batcher, admission limit and
//! metrics) under `/models/NAME/...`, and the first is also served at the
//! top level, where TEI's clients look. OpenAI's `model` field picks one
//! on `/v1/embeddings`; `/info` and `/v1/models` list them all.

use std::sync::Arc;

use axum::http::StatusCode;
use prometheus_client::registry::Registry;

use crate::error::ApiError;
use crate::state::AppState;

pub struct Served {
    models: Vec<Arc<AppState>>,
    /// Every model's metrics under its `model` label; `None` for one model,
    /// whose metrics print unlabelled as before.
    registry: Option<Registry>,
}

impl Served {
    /// One model, served at the top level (and under `/models/NAME`).
    pub fn one(state: Arc<AppState>) -> Self {
        Self {
            models: vec![state],
            registry: None,
        }
    }

    /// Several models, the first the default. Names must be unique and fit
    /// in a URL path; the server-wide settings (API key, payload limit,
    /// connections) must agree, since one listener applies them to all.
    pub fn new(models: Vec<Arc<AppState>>) -> bertha::Result<Self> {
        let Some(first) = models.first() else {
            return Err(bertha::Error::option("model", "no model to serve"));
        };
        for (i, m) in models.iter().enumerate() {
            check_name(&m.config.model_id)?;
            if models[..i]
                .iter()
                .any(|o| o.config.model_id == m.config.model_id)
            {
                return Err(bertha::Error::option(
                    "model",
                    format!(
                        "the name `{}` is given to two models: give each its own (NAME=DIR)",
                        m.config.model_id
                    ),
                ));
            }
            // `a` and `a/embed` would both claim `/models/a/embed` (the
            // router panicked on the overlap after "serving on").
            if let Some(o) = models[..i].iter().find(|o| {
                let (x, y) = (&o.config.model_id, &m.config.model_id);
                y.starts_with(&format!("{x}/")) || x.starts_with(&format!("{y}/"))
            }) {
                let (x, y) = (&o.config.model_id, &m.config.model_id);
                let (short, long) = if x.len() < y.len() { (x, y) } else { (y, x) };
                return Err(bertha::Error::option(
                    "model",
                    format!(
                        "the names `{short}` and `{long}` overlap: /models/{long}/ lies inside \
                         /models/{short}/ (whose routes are /models/{short}/embed, /health, \
                         ...): give names where neither is the other followed by `/`"
                    ),
                ));
            }
            let (a, b) = (&first.config, &m.config);
            if a.api_key != b.api_key
                || a.payload_limit != b.payload_limit
                || a.connections != b.connections
            {
                return Err(bertha::Error::option(
                    "model",
                    format!(
                        "`{}` has server-wide settings (API key, payload limit, connections) \
                         other than `{}`'s: one server applies one set to every model",
                        b.model_id, a.model_id
                    ),
                ));
            }
        }
        let registry = (models.len() > 1).then(|| {
            let mut registry = Registry::with_prefix("bertha");
            for m in &models {
                let labelled = registry
                    .sub_registry_with_label(("model".into(), m.config.model_id.clone().into()));
                m.metrics.register(labelled);
            }
            registry
        });
        Ok(Self { models, registry })
    }

    /// The first model: TEI's routes at the top level serve it.
    pub fn default_model(&self) -> &Arc<AppState> {
        &self.models[0]
    }

    pub fn models(&self) -> &[Arc<AppState>] {
        &self.models
    }

    /// The model OpenAI's `model` field names. With one model any name
    /// (or none) is that model, as TEI answers whatever `model` a client
    /// sends; with several, no name is the default and an unknown name is
    /// a 404 listing the served ones (a typo must not pick another model).
    pub fn pick(&self, name: Option<&str>) -> Result<&Arc<AppState>, ApiError> {
        if self.models.len() == 1 {
            return Ok(self.default_model());
        }
        let Some(name) = name else {
            return Ok(self.default_model());
        };
        self.models
            .iter()
            .find(|m| m.config.model_id == name)
            .ok_or_else(|| model_not_found(name, self))
    }

    /// The Prometheus text of every model's metrics.
    pub fn render_metrics(&self) -> String {
        match &self.registry {
            None => self.default_model().metrics.render(),
            Some(registry) => {
                let mut out = String::new();
                // Writing into a String cannot fail.
                let _ = prometheus_client::encoding::text::encode(&mut out, registry);
                out
            }
        }
    }
}

fn model_not_found(name: &str, served: &Served) -> ApiError {
    let names: Vec<&str> = served
        .models
        .iter()
        .map(|m| m.config.model_id.as_str())
        .collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        error_type: "ModelNotFound",
        message: format!(
            "model `{}` is not served here; served: {}",
            shown(name),
            names.join(", ")
        ),
    }
}

/// A client's name as an error message shows it: at most 64 characters
/// (a 100 KB name is not echoed whole).
fn shown(name: &str) -> String {
    const MAX: usize = 64;
    match name.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}… ({} bytes)", &name[..at], name.len()),
        None => name.to_string(),
    }
}

/// A model name becomes a path prefix (`/models/NAME/embed`): ASCII
/// letters, digits, `-`, `_`, `.` and `/` between non-empty segments
/// (`org/name`, as Hugging Face names models), no `.` or `..` segment.
pub fn check_name(name: &str) -> bertha::Result<()> {
    let bad = |why: &str| {
        Err(bertha::Error::option(
            "model",
            format!("the model name `{name}` {why}"),
        ))
    };
    if name.is_empty() {
        return bad("is empty");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_./".contains(*c)))
    {
        return bad(&format!(
            "has `{c}`: use letters, digits, `-`, `_`, `.` and `/`"
        ));
    }
    if name
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return bad("has an empty, `.` or `..` path segment");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_name, shown};

    #[test]
    fn long_names_are_shown_cut() {
        let long = "x".repeat(100_000);
        let s = shown(&long);
        assert!(s.len() < 100, "{}", s.len());
        assert!(s.ends_with("… (100000 bytes)"), "{s}");
        assert_eq!(shown("minilm"), "minilm");
    }

    #[test]
    fn model_names_fit_a_path() {
        for ok in [
            "minilm",
            "sentence-transformers/all-MiniLM-L6-v2",
            "a.b_c-1",
        ] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "/a", "a/", "a//b", "../a", "a/./b", "a?b", "é"] {
            let e = check_name(bad).unwrap_err().to_string();
            assert!(e.contains("model name"), "{bad}: {e}");
        }
    }
}
