//! The sentence-transformers folder layout: `modules.json` (Transformer →
//! Pooling → optional Normalize), the Pooling module's `config.json`,
//! `sentence_bert_config.json` and `config_sentence_transformers.json`.
//! SparseEncoder folders read too: (MLM)Transformer → SpladePooling, whose
//! `config.json` gives the SPLADE settings.
//!
//! Both layouts read: sentence-transformers 2–5 (legacy `pooling_mode_*`
//! flags, `max_seq_length` in `sentence_bert_config.json`) and 6 (one
//! `pooling_mode`, the length in `tokenizer_config.json`'s
//! `model_max_length`). The writer uses the older spelling, which every
//! version from 3.0 to 6 loads.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::pooling::Pooling;
use crate::splade::SpladeOptions;
use crate::training::checkpoint::write_atomic;

/// What a sentence-transformers folder prescribes beyond the encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentenceTransformerSpec {
    pub pooling: Pooling,
    /// A Normalize module follows the pooling.
    pub normalize: bool,
    /// The Pooling config's `include_prompt`: `false` leaves a prompt's
    /// tokens out of the pooled vector (INSTRUCTOR-style models).
    pub include_prompt: bool,
    /// The truncation length sentence-transformers uses, as the folder
    /// states it (not yet capped at the model's positions).
    pub max_seq_length: Option<usize>,
    /// Prompt name → text prepended to each input.
    pub prompts: BTreeMap<String, String>,
    /// The prompt used when a call names none.
    pub default_prompt_name: Option<String>,
    /// `cosine`, `dot`, `euclidean` or `manhattan`, as the folder says.
    pub similarity_fn_name: Option<String>,
    /// A SparseEncoder's SpladePooling settings (`pooling` is then
    /// [`Pooling::Splade`]).
    pub splade: Option<SpladeOptions>,
}

/// Module types written to `modules.json`: the `sentence_transformers.models`
/// aliases load in every version (6 maps them to its new module paths).
const TRANSFORMER_TYPE: &str = "sentence_transformers.models.Transformer";
const POOLING_TYPE: &str = "sentence_transformers.models.Pooling";
const NORMALIZE_TYPE: &str = "sentence_transformers.models.Normalize";

/// The oldest sentence-transformers that reads every field written here
/// (`similarity_fn_name` came in 3.0): older versions warn when a folder
/// claims a newer one.
const FORMAT_VERSION: &str = "3.0.0";

impl SentenceTransformerSpec {
    /// A spec with no prompts, the prompt included in pooling, no length
    /// of its own and cosine similarity.
    pub fn new(pooling: Pooling, normalize: bool) -> Self {
        Self {
            pooling,
            normalize,
            include_prompt: true,
            max_seq_length: None,
            prompts: BTreeMap::new(),
            default_prompt_name: None,
            similarity_fn_name: Some("cosine".into()),
            splade: None,
        }
    }

    /// Reads the folder's `modules.json` and what it points to.
    /// `Ok(None)` when the folder is a plain transformers checkpoint.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(None);
        }
        let modules = read_json(&modules_path)?;
        let list = modules
            .as_array()
            .ok_or_else(|| Error::config(&modules_path, "<root>", "expected a list of modules"))?;
        // sentence-transformers falls back to mean pooling without a
        // Pooling module.
        let mut spec = Self::new(Pooling::Mean, false);
        spec.similarity_fn_name = None;
        for (i, m) in list.iter().enumerate() {
            let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
            let sub = dir.join(m.get("path").and_then(Value::as_str).unwrap_or_default());
            match ty.rsplit('.').next().unwrap_or_default() {
                // A SparseEncoder's MLMTransformer is a Transformer whose
                // output is the MLM head's logits, which SpladePooling reads.
                "Transformer" | "MLMTransformer" => {}
                "SpladePooling" => {
                    spec.splade = Some(read_splade_config(&sub.join("config.json"))?);
                    spec.pooling = Pooling::Splade;
                }
                "Normalize" => {
                    check_normalize_config(&sub.join("config.json"))?;
                    spec.normalize = true;
                }
                "Pooling" => {
                    (spec.pooling, spec.include_prompt) =
                        read_pooling_config(&sub.join("config.json"))?;
                }
                _ => {
                    return Err(Error::config(
                        &modules_path,
                        format!("[{i}].type"),
                        format!("module `{ty}` is not supported (supported: Transformer, Pooling, Normalize; MLMTransformer, SpladePooling)"),
                    ))
                }
            }
        }
        spec.max_seq_length = max_seq_length(dir)?;
        let config_path = dir.join("config_sentence_transformers.json");
        if config_path.is_file() {
            spec.read_model_config(&config_path)?;
        }
        Ok(Some(spec))
    }

    /// Reads `prompts`, `default_prompt_name` and `similarity_fn_name`
    /// (all optional; `null` is absent).
    fn read_model_config(&mut self, path: &Path) -> Result<()> {
        let v = read_json(path)?;
        let string = |field: &str| -> Result<Option<String>> {
            match v.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(Error::config(
                    path,
                    field,
                    format!("expected a string or null, got {other}"),
                )),
            }
        };
        match v.get("prompts") {
            None | Some(Value::Null) => {}
            Some(Value::Object(prompts)) => {
                for (name, text) in prompts {
                    match text {
                        Value::String(t) => {
                            self.prompts.insert(name.clone(), t.clone());
                        }
                        // sentence-transformers' placeholder for "unset".
                        Value::Null => {}
                        other => {
                            return Err(Error::config(
                                path,
                                format!("prompts.{name}"),
                                format!("expected a string, got {other}"),
                            ))
                        }
                    }
                }
            }
            Some(other) => {
                return Err(Error::config(
                    path,
                    "prompts",
                    format!("expected an object of name → text, got {other}"),
                ))
            }
        }
        self.default_prompt_name = string("default_prompt_name")?;
        if let Some(name) = &self.default_prompt_name {
            if !self.prompts.contains_key(name) {
                return Err(Error::config(
                    path,
                    "default_prompt_name",
                    format!(
                        "`{name}` is not one of the prompts ({})",
                        known_names(&self.prompts)
                    ),
                ));
            }
        }
        self.similarity_fn_name = string("similarity_fn_name")?;
        Ok(())
    }

    /// Writes the sentence-transformers files of a model folder whose
    /// weights, `config.json` and tokenizer are written by the caller:
    /// `modules.json`, `1_Pooling/config.json`, `2_Normalize/config.json`
    /// (when normalising), `sentence_bert_config.json` and
    /// `config_sentence_transformers.json`. `embedding_dim` is the
    /// encoder's hidden size. Each file is written whole (temp + rename);
    /// `modules.json`, which makes the folder a sentence-transformers one,
    /// comes last. A missing `similarity_fn_name` is written as `cosine`.
    pub fn write(&self, dir: &Path, embedding_dim: usize) -> Result<()> {
        let mode_flag = match self.pooling {
            Pooling::Cls => "pooling_mode_cls_token",
            Pooling::Mean => "pooling_mode_mean_tokens",
            Pooling::Max => "pooling_mode_max_tokens",
            Pooling::MeanSqrtLen => "pooling_mode_mean_sqrt_len_tokens",
            Pooling::Pooler | Pooling::None | Pooling::Splade => {
                return Err(Error::option(
                    "pooling",
                    format!(
                    "`{}` is not a sentence-transformers pooling (cls, mean, max or mean_sqrt_len)",
                    self.pooling.name()
                ),
                ))
            }
        };
        if let Some(name) = &self.default_prompt_name {
            if !self.prompts.contains_key(name) {
                return Err(Error::option(
                    "default_prompt_name",
                    format!(
                        "`{name}` is not one of the prompts ({})",
                        known_names(&self.prompts)
                    ),
                ));
            }
        }
        let mut pooling = serde_json::Map::new();
        pooling.insert("word_embedding_dimension".into(), embedding_dim.into());
        for flag in [
            "pooling_mode_cls_token",
            "pooling_mode_mean_tokens",
            "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens",
            "pooling_mode_lasttoken",
        ] {
            pooling.insert(flag.into(), (flag == mode_flag).into());
        }
        pooling.insert("include_prompt".into(), self.include_prompt.into());
        write_json(
            &dir.join("1_Pooling"),
            "config.json",
            &Value::Object(pooling),
        )?;

        let mut modules = vec![
            json!({"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_TYPE}),
            json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING_TYPE}),
        ];
        if self.normalize {
            let config = json!({
                "module_input_name": "sentence_embedding",
                "module_output_name": "sentence_embedding",
            });
            write_json(&dir.join("2_Normalize"), "config.json", &config)?;
            modules.push(
                json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE_TYPE}),
            );
        }

        let mut st_config = json!({"do_lower_case": false});
        if let Some(n) = self.max_seq_length {
            st_config["max_seq_length"] = n.into();
        }
        write_json(dir, "sentence_bert_config.json", &st_config)?;

        let model_config = json!({
            "__version__": {
                "sentence_transformers": FORMAT_VERSION,
                "bertha": env!("CARGO_PKG_VERSION"),
            },
            "model_type": "SentenceTransformer",
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
            "similarity_fn_name": self.similarity_fn_name.as_deref().unwrap_or("cosine"),
        });
        write_json(dir, "config_sentence_transformers.json", &model_config)?;
        write_json(dir, "modules.json", &Value::Array(modules))
    }
}

/// The names of `prompts`, for messages: "`a`, `b`" or "none".
pub fn known_names(prompts: &BTreeMap<String, String>) -> String {
    if prompts.is_empty() {
        return "the folder has none".into();
    }
    prompts
        .keys()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The truncation length sentence-transformers reads from a folder:
/// `sentence_bert_config.json`'s `max_seq_length` (a `model_max_length`
/// in its tokenizer arguments wins, as there), else, in a
/// sentence-transformers folder, `tokenizer_config.json`'s
/// `model_max_length` (where version 6 keeps it). `None`: the model's
/// own limit applies.
pub fn max_seq_length(dir: &Path) -> Result<Option<usize>> {
    let st = dir.join("sentence_bert_config.json");
    if st.is_file() {
        let v = read_json(&st)?;
        for args in ["processor_kwargs", "tokenizer_args"] {
            if let Some(n) = v.get(args).and_then(|a| a.get("model_max_length")) {
                return length(&st, &format!("{args}.model_max_length"), n);
            }
        }
        if let Some(n) = v.get("max_seq_length") {
            if let Some(n) = length(&st, "max_seq_length", n)? {
                return Ok(Some(n));
            }
        }
    }
    let tokenizer_config = dir.join("tokenizer_config.json");
    if dir.join("modules.json").is_file() && tokenizer_config.is_file() {
        let v = read_json(&tokenizer_config)?;
        if let Some(n) = v.get("model_max_length") {
            // transformers writes "no limit" as a huge float (1e30).
            if n.as_f64().is_some_and(|f| f >= u32::MAX as f64) {
                return Ok(None);
            }
            return length(&tokenizer_config, "model_max_length", n);
        }
    }
    Ok(None)
}

/// A token count field: a positive integer, or `null` for none.
fn length(path: &Path, field: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::Null => Ok(None),
        _ => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n as usize)),
            _ => Err(Error::config(
                path,
                field,
                format!("expected a positive integer, got {v}"),
            )),
        },
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn write_json(dir: &Path, name: &str, value: &Value) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::serialise(dir.join(name).display(), e))?;
    text.push('\n');
    write_atomic(&dir.join(name), text.as_bytes())
}

/// Normalize acts on the sentence vector; the multi-vector variant that
/// normalises token vectors is not this layout.
fn check_normalize_config(path: &Path) -> Result<()> {
    if !path.is_file() {
        return Ok(()); // versions before 6 write no config
    }
    let v = read_json(path)?;
    match v.get("module_input_name").and_then(Value::as_str) {
        None | Some("sentence_embedding") => Ok(()),
        Some(other) => Err(Error::config(
            path,
            "module_input_name",
            format!("normalising `{other}` is not supported (only sentence_embedding)"),
        )),
    }
}

/// The Pooling module's mode and `include_prompt`, in either spelling:
/// version 6's `pooling_mode` (a name or a list) or the older
/// `pooling_mode_*` flags (none set means mean, as version 6 reads it).
fn read_pooling_config(path: &Path) -> Result<(Pooling, bool)> {
    let v = read_json(path)?;
    let include_prompt = match v.get("include_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(Error::config(
                path,
                "include_prompt",
                format!("expected true or false, got {other}"),
            ))
        }
    };
    let mode = match v.get("pooling_mode") {
        Some(Value::String(mode)) => mode.clone(),
        Some(Value::Array(modes)) => match modes.as_slice() {
            [Value::String(mode)] => mode.clone(),
            _ => {
                return Err(Error::config(
                    path,
                    "pooling_mode",
                    "several pooling modes at once (concatenated) are not supported",
                ))
            }
        },
        Some(other) => {
            return Err(Error::config(
                path,
                "pooling_mode",
                format!("expected a mode name, got {other}"),
            ))
        }
        None => legacy_pooling_mode(path, &v)?,
    };
    let pooling = match mode.as_str() {
        "cls" => Pooling::Cls,
        "mean" => Pooling::Mean,
        "max" => Pooling::Max,
        "mean_sqrt_len_tokens" => Pooling::MeanSqrtLen,
        other => {
            return Err(Error::config(
                path,
                "pooling_mode",
                format!(
                    "`{other}` is not supported (supported: cls, mean, max, mean_sqrt_len_tokens)"
                ),
            ))
        }
    };
    Ok((pooling, include_prompt))
}

/// A SpladePooling module's `pooling_strategy` and `activation_function`
/// (both optional: max and relu, as sentence-transformers). Its
/// `embedding_dimension` (`word_embedding_dimension` before version 6) is
/// the vocabulary size, which the model says itself.
fn read_splade_config(path: &Path) -> Result<SpladeOptions> {
    let mut options = SpladeOptions::default();
    if !path.is_file() {
        return Ok(options);
    }
    let v = read_json(path)?;
    let field = |name: &str| -> Result<Option<&str>> {
        match v.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(Error::config(
                path,
                name,
                format!("expected a string, got {other}"),
            )),
        }
    };
    let reason = |e: Error| match e {
        Error::Option { reason, .. } => reason,
        other => other.to_string(),
    };
    if let Some(s) = field("pooling_strategy")? {
        options.strategy = s
            .parse()
            .map_err(|e| Error::config(path, "pooling_strategy", reason(e)))?;
    }
    if let Some(s) = field("activation_function")? {
        options.activation = s
            .parse()
            .map_err(|e| Error::config(path, "activation_function", reason(e)))?;
    }
    Ok(options)
}

/// The mode named by the `pooling_mode_*` flags of versions before 6.
fn legacy_pooling_mode(path: &Path, v: &Value) -> Result<String> {
    let flags = [
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
        ("pooling_mode_weightedmean_tokens", "weightedmean"),
        ("pooling_mode_lasttoken", "lasttoken"),
    ];
    let on: Vec<&str> = flags
        .iter()
        .filter(|(k, _)| v.get(*k).and_then(Value::as_bool).unwrap_or(false))
        .map(|(_, mode)| *mode)
        .collect();
    match on.as_slice() {
        [] => Ok("mean".into()),
        [mode] => Ok(mode.to_string()),
        _ => Err(Error::config(
            path,
            "pooling_mode_*",
            "several pooling modes at once (concatenated) are not supported",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/st-embedding")
    }

    fn minilm() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/all-MiniLM-L6-v2")
    }

    #[test]
    fn reads_the_version_6_layout() {
        let spec = SentenceTransformerSpec::from_dir(&fixture())
            .unwrap()
            .unwrap();
        let prompts: BTreeMap<String, String> = [("document", "passage: "), ("query", "query: ")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            spec,
            SentenceTransformerSpec {
                pooling: Pooling::Mean,
                normalize: true,
                include_prompt: true,
                // tokenizer_config.json's model_max_length
                max_seq_length: Some(32),
                prompts,
                default_prompt_name: None,
                similarity_fn_name: Some("cosine".into()),
                splade: None,
            }
        );
    }

    #[test]
    fn reads_the_version_2_layout() {
        // all-MiniLM-L6-v2 (scripts/fetch-model.sh): written by version 2.
        let spec = SentenceTransformerSpec::from_dir(&minilm())
            .unwrap()
            .unwrap();
        assert_eq!(spec.pooling, Pooling::Mean);
        assert!(spec.normalize && spec.include_prompt);
        assert_eq!(spec.max_seq_length, Some(256));
        assert!(spec.prompts.is_empty());
        assert_eq!(spec.default_prompt_name, None);
        assert_eq!(spec.similarity_fn_name, None);
    }

    #[test]
    fn a_written_spec_reads_back_the_same() {
        let tmp = tempfile::tempdir().unwrap();
        let mut spec = SentenceTransformerSpec::new(Pooling::Cls, false);
        spec.include_prompt = false;
        spec.max_seq_length = Some(128);
        spec.prompts
            .insert("query".into(), "Represent this: ".into());
        spec.default_prompt_name = Some("query".into());
        spec.write(tmp.path(), 64).unwrap();
        assert!(!tmp.path().join("2_Normalize").exists());
        assert_eq!(
            SentenceTransformerSpec::from_dir(tmp.path())
                .unwrap()
                .unwrap(),
            spec
        );
        let modules = read_json(&tmp.path().join("modules.json")).unwrap();
        assert_eq!(modules.as_array().unwrap().len(), 2);
        let pooling = read_json(&tmp.path().join("1_Pooling/config.json")).unwrap();
        assert_eq!(pooling["word_embedding_dimension"], 64);
        assert_eq!(pooling["pooling_mode_cls_token"], true);
        assert_eq!(pooling["pooling_mode_mean_tokens"], false);
        // No temp file is left beside the written ones.
        let names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    }

    #[test]
    fn the_fixture_spec_survives_a_rewrite() {
        let spec = SentenceTransformerSpec::from_dir(&fixture())
            .unwrap()
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        spec.write(tmp.path(), 64).unwrap();
        let again = SentenceTransformerSpec::from_dir(tmp.path())
            .unwrap()
            .unwrap();
        assert_eq!(again, spec);
        let modules = read_json(&tmp.path().join("modules.json")).unwrap();
        let types: Vec<&str> = modules
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, [TRANSFORMER_TYPE, POOLING_TYPE, NORMALIZE_TYPE]);
        let config = read_json(&tmp.path().join("config_sentence_transformers.json")).unwrap();
        assert_eq!(config["model_type"], "SentenceTransformer");
        assert_eq!(config["prompts"]["query"], "query: ");
        assert_eq!(config["default_prompt_name"], Value::Null);
    }

    #[test]
    fn version_6_pooling_and_bad_fields_are_read_or_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        SentenceTransformerSpec::new(Pooling::Mean, true)
            .write(dir, 8)
            .unwrap();
        let pooling = dir.join("1_Pooling/config.json");
        std::fs::write(
            &pooling,
            r#"{"embedding_dimension": 8, "pooling_mode": ["max"], "include_prompt": false}"#,
        )
        .unwrap();
        let spec = SentenceTransformerSpec::from_dir(dir).unwrap().unwrap();
        assert_eq!((spec.pooling, spec.include_prompt), (Pooling::Max, false));

        std::fs::write(&pooling, r#"{"pooling_mode": "lasttoken"}"#).unwrap();
        let err = SentenceTransformerSpec::from_dir(dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pooling_mode") && err.contains("lasttoken"),
            "{err}"
        );
        std::fs::write(&pooling, r#"{"pooling_mode": "mean"}"#).unwrap();

        let config = dir.join("config_sentence_transformers.json");
        std::fs::write(
            &config,
            r#"{"prompts": {"query": "q: "}, "default_prompt_name": "passage"}"#,
        )
        .unwrap();
        let err = SentenceTransformerSpec::from_dir(dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("default_prompt_name")
                && err.contains("`passage`")
                && err.contains("`query`"),
            "{err}"
        );
        std::fs::write(&config, r#"{"prompts": ["q: "]}"#).unwrap();
        let err = SentenceTransformerSpec::from_dir(dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("config_sentence_transformers.json") && err.contains("prompts"));

        let st = dir.join("sentence_bert_config.json");
        std::fs::write(&st, r#"{"max_seq_length": -3}"#).unwrap();
        let err = max_seq_length(dir).unwrap_err().to_string();
        assert!(
            err.contains("max_seq_length") && err.contains("-3"),
            "{err}"
        );
        std::fs::write(
            &st,
            r#"{"max_seq_length": 64, "tokenizer_args": {"model_max_length": 16}}"#,
        )
        .unwrap();
        assert_eq!(max_seq_length(dir).unwrap(), Some(16));
    }

    #[test]
    fn pooler_and_none_cannot_be_written() {
        let tmp = tempfile::tempdir().unwrap();
        let err = SentenceTransformerSpec::new(Pooling::Pooler, false)
            .write(tmp.path(), 8)
            .unwrap_err()
            .to_string();
        assert!(err.contains("pooling") && err.contains("pooler"), "{err}");
        assert!(!tmp.path().join("modules.json").exists());
    }
}
