//! Where Q, K and V are read (fp32 rows or bf16 pairs, fused or split)
//! and where their gradients are written, and the pointer the tasks share
//! to write their own elements.

use super::packing::Task;

/// Q, K and V rows: Q's rows `q_stride` apart, K at the start of `kv`'s
/// rows and V `width` values after it: the fused `[T, 3·D]` rows, or a
/// selection's Q `[M, D]` beside every row's K and V `[T, 2·D]`. In fp32,
/// or (`pairs`) as the bf16 pairs the QKV product's tiles stored (the
/// words of fp32 storage; strides and offsets in words): in bf16 every use
/// of Q, K and V is a product's operand, which rounds them anyway.
#[derive(Clone, Copy)]
pub(crate) struct Qkv<'a> {
    pub(super) q: &'a [f32],
    pub(super) q_stride: usize,
    pub(super) kv: &'a [f32],
    pub(super) kv_stride: usize,
    pub(super) pairs: bool,
}

impl<'a> Qkv<'a> {
    /// The fused rows `[T, 3·D]`, in fp32 or (`pairs`) as bf16 pairs
    /// `[T, 3·D / 2]` (`D` even).
    pub fn fused(qkv: &'a [f32], d: usize, pairs: bool) -> Self {
        let u = if pairs { d / 2 } else { d };
        Self {
            q: qkv,
            q_stride: 3 * u,
            kv: qkv.get(u..).unwrap_or(&[]),
            kv_stride: 3 * u,
            pairs,
        }
    }

    /// Q `[M, D]` and K, V `[T, 2·D]`, in fp32 or (`pairs`) as bf16 pairs.
    pub fn split(q: &'a [f32], kv: &'a [f32], d: usize, pairs: bool) -> Self {
        let u = if pairs { d / 2 } else { d };
        Self {
            q,
            q_stride: u,
            kv,
            kv_stride: 2 * u,
            pairs,
        }
    }

    /// Whether Q covers `q_rows` rows and K, V `kv_rows`, of width `d`.
    pub(super) fn covers(&self, q_rows: usize, kv_rows: usize, d: usize) -> bool {
        let u = if self.pairs { d / 2 } else { d };
        fits(self.q.len(), q_rows, self.q_stride, u)
            && fits(self.kv.len(), kv_rows, self.kv_stride, 2 * u)
    }
}

/// The gradients' [`Qkv`]: where dQ, dK and dV are written.
pub(crate) struct QkvGrad<'a> {
    pub(super) q: Shared<f32>,
    pub(super) q_stride: usize,
    q_len: usize,
    pub(super) kv: Shared<f32>,
    pub(super) kv_stride: usize,
    kv_len: usize,
    _rows: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> QkvGrad<'a> {
    /// Into the fused rows `[T, 3·D]`.
    pub fn fused(dqkv: &'a mut [f32], d: usize) -> Self {
        let (ptr, len) = (dqkv.as_mut_ptr(), dqkv.len());
        Self {
            q: Shared(ptr),
            q_stride: 3 * d,
            q_len: len,
            kv: Shared(ptr.wrapping_add(d)),
            kv_stride: 3 * d,
            kv_len: len.saturating_sub(d),
            _rows: std::marker::PhantomData,
        }
    }

    /// Into dQ `[M, D]` and dK, dV `[T, 2·D]`.
    pub fn split(dq: &'a mut [f32], dkv: &'a mut [f32], d: usize) -> Self {
        Self {
            q: Shared(dq.as_mut_ptr()),
            q_stride: d,
            q_len: dq.len(),
            kv: Shared(dkv.as_mut_ptr()),
            kv_stride: 2 * d,
            kv_len: dkv.len(),
            _rows: std::marker::PhantomData,
        }
    }

    pub(super) fn covers(&self, q_rows: usize, kv_rows: usize, d: usize) -> bool {
        fits(self.q_len, q_rows, self.q_stride, d)
            && fits(self.kv_len, kv_rows, self.kv_stride, 2 * d)
    }
}

/// Whether `len` values hold `rows` rows of `width`, `stride` apart.
fn fits(len: usize, rows: usize, stride: usize, width: usize) -> bool {
    rows == 0 || len >= (rows - 1) * stride + width
}

/// A pointer tasks share, each writing its own disjoint elements.
pub(super) struct Shared<T>(pub(super) *mut T);
// SAFETY: every task writes only the rows of its sequence and the columns
// of its head (and its own probabilities and dropout bits blocks).
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

// Not derived: a derive would ask `T: Copy` of the pointee.
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}

impl<T> Shared<T> {
    pub(super) fn at(self, offset: usize) -> *mut T {
        self.0.wrapping_add(offset)
    }
}

impl Shared<u32> {
    /// Task `t`'s dropout bits.
    ///
    /// # Safety
    /// The buffer must hold [`mask_words`](super::packing::mask_words)
    /// words, and no one else may use the task's words while the slice (of
    /// any lifetime the caller picks) lives.
    pub(super) unsafe fn task_bits<'a>(self, t: Task) -> &'a mut [u32] {
        // SAFETY: the caller's contract; the task's block lies inside.
        unsafe { std::slice::from_raw_parts_mut(self.at(t.bits_at), t.len * t.row_words()) }
    }
}
