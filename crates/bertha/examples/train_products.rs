//! Times the bf16 (or fp32) matrix products of a `small` pre-training step (32 × 128
//! tokens, 614 masked rows through the decoder; and three of `mini`'s) one
//! shape at a time, with their operand rounding and packing, beside the
//! bf16 instruction peak:
//! forward `x · Wᵀ`, input gradient `dy · W`, weight gradient `dyᵀ · x`.
//!
//! ```sh
//! cargo run --release -p bertha --example train_products -- [reps]
//! SHAPE=decoder cargo run --release -p bertha --example train_products -- 50
//! ```
//! (best of `reps`, default 5; `SHAPE` picks one of qkv, out, ffn-in,
//! ffn-out, decoder, or `mini`'s decoder-mini, ffn-in-mini, qkv-mini;
//! `COMPUTE=f32` times the fp32 products instead, beside the fp32 peak, as
//! it does by default where `--precision bf16` would run fp32).
use bertha::fast::instruction_peak_gops;
use bertha::fast::train::Compute;
use bertha::fast::Precision;
use std::time::Instant;

fn data(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    // Unset, COMPUTE is bf16 where `--precision bf16` runs bf16 products,
    // else fp32: bf16 on a CPU without them would time a scalar loop.
    let c: Compute = match std::env::var("COMPUTE") {
        Ok(c) => c.parse().expect("COMPUTE is f32 or bf16"),
        Err(_) if bertha::fast::cpu::has_bf16() => Compute::Bf16,
        Err(_) => {
            let why = bertha::fast::cpu::no_bf16_reason();
            println!("fp32 products ({why}; COMPUTE=bf16 times them anyway)");
            Compute::F32
        }
    };
    let precision = match c {
        Compute::F32 => Precision::F32,
        Compute::Bf16 => Precision::Bf16,
    };
    let peak = instruction_peak_gops(precision).unwrap_or(f64::NAN);
    let t = 4096;
    let shapes: [(&str, usize, usize, usize); 8] = [
        ("qkv", t, 512, 1536),
        ("out", t, 512, 512),
        ("ffn-in", t, 512, 2048),
        ("ffn-out", t, 2048, 512),
        ("decoder", 614, 512, 30522),
        ("decoder-mini", 614, 256, 30522),
        ("ffn-in-mini", t, 256, 1024),
        ("qkv-mini", t, 256, 768),
    ];
    println!("peak {peak:.1}");
    let only = std::env::var("SHAPE").ok();
    for (name, m, k, n) in shapes {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (x, w, b) = (data(m * k, 1), data(n * k, 2), data(n, 3));
        let mut y = vec![0f32; m * n];
        let dy = data(m * n, 4);
        let mut dx = vec![0f32; m * k];
        let mut dw = vec![0f32; n * k];
        let flops = 2.0 * (m * n * k) as f64;
        let mut best = [f64::MAX; 3];
        for _ in 0..reps {
            let t0 = Instant::now();
            c.forward(&x, &w, Some(&b), &mut y, m);
            best[0] = best[0].min(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            c.input_grad(&dy, &w, &mut dx, m, false);
            best[1] = best[1].min(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            c.weight_grad(&dy, &x, &mut dw, m);
            best[2] = best[2].min(t0.elapsed().as_secs_f64());
        }
        let r: Vec<String> = best
            .iter()
            .map(|s| {
                format!(
                    "{:.0} ({:.2}) {:.2}ms",
                    flops / s / 1e9,
                    flops / s / 1e9 / peak,
                    s * 1e3
                )
            })
            .collect();
        println!(
            "{name:>8} m{m} k{k} n{n}: fwd {} | dx {} | dw {}",
            r[0], r[1], r[2]
        );
    }
}
