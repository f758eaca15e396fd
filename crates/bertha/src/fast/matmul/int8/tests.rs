//! The int8 products against their definitions: the rounding error,
//! smoothing, every kernel against the scalar loops, the quantizers, and
//! the stored parts.

use super::super::tests::{data, reference};
use super::super::PackedBf16;
use super::*;
fn int8_error(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    act_max: Option<&[f32]>,
) -> (f32, f32) {
    let want = reference(x, w, b, m, k, n);
    let packed = PackedI8::new(w, k, n, act_max, I8Scheme::default());
    let mut y = vec![f32::NAN; m * n];
    packed.matmul(x, b, &mut y, m, &mut QuantScratch::default(), None);
    let err: Vec<f32> = y.iter().zip(&want).map(|(g, w)| g - w).collect();
    let rms = (err.iter().map(|e| e * e).sum::<f32>() / err.len() as f32).sqrt();
    (rms, err.iter().fold(0f32, |m, e| m.max(e.abs())))
}

#[test]
fn int8_error_is_the_rounding_error() {
    let (m, k, n) = (19, 130, 70);
    let (x, w, b) = (data(m * k, 4), data(k * n, 5), data(n, 6));
    // Rounding both factors to 8 bits: each product is off by
    // ~|x|·Δw + |w|·Δx (Δ uniform in ±step/2, steps 1/127 and 2/255
    // here), std ≈ 0.0019; over 130 products ≈ 0.021.
    let (rms, max) = int8_error(&x, &w, &b, m, k, n, None);
    assert!(rms < 0.025 && max < 0.1, "rms {rms}, max {max}");
}

#[test]
fn smoothing_tames_an_outlier_channel() {
    let (m, k, n) = (19, 130, 70);
    let (mut x, w, b) = (data(m * k, 4), data(k * n, 5), data(n, 6));
    // Channel 3 carries activations 30x the others (as LayerNorm
    // outputs of real BERTs do): it sets the range of its group.
    for row in x.chunks_exact_mut(k) {
        row[3] *= 30.0;
    }
    let act_max: Vec<f32> = (0..k)
        .map(|j| x.chunks_exact(k).fold(0f32, |a, r| a.max(r[j].abs())))
        .collect();
    let (plain, _) = int8_error(&x, &w, &b, m, k, n, None);
    let (smoothed, _) = int8_error(&x, &w, &b, m, k, n, Some(&act_max));
    assert!(
        smoothed < 0.7 * plain,
        "smoothed rms {smoothed}, plain {plain}"
    );
}

#[test]
fn int8_kernel_equals_the_scalar_loops() {
    // k spans two full channel groups and a ragged third.
    let (m, k, n) = (5, 2 * QGROUP + 18, 40);
    let (x, w, b) = (data(m * k, 8), data(k * n, 9), data(n, 10));
    let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
    let mut scratch = QuantScratch::default();
    scratch.quantize(&x, m, k, packed.k4, packed.group, &packed.x_scales);
    let n_groups = groups(k, packed.group);
    let tile = I8Tile {
        k4: packed.k4,
        group: packed.group,
        panel: &packed.panels[..packed.k4 * NR],
        group_sums: &packed.group_sums[..n_groups * NR],
        w_scales: &packed.w_scales[..n_groups * NR],
        bias: &b[..NR],
        act: None,
    };
    let mut fast = vec![0f32; m * NR];
    // SAFETY: `fast` is the m × NR tile.
    unsafe { tile.run(&scratch.bytes, &scratch.quants, m, fast.as_mut_ptr(), NR) };
    for r in 0..m {
        let row = &scratch.bytes[r * packed.k4..(r + 1) * packed.k4];
        let mut want = [0f32; NR];
        for g in 0..n_groups {
            let q = scratch.quants[r * n_groups + g];
            let sums = int_sums(row, tile.panel, group_quads(g, packed.group, packed.k4));
            for j in 0..NR {
                let (ws, gs) = (tile.w_scales[g * NR + j], tile.group_sums[g * NR + j]);
                want[j] += sums[j] as f32 * (q.step * ws) + q.min * gs;
            }
        }
        for j in 0..NR {
            let want = want[j] + b[j];
            let got = fast[r * NR + j];
            // Fused multiply-adds round once where the loop rounds twice.
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }
}

/// The AVX2 int8 kernels, on widened words and by AVX-VNNI (or its exact
/// AVX2 emulation where the CPU lacks it), compute the exact integer
/// sums, so they give the AVX-512 VNNI kernel's floats bit for bit (same
/// epilogue, same order) and the scalar loop's within its rounding.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_int8_equals_the_other_int8_kernels() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    // Two full channel groups and a ragged third; large activations
    // and weights, where vpmaddubsw's i16 sums would saturate.
    let (m, k, n) = (6, 2 * QGROUP + 18, 40);
    let (mut x, w, b) = (data(m * k, 21), data(k * n, 22), data(n, 23));
    x.iter_mut().step_by(3).for_each(|v| *v = v.signum() * 8.0);
    let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
    let wide = wide_panels(&packed.panels, packed.k4);
    let mut scratch = QuantScratch::default();
    scratch.quantize(&x, m, k, packed.k4, packed.group, &packed.x_scales);
    scratch.widen();
    let n_groups = groups(k, packed.group);
    for p in 0..n.div_ceil(NR) {
        let cols = NR.min(n - p * NR);
        let tile = I8Tile {
            k4: packed.k4,
            group: packed.group,
            panel: &packed.panels[p * packed.k4 * NR..(p + 1) * packed.k4 * NR],
            group_sums: &packed.group_sums[p * n_groups * NR..(p + 1) * n_groups * NR],
            w_scales: &packed.w_scales[p * n_groups * NR..(p + 1) * n_groups * NR],
            bias: &b[p * NR..p * NR + cols],
            act: None,
        };
        let wide = &wide[p * packed.k4 * NR..(p + 1) * packed.k4 * NR];
        let (mut ours, mut theirs) = (vec![0f32; m * cols], vec![0f32; m * cols]);
        // SAFETY: AVX2 + FMA checked; 6 rows of words and quants; the
        // m × cols tiles.
        unsafe {
            avx2::tile_i16::<6>(
                &tile,
                wide,
                &scratch.words,
                &scratch.quants,
                ours.as_mut_ptr(),
                cols,
            );
            tile.run(
                &scratch.bytes,
                &scratch.quants,
                m,
                theirs.as_mut_ptr(),
                cols,
            );
        }
        let mut emulated = vec![0f32; m * cols];
        // SAFETY: AVX2 + FMA checked; 6 rows of bytes and quants; the
        // m × cols tile.
        unsafe {
            avx2::tile_i8_vnni_emulated::<6>(
                &tile,
                &scratch.bytes,
                &scratch.quants,
                emulated.as_mut_ptr(),
                cols,
            )
        };
        assert_eq!(
            ours, emulated,
            "panel {p}: 16-bit words vs vpdpbusd's definition"
        );
        if is_x86_feature_detected!("avxvnni") {
            let mut vnni = vec![0f32; m * cols];
            // SAFETY: as above, and the CPU has AVX-VNNI (checked).
            unsafe {
                avx2::tile_i8_vnni::<6>(
                    &tile,
                    &scratch.bytes,
                    &scratch.quants,
                    vnni.as_mut_ptr(),
                    cols,
                )
            };
            assert_eq!(ours, vnni, "panel {p}: 16-bit words vs AVX-VNNI");
        } else {
            eprintln!("no AVX-VNNI on this CPU: its tile ran as emulated only");
        }
        if features().vnni {
            assert_eq!(ours, theirs, "panel {p}: AVX2 vs VNNI");
        } else {
            for (o, t) in ours.iter().zip(&theirs) {
                // Fused multiply-adds round once where the loop rounds twice.
                assert!((o - t).abs() <= 1e-5 * t.abs().max(1.0), "{o} vs {t}");
            }
        }
    }
}

/// The vector quantizers (each the CPU has) give the scalar one's
/// bytes and range, bit for bit, on groups of every length to past
/// two vectors, with ties, a constant group and a zero scale.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_quantizers_equal_the_scalar_one() {
    use std::arch::is_x86_feature_detected as has;
    for len in 1..=70 {
        let mut x = data(len, len as u32);
        let mut xs: Vec<f32> = data(len, 100 + len as u32)
            .iter()
            .map(|v| 1.5 + v)
            .collect();
        if len % 5 == 0 {
            x.iter_mut().for_each(|v| *v = 0.25);
        }
        if len > 3 {
            xs[2] = 0.0;
            // Exactly halfway between two steps: round to even.
            x[1] = x[0] + 0.5 * (x[3] - x[0]);
        }
        let mut want = vec![0u8; len];
        let q = quantize_group_scalar(&x, &xs, &mut want);
        let check = |name: &str, got: GroupQuant, bytes: &[u8]| {
            assert_eq!(bytes, &want[..], "{name}, len {len}");
            assert_eq!(
                (got.step.to_bits(), got.min.to_bits()),
                (q.step.to_bits(), q.min.to_bits()),
                "{name}"
            );
        };
        if has!("avx2") && has!("fma") {
            let mut got = vec![0u8; len];
            // SAFETY: AVX2 checked; all three hold len values.
            let g = unsafe { avx2::quantize_group(&x, &xs, &mut got) };
            check("avx2", g, &got);
        }
        if has!("avx512f") && has!("avx512bw") {
            let mut got = vec![0u8; len];
            // SAFETY: AVX-512 F + BW checked; all three hold len values.
            let g = unsafe { avx512::quantize_group(&x, &xs, &mut got) };
            check("avx512", g, &got);
        }
    }
}

#[test]
fn stored_parts_give_back_the_same_multiply() {
    let (m, k, n) = (7, 2 * QGROUP + 20, 45);
    let (x, w, b) = (data(m * k, 14), data(k * n, 15), data(n, 16));
    let act_max: Vec<f32> = (0..k).map(|j| 0.5 + (j % 7) as f32).collect();
    let scheme = I8Scheme {
        group: 32,
        alpha: 0.6,
    };
    let packed = PackedI8::new(&w, k, n, Some(&act_max), scheme);
    let PackedData::I8 {
        panels,
        w_scales,
        x_scales,
        group,
    } = packed.to_parts()
    else {
        panic!("int8 weights store as int8");
    };
    assert_eq!(group, 32);
    let back =
        PackedI8::from_parts(panels.clone(), w_scales.clone(), x_scales, group, k, n).unwrap();
    assert_eq!(back.group_sums, packed.group_sums);
    let mut scratch = QuantScratch::default();
    let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
    packed.matmul(&x, &b, &mut want, m, &mut scratch, None);
    back.matmul(&x, &b, &mut got, m, &mut scratch, None);
    assert_eq!(want, got);
    // Parts of the wrong size are refused, naming the part.
    let short = PackedI8::from_parts(panels, w_scales[1..].to_vec(), vec![1.0; k], 32, k, n);
    assert!(short.unwrap_err().contains("w_scales"));
    let bf = PackedBf16::new(&w, k, n);
    let PackedData::Bf16 { panels } = bf.to_parts() else {
        panic!("bf16 weights store as bf16");
    };
    let back = PackedBf16::from_parts(panels.clone(), k, n).unwrap();
    let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
    bf.matmul(&x, &b, &mut want, m, scratch.bf16_pairs(), None);
    back.matmul(&x, &b, &mut got, m, scratch.bf16_pairs(), None);
    assert_eq!(want, got);
    assert!(PackedBf16::from_parts(panels, k + 2, n).is_err());
}

#[test]
fn group_weight_scales_keep_small_rows_fine() {
    // One input row of the weights 50x the others (what smoothing an
    // outlier channel makes): with a scale per column it would set the
    // step of every row (50/127); per group, only of its own group.
    let (k, n) = (4 * QGROUP, 40);
    let mut w = data(k * n, 18);
    for v in &mut w[5 * n..6 * n] {
        *v *= 50.0;
    }
    let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
    let n_groups = groups(k, QGROUP);
    for r in 0..k {
        for c in 0..n {
            let (p, lane) = (c / NR, c % NR);
            let q = packed.panels[p * packed.k4 * NR + (r / 4) * 4 * NR + lane * 4 + r % 4];
            let scale = packed.w_scales[(p * n_groups + r / QGROUP) * NR + lane];
            let err = (f32::from(q) * scale - w[r * n + c]).abs();
            let bound = if r < QGROUP {
                25.0 / 127.0
            } else {
                0.5 / 127.0
            };
            assert!(err <= bound * 1.001, "row {r}, column {c}: error {err}");
        }
    }
}

#[test]
fn a_constant_row_quantizes_exactly() {
    let (m, k, n) = (2, 8, 3);
    let w = data(k * n, 7);
    let packed = PackedI8::new(&w, k, n, None, I8Scheme::default());
    let mut y = vec![f32::NAN; m * n];
    let x = vec![0.0; m * k];
    packed.matmul(
        &x,
        &[1.0, 2.0, 3.0],
        &mut y,
        m,
        &mut QuantScratch::default(),
        None,
    );
    assert_eq!(y, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
}
