//! Fused training ops with both passes, as candle custom ops: LayerNorm,
//! softmax over the last dimension, and bias + activation.
//!
//! Composed of candle ops, each of these makes a pass and allocates a
//! tensor per elementwise step, forward and backward; candle's fused
//! `layer_norm` / `softmax_last_dim` record no backward at all. Here each
//! op is one pass over the rows, parallel over rows with rayon and
//! vectorised like the inference kernels (sharing their row loops), and
//! its backward is a second custom op on the saved inputs.
//!
//! The fused forms run for `f32` tensors on the CPU (made contiguous
//! first); on any other device or dtype the same function falls back to
//! the composite candle ops, so callers need not care (and `cuda` builds
//! still work).
//!
//! Reductions over rows (the weight and bias gradients) are summed in
//! fixed blocks of rows and then in block order, so a gradient does not
//! depend on the thread count or on scheduling: training stays
//! reproducible.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

use crate::config::Activation;
use crate::fast::kernels::{
    erf_and_gauss, gelu_erf, gelu_tanh, gelu_tanh_inner, lane_dot_centered, lane_sum,
    layer_norm_into, multiversion, row_stats, softmax_row, tanh, Act, ROWS_PER_TASK,
};
use crate::fast::matmul::round_row;

multiversion! {
    pub(crate) fn softmax_rows = softmax_rows_body(x: &mut [f32], d: usize);
    fn add_rows = add_rows_body(acc: &mut [f32], rows: &[f32]);
    fn softmax_bwd_rows = softmax_bwd_rows_body(y: &[f32], dy: &[f32], dx: &mut [f32], d: usize);
    fn norm_bwd_rows = norm_bwd_rows_body(x: &[f32], gamma: &[f32], dy: &[f32], dx: &mut [f32], sums: &mut [f32], eps: f32);
    fn bias_act_rows = bias_act_rows_body(x: &[f32], bias: &[f32], y: &mut [f32], act: Act);
    fn bias_act_bwd_rows = bias_act_bwd_rows_body(x: &[f32], bias: &[f32], dy: &[f32], dz: &mut [f32], dbias: &mut [f32], act: Act);
}

/// Whether the fused CPU kernels can run on these tensors.
fn fused(first: &Tensor, rest: &[&Tensor]) -> bool {
    let ok = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    ok(first) && rest.iter().all(|t| ok(t)) && first.rank() > 0
}

/// `(x - mean) / sqrt(var + eps) · gamma + beta` over the last dimension
/// (biased variance, as PyTorch), with gradients for all three inputs.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    if fused(x, &[gamma, beta]) {
        return x.contiguous()?.apply_op3(
            &gamma.contiguous()?,
            &beta.contiguous()?,
            LayerNormOp { eps: eps as f32 },
        );
    }
    composite::layer_norm(x, gamma, beta, eps)
}

/// Softmax over the last dimension (the maximum subtracted first), with
/// its gradient.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if fused(x, &[]) {
        return x.contiguous()?.apply_op1(SoftmaxOp);
    }
    composite::softmax_last_dim(x)
}

/// `act(x + bias)` with `bias` over the last dimension: the FFN's
/// expansion after its matrix multiply, with gradients for both inputs.
pub fn bias_act(x: &Tensor, bias: &Tensor, act: Activation) -> Result<Tensor> {
    if fused(x, &[bias]) {
        return x.contiguous()?.apply_op2(
            &bias.contiguous()?,
            BiasActOp {
                act: Act::from(act),
            },
        );
    }
    composite::bias_act(x, bias, act)
}

/// The same three ops composed of candle ops, each step recording its own
/// backward: the fallback off the CPU or for other dtypes, and the
/// reference the fused ops are tested and timed against.
pub mod composite {
    use candle_core::{Result, Tensor, D};

    use crate::config::Activation;
    use crate::model::nn::activate;

    pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
        normed.broadcast_mul(gamma)?.broadcast_add(beta)
    }

    pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::softmax(x, D::Minus1)
    }

    pub fn bias_act(x: &Tensor, bias: &Tensor, act: Activation) -> Result<Tensor> {
        activate(&x.broadcast_add(bias)?, act)
    }
}

/// The contiguous `f32` data of a custom op's input.
fn data<'a>(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: `{what}` must be f32")
    };
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&v[start..end]),
        None => bail!("{op}: `{what}` must be contiguous (call .contiguous() first)"),
    }
}

/// The number of rows and the last dimension of `l`.
fn rows_of(l: &Layout, op: &str) -> Result<(usize, usize)> {
    match l.dims().split_last() {
        Some((&d, lead)) => Ok((lead.iter().product(), d)),
        None => bail!("{op}: a scalar has no last dimension"),
    }
}

/// Elements per rayon task for rows of `d` (at least 1, so empty
/// inputs split into no tasks rather than panicking).
fn task_len(d: usize) -> usize {
    (d * ROWS_PER_TASK).max(1)
}

/// Checks that a per-feature vector has `d` elements.
fn per_feature(v: &[f32], d: usize, op: &str, what: &str) -> Result<()> {
    if v.len() != d {
        bail!(
            "{op}: `{what}` has {} elements, the input's last dimension is {d}",
            v.len()
        )
    }
    Ok(())
}

/// Runs `body` on blocks of rows in parallel; each block also adds into
/// its own zeroed `width`-long partial sum, and the partials are added in
/// block order into `sums` (deterministic whatever the scheduling). The
/// rows of `out` hold `out_row` values; `body` gets the offset of its first
/// row in inputs of `d` values per row.
fn rows_with_sums<T: Send>(
    out: &mut [T],
    out_row: usize,
    sums: &mut [f32],
    d: usize,
    body: impl Fn(usize, &mut [T], &mut [f32]) + Sync,
) {
    let width = sums.len();
    let partials: Vec<Vec<f32>> = out
        .par_chunks_mut(task_len(out_row))
        .enumerate()
        .map(|(block, rows)| {
            let mut part = vec![0f32; width];
            body(block * ROWS_PER_TASK * d, rows, &mut part);
            part
        })
        .collect();
    for part in &partials {
        for (s, p) in sums.iter_mut().zip(part) {
            *s += p;
        }
    }
}

/// Splits a `[rows + k, d]` gradient made by a backward op into the
/// input gradient (shaped like `like`) and the `k` per-feature ones.
fn unpack(packed: &Tensor, like: &Tensor, rows: usize, k: usize) -> Result<Vec<Tensor>> {
    let d = packed.dim(1)?;
    let mut out = vec![packed.narrow(0, 0, rows)?.reshape(like.shape())?];
    for i in 0..k {
        out.push(packed.narrow(0, rows + i, 1)?.reshape(d)?);
    }
    Ok(out)
}

// ---- the same passes on slices, for the training fast path ----

/// LayerNorm's backward on rows of `gamma.len()`: `dx` from `(x, dy)`,
/// and dgamma / dbeta added into `dgamma` / `dbeta`.
pub(crate) fn layer_norm_backward(
    x: &[f32],
    gamma: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    (dgamma, dbeta): (&mut [f32], &mut [f32]),
    eps: f32,
) {
    let d = gamma.len();
    let mut sums = vec![0f32; 2 * d];
    rows_with_sums(dx, d, &mut sums, d, |at, dx, part| {
        let n = dx.len();
        norm_bwd_rows(&x[at..at + n], gamma, &dy[at..at + n], dx, part, eps);
    });
    add_into(dgamma, &sums[..d]);
    add_into(dbeta, &sums[d..]);
}

/// `y = act(x + bias)` on rows of `bias.len()`.
pub(crate) fn bias_act_forward(x: &[f32], bias: &[f32], y: &mut [f32], act: Act) {
    let task = task_len(bias.len());
    y.par_chunks_mut(task)
        .zip(x.par_chunks(task))
        .for_each(|(y, x)| bias_act_rows(x, bias, y, act));
}

/// The backward of [`bias_act_forward`]: `dz = dy · act'(x + bias)`, and
/// Σ dz over the rows added into `dbias`.
pub(crate) fn bias_act_backward(
    x: &[f32],
    bias: &[f32],
    dy: &[f32],
    dz: &mut [f32],
    dbias: &mut [f32],
    act: Act,
) {
    let mut sums = vec![0f32; bias.len()];
    rows_with_sums(dz, bias.len(), &mut sums, bias.len(), |at, dz, part| {
        let n = dz.len();
        bias_act_bwd_rows(&x[at..at + n], bias, &dy[at..at + n], dz, part, act);
    });
    add_into(dbias, &sums);
}

/// An output gradient `dy` (rows of `dbias.len()`), each row read as it is
/// or as `prepare(row, values, into)` writes it (a dropout mask), stored only as bf16
/// pairs in `dz` (`⌈d / 2⌉` per row) with its column sums added into
/// `dbias`: a linear layer's output gradient in a bf16 step feeds only its
/// two products (as pairs) and its bias gradient. One pass instead of
/// masking, summing and rounding apart; the sums are [`column_sums`]'s
/// (same blocks, same order) and the pairs those of rounding the rows.
pub(crate) fn grad_to_pairs<P>(dy: &[f32], dz: &mut [u32], dbias: &mut [f32], prepare: Option<P>)
where
    P: Fn(usize, &[f32], &mut [f32]) + Sync,
{
    let d = dbias.len();
    let (d2, rows) = (d.div_ceil(2), dy.len() / d.max(1));
    assert!(
        dy.len() == rows * d && dz.len() == rows * d2,
        "grad_to_pairs: the gradient and its pairs are not [{rows}, {d}] and [{rows}, {d2}]"
    );
    if d == 0 {
        return;
    }
    rows_with_sums(dz, d2, dbias, d, |at, pairs, part| {
        let mut prepared = match prepare {
            Some(_) => vec![0f32; d],
            None => Vec::new(),
        };
        for (r, out) in pairs.chunks_exact_mut(d2).enumerate() {
            let src = &dy[at + r * d..][..d];
            let row = match &prepare {
                Some(prepare) => {
                    prepare(at / d + r, src, &mut prepared);
                    &prepared[..]
                }
                None => src,
            };
            add_rows(part, row);
            round_row(row, out);
        }
    });
}

/// Softmax's backward on one block of rows of `d`: `dx = y · (dy - Σ y·dy)`.
pub(crate) fn softmax_backward(y: &[f32], dy: &[f32], dx: &mut [f32], d: usize) {
    softmax_bwd_rows(y, dy, dx, d);
}

/// Σ over rows of `d` (columns sums) added into `sums`, in fixed blocks
/// of rows then in block order (deterministic).
pub(crate) fn column_sums(x: &[f32], sums: &mut [f32]) {
    let d = sums.len();
    let partials: Vec<Vec<f32>> = x
        .par_chunks(task_len(d))
        .map(|rows| {
            let mut part = vec![0f32; d];
            add_rows(&mut part, rows);
            part
        })
        .collect();
    for part in &partials {
        add_into(sums, part);
    }
}

/// Every row of `rows` (rows of `acc.len()`) added into `acc`, in order.
#[inline(always)]
fn add_rows_body(acc: &mut [f32], rows: &[f32]) {
    for r in rows.chunks_exact(acc.len()) {
        add_into(acc, r);
    }
}

#[inline(always)]
fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

// ---- LayerNorm ----

struct LayerNormOp {
    eps: f32,
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "bertha-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let x = data(s1, l1, op, "x")?;
        let gamma = data(s2, l2, op, "weight")?;
        let beta = data(s3, l3, op, "bias")?;
        let (_, d) = rows_of(l1, op)?;
        per_feature(gamma, d, op, "weight")?;
        per_feature(beta, d, op, "bias")?;
        let mut y = vec![0f32; x.len()];
        if d > 0 {
            layer_norm_into(x, &mut y, gamma, beta, self.eps);
        }
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let packed =
            x.apply_op3_no_bwd(gamma, &dy.contiguous()?, &LayerNormBwd { eps: self.eps })?;
        let rows = packed.dim(0)? - 2;
        let mut g = unpack(&packed, x, rows, 2)?.into_iter();
        Ok((g.next(), g.next(), g.next()))
    }
}

/// LayerNorm's backward on `(x, gamma, dy)`: `[rows + 2, d]` holding dx,
/// then dgamma, then dbeta.
struct LayerNormBwd {
    eps: f32,
}

impl CustomOp3 for LayerNormBwd {
    fn name(&self) -> &'static str {
        "bertha-layer-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let x = data(s1, l1, op, "x")?;
        let gamma = data(s2, l2, op, "weight")?;
        let dy = data(s3, l3, op, "grad")?;
        let (rows, d) = rows_of(l1, op)?;
        per_feature(gamma, d, op, "weight")?;
        if dy.len() != x.len() {
            bail!(
                "{op}: the gradient's shape {:?} is not the input's",
                l3.dims()
            )
        }
        let mut out = vec![0f32; (rows + 2) * d];
        let (dx, sums) = out.split_at_mut(rows * d);
        layer_norm_backward(x, gamma, dy, dx, sums.split_at_mut(d), self.eps);
        Ok((CpuStorage::F32(out), Shape::from((rows + 2, d))))
    }
}

/// Per row, with x̂ = (x - mean)·rstd and g = dy·gamma:
/// dx = rstd·(g - mean(g) - x̂·mean(g·x̂)); adds dy·x̂ and dy into `sums`
/// (dgamma then dbeta).
#[inline(always)]
fn norm_bwd_rows_body(
    x: &[f32],
    gamma: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    sums: &mut [f32],
    eps: f32,
) {
    let d = gamma.len();
    let n = d as f32;
    let (dgamma, dbeta) = sums.split_at_mut(d);
    for ((xr, dyr), dxr) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
    {
        let (mean, rstd) = row_stats(xr, eps);
        // g into dx first, then the two row sums over it.
        for ((((g, &dyv), &gm), &xv), (dg, db)) in dxr
            .iter_mut()
            .zip(dyr)
            .zip(gamma)
            .zip(xr)
            .zip(dgamma.iter_mut().zip(dbeta.iter_mut()))
        {
            *g = dyv * gm;
            *dg += dyv * (xv - mean) * rstd;
            *db += dyv;
        }
        let mean_g = lane_sum(dxr) / n;
        let mean_gx = lane_dot_centered(dxr, xr, mean) * rstd / n;
        for (g, &xv) in dxr.iter_mut().zip(xr) {
            *g = rstd * (*g - mean_g - (xv - mean) * rstd * mean_gx);
        }
    }
}

// ---- softmax ----

struct SoftmaxOp;

impl CustomOp1 for SoftmaxOp {
    fn name(&self) -> &'static str {
        "bertha-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let x = data(s, l, op, "x")?;
        let (_, d) = rows_of(l, op)?;
        let mut y = x.to_vec();
        y.par_chunks_mut(task_len(d))
            .for_each(|rows| softmax_rows(rows, d));
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&dy.contiguous()?, &SoftmaxBwd)?))
    }
}

#[inline(always)]
fn softmax_rows_body(x: &mut [f32], d: usize) {
    for row in x.chunks_exact_mut(d) {
        softmax_row(row);
    }
}

/// Softmax's backward on `(y, dy)`: dx = y·(dy - Σ dy·y) per row.
struct SoftmaxBwd;

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "bertha-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let y = data(s1, l1, op, "y")?;
        let dy = data(s2, l2, op, "grad")?;
        let (_, d) = rows_of(l1, op)?;
        if dy.len() != y.len() {
            bail!(
                "{op}: the gradient's shape {:?} is not the output's",
                l2.dims()
            )
        }
        let mut dx = vec![0f32; y.len()];
        let task = task_len(d);
        dx.par_chunks_mut(task)
            .zip(y.par_chunks(task).zip(dy.par_chunks(task)))
            .for_each(|(dx, (y, dy))| softmax_bwd_rows(y, dy, dx, d));
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[inline(always)]
fn softmax_bwd_rows_body(y: &[f32], dy: &[f32], dx: &mut [f32], d: usize) {
    for ((yr, dyr), dxr) in y
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
    {
        let s = lane_dot_centered(yr, dyr, 0.0);
        for ((o, &yv), &g) in dxr.iter_mut().zip(yr).zip(dyr) {
            *o = yv * (g - s);
        }
    }
}

// ---- bias + activation ----

struct BiasActOp {
    act: Act,
}

impl CustomOp2 for BiasActOp {
    fn name(&self) -> &'static str {
        "bertha-bias-act"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let x = data(s1, l1, op, "x")?;
        let bias = data(s2, l2, op, "bias")?;
        let (_, d) = rows_of(l1, op)?;
        per_feature(bias, d, op, "bias")?;
        let mut y = vec![0f32; x.len()];
        let task = task_len(d);
        y.par_chunks_mut(task)
            .zip(x.par_chunks(task))
            .for_each(|(y, x)| bias_act_rows(x, bias, y, self.act));
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        bias: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed = x.apply_op3_no_bwd(bias, &dy.contiguous()?, &BiasActBwd { act: self.act })?;
        let rows = packed.dim(0)? - 1;
        let mut g = unpack(&packed, x, rows, 1)?.into_iter();
        Ok((g.next(), g.next()))
    }
}

#[inline(always)]
fn bias_act_rows_body(x: &[f32], bias: &[f32], y: &mut [f32], act: Act) {
    let d = bias.len();
    // The match outside the loops, so each loop vectorises.
    for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        let pairs = yr.iter_mut().zip(xr.iter().zip(bias));
        match act {
            Act::GeluErf => pairs.for_each(|(o, (v, b))| *o = gelu_erf(v + b)),
            Act::GeluTanh => pairs.for_each(|(o, (v, b))| *o = gelu_tanh(v + b)),
            Act::Relu => pairs.for_each(|(o, (v, b))| *o = (v + b).max(0.0)),
            Act::Tanh => pairs.for_each(|(o, (v, b))| *o = tanh(v + b)),
        }
    }
}

/// d act(z) / dz.
#[inline(always)]
pub(crate) fn act_grad(z: f32, act: Act) -> f32 {
    match act {
        // Φ(z) + z·φ(z), φ(z) from erf's own exp(-(z/√2)²)
        Act::GeluErf => {
            let (e, gauss) = erf_and_gauss(z * std::f32::consts::FRAC_1_SQRT_2);
            0.5 * (1.0 + e) + z * gauss * 0.398_942_3
        }
        // 0.5·(1 + t) + 0.5·z·(1 - t²)·√(2/π)·(1 + 3·0.044715·z²)
        Act::GeluTanh => {
            let t = gelu_tanh_inner(z);
            0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.797_884_6 * (1.0 + 0.134_145 * z * z)
        }
        // 0 at z = 0, as PyTorch.
        Act::Relu => {
            if z > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Act::Tanh => {
            let t = tanh(z);
            1.0 - t * t
        }
    }
}

/// Bias + activation's backward on `(x, bias, dy)`: `[rows + 1, d]`
/// holding dz = dy·act'(x + bias) (the gradient of x), then dbias = Σ dz.
struct BiasActBwd {
    act: Act,
}

impl CustomOp3 for BiasActBwd {
    fn name(&self) -> &'static str {
        "bertha-bias-act-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let x = data(s1, l1, op, "x")?;
        let bias = data(s2, l2, op, "bias")?;
        let dy = data(s3, l3, op, "grad")?;
        let (rows, d) = rows_of(l1, op)?;
        per_feature(bias, d, op, "bias")?;
        if dy.len() != x.len() {
            bail!(
                "{op}: the gradient's shape {:?} is not the input's",
                l3.dims()
            )
        }
        let mut out = vec![0f32; (rows + 1) * d];
        let (dz, dbias) = out.split_at_mut(rows * d);
        bias_act_backward(x, bias, dy, dz, dbias, self.act);
        Ok((CpuStorage::F32(out), Shape::from((rows + 1, d))))
    }
}

#[inline(always)]
fn bias_act_bwd_rows_body(
    x: &[f32],
    bias: &[f32],
    dy: &[f32],
    dz: &mut [f32],
    dbias: &mut [f32],
    act: Act,
) {
    let d = bias.len();
    for ((xr, dyr), dzr) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dz.chunks_exact_mut(d))
    {
        let (dzr, dbias) = (&mut dzr[..d], &mut dbias[..d]);
        // The match outside the loops, so each loop vectorises; indexed
        // loops, because a zipped `for_each` with this body was compiled as
        // a separate, non-inlined `fold` without the caller's AVX-512.
        macro_rules! each {
            ($act:expr) => {
                for j in 0..d {
                    let o = dyr[j] * act_grad(xr[j] + bias[j], $act);
                    dzr[j] = o;
                    dbias[j] += o;
                }
            };
        }
        match act {
            Act::GeluErf => each!(Act::GeluErf),
            Act::GeluTanh => each!(Act::GeluTanh),
            Act::Relu => each!(Act::Relu),
            Act::Tanh => each!(Act::Tanh),
        }
    }
}
