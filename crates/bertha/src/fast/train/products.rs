//! The three matrix products of a linear layer's training step, on
//! row-major slices: the forward `x · Wᵀ`, the input gradient `dy · W`
//! and the weight gradient `dyᵀ · x`. In fp32 they run on our AVX2 tiles
//! where those exist and win (`fast::matmul`'s `general`), else on the
//! gemm crate; both read transposed operands through strides, so no caller
//! copies a transpose, and the weight stays in `nn.Linear`'s `[out, in]`
//! layout throughout.

use crate::fast::buffers::{scratch, Unwritten};
use crate::fast::kernels::parallelism;
use crate::fast::kernels::Act;
pub(crate) use crate::fast::matmul::Operand;
use crate::fast::matmul::{
    as_halves, as_words, product_bf16, product_bf16_act, product_bf16_act_grad,
    product_bf16_both_pairs, product_bf16_interleaved, product_bf16_new, product_bf16_pairs_new,
    product_bf16_pairs_right, product_bf16_right, product_bf16_to_pairs_new,
    product_bf16_transposed_pairs, product_bf16_transposed_pairs_packed, Dst, LeftIn, Right,
    Strided, Sums, WeightPanels,
};

/// The number format of a training step's matrix products: fp32, or bf16
/// operands with fp32 sums (AVX512-BF16's `vdpbf16ps`); whatever the
/// products, weights, gradients and everything between the products stay
/// fp32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compute {
    #[default]
    F32,
    Bf16,
}

impl std::str::FromStr for Compute {
    type Err = crate::error::Error;

    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "f32" | "fp32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            _ => Err(crate::error::Error::option(
                "precision",
                format!("`{s}` is unknown for training (expected f32 or bf16)"),
            )),
        }
    }
}

/// A linear layer's weight `[n, k]`: its values, and its bf16 panels when
/// the optimizer packed them ([`super::WeightPacks`]).
#[derive(Clone, Copy)]
pub(crate) struct Weight<'a> {
    pub data: &'a [f32],
    pub panels: Option<&'a WeightPanels>,
}

impl<'a> From<&'a [f32]> for Weight<'a> {
    /// A weight not packed: each product packs it.
    fn from(data: &'a [f32]) -> Self {
        Self { data, panels: None }
    }
}

impl<'a> Weight<'a> {
    /// The forward product's right operand `wᵀ` `[k, n]`.
    fn forward(self, k: usize) -> Right<'a> {
        match self.panels {
            Some(p) => p.forward(),
            None => Right::F32(Strided::transposed(self.data, k)),
        }
    }

    /// The input gradient's right operand `w` `[n, k]`.
    fn backward(self, k: usize) -> Right<'a> {
        match self.panels {
            Some(p) => p.backward(),
            None => Right::F32(Strided::rows(self.data, k)),
        }
    }
}

impl Compute {
    /// What this CPU runs: bf16 needs fast bf16 products
    /// ([`crate::fast::cpu::has_bf16`]), else fp32 with a warning.
    pub fn on_this_cpu(self) -> Self {
        if self == Self::Bf16 && !crate::fast::cpu::has_bf16() {
            tracing::warn!(
                "{}: training runs in fp32",
                crate::fast::cpu::no_bf16_reason()
            );
            return Self::F32;
        }
        self
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`.
    pub fn forward(self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32], m: usize) {
        self.forward_weight(x, w.into(), bias, y, m)
    }

    /// [`Compute::forward`] of a [`Weight`] (its panels when packed).
    pub(crate) fn forward_weight(
        self,
        x: &[f32],
        w: Weight,
        bias: Option<&[f32]>,
        y: &mut [f32],
        m: usize,
    ) {
        if self == Self::F32 {
            return forward(x, w.data, bias, y, m);
        }
        let n = bias.map_or_else(|| y.len() / m.max(1), <[f32]>::len);
        let k = x.len() / m.max(1);
        check("linear weight", w.data, n, k);
        let sums = Sums {
            bias,
            accumulate: false,
        };
        product_bf16_right((m, n, k), Strided::rows(x, k), w.forward(k), y, sums);
    }

    /// [`Compute::forward`] with a bias into a new buffer `[m, n]`: in bf16
    /// written whole by the tiles, not zeroed first.
    pub fn forward_new(self, x: &[f32], w: &[f32], bias: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = (bias.len(), x.len() / m.max(1));
        if self == Self::F32 {
            let mut y = scratch(m * n);
            forward(x, w, Some(bias), &mut y, m);
            return y;
        }
        check("linear input", x, m, k);
        check("linear weight", w, n, k);
        let (a, b) = (Strided::rows(x, k), Strided::transposed(w, k));
        product_bf16_new((m, n, k), a, b, Some(bias))
    }

    /// `dx[m, k] (+)= dy[m, n] · w[n, k]`.
    pub fn input_grad(self, dy: &[f32], w: &[f32], dx: &mut [f32], m: usize, accumulate: bool) {
        if self == Self::F32 {
            return input_grad(dy, w, dx, m, accumulate);
        }
        let k = dx.len() / m.max(1);
        let n = dy.len() / m.max(1);
        let (a, b) = (Strided::rows(dy, n), Strided::rows(w, k));
        let sums = Sums {
            bias: None,
            accumulate,
        };
        product_bf16((m, k, n), a, b, dx, sums);
    }

    /// `dw[n, k] += dy[m, n]ᵀ · x[m, k]`.
    pub fn weight_grad(self, dy: &[f32], x: &[f32], dw: &mut [f32], m: usize) {
        self.weight_grad_into(dy, x, GradSink::Add(dw), m)
    }

    /// `dw[n, k] (+)= dy[m, n]ᵀ · x[m, k]`, as `dw` says.
    pub(crate) fn weight_grad_into(self, dy: &[f32], x: &[f32], dw: GradSink, m: usize) {
        if self == Self::F32 {
            return weight_grad(dy, x, dw, m);
        }
        let n = dy.len() / m.max(1);
        let k = x.len() / m.max(1);
        check_sink(&dw, n, k);
        let (a, b) = (Strided::transposed(dy, n), Strided::rows(x, k));
        let (dw, sums) = dw.bf16();
        product_bf16((n, k, m), a, b, dw, sums);
    }
}

/// A weight gradient's destination.
pub(crate) enum GradSink<'a> {
    /// Sums added to what it holds.
    Add(&'a mut [f32]),
    /// Overwritten (a buffer whose old values are of no use).
    Overwrite(&'a mut [f32]),
    /// A new buffer, written whole: the step's first product into a
    /// parameter's gradient, with no pass zeroing it first
    /// ([`super::Param::grad_product`]). Every product taking a sink
    /// writes this one whole, also with no rows to sum.
    New(&'a mut Unwritten),
}

impl<'a> GradSink<'a> {
    fn len(&self) -> usize {
        match self {
            Self::Add(c) | Self::Overwrite(c) => c.len(),
            Self::New(c) => c.len(),
        }
    }

    /// The bf16 product's output and its sums (added, or not).
    fn bf16(self) -> (Dst<'a>, Sums<'static>) {
        let (dst, accumulate) = match self {
            Self::Add(c) => (Dst::Rows(c), true),
            Self::Overwrite(c) => (Dst::Rows(c), false),
            Self::New(c) => (Dst::New(c), false),
        };
        let sums = Sums {
            bias: None,
            accumulate,
        };
        (dst, sums)
    }

    /// The first value's address and whether the product adds.
    fn raw(self) -> (*mut f32, bool) {
        match self {
            Self::Add(c) => (c.as_mut_ptr(), true),
            Self::Overwrite(c) => (c.as_mut_ptr(), false),
            Self::New(c) => (c.as_mut_ptr(), false),
        }
    }
}

fn check_sink(dw: &GradSink, rows: usize, cols: usize) {
    check_len("weight gradient", dw.len(), rows, cols);
}

/// An FFN's input layer `z = x[m, k] · w[n, k]ᵀ + bias` in bf16 products,
/// stored by its tiles as the activation's slopes `act'(z)` `[m, n]` (all
/// its backward reads: [`input_grad_act_to_pairs_bf16`]), `act(z)` as
/// bf16 pairs `[m, ⌈n / 2⌉]` (the words of an fp32 buffer), which the next
/// product reads ([`forward_pairs_bf16`]'s input), and `act(z)` as that
/// product's weight gradient reads it, a right operand's panels
/// ([`weight_grad_panels_bf16`]). New buffers, written whole by the tiles
/// (not zeroed first).
pub(crate) fn forward_act_bf16(
    x: Input,
    w: Weight,
    (bias, act): (&[f32], Act),
    m: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (n, k) = (bias.len(), w.data.len() / bias.len().max(1));
    check("linear weight", w.data, n, k);
    product_bf16_act((m, n, k), x.left(m, k), w.forward(k), (bias, act))
}

/// A forward product's input rows `[m, k]`: fp32, or the bf16 pairs
/// stored beside them (`⌈k / 2⌉` per row) by the pass that made them.
#[derive(Clone, Copy)]
pub(crate) enum Input<'a> {
    F32(&'a [f32]),
    Pairs(&'a [u32]),
}

impl<'a> Input<'a> {
    fn left(self, m: usize, k: usize) -> LeftIn<'a> {
        match self {
            Self::F32(x) => {
                check("linear input", x, m, k);
                LeftIn::F32(Strided::rows(x, k))
            }
            Self::Pairs(p) => {
                assert_eq!(
                    p.len(),
                    m * k.div_ceil(2),
                    "linear input pairs are not [{m}, {}]",
                    k.div_ceil(2)
                );
                LeftIn::Pairs(p)
            }
        }
    }
}

/// `x · w[n, k]ᵀ + bias` in bf16 products, stored only as bf16 pairs
/// `[m, ⌈n / 2⌉]` (the words of a new fp32 buffer, written whole by the
/// tiles): attention's Q, K and V, whose every use is a product operand.
pub(crate) fn forward_to_pairs_bf16(x: Input, w: &[f32], bias: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (bias.len(), w.len() / bias.len().max(1));
    check("linear weight", w, n, k);
    let b = Right::F32(Strided::transposed(w, k));
    product_bf16_to_pairs_new((m, n, k), x.left(m, k), b, bias)
}

/// `y[m, n] = a · w[n, k]ᵀ + bias` in bf16 products into a new buffer, for
/// `a` given as `m` rows of `⌈k / 2⌉` bf16 pairs (rounded before, by the
/// tiles that made it).
pub(crate) fn forward_pairs_bf16(
    pairs: &[u32],
    k: usize,
    w: Weight,
    bias: &[f32],
    m: usize,
) -> Vec<f32> {
    let n = bias.len();
    check("linear weight", w.data, n, k);
    product_bf16_pairs_new((m, n, k), pairs, w.forward(k), bias)
}

/// `dx[m, k] (+)= dy · w[n, k]` in bf16 products, for `dy` given as `m`
/// rows of `⌈n / 2⌉` bf16 pairs (rounded where it was made), `w` read
/// from its panels when packed.
pub(crate) fn input_grad_pairs_bf16(
    (dy, n): (&[u32], usize),
    w: Weight,
    dx: &mut [f32],
    m: usize,
    accumulate: bool,
) {
    let k = dx.len() / m.max(1);
    check("linear weight", w.data, n, k);
    let sums = Sums {
        bias: None,
        accumulate,
    };
    product_bf16_pairs_right((m, k, n), dy, w.backward(k), dx, sums);
}

/// The input gradient of an activation whose output feeds a linear layer
/// `w[n, k]`, from that layer's output gradient `dy` (`m` rows of `⌈n /
/// 2⌉` bf16 pairs) and the activation's `slopes` `[m, k]` (as
/// [`forward_act_bf16`] stores them): `(dy · w) ⊙ slopes` as bf16 pairs
/// `[m, ⌈k / 2⌉]` (the words of a new fp32 buffer), its column sums (the
/// bias gradient) added into `dbias`. The FFN's middle in one product:
/// the activation's output gradient exists only in the tiles' registers.
/// Beside the pairs, their transpose as the layer's weight gradient reads
/// it ([`weight_grad_interleaved_bf16`]), from the same tiles.
pub(crate) fn input_grad_act_to_pairs_bf16(
    (dy, n): (&[u32], usize),
    w: Weight,
    slopes: &[f32],
    dbias: &mut [f32],
    m: usize,
) -> (Vec<f32>, Vec<f32>) {
    let k = dbias.len();
    check("linear weight", w.data, n, k);
    check("activation slopes", slopes, m, k);
    product_bf16_act_grad((m, k, n), dy, w.backward(k), slopes, dbias)
}

/// `dw[n, k] (+)= dyᵀ · x[m, k]` in bf16 products, for `dy` given as `m`
/// rows of `⌈n / 2⌉` bf16 pairs (rounded where it was made).
pub(crate) fn weight_grad_pairs_bf16(dy: &[u32], n: usize, x: &[f32], dw: GradSink, m: usize) {
    let k = x.len() / m.max(1);
    check_sink(&dw, n, k);
    let (dw, sums) = dw.bf16();
    product_bf16_transposed_pairs((n, k, m), dy, Strided::rows(x, k), dw, sums);
}

/// `dw[n, k] (+)= dyᵀ · x[m, k]` in bf16 products, for `dy`'s transpose
/// given as [`input_grad_act_to_pairs_bf16`] stores it (interleaved).
pub(crate) fn weight_grad_interleaved_bf16(
    (dy_t, n): (&[f32], usize),
    x: &[f32],
    dw: GradSink,
    m: usize,
) {
    let k = x.len() / m.max(1);
    check_sink(&dw, n, k);
    let (dw, sums) = dw.bf16();
    product_bf16_interleaved((n, k, m), as_words(dy_t), Strided::rows(x, k), dw, sums);
}

/// `dw[n, k] (+)= dyᵀ · x` in bf16 products, for `dy` given as `m` rows of
/// `⌈n / 2⌉` bf16 pairs and `x` `[m, k]` as the panels
/// [`forward_act_bf16`] stores (the words of fp32 storage).
pub(crate) fn weight_grad_panels_bf16(
    (dy, n): (&[u32], usize),
    (x, k): (&[f32], usize),
    dw: GradSink,
    m: usize,
) {
    check_sink(&dw, n, k);
    let (dw, sums) = dw.bf16();
    product_bf16_transposed_pairs_packed((n, k, m), dy, as_halves(x), dw, sums);
}

/// `dy · w[n, k]` in bf16 products, for `dy` given as `m` rows of `⌈n /
/// 2⌉` bf16 pairs, stored only as bf16 pairs `[m, ⌈k / 2⌉]` in a new
/// buffer (the words of fp32 storage, written whole by the tiles):
/// attention's context gradient, which only attention's products read.
pub(crate) fn input_grad_to_pairs_bf16((dy, n): (&[u32], usize), w: Weight, m: usize) -> Vec<f32> {
    let k = w.data.len() / n.max(1);
    check("linear weight", w.data, n, k);
    let no_bias = vec![0f32; k];
    product_bf16_to_pairs_new((m, k, n), LeftIn::Pairs(dy), w.backward(k), &no_bias)
}

/// `dw[n, k] (+)= dyᵀ · x` in bf16 products, for `dy` given as `m` rows of
/// `⌈n / 2⌉` bf16 pairs and `x` as `m` rows of `⌈k / 2⌉` (both rounded
/// where they were made).
pub(crate) fn weight_grad_both_pairs_bf16(
    (dy, n): (&[u32], usize),
    (x, k): (&[u32], usize),
    dw: GradSink,
    m: usize,
) {
    check_sink(&dw, n, k);
    let (dw, sums) = dw.bf16();
    product_bf16_both_pairs((n, k, m), dy, x, dw, sums);
}

/// `dst[m, n] = (accumulate ? dst : 0) + scale · a[m, k] · b[k, n]`,
/// `dst` with rows `dst_rs` apart.
///
/// # Safety
/// `a`, `b` and `dst` must address `m × k`, `k × n` and `m × n` elements
/// through their strides, and nothing else may write `dst` meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: Operand,
    b: Operand,
    scale: f32,
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                // SAFETY: row r of the m × n destination (written, not
                // read: it may be a new buffer).
                unsafe { std::ptr::write_bytes(dst.add(r * dst_rs), 0, n) };
            }
        }
        return;
    }
    // On AVX2 (without AVX-512) our register tiles take the products they
    // run faster than the gemm crate (`matmul::general`).
    #[cfg(target_arch = "x86_64")]
    if crate::fast::matmul::takes_product((m, n, k), a, parallel) {
        // SAFETY: the caller's contract, and the CPU has the tiles.
        return unsafe {
            crate::fast::matmul::product_general(
                (m, n, k),
                dst,
                dst_rs,
                accumulate,
                a,
                b,
                scale,
                parallel,
            )
        };
    }
    let par = if parallel {
        parallelism()
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the caller's contract.
    unsafe {
        crate::fast::matmul::gemm_f32(
            (m, n, k),
            (dst, 1, dst_rs as isize, accumulate),
            (a.ptr, a.cs, a.rs),
            (b.ptr, b.cs, b.rs),
            if accumulate { 1.0 } else { 0.0 },
            scale,
            par,
        );
    }
}

fn check(what: &str, v: &[f32], rows: usize, cols: usize) {
    check_len(what, v.len(), rows, cols);
}

fn check_len(what: &str, len: usize, rows: usize, cols: usize) {
    assert_eq!(len, rows * cols, "{what} is not [{rows}, {cols}]");
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`: a linear layer's forward.
pub(crate) fn forward(x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32], m: usize) {
    let n = bias.map_or_else(|| y.len() / m.max(1), <[f32]>::len);
    let k = x.len() / m.max(1);
    check("linear input", x, m, k);
    check("linear weight", w, n, k);
    check("linear output", y, m, n);
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(n) {
            row.copy_from_slice(b);
        }
    }
    // SAFETY: shapes checked above.
    unsafe {
        product(
            (m, n, k),
            y.as_mut_ptr(),
            n,
            bias.is_some(),
            Operand::rows(x, k),
            Operand::transposed(w, k),
            1.0,
            true,
        )
    }
}

/// `dx[m, k] (+)= dy[m, n] · w[n, k]`: the input gradient.
pub(crate) fn input_grad(dy: &[f32], w: &[f32], dx: &mut [f32], m: usize, accumulate: bool) {
    let k = dx.len() / m.max(1);
    let n = dy.len() / m.max(1);
    check("output gradient", dy, m, n);
    check("linear weight", w, n, k);
    check("input gradient", dx, m, k);
    // SAFETY: shapes checked above.
    unsafe {
        product(
            (m, k, n),
            dx.as_mut_ptr(),
            k,
            accumulate,
            Operand::rows(dy, n),
            Operand::rows(w, k),
            1.0,
            true,
        )
    }
}

/// `dw[n, k] (+)= dy[m, n]ᵀ · x[m, k]`: the weight gradient.
pub(crate) fn weight_grad(dy: &[f32], x: &[f32], dw: GradSink, m: usize) {
    let n = dy.len() / m.max(1);
    let k = x.len() / m.max(1);
    check("output gradient", dy, m, n);
    check("input", x, m, k);
    check_sink(&dw, n, k);
    let (dw, accumulate) = dw.raw();
    // SAFETY: shapes checked above.
    unsafe {
        product(
            (n, k, m),
            dw,
            k,
            accumulate,
            Operand::transposed(dy, n),
            Operand::rows(x, k),
            1.0,
            true,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn the_three_products_match_their_definitions() {
        let (m, k, n) = (13, 7, 5);
        let (x, w, b, dy) = (data(m * k, 1), data(n * k, 2), data(n, 3), data(m * n, 4));
        let mut y = vec![0f32; m * n];
        forward(&x, &w, Some(&b), &mut y, m);
        let mut dx = vec![1f32; m * k];
        input_grad(&dy, &w, &mut dx, m, true);
        let mut dw = vec![0.5f32; n * k];
        weight_grad(&dy, &x, GradSink::Add(&mut dw), m);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = b[j] + (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum::<f32>();
                assert!((y[i * n + j] - want).abs() < 1e-5);
            }
            for c in 0..k {
                let want: f32 = 1.0 + (0..n).map(|j| dy[i * n + j] * w[j * k + c]).sum::<f32>();
                assert!((dx[i * k + c] - want).abs() < 1e-5);
            }
        }
        for j in 0..n {
            for c in 0..k {
                let want: f32 = 0.5 + (0..m).map(|i| dy[i * n + j] * x[i * k + c]).sum::<f32>();
                assert!((dw[j * k + c] - want).abs() < 1e-4);
            }
        }
    }

    /// Every weight gradient's product written whole into a buffer of
    /// garbage (`accumulate` off: the step's first) has the bits of the one
    /// added into zeros, in both number formats and from every operand
    /// form the backward hands them (fp32 rows, pairs, the forward's
    /// panels, the activation gradient's interleaved blocks).
    #[test]
    fn weight_gradients_written_whole_equal_those_added_into_zeros() {
        use crate::fast::matmul::round_row;
        let (m, n, k) = (37, 21, 45);
        let (x, w, b, dy) = (data(m * k, 5), data(n * k, 6), data(k, 7), data(m * n, 8));
        let pairs_of = |v: &[f32], cols: usize| {
            let mut out = vec![0u32; (v.len() / cols) * cols.div_ceil(2)];
            for (row, o) in v
                .chunks_exact(cols)
                .zip(out.chunks_exact_mut(cols.div_ceil(2)))
            {
                round_row(row, o);
            }
            out
        };
        let (dy_pairs, x_pairs) = (pairs_of(&dy, n), pairs_of(&x, k));
        // x as the FFN-in forward stores its output's panels, and the
        // activation gradient's blocks (w as that layer's weight [n, k]).
        let x_in = data(m * n, 9);
        let w_in = data(k * n, 10);
        let (slopes, _, panels) = forward_act_bf16(
            Input::F32(&x_in),
            Weight::from(&w_in[..]),
            (&b, Act::GeluErf),
            m,
        );
        let mut dbias = vec![0f32; k];
        let (_, blocks) = input_grad_act_to_pairs_bf16(
            (&dy_pairs, n),
            Weight::from(&w[..]),
            &slopes,
            &mut dbias,
            m,
        );
        type Product<'p> = Box<dyn Fn(GradSink) + 'p>;
        let cases: Vec<(&str, usize, Product)> = vec![
            (
                "f32",
                n * k,
                Box::new(|s| Compute::F32.weight_grad_into(&dy, &x, s, m)),
            ),
            (
                "bf16",
                n * k,
                Box::new(|s| Compute::Bf16.weight_grad_into(&dy, &x, s, m)),
            ),
            (
                "pairs",
                n * k,
                Box::new(|s| weight_grad_pairs_bf16(&dy_pairs, n, &x, s, m)),
            ),
            (
                "both pairs",
                n * k,
                Box::new(|s| weight_grad_both_pairs_bf16((&dy_pairs, n), (&x_pairs, k), s, m)),
            ),
            (
                "panels",
                n * k,
                Box::new(|s| weight_grad_panels_bf16((&dy_pairs, n), (&panels, k), s, m)),
            ),
            (
                "interleaved",
                k * k,
                Box::new(|s| weight_grad_interleaved_bf16((&blocks, k), &x, s, m)),
            ),
        ];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (name, len, product) in cases {
            let mut added = vec![0f32; len];
            product(GradSink::Add(&mut added));
            assert!(added.iter().all(|v| v.is_finite() && *v != 0.0), "{name}");
            let mut over = vec![f32::NAN; len];
            product(GradSink::Overwrite(&mut over));
            assert_eq!(bits(&over), bits(&added), "{name}: overwritten");
            // NaN-filled in these debug builds: a value left unwritten shows.
            let mut new = Unwritten::new(len);
            product(GradSink::New(&mut new));
            // SAFETY: the product under test writes a New sink whole.
            let new = unsafe { new.assume_written() };
            assert_eq!(bits(&new), bits(&added), "{name}: new");
            let mut twice = added.clone();
            product(GradSink::Add(&mut twice));
            for (t, a) in twice.iter().zip(&added) {
                assert_eq!(*t, a + a, "{name}: added to");
            }
        }
        // No rows to sum: a new gradient is zeros.
        let mut new = Unwritten::new(n * k);
        weight_grad_both_pairs_bf16((&[], n), (&[], k), GradSink::New(&mut new), 0);
        // SAFETY: as above.
        let new = unsafe { new.assume_written() };
        assert!(new.iter().all(|v| v.to_bits() == 0));
    }
}
