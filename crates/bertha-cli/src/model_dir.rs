//! Where `--model` points when the user does not say.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use bertha::ModelDir;

/// The default model's folder under a repository checkout.
const DEFAULT_MODEL_SUBDIR: &str = ".cache/models/all-MiniLM-L6-v2";

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model folder in the Hugging Face layout (config.json, tokenizer.json
    /// or vocab.txt, model.safetensors or pytorch_model.bin). Default:
    /// $BERTHA_MODEL, else the all-MiniLM-L6-v2 fetched by scripts/fetch-model.sh.
    #[arg(long, short = 'm', env = "BERTHA_MODEL")]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    /// The model folder: `--model` (checked by [`ModelDir::open`]), else
    /// the fetched default.
    pub fn open(&self) -> Result<ModelDir> {
        match &self.model {
            Some(p) => Ok(ModelDir::open(p)?),
            None => Ok(ModelDir::open(default_model()?)?),
        }
    }

    /// The path of [`ModelArgs::open`]'s folder.
    pub fn resolve(&self) -> Result<PathBuf> {
        Ok(self.open()?.path().to_path_buf())
    }
}

fn default_model() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        candidates.extend(cwd.ancestors().map(|d| d.join(DEFAULT_MODEL_SUBDIR)));
    }
    // The checkout this binary was built from.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    candidates.push(repo.join(DEFAULT_MODEL_SUBDIR));
    for c in &candidates {
        if c.join("config.json").is_file() {
            return Ok(c.clone());
        }
    }
    bail!(
        "no --model given and the default model (all-MiniLM-L6-v2) is not fetched yet. Fetch it with:\n    \
         {}/scripts/fetch-model.sh\nor pass --model DIR (or set BERTHA_MODEL)",
        repo.canonicalize().unwrap_or(repo).display()
    )
}
