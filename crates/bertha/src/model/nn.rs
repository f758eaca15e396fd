//! Small building blocks shared by the BERT modules.

use std::cell::RefCell;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};
use rand::Rng;

use super::ops;
use crate::config::Activation;
use crate::fast::cpu::multiversion;

/// `y = x Wᵀ + b` over the last dimension, for inputs of any rank.
///
/// Inputs are flattened to 2-D so the product is a single GEMM rather
/// than a batched one over broadcast weights.
#[derive(Debug, Clone)]
pub struct Dense {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
}

impl Dense {
    /// Loads `{vb}.weight` `[out, in]` and `{vb}.bias` `[out]`, initialised
    /// like transformers (normal(0, std), zero bias) when fresh.
    pub fn load(vb: VarBuilder, in_dim: usize, out_dim: usize, std: f64) -> Result<Self> {
        let weight = vb.get_with_hints(
            (out_dim, in_dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        let bias = vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?;
        Ok(Self {
            weight,
            bias: Some(bias),
        })
    }

    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// As [`Dense::load`], without a bias when `bias` is false (the
    /// checkpoint then has none: ModernBERT's layers).
    pub fn load_with_bias(
        vb: VarBuilder,
        (in_dim, out_dim): (usize, usize),
        std: f64,
        bias: bool,
    ) -> Result<Self> {
        if bias {
            return Self::load(vb, in_dim, out_dim, std);
        }
        let weight = vb.get_with_hints(
            (out_dim, in_dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        Ok(Self { weight, bias: None })
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Dense {
    /// `act(x Wᵀ + b)`: the bias and the non-linearity fused into one pass
    /// (and one backward op) after the matrix multiply.
    pub fn forward_act(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        self.project(x, |y| match &self.bias {
            Some(b) => ops::bias_act(&y, b, act),
            None => activate(&y, act),
        })
    }

    /// `x Wᵀ` on `x` flattened to 2-D, then `then`, then reshaped back.
    fn project(&self, x: &Tensor, then: impl FnOnce(Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let mut out_dims = x.dims().to_vec();
        let Some(last) = out_dims.last_mut() else {
            candle_core::bail!(
                "Dense: the input is a scalar, not [.., {}]",
                self.weight.dim(1)?
            )
        };
        let in_dim = *last;
        *last = self.weight.dim(0)?;
        let rows = x.elem_count() / in_dim.max(1);
        let y = x.reshape((rows, in_dim))?.matmul(&self.weight.t()?)?;
        then(y)?.reshape(out_dims)
    }
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.project(x, |y| match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        })
    }
}

/// LayerNorm over the last dimension with an affine transform.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub(crate) weight: Tensor,
    pub(crate) bias: Tensor,
    pub(crate) eps: f64,
}

impl LayerNorm {
    pub fn load(vb: VarBuilder, dim: usize, eps: f64) -> Result<Self> {
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let bias = vb.get_with_hints(dim, "bias", Init::Const(0.0))?;
        Ok(Self { weight, bias, eps })
    }

    /// As [`LayerNorm::load`], with a constant zero bias (not a parameter,
    /// not in the checkpoint) when `bias` is false, as PyTorch's
    /// `LayerNorm(bias=False)`.
    pub fn load_with_bias(vb: VarBuilder, dim: usize, eps: f64, bias: bool) -> Result<Self> {
        if bias {
            return Self::load(vb, dim, eps);
        }
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let bias = Tensor::zeros(dim, weight.dtype(), weight.device())?;
        Ok(Self { weight, bias, eps })
    }

    /// `{vb}.LayerNorm` over `dim`, when the model has one (`present`).
    pub fn load_optional(
        present: bool,
        vb: &VarBuilder,
        dim: usize,
        eps: f64,
    ) -> Result<Option<Self>> {
        present
            .then(|| Self::load(vb.pp("LayerNorm"), dim, eps))
            .transpose()
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // With a backward pass (candle's fused layer_norm has none): one
        // fused op on the CPU, the composite form elsewhere.
        ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}

/// Inverted dropout; the identity unless `train` is set.
///
/// Every mask element is a hash of (the stream's seed, the dropout call's
/// number in the forward pass, the element's coordinates, the row counted
/// in the whole micro-batch) rather than the next draw of a sequential
/// generator: a data-parallel process that runs rows 16..32 of a batch
/// drops exactly what one process running all 32 rows drops, whatever
/// the padded length of either batch.
#[derive(Debug, Clone, Copy)]
pub struct Dropout {
    p: f64,
}

impl Dropout {
    pub fn new(p: f64) -> Self {
        Self { p }
    }

    /// Dropout on a batch-major tensor `[B, ...]`.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.apply(x, train, true)
    }

    /// Dropout on a tensor every row of the batch shares (e.g. DeBERTa's
    /// relative-position table): the same mask on every process.
    pub fn forward_shared(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.apply(x, train, false)
    }

    fn apply(&self, x: &Tensor, train: bool, batched: bool) -> Result<Tensor> {
        if !train || self.p == 0.0 {
            return Ok(x.clone());
        }
        if self.p >= 1.0 {
            return x.zeros_like();
        }
        let Some(mask) = self.next_mask(batched) else {
            return Ok(x.clone());
        };
        let mask = dropout_mask(x.dims(), &mask);
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * mask
    }

    /// The mask of this thread's next dropout call with this rate (the
    /// call counted, as [`forward`](Self::forward) counts it): what the
    /// training fast path applies to packed rows, so it drops exactly the
    /// elements the candle modules drop. `None` when nothing is dropped
    /// (rate 0; no call is counted then, as in `forward`).
    pub(crate) fn next_mask(&self, batched: bool) -> Option<DropoutMask> {
        if self.p <= 0.0 {
            return None;
        }
        let keep = 1.0 - self.p;
        let (key, rows) = DROPOUT_STREAM.with(|cell| {
            let mut slot = cell.borrow_mut();
            let stream = slot.get_or_insert_with(|| DropoutStream {
                seed: rand::rng().random(),
                rows: BatchRows::from_row(0),
                calls: 0,
            });
            stream.calls += 1;
            (
                mix(stream.seed ^ mix(stream.calls)),
                if batched {
                    stream.rows
                } else {
                    BatchRows::from_row(0)
                },
            )
        });
        Some(DropoutMask {
            key,
            rows,
            threshold: keep_threshold(keep),
            scale: if keep > 0.0 { (1.0 / keep) as f32 } else { 0.0 },
        })
    }

    pub fn rate(&self) -> f64 {
        self.p
    }
}

/// One dropout call's mask, as a function of each element's coordinates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropoutMask {
    key: u64,
    /// Where the first (batch) coordinate's rows sit in the micro-batch.
    rows: BatchRows,
    /// An element keeps when its hash's top 53 bits are below this
    /// ([`keep_threshold`]).
    threshold: u64,
    scale: f32,
}

/// The integer form of "the hash's top 53 bits as a uniform number in
/// [0, 1) are below `keep`": for an integer x, `x · 2⁻⁵³ < keep` exactly
/// when `x < ⌈keep · 2⁵³⌉` (both scalings by 2⁵³ are exact), so the masks
/// are those of the float comparison, with integer ops that vectorise.
fn keep_threshold(keep: f64) -> u64 {
    (keep.clamp(0.0, 1.0) * (1u64 << 53) as f64).ceil() as u64
}

impl DropoutMask {
    /// The key of the row at `outer` (coordinates before the last one,
    /// the batch row first, counted in the slice).
    pub(crate) fn row_key(&self, outer: &[usize]) -> u64 {
        let mut row_key = self.key;
        for (d, &c) in outer.iter().enumerate() {
            let c = c as u64;
            let c = if d == 0 { self.rows.row(c) } else { c };
            row_key = mix(row_key ^ c);
        }
        row_key
    }

    /// Multiplies `row` (elements `0..row.len()` of the row keyed
    /// `row_key`) by its mask: kept elements scaled by 1 / keep, the others
    /// zeroed.
    #[inline]
    pub(crate) fn apply_row(&self, row_key: u64, row: &mut [f32]) {
        mask_row(row_key, self.threshold, self.scale, row);
    }

    /// `dst` = `src` through the mask of the row keyed `row_key`: what
    /// [`DropoutMask::apply_row`] makes of a copy of `src`, bit for bit.
    #[inline]
    pub(crate) fn apply_row_into(&self, row_key: u64, src: &[f32], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "dropout: a row into another length");
        mask_row_into(row_key, self.threshold, self.scale, src, dst);
    }

    /// The keep bits of the row keyed `row_key` (bit `j % 32` of word `j /
    /// 32` set when element `j` keeps), for `bits.len() · 32` elements:
    /// the mask drawn once, for a backward pass to apply again
    /// ([`DropoutMask::apply_bits_into`]) without hashing every element anew.
    pub(crate) fn row_bits(&self, row_key: u64, bits: &mut [u32]) {
        mask_bits(row_key, self.threshold, bits);
    }

    /// `dst = src` times the mask that `bits` ([`DropoutMask::row_bits`])
    /// records: what [`DropoutMask::apply_row`] makes of `src`, bit for
    /// bit (kept elements times 1 / keep, the others times 0).
    pub(crate) fn apply_bits_into(&self, bits: &[u32], src: &[f32], dst: &mut [f32]) {
        assert!(
            src.len() == dst.len() && bits.len() * 32 >= src.len(),
            "dropout: {} keep bits for {} values into {}",
            bits.len() * 32,
            src.len(),
            dst.len()
        );
        apply_mask_bits(bits, self.scale, src, dst);
    }

    /// [`DropoutMask::apply_bits_into`] on `row` in place.
    pub(crate) fn apply_bits_in_place(&self, bits: &[u32], row: &mut [f32]) {
        assert!(
            bits.len() * 32 >= row.len(),
            "dropout: {} keep bits for {} values",
            bits.len() * 32,
            row.len()
        );
        mask_bits_in_place(bits, self.scale, row);
    }
}

multiversion! {
    fn mask_row = mask_row_body(row_key: u64, threshold: u64, scale: f32, row: &mut [f32]);
    fn mask_row_into = mask_row_into_body(row_key: u64, threshold: u64, scale: f32, src: &[f32], dst: &mut [f32]);
    fn mask_bits = mask_bits_body(row_key: u64, threshold: u64, bits: &mut [u32]);
    fn apply_mask_bits = apply_mask_bits_body(bits: &[u32], scale: f32, src: &[f32], dst: &mut [f32]);
    fn mask_bits_in_place = mask_bits_in_place_body(bits: &[u32], scale: f32, row: &mut [f32]);
}

/// [`DropoutMask::apply_bits_in_place`]'s loop.
#[inline(always)]
fn mask_bits_in_place_body(bits: &[u32], scale: f32, row: &mut [f32]) {
    for (word, row) in bits.iter().zip(row.chunks_mut(32)) {
        for (b, v) in row.iter_mut().enumerate() {
            *v *= factor(*word, b, scale);
        }
    }
}

/// [`DropoutMask::row_bits`]'s loop: [`mask_row_body`]'s hash and test,
/// 32 elements a word.
#[inline(always)]
fn mask_bits_body(row_key: u64, threshold: u64, bits: &mut [u32]) {
    for (w, word) in bits.iter_mut().enumerate() {
        let mut v = 0u32;
        for b in 0..32 {
            v |= u32::from(keeps(row_key, (w * 32 + b) as u64, threshold)) << b;
        }
        *word = v;
    }
}

/// Element `b`'s factor in a word of keep bits: `scale` when it keeps, else 0.
#[inline(always)]
fn factor(word: u32, b: usize, scale: f32) -> f32 {
    if word >> b & 1 == 1 {
        scale
    } else {
        0.0
    }
}

/// [`DropoutMask::apply_bits_into`]'s loop.
#[inline(always)]
fn apply_mask_bits_body(bits: &[u32], scale: f32, src: &[f32], dst: &mut [f32]) {
    for ((word, src), dst) in bits.iter().zip(src.chunks(32)).zip(dst.chunks_mut(32)) {
        for (b, (s, d)) in src.iter().zip(dst).enumerate() {
            *d = s * factor(*word, b, scale);
        }
    }
}

/// [`DropoutMask::apply_row`]'s loop, compiled per instruction set: one
/// hash per element, every step of training.
#[inline(always)]
fn mask_row_body(row_key: u64, threshold: u64, scale: f32, row: &mut [f32]) {
    for (j, v) in row.iter_mut().enumerate() {
        *v *= if keeps(row_key, j as u64, threshold) {
            scale
        } else {
            0.0
        };
    }
}

/// [`DropoutMask::apply_row_into`]'s loop: [`mask_row_body`]'s product,
/// written elsewhere.
#[inline(always)]
fn mask_row_into_body(row_key: u64, threshold: u64, scale: f32, src: &[f32], dst: &mut [f32]) {
    for (j, (d, s)) in dst.iter_mut().zip(src).enumerate() {
        *d = *s
            * if keeps(row_key, j as u64, threshold) {
                scale
            } else {
                0.0
            };
    }
}

/// Whether element `j` of the row keyed `row_key` keeps: its hash's top 53
/// bits below `threshold`.
#[inline(always)]
fn keeps(row_key: u64, j: u64, threshold: u64) -> bool {
    mix(row_key ^ j.wrapping_mul(0xd6e8_feb8_6659_fd93)) >> 11 < threshold
}

/// The splitmix64 finaliser: a bijection whose outputs look independent
/// for nearby inputs.
#[inline(always)]
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The keep / drop mask of a tensor of shape `dims`: element
/// `(c0, .., ck)` keeps when `hash(key, row(c0), .., ck)` ([`BatchRows`]), as a
/// uniform number in [0, 1), is below `keep`.
fn dropout_mask(dims: &[usize], mask: &DropoutMask) -> Vec<f32> {
    use rayon::prelude::*;
    let n: usize = dims.iter().product();
    let last = dims.last().copied().unwrap_or(1).max(1);
    let outer = &dims[..dims.len().saturating_sub(1)];
    // Rows per step of each outer coordinate.
    let mut strides = vec![1usize; outer.len()];
    for d in (0..outer.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * outer[d + 1].max(1);
    }
    let mut out = vec![1f32; n];
    out.par_chunks_mut(last)
        .enumerate()
        .for_each(|(row, chunk)| {
            // The row's coordinates, outermost first.
            let coords: Vec<usize> = outer
                .iter()
                .zip(&strides)
                .map(|(&size, &stride)| (row / stride) % size.max(1))
                .collect();
            mask.apply_row(mask.row_key(&coords), chunk);
        });
    out
}

/// A forward pass's dropout stream: its seed, where its batch rows sit in
/// the micro-batch, and the dropout calls made so far.
struct DropoutStream {
    seed: u64,
    rows: BatchRows,
    calls: u64,
}

/// Where a forward pass's batch rows sit in the micro-batch, so each row
/// draws its micro-batch row's masks whichever pass or process runs it:
/// pass row `c` is micro-batch row `first + (c / block) · stride + c %
/// block`. One block (`block` unbounded) is a slice starting at `first`;
/// several are, e.g., the columns of a data-parallel process's slice
/// packed end to end (`block` rows each, `stride` = the micro-batch's
/// rows apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRows {
    first: u64,
    block: u64,
    stride: u64,
}

impl BatchRows {
    /// Rows `first`, `first + 1`, …
    pub fn from_row(first: u64) -> Self {
        Self {
            first,
            block: u64::MAX,
            stride: 0,
        }
    }

    /// Blocks of `block` rows from `first`, block `b` at `first + b ·
    /// stride`.
    pub fn blocks(first: u64, block: u64, stride: u64) -> Self {
        Self {
            first,
            block: block.max(1),
            stride,
        }
    }

    /// The micro-batch row of pass row `c`.
    fn row(&self, c: u64) -> u64 {
        self.first + (c / self.block) * self.stride + c % self.block
    }
}

thread_local! {
    /// Dropout's stream (candle's own generator is unseeded), so a
    /// training step is reproducible: the trainer reseeds it every
    /// micro-batch.
    static DROPOUT_STREAM: RefCell<Option<DropoutStream>> = const { RefCell::new(None) };
}

/// Seeds the dropout masks of this thread's next forward passes, whose
/// batches start at row `first_row` of the micro-batch (a data-parallel
/// process's slice; 0 for a whole batch).
pub fn seed_dropout(seed: u64, first_row: u64) {
    seed_dropout_rows(seed, BatchRows::from_row(first_row));
}

/// [`seed_dropout`] for a pass whose rows sit at `rows` in the
/// micro-batch.
pub fn seed_dropout_rows(seed: u64, rows: BatchRows) {
    DROPOUT_STREAM.with(|cell| {
        *cell.borrow_mut() = Some(DropoutStream {
            seed,
            rows,
            calls: 0,
        })
    });
}

/// The composite non-linearity (see [`Dense::forward_act`] for the fused
/// bias + activation).
pub fn activate(x: &Tensor, act: Activation) -> Result<Tensor> {
    match act {
        Activation::Gelu => x.gelu_erf(),
        Activation::GeluTanh => x.gelu(),
        Activation::Relu => x.relu(),
        Activation::Tanh => x.tanh(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The integer threshold keeps exactly the elements the float
    /// comparison `(h >> 11) · 2⁻⁵³ < keep` keeps.
    #[test]
    fn integer_keep_threshold_equals_the_float_comparison() {
        for keep in [0.9, 0.5, 0.1, 1.0 / 3.0, 0.999_999, 1e-9] {
            let t = keep_threshold(keep);
            let mut x = 0x1234_5678_9abc_def0u64;
            for _ in 0..200_000 {
                x = mix(x);
                let h = x >> 11;
                let float = (h as f64) * (1.0 / (1u64 << 53) as f64) < keep;
                assert_eq!(h < t, float, "keep {keep}, h {h}");
                // Around the boundary too.
                for h in [t.saturating_sub(1), t, t + 1] {
                    let float = (h as f64) * (1.0 / (1u64 << 53) as f64) < keep;
                    assert_eq!(h < t, float, "keep {keep}, h {h} at the threshold");
                }
            }
        }
    }

    /// The masks of one dropout call on `[b, heads, t, t]` ones.
    fn masks(b: usize, t: usize, seed: u64, first_row: u64) -> Vec<Vec<Vec<Vec<f32>>>> {
        seed_dropout(seed, first_row);
        let x = Tensor::ones((b, 2, t, t), candle_core::DType::F32, &Device::Cpu).unwrap();
        let y = Dropout::new(0.25).forward(&x, true).unwrap();
        (0..b)
            .map(|i| {
                (0..2)
                    .map(|h| y.get(i).unwrap().get(h).unwrap().to_vec2::<f32>().unwrap())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_slice_of_the_batch_drops_what_the_whole_batch_drops() {
        // The whole micro-batch: 5 rows padded to 7 tokens.
        let whole = masks(5, 7, 42, 0);
        // Rows 2..5 on another process, padded to 6 tokens only.
        let part = masks(3, 6, 42, 2);
        for (r, rows) in part.iter().enumerate() {
            for (h, m) in rows.iter().enumerate() {
                for i in 0..6 {
                    assert_eq!(
                        m[i][..6],
                        whole[r + 2][h][i][..6],
                        "row {r} head {h} query {i}"
                    );
                }
            }
        }
        // Another seed, other masks; the rate is the configured one.
        assert_ne!(masks(5, 7, 43, 0), whole);
        let flat: Vec<f32> = whole.into_iter().flatten().flatten().flatten().collect();
        let kept = flat.iter().filter(|&&v| v > 0.0).count() as f64 / flat.len() as f64;
        assert!((kept - 0.75).abs() < 0.06, "kept {kept}");
        assert!(flat
            .iter()
            .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    }

    /// A mask kept as bits and applied again gives what drawing it
    /// element by element gives, bit for bit, into another row and in
    /// place, for rows of whole and partial words; so does drawing it into
    /// another row.
    #[test]
    fn kept_bits_apply_the_mask_drawn() {
        seed_dropout(11, 3);
        let mask = Dropout::new(0.3).next_mask(true).unwrap();
        for (n, key) in [
            (1usize, [0, 0]),
            (31, [1, 2]),
            (32, [2, 0]),
            (128, [3, 7]),
            (77, [9, 1]),
        ] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() + 1.5).collect();
            let row_key = mask.row_key(&key);
            let mut want = x.clone();
            mask.apply_row(row_key, &mut want);
            let mut bits = vec![u32::MAX; n.div_ceil(32)];
            mask.row_bits(row_key, &mut bits);
            let mut got = vec![f32::NAN; n];
            mask.apply_bits_into(&bits, &x, &mut got);
            let mut in_place = x.clone();
            mask.apply_bits_in_place(&bits, &mut in_place);
            let mut drawn_into = vec![f32::NAN; n];
            mask.apply_row_into(row_key, &x, &mut drawn_into);
            let as_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(as_bits(&got), as_bits(&want), "{n} values");
            assert_eq!(
                as_bits(&drawn_into),
                as_bits(&want),
                "{n} values drawn into another row"
            );
            assert_eq!(as_bits(&in_place), as_bits(&want), "{n} values in place");
            let dropped = want.iter().filter(|v| **v == 0.0).count();
            assert_eq!(
                dropped,
                (0..n).filter(|j| bits[j / 32] >> (j % 32) & 1 == 0).count()
            );
        }
    }

    #[test]
    fn each_dropout_call_draws_a_new_mask() {
        seed_dropout(7, 0);
        let x = Tensor::ones((4, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
        let d = Dropout::new(0.5);
        let a = d.forward(&x, true).unwrap().to_vec2::<f32>().unwrap();
        let b = d.forward(&x, true).unwrap().to_vec2::<f32>().unwrap();
        assert_ne!(a, b);
        // Reseeding repeats the sequence of masks.
        seed_dropout(7, 0);
        assert_eq!(d.forward(&x, true).unwrap().to_vec2::<f32>().unwrap(), a);
    }
}
