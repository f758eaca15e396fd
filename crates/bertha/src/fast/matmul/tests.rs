//! The fp32 products, the fused activations and the panel transposes
//! against their definitions, and the helpers every kernel test shares.

use super::*;

pub(super) fn data(len: usize, seed: u32) -> Vec<f32> {
    // A small LCG: deterministic values in [-1, 1).
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

pub(super) fn reference(
    x: &[f32],
    w_t: &[f32],
    bias: &[f32],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let dot: f64 = (0..k)
                .map(|i| f64::from(x[r * k + i]) * f64::from(w_t[i * n + c]))
                .sum();
            y[r * n + c] = dot as f32 + bias[c];
        }
    }
    y
}

#[test]
fn fp32_matches_the_definition_on_ragged_shapes() {
    for &(m, k, n) in &[(1, 3, 1), (7, 33, 45), (70, 64, 96), (9, 384, 40)] {
        let (x, w, b) = (data(m * k, 1), data(k * n, 2), data(n, 3));
        // Both layouts: panels (in halves where the AVX2 tile runs) and
        // row-major (where no tile runs).
        for panels in [true, false] {
            let packed = PackedF32::with_panels(&w, k, n, panels);
            let mut y = vec![f32::NAN; m * n];
            packed.matmul(&x, &b, &mut y, m, None);
            let want = reference(&x, &w, &b, m, k, n);
            for (i, (g, w)) in y.iter().zip(&want).enumerate() {
                assert!((g - w).abs() < 1e-4, "({m},{k},{n}) [{i}]: {g} vs {w}");
            }
            assert_eq!(packed.unpack(), w);
        }
    }
}

/// One call of a register tile kernel: `(rows, a, k, panel, c, ldc, cols,
/// bias, act)`, as every instruction set's `tile_f32::<rows>` takes them.
pub(super) type F32Tile<'a> =
    &'a dyn Fn(usize, &[f32], usize, &[f32], *mut f32, usize, usize, &[f32], Option<Act>);

/// A register tile kernel against the f64 definition: every tile height
/// to `max_rows`, partial halves and panels, k from 1 to past a group (and
/// not a multiple of 4), with the activation applied, and nothing written
/// past the tile; on a panel in rows of [`NR`], or in halves
/// ([`panel_index`]).
pub(super) fn assert_f32_tiles_equal_the_definition(max_rows: usize, halves: bool, tile: F32Tile) {
    for (k, cols) in [(1, 32), (7, 5), (33, 16), (64, 17), (130, 31)] {
        let (w, b) = (data(k * NR, k as u32), data(NR, 3));
        let mut panel = vec![0f32; k * NR];
        for row in 0..k {
            for j in 0..NR {
                panel[panel_index(row, j, k, halves)] = w[row * NR + j];
            }
        }
        for rows in 1..=max_rows {
            let x = data(rows * k, 40 + rows as u32);
            let want = reference(&x, &w, &b, rows, k, NR);
            for act in [None, Some(Act::GeluErf)] {
                // A stride past the tile: columns from `cols` on and
                // the gap stay NaN (nothing is written there).
                let ldc = NR + 3;
                let mut c = vec![f32::NAN; rows * ldc];
                tile(
                    rows,
                    &x,
                    k,
                    &panel,
                    c.as_mut_ptr(),
                    ldc,
                    cols,
                    &b[..cols],
                    act,
                );
                for r in 0..rows {
                    let mut row = want[r * NR..r * NR + cols].to_vec();
                    if let Some(act) = act {
                        activate_body(&mut row, act);
                    }
                    let got = &c[r * ldc..(r + 1) * ldc];
                    for (j, (g, w)) in got.iter().zip(&row).enumerate() {
                        assert!(
                            (g - w).abs() < 1e-4,
                            "k {k} rows {rows} [{r},{j}]: {g} vs {w}"
                        );
                    }
                    assert!(got[cols..].iter().all(|v| v.is_nan()), "wrote past {cols}");
                }
            }
        }
    }
}

/// The AVX2 tiles (where the CPU has AVX2, whatever BERTHA_ISA picks)
/// against the f64 definition, on panels in rows of 32 (attention's) and
/// in halves (the weights', where these tiles run).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_f32_tiles_equal_the_definition() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    for halves in [false, true] {
        assert_f32_tiles_equal_the_definition(
            avx2::MR,
            halves,
            &|rows, x, k, panel, c, ldc, cols, bias, act| {
                macro_rules! run {
                ($($n:literal)*) => {
                    match rows {
                        // SAFETY: AVX2 + FMA checked; c holds the rows ×
                        // cols tile at stride ldc.
                        $($n if halves => unsafe { avx2::tile_f32::<$n, true>(x, k, panel, c, ldc, cols, bias, act) },
                        $n => unsafe { avx2::tile_f32::<$n, false>(x, k, panel, c, ldc, cols, bias, act) },)*
                        _ => unreachable!(),
                    }
                };
            }
                run!(1 2 3 4 5 6);
            },
        );
    }
}

#[test]
fn the_fused_activation_is_the_activation_of_the_product() {
    let (m, k, n) = (11, 40, 50);
    let (x, w, b) = (data(m * k, 11), data(k * n, 12), data(n, 13));
    let (f, q) = (
        PackedF32::new(&w, k, n),
        PackedI8::new(&w, k, n, None, I8Scheme::default()),
    );
    let row_major = PackedF32::with_panels(&w, k, n, false);
    let mut scratch = QuantScratch::default();
    for act in [Act::Relu, Act::GeluErf, Act::GeluTanh, Act::Tanh] {
        let (mut plain, mut fused) = (vec![0f32; m * n], vec![0f32; m * n]);
        for f in [&f, &row_major] {
            f.matmul(&x, &b, &mut plain, m, None);
            f.matmul(&x, &b, &mut fused, m, Some(act));
            activate_body(&mut plain, act);
            assert_eq!(plain, fused, "{act:?} (fp32)");
        }
        q.matmul(&x, &b, &mut plain, m, &mut scratch, None);
        q.matmul(&x, &b, &mut fused, m, &mut scratch, Some(act));
        activate_body(&mut plain, act);
        for (p, f) in plain.iter().zip(&fused) {
            assert!((p - f).abs() < 1e-6, "{act:?} (int8): {p} vs {f}");
        }
    }
    assert!(fused_has_negatives_clipped(&f, &x, &b, m));
}

/// The tile store's activations in registers give the bits of the
/// scalar loops, over a dense sweep and at the extremes.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_activations_equal_the_scalar_ones() {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_storeu_ps};
    if !features().avx512_bw {
        return;
    }
    let mut xs: Vec<f32> = (-200_000..200_000).map(|i| i as f32 * 1e-4).collect();
    xs.extend([
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1e30,
        -1e30,
        f32::MAX,
        f32::MIN,
        88.0,
        -88.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    xs.resize(xs.len().next_multiple_of(16), 3.0);
    for act in [Act::Relu, Act::GeluErf, Act::GeluTanh, Act::Tanh] {
        let mut want = xs.clone();
        activate_body(&mut want, act);
        let mut got = vec![0f32; xs.len()];
        for (x, y) in xs.chunks_exact(16).zip(got.chunks_exact_mut(16)) {
            // SAFETY: the CPU has AVX-512F (checked); 16 lanes each.
            unsafe {
                _mm512_storeu_ps(
                    y.as_mut_ptr(),
                    avx512::activate(_mm512_loadu_ps(x.as_ptr()), act),
                )
            };
        }
        for ((x, w), g) in xs.iter().zip(&want).zip(&got) {
            assert_eq!(w.to_bits(), g.to_bits(), "{act:?}({x}): {w} vs {g}");
        }
        // With the slope (the FFN-in tiles' store): the same outputs,
        // and the slopes of the scalar derivative.
        for (chunk, want) in xs.chunks_exact(16).zip(want.chunks_exact(16)) {
            let (mut y, mut slope) = ([0f32; 16], [0f32; 16]);
            // SAFETY: the CPU has AVX-512F (checked); 16 lanes each.
            unsafe {
                let (v, g) = avx512::act_and_grad(_mm512_loadu_ps(chunk.as_ptr()), act);
                _mm512_storeu_ps(y.as_mut_ptr(), v);
                _mm512_storeu_ps(slope.as_mut_ptr(), g);
            }
            for (j, x) in chunk.iter().enumerate() {
                let w = crate::model::ops::act_grad(*x, act);
                assert_eq!(
                    want[j].to_bits(),
                    y[j].to_bits(),
                    "{act:?}({x}) with its slope"
                );
                assert_eq!(
                    w.to_bits(),
                    slope[j].to_bits(),
                    "{act:?}'({x}): {w} vs {}",
                    slope[j]
                );
            }
        }
    }
}

#[test]
fn transpose16_transposes_partial_blocks() {
    let (ss, ds) = (21, 19);
    let src: Vec<f32> = (0..16 * ss).map(|i| i as f32 + 0.5).collect();
    for (rows, cols) in [(16, 16), (9, 16), (16, 7), (1, 1), (13, 11)] {
        let mut dst = vec![-1f32; 15 * ds + 16];
        transpose16(&src, ss, rows, cols, &mut dst, ds);
        for c in 0..16 {
            for r in 0..16 {
                let got = dst[c * ds + r];
                let want = match (c < cols, r < rows) {
                    (false, _) => -1.0,
                    (true, false) => 0.0,
                    (true, true) => src[r * ss + c],
                };
                assert_eq!(got, want, "{rows} × {cols} block, [{c}, {r}]");
            }
        }
    }
}

/// ReLU really ran: the plain product has negatives, the fused none.
fn fused_has_negatives_clipped(f: &PackedF32, x: &[f32], b: &[f32], m: usize) -> bool {
    let n = f.out_dim();
    let (mut plain, mut fused) = (vec![0f32; m * n], vec![0f32; m * n]);
    f.matmul(x, b, &mut plain, m, None);
    f.matmul(x, b, &mut fused, m, Some(Act::Relu));
    plain.iter().any(|v| *v < 0.0) && fused.iter().all(|v| *v >= 0.0)
}

#[test]
fn even_tiles_cover_the_rows_in_the_fewest_even_tiles() {
    let tiles = |rows: std::ops::Range<usize>, most| even_tiles(rows, most).collect::<Vec<_>>();
    assert_eq!(tiles(0..25, 12), [(0, 9), (9, 8), (17, 8)]);
    assert_eq!(tiles(96..120, 12), [(96, 12), (108, 12)]);
    assert_eq!(tiles(5..6, 6), [(5, 1)]);
    assert!(tiles(3..3, 6).is_empty());
    for len in 0..100 {
        for most in 1..14 {
            let got = tiles(10..10 + len, most);
            assert_eq!(
                got.len(),
                len.div_ceil(most),
                "{len} rows in tiles of {most}"
            );
            let mut next = 10;
            for &(start, rows) in &got {
                assert_eq!(start, next, "tiles of {len} rows by {most} leave a gap");
                assert!((1..=most).contains(&rows), "{got:?}");
                next += rows;
            }
            assert_eq!(next, 10 + len);
            let sizes = got.iter().map(|t| t.1);
            assert!(
                sizes.clone().max().unwrap_or(0) - sizes.min().unwrap_or(0) <= 1,
                "{got:?}"
            );
        }
    }
}
