//! `bertha quantize`: a model folder with its fast path packed in int8 or
//! bf16 (weights, scales and smoothing factors in `bertha-packed.safetensors`),
//! so that `embed`, `bench` and `serve` with the same `--precision` start
//! without calibrating or packing.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;

use bertha::fast::Precision;
use bertha::{EmbedOptions, Embedder};

use crate::model_dir::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// int8 (calibrated on --calibration's texts) or bf16.
    #[arg(long)]
    precision: Precision,

    /// The new model folder (must not exist; written atomically).
    #[arg(long)]
    out: PathBuf,

    /// int8 calibration texts, one per line (default: built-in English
    /// sentences).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
}

/// Writes the folder and prints one JSON line saying what was written.
pub fn run(a: Args) -> Result<()> {
    if a.precision == Precision::F32 {
        bail!("--precision f32 has nothing to pack: choose int8 or bf16");
    }
    let start = Instant::now();
    let src = a.model.resolve()?;
    let opts = EmbedOptions {
        calibration: a.calibration.clone(),
        ..EmbedOptions::default()
    };
    let embedder = Embedder::from_dir(&src, &bertha::Device::Cpu, &opts)?;
    let calibration = match (&a.calibration, a.precision) {
        (_, Precision::Bf16) => "none (bf16)".to_string(),
        (Some(path), _) => path.display().to_string(),
        (None, _) => "built-in (calibration-en.txt)".to_string(),
    };
    embedder.write_quantized(&src, &a.out, a.precision, &calibration)?;
    println!(
        "{}",
        json!({
            "model": src,
            "out": a.out,
            "precision": a.precision.name(),
            "calibration": calibration,
            "seconds": start.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}
