//! A step's buffers made, copied and summed on every core.
//!
//! A training step allocates a few hundred MB of activations and
//! gradients. `vec![0.0; n]` zeroes reused heap memory with one `memset`
//! on the calling thread, and a plain copy or sum runs there too, while
//! the other cores wait for the next parallel pass: on two cores that
//! serial tail cost a tenth of a `mini` step. These do the same work on
//! every core.
//!
//! Zeroing on every core still wrote each buffer once more than the step
//! needed (5 % of a `mini` bf16 step): buffers a pass overwrites whole come
//! from [`scratch`], which hands out the buffers earlier passes gave back
//! ([`recycle`]) with their old values, and zeros only when none fits.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::{CpuStorage, DType, Storage, Tensor};
use rayon::prelude::*;

use crate::fast::cpu::multiversion;

/// Elements per task: below this a buffer is handled on the calling
/// thread (a task costs more than it saves).
const CHUNK: usize = 1 << 15;

/// `len` zeros.
/// Within a step ([`StepBuffers`]) a buffer given back is zeroed and
/// reused (a fresh one would sit beside it until the step ends).
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    if let Some(mut v) = pooled(len) {
        if len <= CHUNK {
            v.fill(0.0);
        } else {
            v.par_chunks_mut(CHUNK).for_each(|c| c.fill(0.0));
        }
        return v;
    }
    fresh_zeros(len)
}

/// Allocations of at least this many values (32 MiB, glibc's largest
/// threshold for serving a request with fresh pages from `mmap`) come
/// zeroed from `calloc`: fresh pages are zero already, and glibc does not
/// clear them again, so the zeroing is the page faults' alone (on the
/// threads that first write them) instead of a second pass over the
/// buffer (a `small` step has ~240 MB of such buffers: the tied word
/// embeddings' gradient, the logits, FFN pre-activations).
const FRESH_PAGES: usize = (32 << 20) / std::mem::size_of::<f32>();

/// `len` zeros in a new allocation.
fn fresh_zeros(len: usize) -> Vec<f32> {
    if len >= FRESH_PAGES {
        return vec![0f32; len];
    }
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

/// Buffers given back for reuse, oldest first.
#[derive(Default)]
struct Pool {
    kept: Vec<Vec<f32>>,
}

/// Buffers shorter than this are not kept (malloc serves them well).
/// Builds with debug assertions keep short ones too, so that the tests'
/// tiny models take their buffers from the pool, NaN-filled.
const POOL_MIN: usize = if cfg!(debug_assertions) { 16 } else { CHUNK };

/// At most this many buffers are kept; past it the oldest is freed (a
/// `small` step keeps about 40 at its end).
const POOL_MAX: usize = 192;

/// Large buffers (at least [`FRESH_PAGES`] values, fresh pages from `mmap`
/// each time) serve a request up to this fraction shorter (1/4): the
/// rows of a step change with its batch (QA's longest window, MLM's
/// masked rows), so exact lengths would rarely meet again.
const LARGE_SLACK: usize = 4;

impl Pool {
    fn give(&mut self, v: Vec<f32>) {
        if v.len() < POOL_MIN {
            return;
        }
        self.kept.push(v);
        if self.kept.len() > POOL_MAX {
            self.kept.remove(0);
        }
    }

    /// A kept buffer of exactly `len` values, the most recently given
    /// back first (the warmest in cache); for a large `len`, else the
    /// shortest large one whose allocation holds `len` values with at
    /// most a [`LARGE_SLACK`]th to spare, cut or grown to `len` (growing
    /// writes zeros, within the allocation). A large request none fits
    /// frees kept large buffers that do not fit it, as many values as it
    /// asks for: first those too short for it, oldest first (buffers
    /// shorter than this step's rows seldom fit again), then those too
    /// long, longest first. The new allocation takes their place, so the
    /// kept buffers and the step's own never hold much more than the
    /// largest step alone would. Freeing only the short ones, a run's
    /// last, smaller batch of QA windows allocated its buffers beside
    /// the idle, longer ones of the steps before it, and the run peaked at
    /// 2.20 GB instead of 1.82 (all-MiniLM-L6-v2, 32 × 256).
    fn take(&mut self, len: usize) -> Option<Vec<f32>> {
        if let Some(i) = self.kept.iter().rposition(|v| v.len() == len) {
            return Some(self.kept.remove(i));
        }
        if len < FRESH_PAGES {
            return None;
        }
        let fits = |v: &Vec<f32>| (len..=len + len / LARGE_SLACK).contains(&v.capacity());
        let best = self.kept.iter().enumerate().filter(|(_, v)| fits(v));
        if let Some((i, _)) = best.min_by_key(|(_, v)| v.capacity()) {
            let mut v = self.kept.remove(i);
            v.resize(len, 0.0);
            return Some(v);
        }
        let mut freed = 0;
        self.kept.retain(|v| {
            let evict = freed < len && v.capacity() >= FRESH_PAGES && v.capacity() < len;
            if evict {
                freed += v.capacity();
            }
            !evict
        });
        while freed < len {
            // The too-short ones are all gone: the large ones left are too
            // long.
            let longest = self
                .kept
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= FRESH_PAGES);
            let Some((i, _)) = longest.max_by_key(|(_, v)| v.capacity()) else {
                break;
            };
            freed += self.kept.remove(i).capacity();
        }
        None
    }

    /// The last step under way ended: with `keep_large`, the large
    /// buffers stay for the next step (their pages are mapped already),
    /// the others are freed (malloc's heap serves them without faults).
    fn steps_ended(&mut self, keep_large: bool) -> Vec<Vec<f32>> {
        let kept = std::mem::take(&mut self.kept);
        if !keep_large {
            return kept;
        }
        let (large, freed) = kept.into_iter().partition(|v| v.capacity() >= FRESH_PAGES);
        self.kept = large;
        freed
    }
}

/// The buffers [`recycle`] gave back, for [`scratch`] and [`copied`].
static POOL: Mutex<Pool> = Mutex::new(Pool { kept: Vec::new() });

/// Training steps under way (in this process: tests run several at once).
static STEPS: AtomicUsize = AtomicUsize::new(0);

/// Training runs under way that keep a step's large buffers for the next
/// ([`KeptBetweenSteps`]).
static RUNS: AtomicUsize = AtomicUsize::new(0);

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// While one lives, [`recycle`] keeps buffers for [`scratch`]; when the
/// last one ends, the kept buffers are freed, or, within a
/// [`KeptBetweenSteps`], all but the large ones. A step's own buffers come
/// back within the step (a layer's tape for the backward of the layers
/// below it); kept across steps, buffers of every size sat beside the
/// next step's allocations of other sizes (the masked rows change every
/// batch) and raised the peak memory (by 40 % on `small`, measured).
pub(crate) struct StepBuffers(());

impl StepBuffers {
    pub fn begin() -> Self {
        STEPS.fetch_add(1, Ordering::AcqRel);
        Self(())
    }
}

impl Drop for StepBuffers {
    fn drop(&mut self) {
        if STEPS.fetch_sub(1, Ordering::AcqRel) == 1 {
            let keep_large = RUNS.load(Ordering::Acquire) > 0;
            let freed = pool().steps_ended(keep_large);
            drop(freed);
        }
    }
}

/// A training run: while one lives, the large buffers of a step (at least
/// 32 MiB each: QA's attention probabilities and FFN activations, MLM's
/// logits) are kept for the next step instead of going back to the
/// kernel, which would hand the next step fresh pages to fault in and
/// zero again (6 % of a QA step at 32 × 256 on all-MiniLM-L6-v2). The
/// process holds about one step's worth of them between steps;
/// [`release_kept`] frees them (before an evaluation), and so does the
/// end of the last run.
pub(crate) struct KeptBetweenSteps(());

impl KeptBetweenSteps {
    pub fn begin() -> Self {
        RUNS.fetch_add(1, Ordering::AcqRel);
        Self(())
    }
}

impl Drop for KeptBetweenSteps {
    fn drop(&mut self) {
        if RUNS.fetch_sub(1, Ordering::AcqRel) == 1 {
            release_kept();
        }
    }
}

/// Frees the buffers kept between steps (none while a step is under way).
pub(crate) fn release_kept() {
    if STEPS.load(Ordering::Acquire) == 0 {
        let freed = pool().steps_ended(false);
        drop(freed);
    }
}

/// `len` values for a caller that writes every one of them before reading
/// any: a buffer given back by [`recycle`] (its old values; NaN in builds
/// with debug assertions, so that a read before a write shows in the
/// tests), else zeros.
pub(crate) fn scratch(len: usize) -> Vec<f32> {
    match pooled(len) {
        Some(mut v) => {
            if cfg!(debug_assertions) {
                v.fill(f32::NAN);
            }
            v
        }
        None => fresh_zeros(len),
    }
}

/// `len` values not written yet, for a pass that writes every one of them
/// through [`Unwritten::as_mut_ptr`] before any is read (a product's
/// output): a buffer given back to the step's pool (its old values; NaN
/// with debug assertions), else new memory left as it is. Zeroing a step's
/// new buffers first cost 4 % of a `mini` bf16 step.
pub(crate) struct Unwritten(Vec<MaybeUninit<f32>>);

impl Unwritten {
    pub fn new(len: usize) -> Self {
        if let Some(mut v) = pooled(len) {
            if cfg!(debug_assertions) {
                v.fill(f32::NAN);
            }
            // SAFETY: initialised f32 values are valid MaybeUninit ones.
            return Self(unsafe { recast(v) });
        }
        let mut v = Vec::with_capacity(len);
        if cfg!(debug_assertions) {
            v.resize(len, MaybeUninit::new(f32::NAN));
        } else {
            // SAFETY: the capacity holds len values, and MaybeUninit values
            // need no initialisation.
            unsafe { v.set_len(len) };
        }
        Self(v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn as_mut_ptr(&mut self) -> *mut f32 {
        self.0.as_mut_ptr().cast()
    }

    /// The values, once written.
    ///
    /// # Safety
    /// Every one of the `len` values must have been written through
    /// [`Unwritten::as_mut_ptr`].
    pub unsafe fn assume_written(self) -> Vec<f32> {
        // SAFETY: every value is initialised (the caller's contract).
        unsafe { recast(self.0) }
    }
}

/// `v`'s allocation, length and capacity as a vector of `B` (`f32` and
/// `MaybeUninit<f32>` have one size and alignment).
///
/// # Safety
/// Every value must be a valid `B`.
unsafe fn recast<A, B>(v: Vec<A>) -> Vec<B> {
    const {
        assert!(std::mem::size_of::<A>() == std::mem::size_of::<B>());
        assert!(std::mem::align_of::<A>() == std::mem::align_of::<B>());
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: one size and alignment (asserted), the same allocation; the
    // values are valid (the caller's contract).
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast(), v.len(), v.capacity()) }
}

/// Gives `v` back for [`scratch`] and [`copied`] to hand out again.
pub(crate) fn recycle(v: Vec<f32>) {
    if STEPS.load(Ordering::Acquire) == 0 {
        return;
    }
    pool().give(v);
}

/// A kept buffer of `len` values, if a step is under way (the pool is
/// empty otherwise: no lock for the allocations outside steps).
fn pooled(len: usize) -> Option<Vec<f32>> {
    if len < POOL_MIN || STEPS.load(Ordering::Acquire) == 0 {
        return None;
    }
    pool().take(len)
}

/// A copy of `x`.
pub(crate) fn copied(x: &[f32]) -> Vec<f32> {
    if let Some(mut v) = pooled(x.len()) {
        copy_into(&mut v, x);
        return v;
    }
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
    Ok(f(&values_of(t)?))
}

/// A contiguous CPU fp32 tensor's values, read in place while its storage
/// is read-locked (writers wait until this is dropped).
pub(crate) struct Held<'a> {
    /// The storage's read guard (candle's lock type, not named here).
    storage: Box<dyn std::ops::Deref<Target = Storage> + 'a>,
    range: std::ops::Range<usize>,
}

impl std::ops::Deref for Held<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &**self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => &v[self.range.clone()],
            // `held` makes a Held of CPU fp32 storage only.
            _ => &[],
        }
    }
}

/// `t`'s values in place, if it is a contiguous CPU fp32 tensor.
pub(crate) fn held(t: &Tensor) -> Option<Held<'_>> {
    let (storage, layout) = t.storage_and_layout();
    let range = match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(_)), Some((a, b))) => a..b,
        _ => return None,
    };
    Some(Held {
        storage: Box::new(storage),
        range,
    })
}

/// A tensor's fp32 values: in place ([`Held`]), or a converted copy when
/// the tensor is not contiguous CPU fp32.
pub(crate) enum TensorValues<'a> {
    Held(Held<'a>),
    Copied(Vec<f32>),
}

impl std::ops::Deref for TensorValues<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Self::Held(h) => h,
            Self::Copied(v) => v,
        }
    }
}

/// `t`'s values, in place where they can be.
pub(crate) fn values_of(t: &Tensor) -> candle_core::Result<TensorValues<'_>> {
    Ok(match held(t) {
        Some(h) => TensorValues::Held(h),
        None => TensorValues::Copied(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
    })
}

/// One part of [`concatenated`]: values, or that many zeros.
pub(crate) enum Part<'a> {
    Values(&'a [f32]),
    Zeros(usize),
}

impl Part<'_> {
    fn len(&self) -> usize {
        match self {
            Part::Values(v) => v.len(),
            Part::Zeros(n) => *n,
        }
    }
}

/// The parts one after another in a new buffer, written once (no zeroing
/// before the copy), on every core.
pub(crate) fn concatenated(parts: &[Part]) -> Vec<f32> {
    let len = parts.iter().map(Part::len).sum();
    let mut out: Vec<f32> = Vec::with_capacity(len);
    let mut rest = &mut out.spare_capacity_mut()[..len];
    // Work in pieces of at most CHUNK values: a destination and its source
    // (`None`: zeros).
    type Piece<'a, 'b> = (&'a mut [MaybeUninit<f32>], Option<&'b [f32]>);
    let mut pieces: Vec<Piece> = Vec::new();
    for part in parts {
        let (mut dst, tail) = std::mem::take(&mut rest).split_at_mut(part.len());
        rest = tail;
        let mut at = 0;
        while !dst.is_empty() {
            let k = dst.len().min(CHUNK);
            let (head, tail) = std::mem::take(&mut dst).split_at_mut(k);
            dst = tail;
            let src = match part {
                Part::Values(v) => Some(&v[at..at + k]),
                Part::Zeros(_) => None,
            };
            pieces.push((head, src));
            at += k;
        }
    }
    pieces.into_par_iter().for_each(|(dst, src)| match src {
        Some(src) => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = MaybeUninit::new(*s);
            }
        }
        None => dst.fill(MaybeUninit::new(0.0)),
    });
    // SAFETY: the pieces cover the first len elements, each written above.
    unsafe { out.set_len(len) };
    out
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
        // Past FRESH_PAGES the zeros come from calloc.
        let big = zeros(FRESH_PAGES + 3);
        assert_eq!(big.len(), FRESH_PAGES + 3);
        assert!(big.iter().all(|&v| v == 0.0));
    }

    /// Parts of values and of zeros, short and longer than a task's
    /// chunk, land one after another.
    #[test]
    fn concatenated_parts_follow_each_other() {
        let a: Vec<f32> = (0..CHUNK + 5).map(|i| i as f32 + 0.5).collect();
        let b = [7f32, -1.0];
        let parts = [
            Part::Values(&b),
            Part::Zeros(3),
            Part::Values(&a),
            Part::Zeros(2 * CHUNK + 1),
            Part::Values(&[]),
            Part::Values(&b),
        ];
        let mut want = b.to_vec();
        want.extend([0.0; 3]);
        want.extend(&a);
        want.extend(vec![0.0; 2 * CHUNK + 1]);
        want.extend(b);
        assert_eq!(concatenated(&parts), want);
        assert!(concatenated(&[]).is_empty());
    }

    /// A tensor's values are read in place when it is contiguous CPU fp32,
    /// and converted otherwise.
    #[test]
    fn tensor_values_in_place_or_converted() {
        let dev = candle_core::Device::Cpu;
        let t = Tensor::arange(0f32, 6.0, &dev)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        assert!(matches!(values_of(&t).unwrap(), TensorValues::Held(_)));
        assert_eq!(&*values_of(&t).unwrap(), &[0f32, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let row = t.narrow(0, 1, 1).unwrap();
        assert_eq!(&*held(&row).unwrap(), &[3f32, 4.0, 5.0]);
        let tt = t.t().unwrap();
        assert!(held(&tt).is_none());
        assert!(matches!(values_of(&tt).unwrap(), TensorValues::Copied(_)));
        assert_eq!(&*values_of(&tt).unwrap(), &[0f32, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let half = t.to_dtype(DType::BF16).unwrap();
        assert_eq!(
            &*values_of(&half).unwrap(),
            &[0f32, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
    }

    /// A buffer given back comes out again for a request of its length,
    /// the last given back first; short buffers are not kept, and past
    /// [`POOL_MAX`] the oldest goes.
    #[test]
    fn the_pool_hands_out_what_fits() {
        let len = 4 * POOL_MIN;
        let mut pool = Pool::default();
        pool.give(vec![3f32; len]);
        pool.give(vec![1f32; POOL_MIN - 1]);
        assert_eq!(pool.kept.len(), 1, "short buffers are not kept");
        pool.give(vec![5f32; len]);
        pool.give(vec![7f32; 2 * len]);
        assert!(pool.take(len - 1).is_none(), "no buffer of that length");
        assert_eq!(
            pool.take(len),
            Some(vec![5f32; len]),
            "the last of that length"
        );
        assert_eq!(pool.take(len), Some(vec![3f32; len]));
        assert_eq!(pool.take(len), None);
        assert_eq!(pool.kept.len(), 1);
        pool.kept.clear();
        for i in 0..POOL_MAX + 3 {
            pool.give(vec![i as f32; POOL_MIN]);
        }
        assert_eq!(pool.kept.len(), POOL_MAX);
        assert_eq!(pool.kept[0][0], 3.0, "the three oldest went first");
        // Within a step, a buffer given back is handed out again (a length
        // no other test's buffers have: the pool is the process's).
        let (step, odd) = (StepBuffers::begin(), POOL_MIN + 1237);
        let fresh = scratch(odd);
        let at = fresh.as_ptr();
        recycle(fresh);
        let again = zeros(odd);
        assert_eq!(again.as_ptr(), at, "reused within the step");
        assert!(again.iter().all(|&x| x == 0.0));
        drop(step);
        assert_eq!(copied(&[2f32; 5]), vec![2f32; 5]);
    }

    /// A large buffer serves a request up to a quarter shorter, cut or
    /// grown within its allocation (grown with zeros); a large request
    /// nothing fits frees large buffers that do not fit it, the too short
    /// first; between steps only the large ones stay.
    #[test]
    fn large_buffers_serve_nearby_lengths_and_stay_between_steps() {
        let big = FRESH_PAGES;
        let mut pool = Pool::default();
        pool.give(vec![1f32; big + 100]);
        let cut = pool.take(big + 50).expect("a quarter's slack");
        assert_eq!((cut.len(), cut.capacity()), (big + 50, big + 100));
        assert!(cut.iter().all(|&v| v == 1.0));
        let at = cut.as_ptr();
        pool.give(cut);
        let grown = pool.take(big + 80).expect("its allocation holds it");
        assert_eq!((grown.as_ptr(), grown.len()), (at, big + 80));
        assert!(grown[..big + 50].iter().all(|&v| v == 1.0));
        assert!(grown[big + 50..].iter().all(|&v| v == 0.0));
        pool.give(grown);
        // A request that is not large leaves it.
        assert!(pool.take(big / 2 + big / 8).is_none(), "not large");
        assert_eq!(pool.kept.len(), 1);
        // The shortest that fits goes first.
        pool.give(vec![2f32; big + 20]);
        assert_eq!(pool.take(big + 10).map(|v| v[0]), Some(2.0));
        // A large request nothing fits frees large buffers, the too short
        // first, oldest first, as many values as it asks for. (Zeroed
        // allocations from here on: their pages are never touched.)
        pool.give(vec![3f32; POOL_MIN]);
        for extra in 1..=3 {
            pool.give(vec![0f32; big + extra]);
        }
        assert!(pool.take(big + big / 2).is_none());
        let left: Vec<usize> = pool.kept.iter().map(Vec::len).collect();
        assert_eq!(left, [POOL_MIN, big + 2, big + 3], "two were enough");
        assert!(pool.take(2 * big + 10).is_none());
        assert_eq!(pool.kept.len(), 1, "the large ones went, the short stays");
        assert_eq!(pool.kept[0].len(), POOL_MIN);
        // One a quarter or more shorter than every large buffer frees the
        // longest of them, as many values as it asks for: the smaller
        // batch's buffers take their place.
        for times in 2..=4 {
            pool.give(vec![0f32; times * big]);
        }
        assert!(pool.take(big + big / 2).is_none());
        let left: Vec<usize> = pool.kept.iter().map(Vec::len).collect();
        assert_eq!(left, [POOL_MIN, 2 * big, 3 * big], "the longest went");
        // Between steps, only the large ones stay (when kept at all).
        pool.give(vec![4f32; big]);
        let freed = pool.steps_ended(true);
        assert_eq!(freed.iter().map(Vec::len).collect::<Vec<_>>(), [POOL_MIN]);
        let left: Vec<usize> = pool.kept.iter().map(Vec::len).collect();
        assert_eq!(left, [2 * big, 3 * big, big]);
        assert_eq!(pool.steps_ended(false).len(), 3);
        assert!(pool.kept.is_empty());
    }
}
