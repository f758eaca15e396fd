//! Buffers that start on a cache line, for packed weights.
//!
//! A `Vec<f32>` is only 4-byte aligned, and glibc's large allocations
//! (`mmap`ed) start 16 bytes past a page. A weight panel's 32-column row
//! is 128 bytes; at offset 16 every 16-float half of it (the tile one
//! AVX2 or NEON register block reads per input) straddles two cache lines,
//! so each step of the kernels' inner loop touches two lines instead of
//! one. [`Aligned`] stores its values in 64-byte lines, so element 0, and
//! every panel row at a multiple of 64 bytes, starts on a line.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// One cache line of storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Plain numbers that any bit pattern is a valid value of (so a buffer of
/// zeroed lines can be read as them) and that divide a line evenly.
///
/// # Safety
/// Implementors are `Copy`, have no padding or invalid bit patterns, and
/// their size divides 64.
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: every bit pattern is a valid value of these, and their sizes
// (1, 2, 4) divide 64.
unsafe impl Plain for f32 {}
unsafe impl Plain for i8 {}
unsafe impl Plain for i16 {}

/// `len` values of `T`, zero-initialised, starting on a 64-byte line.
#[derive(Clone)]
pub(crate) struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _values: PhantomData<T>,
}

impl<T: Plain> Aligned<T> {
    /// `len` zeros (all bits 0).
    pub(crate) fn zeroed(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        Self {
            lines: vec![Line([0; 64]); bytes.div_ceil(64)],
            len,
            _values: PhantomData,
        }
    }

    /// A copy of `values`, aligned.
    pub(crate) fn from_slice(values: &[T]) -> Self {
        let mut out = Self::zeroed(values.len());
        out.copy_from_slice(values);
        out
    }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values' bytes, are aligned
        // for any `T` whose size divides 64, and every bit pattern is a
        // `T` (`Plain`).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aligned({} values)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_line_and_hold_their_values() {
        for len in [0, 1, 15, 16, 17, 1000, 100_003] {
            let values: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
            let a = Aligned::from_slice(&values);
            assert_eq!(a.as_ptr() as usize % 64, 0);
            assert_eq!(&a[..], &values[..]);
            let b = a.clone();
            assert_eq!(b.as_ptr() as usize % 64, 0);
            assert_eq!(&b[..], &values[..]);
            let w: Aligned<i16> = Aligned::zeroed(len);
            assert!(w.iter().all(|&x| x == 0) && w.len() == len);
        }
    }
}
