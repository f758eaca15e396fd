//! Tests of the kernels: each attention path against the definition, and
//! the approximations of exp, erf and GELU.

use super::activations::erf;
use super::attention::{packed_attention_on, AttentionPath, QUERY_BLOCK};
use super::*;

/// Packed attention against softmax(scale · Q Kᵀ) V in f64, on every
/// path (the CPU's choice, gemm, loops, fp32 and bf16 tiles where the
/// CPU has them), for short sequences, two key panels, query blocks
/// with a partial last one, and an empty sequence.
#[test]
fn packed_attention_matches_the_definition() {
    let mut paths = vec![None, Some(AttentionPath::Gemm), Some(AttentionPath::Loops)];
    if crate::fast::matmul::has_f32_tiles() {
        paths.push(Some(AttentionPath::Tiles));
    }
    // Head widths below, at and above a panel of 32; lengths short,
    // spanning two key panels, and past two query blocks.
    for (heads, hd) in [(3, 8), (2, 32), (2, 40)] {
        let d = heads * hd;
        // The last sequence is empty: it starts at the end of qkv.
        let offsets = [
            0,
            5,
            5 + 33,
            5 + 33 + 2 * QUERY_BLOCK + 22,
            5 + 33 + 2 * QUERY_BLOCK + 22,
        ];
        let tokens = offsets[4];
        let qkv: Vec<f32> = (0..tokens * 3 * d)
            .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 2.0)
            .collect();
        for &path in &paths {
            let mut ctx = vec![0f32; tokens * d];
            packed_attention_on((path, None), &qkv, &mut ctx, &offsets, heads, hd);
            let worst = worst_attention_error(&qkv, &ctx, &offsets, (heads, hd), None);
            assert!(
                worst < 1e-5,
                "{path:?}, head_dim {hd}: largest difference {worst}"
            );
        }
        if crate::fast::cpu::features().bf16 {
            // Inputs rounded to 8 significant bits: errors of a few
            // 2^-9 of the values (|v| ≤ 1), far above fp32's.
            let mut ctx = vec![0f32; tokens * d];
            let path = Some(AttentionPath::TilesBf16);
            packed_attention_on((path, None), &qkv, &mut ctx, &offsets, heads, hd);
            let worst = worst_attention_error(&qkv, &ctx, &offsets, (heads, hd), None);
            assert!(
                worst < 1e-2,
                "bf16, head_dim {hd}: largest difference {worst}"
            );
            assert!(worst > 1e-5, "bf16 rounding shows ({worst})");
        }
    }
}

/// The largest difference of `ctx` from `softmax(scale · Q Kᵀ) V` in
/// f64, each query over the keys within `window` of it (all without).
pub(in crate::fast) fn worst_attention_error(
    qkv: &[f32],
    ctx: &[f32],
    offsets: &[usize],
    (heads, hd): (usize, usize),
    window: Option<usize>,
) -> f64 {
    let d = heads * hd;
    let lens: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
    let scale = 1.0 / (hd as f64).sqrt();
    let at =
        |t: usize, part: usize, h: usize, c: usize| qkv[t * 3 * d + part * d + h * hd + c] as f64;
    let mut worst = 0f64;
    for s in 0..lens.len() {
        let (a, n) = (offsets[s], lens[s]);
        for h in 0..heads {
            for i in 0..n {
                let keys: Vec<usize> = (0..n)
                    .filter(|j| match window {
                        Some(w) => i.abs_diff(*j) <= w,
                        None => true,
                    })
                    .collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        (0..hd)
                            .map(|c| at(a + i, 0, h, c) * at(a + j, 1, h, c))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..hd {
                    let want: f64 = keys
                        .iter()
                        .zip(&e)
                        .map(|(&j, p)| p / z * at(a + j, 2, h, c))
                        .sum();
                    let got = ctx[(a + i) * d + h * hd + c] as f64;
                    worst = worst.max((got - want).abs());
                }
            }
        }
    }
    worst
}

/// The bit trick for 2^n gives what `n as i32` gave, for every input
/// in the clamped range (sampled densely) and beyond it.
#[test]
fn fast_exp_scale_bits_equal_the_integer_cast() {
    let old = |x: f32| {
        let x = x.clamp(-87.3, 88.7);
        const SHIFT: f32 = 12_582_912.0;
        let n = (x * std::f32::consts::LOG2_E + SHIFT) - SHIFT;
        let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
        p * f32::from_bits(((n as i32).wrapping_add(127) as u32) << 23)
    };
    let mut x = -100.0f32;
    while x < 100.0 {
        assert_eq!(fast_exp(x).to_bits(), old(x).to_bits(), "x = {x}");
        x += 0.000_37;
    }
}

#[test]
fn fast_exp_is_accurate() {
    let mut x = -80.0f32;
    while x < 80.0 {
        let (got, want) = (fast_exp(x), x.exp());
        assert!(
            ((got - want) / want).abs() < 5e-7,
            "exp({x}) = {got}, want {want}"
        );
        x += 0.0173;
    }
    assert!(fast_exp(-1e9) < 1e-37, "underflows to (nearly) zero");
}

#[test]
fn gelu_matches_the_erf_definition() {
    let mut x = -8.0f64;
    while x < 8.0 {
        let want = 0.5 * x * (1.0 + libm_erf(x / std::f64::consts::SQRT_2));
        let got = f64::from(gelu_erf(x as f32));
        assert!((got - want).abs() < 1e-6, "gelu({x}) = {got}, want {want}");
        x += 0.01;
    }
}

/// The exponential erf computes on the way is exp(-x²) (of x² rounded
/// to fp32, as erf's argument is), and erf's value is the same with or
/// without it.
#[test]
fn erf_hands_out_its_gaussian() {
    let mut x = -6.0f32;
    while x < 6.0 {
        let (e, gauss) = erf_and_gauss(x);
        let want = (-f64::from(x.abs() * x.abs())).exp();
        assert!(
            (f64::from(gauss) - want).abs() <= 1e-6 * want + 1e-30,
            "exp(-{x}²) = {gauss}, want {want}"
        );
        assert_eq!(e.to_bits(), erf(x).to_bits());
        x += 0.0137;
    }
}

/// erf by its Taylor/continued series in f64, as an independent check.
fn libm_erf(x: f64) -> f64 {
    // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)); beyond
    // |x| = 4, |1 - |erf|| < 2e-8 and the series would lose precision.
    if x.abs() > 4.0 {
        return x.signum();
    }
    let mut sum = 0.0;
    let mut term = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 || n < 5.0 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
        if n > 400.0 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn linear_adds_bias_and_multiplies() {
    // x [2,3], w_t [3,2]
    let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let w_t = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
    let mut y = [0.0; 4];
    linear(&x, &w_t, &[10.0, 20.0], &mut y, 2, 3, 2);
    assert_eq!(y, [14.0, 25.0, 20.0, 31.0]);
}
