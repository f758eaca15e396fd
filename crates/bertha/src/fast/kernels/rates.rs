//! Probes of this machine's matrix-multiply rates, so that benchmark
//! figures can be read against them.

use super::linear::linear;
use crate::fast::Precision;

/// The machine's fp32 matrix-multiply rate in GFLOP/s, measured now with
/// the multiply the encoder uses (best of `reps` products of two
/// `size`×`size` matrices), so benchmark figures can be read as a
/// fraction of it on a machine whose speed drifts.
pub fn matmul_gflops(size: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..size * size)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.1)
        .collect();
    let b: Vec<f32> = (0..size * size)
        .map(|i| ((i % 5) as f32 - 2.0) * 0.1)
        .collect();
    let bias = vec![0f32; size];
    let mut c = vec![0f32; size * size];
    linear(&a, &b, &bias, &mut c, size, size, size);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        linear(&a, &b, &bias, &mut c, size, size, size);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (size as f64).powi(3) / best / 1e9
}

/// The rate, in G multiply-adds × 2 per second, of one `[m, k] · [k, n]`
/// linear layer at `precision` on the packed kernels (best of `reps`),
/// input rounding or quantization included: what a benchmark compares
/// with the instruction peaks of `fast::cpu`.
pub fn linear_gops(precision: Precision, m: usize, k: usize, n: usize, reps: usize) -> f64 {
    use crate::fast::matmul::{PackedBf16, PackedF32, PackedI8, QuantScratch};
    let x: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) * 0.05).collect();
    let w: Vec<f32> = (0..k * n).map(|i| ((i % 11) as f32 - 5.0) * 0.02).collect();
    let (bias, mut y) = (vec![0f32; n], vec![0f32; m * n]);
    let mut scratch = QuantScratch::default();
    type Run = Box<dyn FnMut(&mut Vec<f32>, &mut QuantScratch)>;
    let mut run: Run = match precision {
        Precision::F32 => {
            let p = PackedF32::new(&w, k, n);
            Box::new(move |y, _| p.matmul(&x, &bias, y, m, None))
        }
        Precision::Bf16 => {
            let p = PackedBf16::new(&w, k, n);
            Box::new(move |y, s| p.matmul(&x, &bias, y, m, s.bf16_pairs(), None))
        }
        Precision::Int8 => {
            let p = PackedI8::new(&w, k, n, None, Default::default());
            Box::new(move |y, s| p.matmul(&x, &bias, y, m, s, None))
        }
    };
    run(&mut y, &mut scratch);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        run(&mut y, &mut scratch);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (m * k * n) as f64 / best / 1e9
}
