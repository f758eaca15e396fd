//! `bertha prepare-corpus`: tokenizes a pre-training corpus once, in
//! parallel, into memory-mapped shards that `pretrain --corpus DIR` reads
//! without tokenizing again (every data-parallel process maps the same
//! files and reads only its rows).

use std::path::PathBuf;

use anyhow::{Context, Result};
use bertha::data::{prepare_corpus, PrepareOptions};

use super::pretrain::load_tokenizer;
use crate::model_dir::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Plain-text files or folders (documents are blank-line-separated
    /// blocks; a file without blank lines is one document).
    #[arg(long, required = true, num_args = 1..)]
    corpus: Vec<PathBuf>,

    /// The tokenizer: a model folder (tokenizer.json or vocab.txt) or a
    /// vocab.txt file; `pretrain` must use the same. Default: the default
    /// model's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,

    /// Split documents into sentences (what `pretrain --nsp` pairs need)
    /// rather than lines.
    #[arg(long)]
    nsp: bool,

    /// The output folder: corpus.json and shard-NNNNN.bin files.
    #[arg(long)]
    out: PathBuf,

    /// Tokens per shard, at most (a shard ends at a document's end).
    #[arg(long, default_value_t = 1 << 26)]
    shard_tokens: usize,

    /// Replace a prepared corpus already in --out.
    #[arg(long)]
    overwrite: bool,
}

pub fn run(a: Args) -> Result<()> {
    let source = match &a.tokenizer {
        Some(t) => t.clone(),
        None => ModelArgs { model: None }.resolve()?,
    };
    let tokenizer = load_tokenizer(&source)
        .with_context(|| format!("loading the tokenizer from {}", source.display()))?;
    let t0 = std::time::Instant::now();
    let header = prepare_corpus(
        &a.corpus,
        &tokenizer,
        &source,
        &PrepareOptions {
            sentences: a.nsp,
            shard_tokens: a.shard_tokens,
            overwrite: a.overwrite,
        },
        &a.out,
    )?;
    eprintln!(
        "prepared {} documents, {} tokens ({}-byte ids, {} pieces) in {} shard(s) ({:.1} s): {}",
        header.documents,
        header.tokens,
        header.token_bytes,
        header.pieces,
        header.shards.len(),
        t0.elapsed().as_secs_f64(),
        a.out.display()
    );
    println!("{}", serde_json::to_string(&header)?);
    Ok(())
}
