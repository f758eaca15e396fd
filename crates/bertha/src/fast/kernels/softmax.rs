//! The softmax of a row of scores, shared by the attention paths and the
//! training ops.

use super::activations::fast_exp;
use super::lanes::{lane_sum, LANES};

/// Softmax of one row of scores, in place.
#[inline(always)]
pub(crate) fn softmax_row(scores: &mut [f32]) {
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let chunks = scores.chunks_exact(LANES);
    let mut max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (m, s) in maxes.iter_mut().zip(c) {
            *m = if *s > *m { *s } else { *m };
        }
    }
    max = maxes.iter().copied().fold(max, f32::max);
    // `for` loops, not `for_each`: a closure's `fold` may be compiled
    // apart from the caller, without its AVX-512.
    for s in scores.iter_mut() {
        *s = fast_exp(*s - max);
    }
    let inv = 1.0 / lane_sum(scores);
    for s in scores.iter_mut() {
        *s *= inv;
    }
}
