//! Where `--model` points when the user does not say.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

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
    pub fn resolve(&self) -> Result<PathBuf> {
        match &self.model {
            Some(p) => check_given(p),
            None => default_model(),
        }
    }
}

fn check_given(p: &Path) -> Result<PathBuf> {
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    let s = p.to_string_lossy();
    let looks_like_hub_id =
        !p.exists() && s.matches('/').count() == 1 && !s.starts_with('.') && !s.starts_with('/');
    if looks_like_hub_id {
        bail!(
            "model folder `{s}` does not exist. It looks like a Hugging Face hub id, but bertha reads local \
             folders only (the hub is not reachable from here): download the model folder and pass its path"
        );
    }
    if p.exists() {
        bail!("model path `{s}` is not a folder (expected a folder with config.json)");
    }
    bail!("model folder `{s}` does not exist")
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
