//! `bertha bench`: embedding throughput on a text file.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;

use bertha::tasks::embed::encoder_flops;

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

    /// Texts timed one at a time for the batch-1 latency (0 to skip).
    #[arg(long, default_value_t = 64)]
    latency_texts: usize,

    /// Side of the square matrices timed for the matrix-multiply peak.
    #[arg(long, default_value_t = 2048)]
    peak_size: usize,
}

/// Prints one JSON line: throughput of the best repetition (texts/s and
/// tokens/s of the whole `embed` path, tokenization included), achieved
/// GFLOP/s of model work on real tokens, batch-1 latency percentiles, and
/// the machine's matrix-multiply peak measured in the same run.
pub fn run(a: Args) -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; measure with `cargo build --release`");
    }
    let embedder = a.embed.load()?;
    let mut texts = match &a.column {
        Some(c) => bertha::io::texts::read_column(&a.input, c)?,
        None => bertha::io::texts::read_lines_from_file(&a.input)?,
    };
    if let Some(n) = a.limit {
        texts.truncate(n);
    }
    if texts.is_empty() {
        bail!("{} has no texts", a.input.display());
    }
    let encodings = embedder.tokenizer().encode_batch(&texts)?;
    let lengths: Vec<usize> = encodings.iter().map(|e| e.len()).collect();
    let tokens: usize = lengths.iter().sum();
    let flops = encoder_flops(
        embedder.model().config(),
        &lengths,
        embedder.reads_one_row(),
    );

    // The peak is timed before and after the model runs and the better
    // figure kept: on a shared machine one of the two can land on a
    // slow spell.
    let peak_before = bertha::fast::matmul_gflops(a.peak_size, 3);

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

    // Batch-1 latency: the first --latency-texts texts, one call each.
    let mut latencies: Vec<f64> = Vec::new();
    for t in texts.iter().take(a.latency_texts) {
        let start = Instant::now();
        embedder.embed(std::slice::from_ref(t), 1, &mut |_| {})?;
        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| -> Option<f64> {
        (!latencies.is_empty())
            .then(|| latencies[((latencies.len() - 1) as f64 * p).round() as usize])
    };

    // Reduced precision: how far its embeddings are from fp32 ones.
    let cosine = if embedder.precision() != bertha::fast::Precision::F32 {
        let mut exact = a.embed.clone();
        exact.precision.precision = bertha::fast::Precision::F32;
        let want = exact
            .load()?
            .embed(&texts, a.embed.batch_size, &mut |_| {})?;
        let got = embedder.embed(&texts, a.embed.batch_size, &mut |_| {})?;
        let sims: Vec<f64> = got.iter().zip(&want).map(|(g, w)| cosine(g, w)).collect();
        Some((
            sims.iter().copied().fold(f64::INFINITY, f64::min),
            sims.iter().sum::<f64>() / sims.len() as f64,
        ))
    } else {
        None
    };

    let peak = peak_before.max(bertha::fast::matmul_gflops(a.peak_size, 3));
    let gflops = flops / best / 1e9;
    let instruction_peak = bertha::fast::instruction_peak_gops(embedder.precision());
    let threads = rayon_threads();
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
            "model_gflops": gflops,
            "matmul_peak_gflops": peak,
            "fraction_of_peak": gflops / peak,
            "instruction_peak_gops": instruction_peak,
            "fraction_of_instruction_peak": instruction_peak.map(|p| gflops / p),
            "batch1_texts": latencies.len(),
            "batch1_p50_ms": pct(0.5),
            "batch1_p99_ms": pct(0.99),
            "fast_path": embedder.uses_fast_path(),
            // The kernels that ran (BERTHA_ISA lowers them).
            "isa": bertha::fast::cpu::describe(),
            "precision": format!("{:?}", embedder.precision()).to_lowercase(),
            "min_cosine_to_f32": cosine.map(|c| c.0),
            "mean_cosine_to_f32": cosine.map(|c| c.1),
        })
    );
    Ok(())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot = |x: &[f32], y: &[f32]| -> f64 {
        x.iter()
            .zip(y)
            .map(|(p, q)| f64::from(*p) * f64::from(*q))
            .sum()
    };
    dot(a, b) / (dot(a, a).sqrt() * dot(b, b).sqrt()).max(f64::MIN_POSITIVE)
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}
