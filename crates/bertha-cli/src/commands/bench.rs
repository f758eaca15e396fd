//! `bertha bench`: embedding throughput on a text file.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;

use super::EmbedArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    embed: EmbedArgs,

    /// Text file, one text per line (or a TSV/CSV with --column).
    #[arg(long, short = 'i')]
    input: PathBuf,

    /// Take this column of a TSV/CSV with a header (e.g. `sentence` for SST-2).
    #[arg(long)]
    column: Option<String>,

    /// Use only the first N texts.
    #[arg(long)]
    limit: Option<usize>,

    /// Timed repetitions; the best is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// Prints one JSON line with the best repetition: texts/s and tokens/s of
/// the whole `embed` path (tokenization included), in release builds.
pub fn run(a: Args) -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; measure with `cargo build --release`");
    }
    let embedder = a.embed.load()?;
    let mut texts = match &a.column {
        Some(c) => bertha::input::read_column(&a.input, c)?,
        None => bertha::input::read_lines_from_file(&a.input)?,
    };
    if let Some(n) = a.limit {
        texts.truncate(n);
    }
    if texts.is_empty() {
        bail!("{} has no texts", a.input.display());
    }
    let tokens: usize = embedder
        .tokenizer()
        .encode_batch(&texts)?
        .iter()
        .map(|e| e.len())
        .sum();
    // One untimed pass warms caches and the thread pool.
    embedder.embed(
        &texts[..texts.len().min(a.embed.batch_size)],
        a.embed.batch_size,
        &mut |_| {},
    )?;
    let mut best = f64::INFINITY;
    for rep in 0..a.reps.max(1) {
        let start = Instant::now();
        embedder.embed(&texts, a.embed.batch_size, &mut |_| {})?;
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "rep {}: {:.3} s, {:.1} texts/s",
            rep + 1,
            secs,
            texts.len() as f64 / secs
        );
        best = best.min(secs);
    }
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    println!(
        "{}",
        json!({
            "input": a.input,
            "texts": texts.len(),
            "tokens": tokens,
            "batch_size": a.embed.batch_size,
            "threads": threads,
            "seconds": best,
            "texts_per_s": texts.len() as f64 / best,
            "tokens_per_s": tokens as f64 / best,
            "ms_per_text": 1000.0 * best / texts.len() as f64,
        })
    );
    Ok(())
}
