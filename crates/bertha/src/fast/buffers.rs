//! A step's buffers made, copied and summed on every core.
//!
//! A training step allocates a few hundred MB of activations and
//! gradients. `vec![0.0; n]` zeroes reused heap memory with one `memset`
//! on the calling thread, and a plain copy or sum runs there too, while
//! the other cores wait for the next parallel pass: on two cores that
//! serial tail cost a tenth of a `mini` step. These do the same work on
//! every core.

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, DType, Storage, Tensor};
use rayon::prelude::*;

use crate::fast::cpu::multiversion;

/// Elements per task: below this a buffer is handled on the calling
/// thread (a task costs more than it saves).
const CHUNK: usize = 1 << 15;

/// `len` zeros.
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(len);
    let spare = &mut v.spare_capacity_mut()[..len];
    if len <= CHUNK {
        spare.fill(MaybeUninit::new(0.0));
    } else {
        spare
            .par_chunks_mut(CHUNK)
            .for_each(|c| c.fill(MaybeUninit::new(0.0)));
    }
    // SAFETY: the first len elements were written just above.
    unsafe { v.set_len(len) };
    v
}

/// A copy of `x`.
pub(crate) fn copied(x: &[f32]) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(x.len());
    let spare = &mut v.spare_capacity_mut()[..x.len()];
    let copy = |dst: &mut [MaybeUninit<f32>], src: &[f32]| {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = MaybeUninit::new(*s);
        }
    };
    if x.len() <= CHUNK {
        copy(spare, x);
    } else {
        spare
            .par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(d, s)| copy(d, s));
    }
    // SAFETY: every element up to x.len() was written just above.
    unsafe { v.set_len(x.len()) };
    v
}

/// `dst` = `src` (same length).
pub(crate) fn copy_into(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "copy_into: lengths differ");
    if src.len() <= CHUNK {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

multiversion! {
    fn add_chunk = add_chunk_body(acc: &mut [f32], x: &[f32]);
}

#[inline(always)]
fn add_chunk_body(acc: &mut [f32], x: &[f32]) {
    for i in 0..acc.len().min(x.len()) {
        acc[i] += x[i];
    }
}

/// `acc += x`, element by element (the same bits as a serial loop).
pub(crate) fn add(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len(), "add: lengths differ");
    if x.len() <= CHUNK {
        add_chunk(acc, x);
        return;
    }
    acc.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(a, b)| add_chunk(a, b));
}

/// `f` of a tensor's values as one fp32 slice: read in place from a
/// contiguous CPU fp32 tensor's storage (weights and gradients, every
/// step), else from a converted copy.
pub(crate) fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[a..b]));
        }
    }
    let values = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(f(&values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_what_the_serial_versions_do() {
        for len in [0, 5, CHUNK, CHUNK + 7, 3 * CHUNK + 1] {
            let x: Vec<f32> = (0..len).map(|i| (i % 97) as f32 * 0.37 - 11.0).collect();
            let y: Vec<f32> = (0..len).map(|i| (i % 13) as f32 * 1.1 + 0.3).collect();
            assert_eq!(zeros(len), vec![0f32; len]);
            assert_eq!(copied(&x), x);
            let mut dst = vec![1f32; len];
            copy_into(&mut dst, &x);
            assert_eq!(dst, x);
            let mut acc = x.clone();
            add(&mut acc, &y);
            let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
            assert_eq!(acc, want);
        }
    }
}
