//! Times the packed linear-layer kernels at each precision on the shapes of
//! all-MiniLM-L6-v2's four linears (rows: a batch of 32 sentences of ~30
//! tokens), beside the instruction peak of each precision, so a kernel
//! change can be judged without a whole model run.
//!
//! ```sh
//! cargo run --release -p bertha --example kernel_rates -- [rows] [reps] [precisions]
//! ```

use bertha::fast::{instruction_peak_gops, linear_gops, Precision};

fn main() {
    let mut args = std::env::args().skip(1);
    let m: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(960);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    // A comma-separated subset, e.g. `f32,int8` (bf16 without AVX512-BF16
    // is emulated, and slow to time).
    let precisions: Vec<Precision> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|p| p.parse().unwrap_or_else(|e| panic!("precision {p:?}: {e}")))
            .collect(),
        None => vec![Precision::F32, Precision::Bf16, Precision::Int8],
    };
    let shapes = [
        ("qkv", 384, 1152),
        ("out", 384, 384),
        ("ffn-in", 384, 1536),
        ("ffn-out", 1536, 384),
    ];
    for precision in precisions {
        let peak = instruction_peak_gops(precision);
        let rates: Vec<String> = shapes
            .iter()
            .map(|&(name, k, n)| {
                let rate = linear_gops(precision, m, k, n, reps);
                match peak {
                    Some(p) => format!("{name} {rate:.1} ({:.2})", rate / p),
                    None => format!("{name} {rate:.1}"),
                }
            })
            .collect();
        let peak = peak.map_or("-".to_string(), |p| format!("{p:.1}"));
        println!(
            "{:>4}: peak {peak}; {} G ops/s (rows {m})",
            precision.name(),
            rates.join(", ")
        );
    }
}
