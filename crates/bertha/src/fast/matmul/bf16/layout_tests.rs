//! Tests of the layouts and the tiles: rounding, panel packing, the
//! transposed left operand, AMX against the register tiles, weight
//! panels.

use super::driver::{product_bf16_on, ProductBuffers, Store, Sums};
use super::operands::{Left, Right, Strided};
use super::pairs::{from_bf16, round_bits, round_rows, to_bf16};
use super::panels::{pack_panel_pairs, pack_panel_pairs_body, pack_panels};
#[cfg(target_arch = "x86_64")]
use super::tiles::{PairsIn, TileOut};
use super::transposed::{
    transpose_rows, transpose_rows_body, transposed_stride, Source, TRANSPOSE_ROWS,
};
use super::weight_panels::WeightPanels;
use crate::fast::cpu::features;
use crate::fast::matmul::NR;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The packing loops' rounding is `half`'s, bit for bit.
#[test]
fn bit_rounding_equals_half() {
    let mut specials = vec![
        0.0f32,
        -0.0,
        1.0 + 1.0 / 256.0,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        1e-40,
    ];
    specials.extend((0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
    for x in specials {
        if x.is_nan() {
            assert!(from_bf16(round_bits(x) as u16).is_nan());
            continue;
        }
        assert_eq!(round_bits(x) as u16, to_bf16(x), "{x:e}");
    }
}

/// The vector rounding pass gives the scalar one's bits, for row
/// lengths around its 32-value steps (odd ones too).
#[test]
fn vector_rounding_equals_scalar() {
    if !features().bf16 {
        return;
    }
    for k in [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 384, 1537] {
        let x: Vec<f32> = (0..3 * k)
            .map(|i| ((i as f32) * 0.7318).sin() * 10f32.powi(i as i32 % 7 - 3))
            .collect();
        let (mut simd, mut scalar) = (Vec::new(), Vec::new());
        round_rows(true, &x, 3, k, k.div_ceil(2), &mut simd);
        round_rows(false, &x, 3, k, k.div_ceil(2), &mut scalar);
        assert_eq!(simd, scalar, "k = {k}");
    }
}

#[test]
fn rounding_is_to_nearest_even() {
    // 1 + 2^-8 lies halfway between two bf16 values: it goes to the
    // even one (1.0); just above halfway rounds up.
    assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
    assert_eq!(
        from_bf16(to_bf16(1.0 + 1.0 / 256.0 + 1.0 / 65536.0)),
        1.0 + 1.0 / 128.0
    );
    assert_eq!(from_bf16(to_bf16(-3.5)), -3.5);
}

/// Pair rows packed a pair row at a time (AVX-512) are the words the
/// scalar loop moves, for odd row counts (an odd last row pairs with
/// zeros), odd and partial column counts and offsets; columns past
/// `cols` keep what the panel held.
#[test]
fn pair_panels_equal_the_scalar_loop() {
    let (rows, row) = (13, 40);
    let words: Vec<u32> = (0..rows * row as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let cases: [(usize, usize, usize); 5] = [
        (13, 0, 32),
        (12, 2, 31),
        (1, 8, 5),
        (7, 48, 32),
        (13, 60, 20),
    ];
    for (k, c0, cols) in cases {
        // Whole words, so both take the word-aligned paths.
        let mut fast = vec![0xbeef_beefu32; k.div_ceil(2) * NR];
        let mut slow = fast.clone();
        // SAFETY: any u32 is two valid u16.
        let halves = |w: &mut Vec<u32>| unsafe { w.align_to_mut::<u16>().1.to_vec() };
        let (mut f, mut s) = (halves(&mut fast), halves(&mut slow));
        pack_panel_pairs(&words, row, k, c0, cols, &mut f);
        pack_panel_pairs_body(&words, row, k, c0, cols, &mut s);
        assert_eq!(f, s, "k {k}, columns {c0}..+{cols}");
    }
}

/// The transpose as rows of pairs (AMX's layout of a transposed left
/// operand) equals its scalar twin's words, from fp32 and bf16 sources,
/// with rows and steps past whole 16 × 16 blocks and an odd `k`.
#[test]
fn transposed_rows_equal_the_scalar_transpose() {
    let val = |i: usize| ((i as f32) * 0.618).sin() * 3.0;
    // k 1,024: rows of 512 words, padded on AMX (transposed_stride).
    for (k, m) in [(67, 53), (64, 32), (5, 16), (33, 17), (1024, 20)] {
        let cs = m + 3;
        let data: Vec<f32> = (0..k * cs).map(val).collect();
        let pairs: Vec<u32> = (0..k * cs.div_ceil(2))
            .map(|i| round_bits(val(2 * i)) | round_bits(val(2 * i + 1)) << 16)
            .collect();
        let sources = [
            Source::F32 { data: &data, cs },
            Source::Pairs {
                data: &pairs,
                row: cs.div_ceil(2),
            },
        ];
        for src in sources {
            let k2 = k.div_ceil(2);
            let stride = transposed_stride(k2);
            let mut fast = vec![u32::MAX; m * stride];
            transpose_rows(src, k, m, &mut fast, true);
            let mut slow = vec![u32::MAX; m * stride];
            for (t, rows) in slow.chunks_mut(TRANSPOSE_ROWS * stride).enumerate() {
                transpose_rows_body(src, k, t * TRANSPOSE_ROWS, 0, rows);
            }
            assert_eq!(fast, slow, "[{k}, {m}] transposed");
            // Word (r, i) pairs source rows 2i and 2i + 1 of column r
            // (0 past k): the last row's last word.
            let value = |row: usize, c: usize| match src {
                Source::F32 { data, cs } => round_bits(data[row * cs + c]),
                Source::Pairs { data, row: w } => data[row * w + c / 2] >> (16 * (c % 2)) & 0xffff,
            };
            let (r, i) = (m - 1, k2 - 1);
            let hi = if 2 * i + 1 < k {
                value(2 * i + 1, r)
            } else {
                0
            };
            assert_eq!(fast[r * stride + i], value(2 * i, r) | hi << 16);
            // The padding is written, with zeros.
            assert!(fast
                .chunks(stride)
                .all(|row| row[k2..].iter().all(|&w| w == 0)));
        }
    }
}

/// AMX tiles sum the same products as the AVX-512 register tiles (in
/// another order: equal up to fp32 rounding), for every tile height,
/// steps past whole 16-pair tile steps, partial panels and padded
/// left rows. Where the CPU has no AMX there is nothing to compare.
#[test]
#[cfg(target_arch = "x86_64")]
fn amx_tiles_equal_the_register_tiles() {
    if !features().amx {
        eprintln!("no AMX here: the register tiles alone are tested");
        return;
    }
    let val = |i: usize| ((i as f32) * 0.377).cos();
    for k2 in [1, 15, 16, 17, 40] {
        let lda = k2 + 3;
        let a: Vec<u32> = (0..12 * lda)
            .map(|i| round_bits(val(2 * i)) | round_bits(val(2 * i + 1)) << 16)
            .collect();
        let panel: Vec<u16> = (0..k2 * NR * 2).map(|i| to_bf16(val(i + 7))).collect();
        let bias: Vec<f32> = (0..NR).map(|j| val(j + 3)).collect();
        macro_rules! compare {
            ($($r:literal)*) => {$(
                for cols in [NR, 20] {
                    let [mut amx, mut reg] = [[0f32; 12 * NR]; 2];
                    for (c, amx_kernel) in [(&mut amx, true), (&mut reg, false)] {
                        let out = TileOut::F32 { c: c.as_mut_ptr(), ldc: NR, accumulate: false };
                        let a = PairsIn::rows(&a, lda);
                        // SAFETY: AMX and AVX512-BF16 (checked); a holds
                        // 12 rows of k2 pairs lda apart, the panel k2
                        // pair rows, c a 12 × NR tile.
                        unsafe {
                            match amx_kernel {
                                true => super::super::avx512::tile_amx::<$r>(a, k2, &panel, &bias[..cols], None, out),
                                false => super::super::avx512::tile_bf16::<$r>(a, k2, &panel, &bias[..cols], None, out),
                            }
                        }
                    }
                    for (i, (x, y)) in amx.iter().zip(&reg).enumerate() {
                        let (r, j) = (i / NR, i % NR);
                        let tol = 1e-6 * (2 * k2) as f32;
                        match r < $r && j < cols {
                            true => assert!((x - y).abs() <= tol, "{}-row tile, k2 {k2}, ({r}, {j}): {x} vs {y}", $r),
                            false => assert_eq!((*x, *y), (0.0, 0.0), "written outside the tile"),
                        }
                    }
                }
            )*};
        }
        compare!(1 2 3 4 5 6 7 8 9 10 11 12);
        // 16-row AMX tiles, and two at once (16 + R rows, each stored
        // as its own): against register tiles of 12 and 4 rows, and
        // two single AMX tiles (the same sums, bit for bit).
        let a32: Vec<u32> = (0..32 * lda)
            .map(|i| round_bits(val(3 * i)) | round_bits(val(3 * i + 1)) << 16)
            .collect();
        let rows = |r0: usize| PairsIn::rows(&a32[r0 * lda..], lda);
        let out = |c: &mut [f32; 32 * NR], r0: usize| TileOut::F32 {
            c: c[r0 * NR..].as_mut_ptr(),
            ldc: NR,
            accumulate: false,
        };
        let tol = 1e-6 * (2 * k2) as f32;
        let [mut amx, mut reg] = [[0f32; 32 * NR]; 2];
        // SAFETY: AMX and AVX512-BF16 (checked); a32 holds 32 rows of
        // k2 pairs lda apart, the panel k2 pair rows, each output the
        // tiles' rows of NR.
        unsafe {
            super::super::avx512::tile_amx::<16>(
                rows(0),
                k2,
                &panel,
                &bias,
                None,
                out(&mut amx, 0),
            );
            super::super::avx512::tile_bf16::<12>(
                rows(0),
                k2,
                &panel,
                &bias,
                None,
                out(&mut reg, 0),
            );
            super::super::avx512::tile_bf16::<4>(
                rows(12),
                k2,
                &panel,
                &bias,
                None,
                out(&mut reg, 12),
            );
        }
        for (i, (x, y)) in amx.iter().zip(&reg).enumerate() {
            assert!(
                (x - y).abs() <= tol,
                "16-row tile, k2 {k2}, {i}: {x} vs {y}"
            );
        }
        macro_rules! compare2 {
            ($($r:literal)*) => {$(
                let [mut two, mut one] = [[0f32; 32 * NR]; 2];
                // SAFETY: as above.
                unsafe {
                    let outs = (out(&mut two, 0), out(&mut two, 16));
                    super::super::avx512::tile_amx2::<$r>(rows(0), k2, &panel, &bias, None, outs);
                    super::super::avx512::tile_amx::<16>(rows(0), k2, &panel, &bias, None, out(&mut one, 0));
                    super::super::avx512::tile_amx::<$r>(rows(16), k2, &panel, &bias, None, out(&mut one, 16));
                }
                assert_eq!(bits(&two), bits(&one), "16 + {} rows, k2 {k2}", $r);
                assert!(two[(16 + $r) * NR..].iter().all(|&x| x == 0.0), "written outside the tiles");
            )*};
        }
        compare2!(1 5 15 16);
    }
}

/// A weight packed block of rows by block (in reverse, as threads may
/// finish them) has the panels of packing it whole for both products,
/// and products reading them the bits of products packing the fp32
/// weight: partial panels, odd widths and row counts, blocks of one
/// and of two panels' rows.
#[test]
fn weight_panels_packed_by_rows_equal_packing_whole() {
    let val = |i: usize| ((i as f32) * 0.711).sin();
    for (n, k, block) in [
        (70, 33, NR),
        (64, 512, NR),
        (31, 7, NR),
        (1, 1, NR),
        (97, 64, 2 * NR),
    ] {
        let w: Vec<f32> = (0..n * k).map(val).collect();
        let mut panels = WeightPanels::new(n, k);
        let writer = panels.writer();
        for r0 in (0..n).step_by(block).rev() {
            let r1 = (r0 + block).min(n);
            writer.pack_rows(r0, &w[r0 * k..r1 * k]);
        }
        let (Right::Packed(fwd), Right::Packed(bwd)) = (panels.forward(), panels.backward()) else {
            unreachable!("weight panels are packed operands")
        };
        assert_eq!(
            fwd,
            &pack_panels(Strided::transposed(&w, k), k, n)[..],
            "[{n}, {k}]"
        );
        assert_eq!(
            bwd,
            &pack_panels(Strided::rows(&w, k), n, k)[..],
            "[{n}, {k}]ᵀ"
        );
        let m = 13;
        let x: Vec<f32> = (0..m * k).map(|i| val(i + 400)).collect();
        let dy: Vec<f32> = (0..m * n).map(|i| val(i + 900)).collect();
        let mut buffers = ProductBuffers::default();
        let mut product = |a: Strided, b: Right, (m, n, k)| {
            let mut c = vec![0f32; m * n];
            let (a, none) = (Left::Strided(a), Store::Sums(Sums::default()));
            product_bf16_on(features().bf16, (m, n, k), a, b, &mut c, none, &mut buffers);
            bits(&c)
        };
        let (x_rows, dy_rows) = (Strided::rows(&x, k), Strided::rows(&dy, n));
        assert_eq!(
            product(x_rows, panels.forward(), (m, n, k)),
            product(x_rows, Right::F32(Strided::transposed(&w, k)), (m, n, k)),
            "x · wᵀ, [{n}, {k}]"
        );
        assert_eq!(
            product(dy_rows, panels.backward(), (m, k, n)),
            product(dy_rows, Right::F32(Strided::rows(&w, k)), (m, k, n)),
            "dy · w, [{n}, {k}]"
        );
    }
}
