//! Checkpoints in the Hugging Face layout (`config.json`,
//! `model.safetensors`, the tokenizer files) plus what resuming needs
//! (`optimizer.safetensors`, `trainer_state.json`). A checkpoint folder is
//! written beside its final name and renamed into place, so a crash never
//! leaves a half-written one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::optim::AdamW;
use super::params::ParamStore;
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::RawTensor;

pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";

/// Tokenizer files copied next to the weights when the source has them.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Where a run stands: enough to continue it exactly.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainerState {
    /// Optimiser steps taken.
    pub step: u64,
    pub total_steps: u64,
    pub seed: u64,
    /// The run's options, for the record (and a warning when a resumed
    /// run differs).
    pub options: serde_json::Value,
    pub last_loss: Option<f64>,
    /// The fingerprint of the training inputs (checked on resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// What a checkpoint folder holds, loaded.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub state: TrainerState,
    pub model: HashMap<String, Tensor>,
    pub optimizer: HashMap<String, Tensor>,
}

/// Everything a checkpoint is written from.
pub struct CheckpointParts<'a> {
    pub config: &'a BertConfig,
    pub params: &'a ParamStore,
    pub optimizer: Option<&'a AdamW>,
    pub state: Option<&'a TrainerState>,
    /// The folder (or vocab file) the tokenizer came from.
    pub tokenizer_source: &'a Path,
}

impl Checkpoint {
    /// Writes `dir` atomically: into a temporary sibling, then renamed.
    pub fn save(dir: &Path, parts: &CheckpointParts) -> Result<()> {
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Input(format!("{}: not a folder name", dir.display())))?;
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let written = write_files(&tmp, parts);
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        replace_dir(&tmp, dir)
    }

    /// Writes the model files (config, weights, tokenizer) into an
    /// existing folder, each file atomically (the run's output folder also
    /// holds metrics and checkpoints).
    pub fn save_model_files(dir: &Path, parts: &CheckpointParts) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let model_only = CheckpointParts {
            optimizer: None,
            state: None,
            ..*parts
        };
        write_files(dir, &model_only)
    }

    pub fn load(dir: &Path) -> Result<Self> {
        let state_path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&state_path).map_err(|e| Error::io(&state_path, e))?;
        let state: TrainerState = serde_json::from_str(&text).map_err(|e| Error::Json {
            path: state_path.clone(),
            source: e,
        })?;
        let read = |file: &str| -> Result<HashMap<String, Tensor>> {
            let p = dir.join(file);
            if !p.is_file() {
                return Err(Error::io(
                    &p,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "missing from the checkpoint",
                    ),
                ));
            }
            candle_core::safetensors::load(&p, &Device::Cpu).map_err(|e| Error::Weights {
                path: p.clone(),
                reason: crate::io::weights::strip_backtrace(&e),
            })
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            model: read(MODEL_FILE)?,
            optimizer: read(OPTIMIZER_FILE)?,
            state,
        })
    }

    /// `dir` itself when it is a checkpoint, else its newest
    /// `checkpoint-N` folder (a run's output folder).
    pub fn find(dir: &Path) -> Result<PathBuf> {
        if dir.join(STATE_FILE).is_file() {
            return Ok(dir.to_path_buf());
        }
        let newest = list(dir)?
            .into_iter()
            .rev()
            .find(|(_, p)| p.join(STATE_FILE).is_file());
        newest.map(|(_, p)| p).ok_or_else(|| {
            Error::Input(format!(
                "{}: no {STATE_FILE} there and no checkpoint-N folder inside to resume from",
                dir.display()
            ))
        })
    }
}

/// The `checkpoint-N` folders in `out`, by step.
pub fn list(out: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(out)
        .map_err(|e| Error::io(out, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let step: u64 = name.to_str()?.strip_prefix("checkpoint-")?.parse().ok()?;
            e.path().is_dir().then(|| (step, e.path()))
        })
        .collect();
    found.sort();
    Ok(found)
}

fn write_files(dir: &Path, parts: &CheckpointParts) -> Result<()> {
    let config_text = serde_json::to_string_pretty(&parts.config.to_json())
        .map_err(|e| Error::Input(format!("serialising config.json: {e}")))?;
    write_atomic(&dir.join("config.json"), config_text.as_bytes())?;
    save_safetensors(&dir.join(MODEL_FILE), &parts.params.tensors())?;
    copy_tokenizer(parts.tokenizer_source, dir)?;
    if let Some(opt) = parts.optimizer {
        save_safetensors(&dir.join(OPTIMIZER_FILE), &opt.state_tensors()?)?;
    }
    if let Some(state) = parts.state {
        let text = serde_json::to_string_pretty(state)
            .map_err(|e| Error::Input(format!("serialising {STATE_FILE}: {e}")))?;
        write_atomic(&dir.join(STATE_FILE), text.as_bytes())?;
    }
    Ok(())
}

/// safetensors with `{"format": "pt"}` metadata, which transformers'
/// loader expects.
pub fn save_safetensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let mut views: Vec<(String, RawTensor)> = tensors
        .iter()
        .map(|(n, t)| {
            let values = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            Ok((n.clone(), RawTensor::f32(t.dims().to_vec(), &values)))
        })
        .collect::<Result<_>>()?;
    views.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let bytes = safetensors::serialize(views.iter().map(|(n, v)| (n.as_str(), v)), metadata)
        .map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("serialising: {e}"),
        })?;
    write_atomic(path, &bytes)
}

/// Writes a temporary file beside `path`, then renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

fn copy_tokenizer(source: &Path, dir: &Path) -> Result<()> {
    if source.is_file() {
        // A bare vocab.txt: copy it with the config a BERT tokenizer needs.
        let bytes = std::fs::read(source).map_err(|e| Error::io(source, e))?;
        write_atomic(&dir.join("vocab.txt"), &bytes)?;
        let config = serde_json::json!({"tokenizer_class": "BertTokenizer", "do_lower_case": true});
        return write_atomic(
            &dir.join("tokenizer_config.json"),
            config.to_string().as_bytes(),
        );
    }
    for f in TOKENIZER_FILES {
        let src = source.join(f);
        if src.is_file() {
            let bytes = std::fs::read(&src).map_err(|e| Error::io(&src, e))?;
            write_atomic(&dir.join(f), &bytes)?;
        }
    }
    Ok(())
}

fn replace_dir(tmp: &Path, dir: &Path) -> Result<()> {
    if dir.exists() {
        let old = tmp.with_extension("old");
        std::fs::rename(dir, &old).map_err(|e| Error::io(dir, e))?;
        std::fs::rename(tmp, dir).map_err(|e| Error::io(dir, e))?;
        std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))
    } else {
        std::fs::rename(tmp, dir).map_err(|e| Error::io(dir, e))
    }
}
