//! Tests of the products: inference and training, strided, serial, from
//! pairs and transposes, into new buffers, and the fused stores a
//! training FFN chains.

use super::driver::{product_bf16_on, ProductBuffers, SharedPairs, Store, Sums};
use super::fused::{act_grad_on, product_bf16_act};
use super::operands::{Left, LeftIn, Right, Strided};
use super::packed::PackedBf16;
use super::pairs::{as_words, from_bf16, pair_stride, round_row, round_rows, to_bf16};
use super::panels::{pack_panels_reusing, panels_len};
use super::products::{
    product_bf16, product_bf16_both_pairs, product_bf16_new, product_bf16_pairs_new,
    product_bf16_pairs_right, product_bf16_transposed_pairs,
};
use super::serial::product_bf16_serial;
use super::tiles::MR_BF16;
use super::transposed::{interleave_rows, transposed_len, Source};
use crate::fast::cpu::features;
use crate::fast::kernels::{activate_body, Act};
use crate::model::ops::act_grad;

/// The bf16 multiply equals an f64 sum of the bf16-rounded operands
/// (up to fp32 accumulation) for shapes with partial panels, odd `k`,
/// short tiles and more than one task.
#[test]
fn bf16_products_equal_the_rounded_operands_sum() {
    let mut seed = 7u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    for (m, k, n) in [(1, 1, 1), (5, 7, 33), (13, 64, 32), (200, 385, 70)] {
        let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
        let w: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
        let bias: Vec<f32> = (0..n).map(|_| rnd()).collect();
        let packed = PackedBf16::new(&w, k, n);
        let mut y = vec![0f32; m * n];
        packed.matmul(&x, &bias, &mut y, m, &mut Vec::new(), None);
        // The scalar loop (CPUs without AVX512-BF16) gives the same.
        let mut scalar = vec![0f32; m * n];
        packed.matmul_on(false, &x, &bias, &mut scalar, m, &mut Vec::new(), None);
        let r = |v: f32| f64::from(from_bf16(to_bf16(v)));
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|t| r(x[i * k + t]) * r(w[t * n + j]))
                    .sum::<f64>()
                    + f64::from(bias[j]);
                let got = f64::from(y[i * n + j]);
                let other = f64::from(scalar[i * n + j]);
                assert!(
                    (other - want).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * want.abs(),
                    "scalar ({i}, {j}): {other} vs {want}"
                );
                assert!(
                    (got - want).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * want.abs(),
                    "[{m}, {k}] x [{k}, {n}] at ({i}, {j}): {got} vs {want}"
                );
            }
        }
    }
}

/// Strided operands (transposed either side) multiply as their
/// row-major copies, on the SIMD and the scalar tiles; the output is
/// overwritten, or with a bias and `accumulate` added to. One set of
/// buffers serves every product, larger ones first, so stale values
/// (a wider partial panel's columns among them) must not leak in.
#[test]
fn strided_products_equal_the_rounded_operands_sum() {
    let val = |i: usize| ((i as f32) * 0.618).sin();
    let mut buffers = ProductBuffers {
        pairs: Vec::new(),
        panels: Vec::new(),
    };
    // Odd and even k: a transposed right operand with even k is packed
    // 16 × 16 blocks at a time (full and partial ones here). A
    // transposed left operand is interleaved in blocks of a tile's rows
    // (m not a multiple of MR_BF16 here, and one block per task below).
    for (m, n, k) in [
        (130, 70, 129),
        (1, 1, 1),
        (7, 33, 5),
        (24, 45, 70),
        (3, 2, 2),
        (40, 70, 129),
        (130, 20, 37),
        // On AMX, transposed rows of 512 words are padded
        // (transposed_stride).
        (40, 20, 1024),
    ] {
        // a as its transpose's storage [k, m], b row-major [k, n].
        let at: Vec<f32> = (0..k * m).map(val).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i + 999)).collect();
        // b's transpose's storage [n, k]; a row-major copy of a.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let a: Vec<f32> = (0..m * k).map(|i| at[(i % k) * m + i / k]).collect();
        let bias: Vec<f32> = (0..n).map(|j| val(j + 5000)).collect();
        let start: Vec<f32> = (0..m * n).map(|i| val(i + 7000)).collect();
        let layouts = [
            (Strided::transposed(&at, m), Strided::rows(&b, n)),
            (Strided::rows(&a, k), Strided::transposed(&bt, k)),
        ];
        let outputs = [
            Sums::default(),
            Sums {
                bias: Some(&bias),
                accumulate: true,
            },
        ];
        for (simd, fresh) in [features().bf16, false]
            .into_iter()
            .flat_map(|simd| [(simd, false), (simd, true)])
        {
            for ((sa, sb), sums) in layouts.iter().flat_map(|l| outputs.map(|o| (*l, o))) {
                let mut c = start.clone();
                // Buffers kept from larger products, or new ones sized
                // for this product alone.
                let mut new = ProductBuffers {
                    pairs: Vec::new(),
                    panels: Vec::new(),
                };
                let buffers = if fresh { &mut new } else { &mut buffers };
                product_bf16_on(
                    simd,
                    (m, n, k),
                    Left::Strided(sa),
                    Right::F32(sb),
                    &mut c,
                    Store::Sums(sums),
                    buffers,
                );
                let r = |v: f32| f64::from(from_bf16(to_bf16(v)));
                for i in 0..m {
                    for j in 0..n {
                        let mut want: f64 =
                            (0..k).map(|t| r(at[t * m + i]) * r(b[t * n + j])).sum();
                        if sums.accumulate {
                            want += f64::from(bias[j]) + f64::from(start[i * n + j]);
                        }
                        let got = f64::from(c[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-5 * (k as f64).sqrt(),
                            "simd {simd} [{m}, {k}] x [{k}, {n}] ({}) at ({i}, {j}): {got} vs {want}",
                            sums.accumulate
                        );
                    }
                }
            }
        }
    }
}

/// A left operand whose rows lie further apart than their length is
/// read in place, and the serial product (a parallel task's, into rows
/// `ldc` apart, scaled) gives the parallel product's bits, leaving the
/// columns between its rows alone; with `accumulate` it adds. The
/// first case's left operand is larger than L2, so its parallel tasks
/// go block of rows by block.
#[test]
fn serial_and_strided_products_equal_the_parallel_contiguous_ones() {
    let val = |i: usize| ((i as f32) * 0.731).cos();
    const _: () = assert!(1030 * 520 / 2 * 4 > super::super::LEFT_IN_L2);
    for (m, n, k) in [
        (1030, 70, 520),
        (130, 70, 129),
        (7, 33, 5),
        (24, 45, 64),
        (1, 1, 1),
    ] {
        let wide = k + 3;
        let a_wide: Vec<f32> = (0..m * wide).map(val).collect();
        let a: Vec<f32> = (0..m * k).map(|i| a_wide[(i / k) * wide + i % k]).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i + 333)).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut want = vec![0f32; m * n];
        product_bf16(
            (m, n, k),
            Strided::rows(&a, k),
            Strided::rows(&b, n),
            &mut want,
            Sums::default(),
        );
        let strided = Strided {
            data: &a_wide,
            rs: wide,
            cs: 1,
        };
        let mut got = vec![0f32; m * n];
        product_bf16(
            (m, n, k),
            strided,
            Strided::transposed(&bt, k),
            &mut got,
            Sums::default(),
        );
        assert_eq!(got, want, "[{m}, {k}] x [{k}, {n}] with rows {wide} apart");
        let ldc = n + 5;
        let start: Vec<f32> = (0..m * ldc).map(|i| val(i + 9000)).collect();
        let [c, added] = [(false, 0.5), (true, 1.0)].map(|(accumulate, scale)| {
            let mut c = start.clone();
            let dst = (c.as_mut_ptr(), ldc);
            // SAFETY: c holds m rows of ldc ≥ n values.
            unsafe {
                product_bf16_serial(
                    (m, n, k),
                    strided,
                    Strided::rows(&b, n),
                    dst,
                    accumulate,
                    scale,
                )
            };
            c
        });
        for i in 0..m {
            for j in 0..ldc {
                let at = i * ldc + j;
                if j < n {
                    assert_eq!(c[at], 0.5 * want[i * n + j], "serial ({i}, {j})");
                    assert_eq!(
                        added[at],
                        start[at] + want[i * n + j],
                        "accumulated ({i}, {j})"
                    );
                } else {
                    assert_eq!(
                        (c[at], added[at]),
                        (start[at], start[at]),
                        "outside ({i}, {j})"
                    );
                }
            }
        }
    }
}

/// A weight gradient whose `dy` comes as bf16 pairs (rounded where it
/// was made) has the bits of the one that rounds the fp32 `dy` itself:
/// the interleave from pairs (AVX-512 over 48 columns, the scalar loop
/// for the rest) equals the one from fp32, with odd widths and an odd
/// number of rows.
#[test]
fn products_of_transposed_pairs_equal_those_of_the_fp32_transpose() {
    let val = |i: usize| ((i as f32) * 0.613).sin();
    for (n, rows, k) in [(101, 37, 50), (61, 8, 33), (3, 1, 5)] {
        let dy: Vec<f32> = (0..rows * n).map(val).collect();
        let x: Vec<f32> = (0..rows * k).map(|i| val(i + 77)).collect();
        let n2 = n.div_ceil(2);
        let mut pairs = vec![0u32; rows * n2];
        for (row, out) in dy.chunks_exact(n).zip(pairs.chunks_exact_mut(n2)) {
            round_row(row, out);
        }
        let start: Vec<f32> = (0..n * k).map(|i| val(i + 5000)).collect();
        let sums = Sums {
            bias: None,
            accumulate: true,
        };
        let mut want = start.clone();
        let a = Strided::transposed(&dy, n);
        product_bf16((n, k, rows), a, Strided::rows(&x, k), &mut want, sums);
        let mut got = start.clone();
        let b = Strided::rows(&x, k);
        product_bf16_transposed_pairs((n, k, rows), &pairs, b, &mut got, sums);
        assert_eq!(got, want, "dyᵀ [{n}, {rows}] · x [{rows}, {k}]");
        assert_ne!(got, start);
    }
}

/// A weight gradient whose output gradient and input both come as bf16
/// pairs (as the passes that made them stored them) has the bits of
/// the one that rounds and packs the fp32 operands itself: full and
/// partial panels, odd widths and an odd number of rows.
#[test]
fn products_of_both_pairs_equal_those_of_the_fp32_operands() {
    let val = |i: usize| ((i as f32) * 0.419).cos();
    for (n, rows, k) in [(19, 45, 75), (12, 8, 64), (1, 1, 1)] {
        let dy: Vec<f32> = (0..rows * n).map(val).collect();
        let x: Vec<f32> = (0..rows * k).map(|i| val(i + 91)).collect();
        let k2 = k.div_ceil(2);
        let mut pairs = vec![0u32; rows * k2];
        for (row, out) in x.chunks_exact(k).zip(pairs.chunks_exact_mut(k2)) {
            round_row(row, out);
        }
        let start: Vec<f32> = (0..n * k).map(|i| val(i + 3000)).collect();
        let sums = Sums {
            bias: None,
            accumulate: true,
        };
        let a = Strided::transposed(&dy, n);
        let mut want = start.clone();
        product_bf16((n, k, rows), a, Strided::rows(&x, k), &mut want, sums);
        let n2 = n.div_ceil(2);
        let mut dy_pairs = vec![0u32; rows * n2];
        for (row, out) in dy.chunks_exact(n).zip(dy_pairs.chunks_exact_mut(n2)) {
            round_row(row, out);
        }
        let mut got = start.clone();
        product_bf16_both_pairs((n, k, rows), &dy_pairs, &pairs, &mut got, sums);
        assert_eq!(got, want, "dyᵀ [{n}, {rows}] · x [{rows}, {k}]");
        assert_ne!(got, start);
    }
}

/// Products into new, unzeroed buffers (NaN-filled in these debug
/// builds, so a value left unwritten shows) equal the products into
/// zeroed ones, bit for bit: odd widths, partial panels and tiles, and
/// the pairs of the activation beside the sums.
#[test]
fn products_into_new_buffers_write_every_value() {
    use crate::fast::kernels::Act;
    let val = |i: usize| ((i as f32) * 0.523).sin();
    for (m, n, k) in [(1, 1, 1), (13, 70, 33), (30, 33, 64)] {
        let x: Vec<f32> = (0..m * k).map(val).collect();
        let w: Vec<f32> = (0..n * k).map(|i| val(i + 500)).collect();
        let bias: Vec<f32> = (0..n).map(|i| val(i + 77)).collect();
        let (a, b) = (Strided::rows(&x, k), Strided::transposed(&w, k));
        let sums = Sums {
            bias: Some(&bias),
            accumulate: false,
        };
        let mut want = vec![0f32; m * n];
        product_bf16((m, n, k), a, b, &mut want, sums);
        let got = product_bf16_new((m, n, k), a, b, Some(&bias));
        assert_eq!(as_words(&got), as_words(&want), "[{m}, {n}, {k}]");
        let (slopes, pairs, panels) = product_bf16_act(
            (m, n, k),
            LeftIn::F32(a),
            Right::F32(b),
            (&bias, Act::GeluErf),
        );
        assert_eq!(panels.len() * 2, panels_len(m, n), "[{m}, {n}, {k}] panels");
        let mut raw = vec![0f32; m * n];
        product_bf16((m, n, k), a, b, &mut raw, Sums::default());
        let n2 = n.div_ceil(2);
        let mut act: Vec<f32> = raw
            .iter()
            .zip(bias.iter().cycle())
            .map(|(v, b)| v + b)
            .collect();
        let want_slopes: Vec<f32> = act.iter().map(|z| act_grad(*z, Act::GeluErf)).collect();
        assert_eq!(
            as_words(&slopes),
            as_words(&want_slopes),
            "[{m}, {n}, {k}] slopes"
        );
        crate::fast::kernels::activate_body(&mut act, Act::GeluErf);
        let mut rounded = vec![0u32; m * n2];
        for (row, out) in act.chunks_exact(n).zip(rounded.chunks_exact_mut(n2)) {
            round_row(row, out);
        }
        assert_eq!(as_words(&pairs), &rounded[..], "[{m}, {n}, {k}] pairs");
        // FFN-out's product on those pairs, into a new buffer.
        let w2: Vec<f32> = (0..5 * n).map(|i| val(i + 900)).collect();
        let b2 = Strided::transposed(&w2, n);
        let y = product_bf16_pairs_new((m, 5, n), &rounded, Right::F32(b2), &[0.5; 5]);
        let mut want = vec![0f32; m * 5];
        let sums = Sums {
            bias: Some(&[0.5; 5]),
            accumulate: false,
        };
        product_bf16_pairs_right((m, 5, n), &rounded, Right::F32(b2), &mut want, sums);
        assert_eq!(as_words(&y), as_words(&want), "[{m}, 5, {n}] from pairs");
    }
}

/// Two multiplies chained through bf16 pairs stored by the first
/// one's tiles give the bits of the fp32 chain (the second rounds the
/// first's fp32 output itself), with an activation, odd widths and
/// partial panels and tiles.
#[test]
fn pairs_out_of_the_store_equal_rounding_the_fp32_output() {
    let val = |i: usize| ((i as f32) * 0.377).sin();
    for (m, k, mid, n) in [(1, 4, 2, 3), (13, 40, 37, 9), (30, 64, 70, 33)] {
        let x: Vec<f32> = (0..m * k).map(val).collect();
        let w1 = PackedBf16::new(
            &(0..k * mid).map(|i| val(i + 100)).collect::<Vec<_>>(),
            k,
            mid,
        );
        let w2 = PackedBf16::new(
            &(0..mid * n).map(|i| val(i + 900)).collect::<Vec<_>>(),
            mid,
            n,
        );
        let b1: Vec<f32> = (0..mid).map(|i| val(i + 5000) * 0.1).collect();
        let b2: Vec<f32> = (0..n).map(|i| val(i + 6000)).collect();
        let act = Some(Act::GeluErf);
        let (mut h, mut want, mut scratch) = (vec![0f32; m * mid], vec![0f32; m * n], Vec::new());
        w1.matmul(&x, &b1, &mut h, m, &mut scratch, act);
        w2.matmul(&h, &b2, &mut want, m, &mut scratch, None);
        // Stale values in the pairs buffer must not leak in.
        let mut pairs = vec![u32::MAX; 3];
        w1.matmul_to_pairs(&x, &b1, &mut pairs, m, &mut scratch, act);
        let mut got = vec![0f32; m * n];
        w2.matmul_pairs(&pairs[..m * mid.div_ceil(2)], &b2, &mut got, m, None);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "[{m}, {k}] -> {mid} -> {n}");
    }
}

/// A training FFN's two products: the first stores the activation's
/// slopes and its output's bf16 pairs from the same tiles, the second
/// reads those pairs; both equal the products on fp32 operands rounded
/// apart, bit for bit, on AVX512-BF16 (where the CPU has it) and the
/// scalar loop, for strided (transposed) weights, odd widths and
/// partial tiles. Backward, the second's input gradient times the
/// slopes (from the tiles' registers) gives the pairs of that product
/// stored, multiplied and rounded apart, bit for bit, and the bias
/// gradient its column sums.
#[test]
fn stored_pairs_feed_the_next_product_as_rounding_apart_does() {
    let val = |i: usize| ((i as f32) * 0.377).sin();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let sims = if features().bf16 {
        vec![false, true]
    } else {
        vec![false]
    };
    for simd in sims {
        for (m, k, mid, n) in [
            (1, 4, 3, 2),
            (13, 40, 37, 9),
            (30, 64, 70, 33),
            (200, 24, 40, 9),
            // A padded middle (pair_stride): rows of 1,024 + 16 words.
            (26, 6, 2048, 5),
            // On AMX, the middle's transpose has rows of 512 words,
            // padded (transposed_stride).
            (1024, 6, 40, 5),
        ] {
            let x: Vec<f32> = (0..m * k).map(val).collect();
            // nn.Linear weights [out, in], read transposed.
            let w1: Vec<f32> = (0..mid * k).map(|i| val(i + 100)).collect();
            let w2: Vec<f32> = (0..n * mid).map(|i| val(i + 900)).collect();
            let b1: Vec<f32> = (0..mid).map(|i| val(i + 5000) * 0.1).collect();
            let mut buffers = ProductBuffers::default();
            let mut run = |a: Left, b: Strided, c: &mut [f32], store: Store, (m, n, k)| {
                product_bf16_on(simd, (m, n, k), a, Right::F32(b), c, store, &mut buffers)
            };
            let w1_t = Strided::transposed(&w1, k);
            let mut want_f = vec![0f32; m * mid];
            let none = Store::Sums(Sums::default());
            run(
                Left::Strided(Strided::rows(&x, k)),
                w1_t,
                &mut want_f,
                none,
                (m, mid, k),
            );
            // The padding words (none but at 2,048) stay as they were:
            // no product may read them.
            let (mid2, ldp) = (mid.div_ceil(2), pair_stride(mid));
            let (mut f, mut pairs) = (vec![f32::NAN; m * mid], vec![u32::MAX; m * ldp]);
            // Garbage where the tiles must write every word.
            let mut panels = vec![u16::MAX; panels_len(m, mid)];
            let store = Store::Both {
                bias: &b1,
                act: Act::GeluErf,
                pairs: SharedPairs(pairs.as_mut_ptr()),
                ldp,
                panels: SharedPairs(panels.as_mut_ptr().cast()),
            };
            run(
                Left::Strided(Strided::rows(&x, k)),
                w1_t,
                &mut f,
                store,
                (m, mid, k),
            );
            let mut h = want_f.clone();
            let mut slopes = vec![0f32; m * mid];
            for (row, slopes) in h.chunks_exact_mut(mid).zip(slopes.chunks_exact_mut(mid)) {
                row.iter_mut().zip(&b1).for_each(|(v, b)| *v += b);
                for (g, z) in slopes.iter_mut().zip(&*row) {
                    *g = act_grad(*z, Act::GeluErf);
                }
                activate_body(row, Act::GeluErf);
            }
            assert_eq!(
                bits(&f),
                bits(&slopes),
                "slopes, [{m}, {k}] -> {mid}, simd {simd}"
            );
            let mut g_pairs = vec![0u32; m * mid2];
            round_rows(false, &h, m, mid, mid2, &mut g_pairs);
            let dense = |p: &[u32]| {
                let rows = p.chunks_exact(ldp).map(|r| &r[..mid2]);
                rows.flatten().copied().collect::<Vec<_>>()
            };
            assert_eq!(
                dense(&pairs),
                g_pairs,
                "pairs, [{m}, {k}] -> {mid}, simd {simd}"
            );
            let w2_t = Strided::transposed(&w2, mid);
            let (mut want, mut got) = (vec![0f32; m * n], vec![f32::NAN; m * n]);
            run(
                Left::Strided(Strided::rows(&h, mid)),
                w2_t,
                &mut want,
                none,
                (m, n, mid),
            );
            run(Left::Pairs(&pairs), w2_t, &mut got, none, (m, n, mid));
            assert_eq!(bits(&got), bits(&want), "{mid} -> {n}, simd {simd}");
            // Backward: the output gradient dy [m, n] as pairs, the
            // activation's output gradient dy · w2 [m, mid].
            let dy: Vec<f32> = (0..m * n).map(|i| val(i + 7000)).collect();
            let mut dy_pairs = vec![0u32; m * n.div_ceil(2)];
            round_rows(false, &dy, m, n, n.div_ceil(2), &mut dy_pairs);
            let w2_rows = Strided::rows(&w2, mid);
            let mut dg = vec![0f32; m * mid];
            run(Left::Pairs(&dy_pairs), w2_rows, &mut dg, none, (m, mid, n));
            let dz: Vec<f32> = dg.iter().zip(&slopes).map(|(g, s)| g * s).collect();
            let mut want_pairs = vec![0u32; m * mid2];
            // Rounded as the tiles round (vcvtne2ps2bf16 flushes
            // subnormal inputs to 0; the scalar loop does not).
            round_rows(simd, &dz, m, mid, mid2, &mut want_pairs);
            let start: Vec<f32> = (0..mid).map(|j| val(j + 9000)).collect();
            let mut dbias = start.clone();
            let dims = (m, mid, n);
            let w2_rows = Right::F32(w2_rows);
            let (got, blocks) = act_grad_on(simd, dims, &dy_pairs, w2_rows, &slopes, &mut dbias);
            let got = as_words(&got);
            assert_eq!(got.len(), m * ldp, "act grad rows, simd {simd}");
            assert_eq!(dense(got), want_pairs, "act grad, simd {simd}");
            let padding = got.chunks_exact(ldp).flat_map(|r| &r[mid2..]);
            assert!(padding.into_iter().all(|&w| w == 0), "act grad padding");
            // The products after read the padded rows as the dense ones:
            // FFN-out's weight gradient dyᵀ · g (g the right operand),
            // FFN-in's dzᵀ · x (dz the left operand, transposed) and
            // its input gradient dz · w1.
            let mut products = |a: Left, b: Right, (m, n, k)| {
                let mut c = vec![0f32; m * n];
                product_bf16_on(simd, (m, n, k), a, b, &mut c, none, &mut buffers);
                bits(&c)
            };
            let dy_t = Left::TransposedPairs(&dy_pairs);
            let want_dw = products(dy_t, Right::Pairs(&g_pairs), (n, mid, m));
            assert_eq!(
                products(dy_t, Right::Pairs(&pairs), (n, mid, m)),
                want_dw,
                "FFN-out weight gradient, simd {simd}"
            );
            // The tiles' panels of g are those packing its pairs
            // makes (an odd m's last pair row half zeros, a partial
            // last panel's columns zeros), and the weight gradient
            // reading them unpacked has the same bits.
            let mut packed = Vec::new();
            pack_panels_reusing(Right::Pairs(&g_pairs), m, mid, &mut packed, false);
            assert!(panels == packed, "g's panels, [{m}] -> {mid}, simd {simd}");
            assert_eq!(
                products(dy_t, Right::Packed(&panels), (n, mid, m)),
                want_dw,
                "FFN-out weight gradient from the panels, simd {simd}"
            );
            let x_rows = Right::F32(Strided::rows(&x, k));
            let want_dw = products(Left::TransposedPairs(&want_pairs), x_rows, (mid, k, m));
            assert_eq!(
                products(Left::TransposedPairs(got), x_rows, (mid, k, m)),
                want_dw,
                "FFN-in weight gradient, simd {simd}"
            );
            // The tiles' transpose of dz is what interleaving its
            // pairs makes (an odd m's last step's high halves zeros),
            // and the weight gradient reading it has the same bits.
            let mut interleaved = Vec::new();
            let src = Source::Pairs {
                data: &want_pairs,
                row: mid2,
            };
            interleave_rows(src, m, mid, &mut interleaved, false);
            let blocks = as_words(&blocks);
            let m2 = m.div_ceil(2);
            assert_eq!(blocks.len(), transposed_len(mid, m2));
            for (b, (got, want)) in blocks
                .chunks_exact(MR_BF16)
                .zip(interleaved.chunks_exact(MR_BF16))
                .enumerate()
            {
                // The last block's rows past mid are padding.
                let rows = (mid - b / m2 * MR_BF16).min(MR_BF16);
                assert_eq!(got[..rows], want[..rows], "dz's transpose, simd {simd}");
            }
            assert_eq!(
                products(Left::Interleaved(blocks), x_rows, (mid, k, m)),
                want_dw,
                "FFN-in weight gradient from the transpose, simd {simd}"
            );
            let w1_rows = Right::F32(Strided::rows(&w1, k));
            assert_eq!(
                products(Left::Pairs(got), w1_rows, (m, k, mid)),
                products(Left::Pairs(&want_pairs), w1_rows, (m, k, mid)),
                "FFN-in input gradient, simd {simd}"
            );
            for (j, (got, start)) in dbias.iter().zip(&start).enumerate() {
                let want: f64 =
                    f64::from(*start) + (0..m).map(|r| f64::from(dz[r * mid + j])).sum::<f64>();
                let scale: f64 = (0..m).map(|r| f64::from(dz[r * mid + j]).abs()).sum();
                assert!(
                    (f64::from(*got) - want).abs() <= 1e-6 * (scale + 1.0),
                    "bias gradient {j}: {got} vs {want}, simd {simd}"
                );
            }
        }
    }
}
