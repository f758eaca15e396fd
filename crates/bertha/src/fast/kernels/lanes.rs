//! Sums in lane-wise partial sums: a row's sum and a centred dot
//! product, in a fixed order that vectorises.

/// Lanes of the manual accumulators below: sums kept in 16 independent
/// partial sums vectorise without fast-math reassociation.
pub(crate) const LANES: usize = 16;

#[inline(always)]
pub(crate) fn lane_sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Σ a·(b - shift) in lane-wise partial sums (see `lane_sum`).
#[inline(always)]
pub(crate) fn lane_dot_centered(a: &[f32], b: &[f32], shift: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(a, b)| a * (b - shift))
        .sum();
    for (ca, cb) in ac.zip(bc) {
        for ((s, a), b) in acc.iter_mut().zip(ca).zip(cb) {
            *s += a * (b - shift);
        }
    }
    acc.iter().sum::<f32>() + tail
}
