//! A model folder in the Hugging Face layout: `config.json`, the weights
//! (`model.safetensors`, sharded safetensors or `pytorch_model.bin`) and the
//! tokenizer (`tokenizer.json`, or `vocab.txt` + `tokenizer_config.json`).
//!
//! Every loader opens its folder here, so a bad path gets the same
//! explanation from the library, the CLI and the server, naming the folder
//! and the file that is missing.

use std::path::{Path, PathBuf};

use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::tokenizer::{default_max_length, Tokenizer};
use crate::io::weights::Weights;

/// A folder that exists; its files are read on demand, each with an error
/// naming the folder or the file at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDir {
    path: PathBuf,
}

impl ModelDir {
    /// Checks that `path` is a folder (it may still lack what a loader
    /// needs: [`ModelDir::config`] and the others say what).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Ok(Self {
                path: path.to_path_buf(),
            });
        }
        let reason = if path.exists() {
            "not a folder (expected a folder with config.json)".to_string()
        } else if looks_like_hub_id(path) {
            "no such directory (the path does not exist). It looks like a Hugging Face hub id, but \
             bertha reads local folders only (the hub is not reachable from here): download the \
             model folder and pass its path"
                .to_string()
        } else {
            "no such directory (the path does not exist)".to_string()
        };
        Err(Error::ModelDir {
            path: path.to_path_buf(),
            reason,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `config.json` (which may be missing).
    pub fn config_path(&self) -> PathBuf {
        self.path.join("config.json")
    }

    /// Whether the folder has a `config.json` (a tokenizer-only folder has
    /// none).
    pub fn has_config(&self) -> bool {
        self.config_path().is_file()
    }

    /// Reads and validates `config.json`.
    pub fn config(&self) -> Result<BertConfig> {
        let path = self.config_path();
        if !path.is_file() {
            return Err(Error::ModelDir {
                path: self.path.clone(),
                reason: "config.json is missing".into(),
            });
        }
        BertConfig::from_file(&path)
    }

    /// Finds and opens the weights (without reading every tensor).
    pub fn weights(&self) -> Result<Weights> {
        Weights::from_model_dir(&self.path)
    }

    /// The config, then the weights: what every model loader starts with.
    pub fn config_and_weights(&self) -> Result<(BertConfig, Weights)> {
        let config = self.config()?;
        Ok((config, self.weights()?))
    }

    /// The tokenizer, truncating at `max_length` tokens.
    pub fn tokenizer(&self, max_length: usize) -> Result<Tokenizer> {
        Tokenizer::from_dir(&self.path, max_length)
    }

    /// The tokenizer of the model `config` describes, refused when it can
    /// give ids past the model's `vocab_size` (those ids have no embedding
    /// row: every text holding one would fail in the model instead).
    pub fn model_tokenizer(&self, config: &BertConfig, max_length: usize) -> Result<Tokenizer> {
        let tokenizer = self.tokenizer(max_length)?;
        let ids = tokenizer.id_limit();
        if ids > config.vocab_size {
            return Err(Error::ModelDir {
                path: self.path.clone(),
                reason: format!(
                    "the tokenizer's vocabulary has {ids} ids but config.json's vocab_size is {}: \
                     ids {}..{ids} would have no embedding (is the tokenizer from another model?)",
                    config.vocab_size, config.vocab_size
                ),
            });
        }
        Ok(tokenizer)
    }

    /// The `max_length` a text gets by default for this folder: see
    /// [`default_max_length`].
    pub fn default_max_length(&self, config: &BertConfig) -> Result<usize> {
        default_max_length(&self.path, config)
    }
}

/// `owner/name` with no such path on disk: what a user copying a hub id
/// writes.
fn looks_like_hub_id(path: &Path) -> bool {
    let s = path.to_string_lossy();
    s.matches('/').count() == 1 && !s.starts_with('.') && !s.starts_with('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_paths_and_files_are_named() {
        let err = ModelDir::open("/nonexistent/model")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/model") && err.contains("no such directory"));
        let err = ModelDir::open("someone/some-model")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Hugging Face hub id"), "{err}");
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f.txt");
        std::fs::write(&file, "x").unwrap();
        let err = ModelDir::open(&file).unwrap_err().to_string();
        assert!(err.contains("not a folder"), "{err}");
        let dir = ModelDir::open(tmp.path()).unwrap();
        assert!(!dir.has_config());
        let err = dir.config().unwrap_err().to_string();
        assert!(err.contains("config.json is missing"), "{err}");
    }
}
