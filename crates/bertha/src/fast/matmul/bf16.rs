//! bf16 products with fp32 sums: weights rounded to bf16 once, at packing;
//! activations rounded at the multiply's input only. AVX512-BF16's
//! `vdpbf16ps` multiplies two bf16 pairs per 32-bit lane and adds both
//! products to an fp32 sum, so a tile does twice fp32's work per
//! instruction.

use super::{check_shapes, for_each_task, SharedOut, NR};
use crate::fast::cpu::features;
use crate::fast::kernels::{activate_body, Act};
use crate::io::quantized::PackedData;

/// Output rows per register tile (as fp32's: 12 × 2 accumulators).
const MR_BF16: usize = 12;

/// bf16 weights `[k, n]` in column panels: panel `p`, pair row `i` holds,
/// for each of its [`NR`] columns `c`, `w[2i, c]` then `w[2i + 1, c]` (the
/// `vdpbf16ps` operand layout; an odd `k` is padded with a zero row).
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    panels: Vec<u16>,
    k: usize,
    /// Input pairs: `k` rounded up to even, halved.
    k2: usize,
    n: usize,
}

/// `x` rounded to the nearest bf16 (ties to even), as its bit pattern.
pub fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

pub fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl PackedBf16 {
    /// Rounds and packs `w_t`, row-major `[k, n]`.
    pub fn new(w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "PackedBf16: weight is not [{k}, {n}]");
        let k2 = k.div_ceil(2);
        let n_panels = n.div_ceil(NR);
        let mut panels = vec![0u16; n_panels * k2 * NR * 2];
        for (p, panel) in panels.chunks_exact_mut(k2 * NR * 2).enumerate() {
            let cols = NR.min(n - p * NR);
            for r in 0..k {
                let (i, half) = (r / 2, r % 2);
                for c in 0..cols {
                    panel[(i * NR + c) * 2 + half] = to_bf16(w_t[r * n + p * NR + c]);
                }
            }
        }
        Self { panels, k, k2, n }
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// The stored form (what [`PackedBf16::from_parts`] takes back).
    pub fn to_parts(&self) -> PackedData {
        PackedData::Bf16 {
            panels: self.panels.clone(),
        }
    }

    /// A `[k, n]` multiply from its stored panels; `Err` when their size
    /// does not fit.
    pub fn from_parts(panels: Vec<u16>, k: usize, n: usize) -> std::result::Result<Self, String> {
        let k2 = k.div_ceil(2);
        let want = n.div_ceil(NR) * k2 * NR * 2;
        if panels.len() != want {
            return Err(format!(
                "packed has {} values, expected {want}",
                panels.len()
            ));
        }
        Ok(Self { panels, k, k2, n })
    }

    /// `y[m, n] = act(bf16(x)[m, k] · W + bias)`, `x` rounded into
    /// `scratch` (reused between calls).
    pub fn matmul(
        &self,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        self.matmul_on(features().bf16, x, bias, y, m, scratch, act);
    }

    /// [`PackedBf16::matmul`] on AVX512-BF16 (`simd`, which the caller
    /// checked the CPU has) or the scalar loop.
    #[allow(clippy::too_many_arguments)]
    fn matmul_on(
        &self,
        simd: bool,
        x: &[f32],
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        scratch: &mut Vec<u32>,
        act: Option<Act>,
    ) {
        let (k, k2, n) = (self.k, self.k2, self.n);
        check_shapes(x, bias, y, m, k, n);
        round_rows(simd, x, m, k, k2, scratch);
        let pairs = &scratch[..];
        let out = SharedOut(y.as_mut_ptr());
        for_each_task(m, n, |p, rows| {
            let panel = &self.panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
            let cs = p * NR..(p * NR + NR).min(n);
            let bias = &bias[cs];
            for r0 in rows.step_by(MR_BF16) {
                let mr = MR_BF16.min(m - r0);
                let a = &pairs[r0 * k2..(r0 + mr) * k2];
                let c = out.at(r0 * n + p * NR);
                // SAFETY: rows r0..r0+mr, columns of panel p lie inside y
                // (shapes checked) and belong to this task only.
                unsafe { tile(simd, a, k2, mr, panel, c, n, bias, act) };
            }
        });
    }
}

/// Rounds each row of `x` `[m, k]` to bf16 pairs `[m, k2]` (low half: the
/// even input), with AVX512-BF16's conversion when `simd`.
fn round_rows(simd: bool, x: &[f32], m: usize, k: usize, k2: usize, out: &mut Vec<u32>) {
    use rayon::prelude::*;
    out.clear();
    out.resize(m * k2, 0);
    out.par_chunks_mut(k2)
        .zip(x.par_chunks(k))
        .with_min_len(16)
        .for_each(|(pairs, row)| {
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: the CPU has AVX512-BF16 (the caller checked);
                // pairs holds ceil(k / 2) values.
                unsafe { super::avx512::round_row_bf16(row, pairs) };
                return;
            }
            for (pair, xs) in pairs.iter_mut().zip(row.chunks(2)) {
                let lo = u32::from(to_bf16(xs[0]));
                let hi = xs.get(1).map_or(0, |&v| u32::from(to_bf16(v)));
                *pair = lo | hi << 16;
            }
        });
}

/// One `mr` × `bias.len()` tile at `c` (row stride `ldc`).
///
/// # Safety
/// `c` must address that tile, which no one else reads or writes meanwhile;
/// `simd` only when the CPU has AVX512-BF16.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    simd: bool,
    a: &[u32],
    k2: usize,
    mr: usize,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    bias: &[f32],
    act: Option<Act>,
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        macro_rules! dispatch {
            ($($n:literal)*) => {
                match mr {
                    // SAFETY: the CPU has AVX512-BF16 (the caller checked);
                    // a holds mr rows of k2 pairs, the caller owns the tile.
                    $($n => unsafe {
                        super::avx512::tile_bf16::<$n>(a, k2, panel, c, ldc, bias, act)
                    },)*
                    _ => unreachable!("tiles have 1..=MR_BF16 rows"),
                }
            };
        }
        dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
        return;
    }
    let _ = simd;
    for r in 0..mr {
        let row = &a[r * k2..(r + 1) * k2];
        // SAFETY: row r < mr, columns < bias.len() of the caller's tile.
        let out = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), bias.len()) };
        for (j, (y, b)) in out.iter_mut().zip(bias).enumerate() {
            let mut acc = 0f32;
            for (i, &pair) in row.iter().enumerate() {
                let w = &panel[(i * NR + j) * 2..][..2];
                acc += from_bf16(pair as u16) * from_bf16(w[0])
                    + from_bf16((pair >> 16) as u16) * from_bf16(w[1]);
            }
            *y = acc + b;
        }
        if let Some(act) = act {
            activate_body(out, act);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
