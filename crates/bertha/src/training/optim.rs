//! AdamW (decoupled weight decay, as `torch.optim.AdamW`) with global-norm
//! gradient clipping: both moments each one contiguous f32 buffer over all
//! parameters, the gradients one too (or, for a single backward pass, read
//! in place in the tensors it made), updated in parallel chunks.
//!
//! The moments live in plain vectors so a checkpoint stores them exactly
//! and resuming continues bit for bit.

use std::collections::HashMap;

use candle_core::{backprop::GradStore, CpuStorage, DType, InplaceOp1, Layout, Tensor, TensorId};
use rayon::prelude::*;

use super::params::ParamStore;
use crate::error::{Error, Result};
use crate::fast::buffers;
use crate::fast::kernels::multiversion;

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this; `None` leaves it.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    /// transformers' Trainer defaults (betas 0.9/0.999, eps 1e-8, clip 1.0),
    /// with BERT's weight decay of 0.01.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
        }
    }
}

/// Biases and LayerNorm weights get no weight decay (as BERT and
/// transformers' Trainer).
pub fn decays(name: &str) -> bool {
    !(name.ends_with(".bias")
        || name.contains("LayerNorm")
        || name.contains("layer_norm")
        || name.contains("layernorm"))
}

/// Where each parameter's values lie in the flat buffers: the parameters
/// in name order (the order the norm sums and an all-reduce walks), one
/// after another.
#[derive(Debug, Clone, PartialEq, Default)]
struct FlatLayout {
    segments: Vec<Segment>,
    len: usize,
}

/// One parameter's place in a [`FlatLayout`].
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    name: String,
    offset: usize,
    len: usize,
}

impl Segment {
    fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

impl FlatLayout {
    /// The layout of `params`' variables.
    fn of(params: &ParamStore) -> Self {
        let mut segments = Vec::with_capacity(params.len());
        let mut len = 0;
        for (name, var) in params.vars() {
            let n = var.elem_count();
            segments.push(Segment {
                name: name.to_string(),
                offset: len,
                len: n,
            });
            len += n;
        }
        Self { segments, len }
    }

    /// Values over all parameters.
    fn len(&self) -> usize {
        self.len
    }

    /// The index of parameter `name` (the segments are in name order).
    fn find(&self, name: &str) -> Option<usize> {
        self.segments
            .binary_search_by(|s| s.name.as_str().cmp(name))
            .ok()
    }
}

/// Values per norm task: the chunks are fixed, and their sums added in
/// order, so the norm has the same bits on every run (a rayon reduction's
/// tree depends on work stealing).
const NORM_CHUNK: usize = 1 << 14;

/// Gradients summed over micro-batches: one contiguous buffer over all
/// parameters ([`FlatLayout`]), and which parameters have one.
///
/// Until something needs the buffer (a second micro-batch, a set or a
/// mutable walk: the data-parallel sum, a gradient hook), one backward
/// pass's gradients are held as the tensors it made and read in place: a
/// step of one micro-batch on one process copies no gradient and zeroes no
/// buffer (two passes over every parameter: 1.5 % of a `mini` or `small`
/// bf16 step, measured).
#[derive(Debug)]
pub struct GradAccumulator {
    layout: FlatLayout,
    /// The sums in `layout` (empty until made).
    values: Vec<f32>,
    /// Per parameter, while `values` is not made: its one gradient.
    held: Vec<Option<Tensor>>,
    present: Vec<bool>,
    micro_batches: usize,
}

/// One parameter's summed gradient, read in place (a slice of it).
pub struct GradValues<'a>(Values<'a>);

enum Values<'a> {
    Slice(&'a [f32]),
    Held(buffers::Held<'a>),
}

impl std::ops::Deref for GradValues<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.0 {
            Values::Slice(s) => s,
            Values::Held(h) => h,
        }
    }
}

impl GradAccumulator {
    /// An empty sum for `params`.
    pub fn new(params: &ParamStore) -> Self {
        let layout = FlatLayout::of(params);
        Self {
            values: Vec::new(),
            held: vec![None; layout.segments.len()],
            present: vec![false; layout.segments.len()],
            layout,
            micro_batches: 0,
        }
    }

    /// Adds one backward pass's gradients.
    pub fn add(&mut self, params: &ParamStore, grads: &GradStore) -> Result<()> {
        for (name, var) in params.vars() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let i = self.index(name, g.elem_count())?;
            if self.values.is_empty() && !self.present[i] && buffers::held(g).is_some() {
                self.held[i] = Some(g.clone());
            } else {
                self.make_values();
                let dst = &mut self.values[self.layout.segments[i].range()];
                add_tensor(g, dst, self.present[i])?;
            }
            self.present[i] = true;
        }
        self.micro_batches += 1;
        Ok(())
    }

    /// Makes the buffer from the held gradients (zeros elsewhere).
    fn make_values(&mut self) {
        if self.values.len() == self.layout.len() {
            return;
        }
        let held: Vec<Option<buffers::Held>> = self
            .held
            .iter()
            .map(|t| t.as_ref().and_then(buffers::held))
            .collect();
        let parts: Vec<buffers::Part> = self
            .layout
            .segments
            .iter()
            .zip(&held)
            .map(|(seg, h)| match h {
                Some(h) => buffers::Part::Values(h),
                None => buffers::Part::Zeros(seg.len),
            })
            .collect();
        let values = buffers::concatenated(&parts);
        drop(parts);
        drop(held);
        self.values = values;
        self.held.iter_mut().for_each(|t| *t = None);
    }

    /// Every parameter's summed gradient in place, in layout order (`None`
    /// for those without one).
    fn segments(&self) -> Vec<Option<GradValues<'_>>> {
        (0..self.layout.segments.len())
            .map(|i| self.segment(i))
            .collect()
    }

    /// Parameter `i`'s summed gradient in place, if it has one.
    fn segment(&self, i: usize) -> Option<GradValues<'_>> {
        if !self.present[i] {
            return None;
        }
        match &self.held[i] {
            Some(t) => buffers::held(t).map(|h| GradValues(Values::Held(h))),
            None => Some(GradValues(Values::Slice(
                &self.values[self.layout.segments[i].range()],
            ))),
        }
    }

    /// The segment of parameter `name`, checked to hold `len` values.
    fn index(&self, name: &str, len: usize) -> Result<usize> {
        let i = self.layout.find(name).ok_or_else(|| {
            Error::Input(format!("a gradient for `{name}`, which is not a parameter"))
        })?;
        let want = self.layout.segments[i].len;
        if len != want {
            return Err(Error::Input(format!(
                "parameter `{name}`: {want} values but a gradient of {len}"
            )));
        }
        Ok(i)
    }

    pub fn is_empty(&self) -> bool {
        self.micro_batches == 0
    }

    /// Micro-batches summed so far (the update averages over them).
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// The summed gradient of parameter `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<GradValues<'_>> {
        self.segment(self.layout.find(name)?)
    }

    /// Replaces (or gives) parameter `name`'s summed gradient by `grad`,
    /// e.g. by the sum over data-parallel processes.
    pub fn set_from(&mut self, name: &str, grad: &[f32]) -> Result<()> {
        let i = self.index(name, grad.len())?;
        self.make_values();
        self.values[self.layout.segments[i].range()].copy_from_slice(grad);
        self.present[i] = true;
        Ok(())
    }

    /// Sets how many micro-batches the update averages over (in a
    /// data-parallel run: those with targets on any process, not only on
    /// this one).
    pub fn set_micro_batches(&mut self, n: usize) {
        self.micro_batches = n;
    }

    /// The summed gradients by parameter name, in name order (the same on
    /// every process: what an all-reduce walks).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut [f32])> {
        self.make_values();
        let mut rest = self.values.as_mut_slice();
        let mut out = Vec::new();
        for (seg, &present) in self.layout.segments.iter().zip(&self.present) {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(seg.len);
            rest = tail;
            if present {
                out.push((seg.name.as_str(), head));
            }
        }
        out.into_iter()
    }

    /// The global L2 norm of the sums scaled by `scale`, over the
    /// parameters with a gradient, in fixed chunks (see [`NORM_CHUNK`]).
    fn norm(&self, scale: f64) -> f64 {
        let segments = self.segments();
        let chunks: Vec<(usize, &[f32])> = segments
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.as_deref().map(|g| (i, g)))
            .flat_map(|(i, g)| g.chunks(NORM_CHUNK).map(move |c| (i, c)))
            .collect();
        let sums: Vec<f64> = chunks.par_iter().map(|(_, c)| sum_squares(c)).collect();
        // Per parameter, then over parameters: the order the sums had when
        // each parameter had its own buffer (runs resume bit for bit).
        let mut total = 0.0f64;
        let mut k = 0;
        while k < chunks.len() {
            let i = chunks[k].0;
            let mut param = 0.0f64;
            while k < chunks.len() && chunks[k].0 == i {
                param += sums[k];
                k += 1;
            }
            total += param;
        }
        total * scale * scale
    }
}

/// `dst = t` (or `dst += t` with `accumulate`), reading a CPU tensor's
/// values in place.
fn add_tensor(t: &Tensor, dst: &mut [f32], accumulate: bool) -> Result<()> {
    buffers::with_values(t, |src| match accumulate {
        true => buffers::add(dst, src),
        false => buffers::copy_into(dst, src),
    })?;
    Ok(())
}

/// The optimiser: its config, the number of steps taken and the moments,
/// each one contiguous buffer in the gradients' [`FlatLayout`].
#[derive(Debug, Clone)]
pub struct AdamW {
    pub config: AdamWConfig,
    pub step: u64,
    layout: FlatLayout,
    m: Vec<f32>,
    v: Vec<f32>,
    /// Per segment: whether its moments exist (a parameter that never had
    /// a gradient has none, and a checkpoint leaves it out).
    started: Vec<bool>,
    /// Moments read from a checkpoint, by name, until the first step
    /// places them (and any of a name that is not a parameter).
    pending: HashMap<String, (Vec<f32>, Vec<f32>)>,
}

/// One step's AdamW coefficients, the same for every value.
#[derive(Debug, Clone, Copy)]
struct Coeffs {
    /// Gradient scale: the mean over micro-batches, then the clip.
    gscale: f32,
    b1: f32,
    b2: f32,
    eps: f32,
    /// `1 - lr·wd` for decayed parameters, else 1.
    decay: f32,
    step_size: f32,
    bc2_sqrt: f32,
}

/// torch's AdamW on one parameter's values, in parallel chunks:
/// `p -= lr·wd·p; p -= (lr / bc1) · m / (sqrt(v)/sqrt(bc2) + eps)`. With a
/// `writer`, chunks are whole blocks of rows (from multiples of 32), each
/// handed to it as soon as it is written.
fn update(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    k: Coeffs,
    writer: Option<&dyn RowWriter>,
) {
    // With a writer, chunks of whole rows (a multiple of 32), each a block
    // it can pack.
    let (rows, chunk) = match writer {
        Some(w) => {
            let row = w.row_len().max(1);
            let rows = (NORM_CHUNK / row).max(1).next_multiple_of(32);
            (rows, rows * row)
        }
        None => (0, NORM_CHUNK),
    };
    p.par_chunks_mut(chunk)
        .zip(m.par_chunks_mut(chunk))
        .zip(v.par_chunks_mut(chunk))
        .zip(g.par_chunks(chunk))
        .enumerate()
        .for_each(|(i, (((p, m), v), g))| {
            update_chunk(p, m, v, g, k);
            if let Some(writer) = writer {
                writer.rows_written(i * rows, p);
            }
        });
}

/// What else an optimizer step writes the weights into, while they are in
/// cache: the fast path's bf16 panels of its weights
/// (`fast::train::WeightPacks`), which it would otherwise pack from
/// memory in the next step.
pub trait UpdateSink: Sync {
    /// A writer for `t`'s new values (the write counted `version`, see
    /// [`weight_written`]), or `None` when the sink keeps nothing of `t`.
    fn writer<'s>(&'s self, t: &Tensor, version: u64) -> Option<Box<dyn RowWriter + 's>>;
}

/// Receives one tensor's new values, block of rows by block, from the
/// optimizer's threads.
pub trait RowWriter: Sync {
    /// Values per row (the tensor's last dimension).
    fn row_len(&self) -> usize;

    /// Rows from `r0` (a multiple of 32) were written: `values`, whole
    /// rows. Blocks arrive in any order, from any thread, never twice.
    fn rows_written(&self, r0: usize, values: &[f32]);

    /// Every row was written (and handed over).
    fn finish(self: Box<Self>);
}

/// How many times each training weight was written in this process: by
/// an optimizer step, or replaced whole (a checkpoint's weights loaded,
/// process 0's broadcast). A copy of a weight stamped with an older count
/// (see [`UpdateSink`]) is stale. Counted per tensor, so one model's
/// writes leave another's copies current (tests train several at once).
static WRITES: std::sync::LazyLock<std::sync::Mutex<HashMap<TensorId, u64>>> =
    std::sync::LazyLock::new(Default::default);

/// Records that `t`'s values are about to change; returns its new count
/// (from 1), which copies made from the new values carry.
pub fn weight_written(t: &Tensor) -> u64 {
    let mut writes = WRITES.lock().unwrap_or_else(|e| e.into_inner());
    let count = writes.entry(t.id()).or_insert(0);
    *count += 1;
    *count
}

/// `t`'s write count now (0: never written; see [`weight_written`]).
pub fn weight_version(t: &Tensor) -> u64 {
    let writes = WRITES.lock().unwrap_or_else(|e| e.into_inner());
    writes.get(&t.id()).copied().unwrap_or(0)
}

multiversion! {
    fn sum_squares = sum_squares_body(x: &[f32]) -> f64;
}

/// Lanes of [`sum_squares`]: 16 f64 partial sums (two AVX-512 registers),
/// enough independent additions to hide the adds' latency.
const SQUARE_LANES: usize = 16;

/// `Σ x²` in f64: lane `j` sums elements `j, j + 16, ..` in order, the
/// lanes then combine pairwise in a fixed tree, the tail last. Fixed by
/// the length alone (no thread count), so runs resume bit for bit; a
/// single running f64 sum (one dependent add per element, not
/// vectorised) cost 1.2 % of a `small` bf16 pre-training step.
#[inline(always)]
fn sum_squares_body(x: &[f32]) -> f64 {
    let mut lanes = [0f64; SQUARE_LANES];
    let mut blocks = x.chunks_exact(SQUARE_LANES);
    for block in &mut blocks {
        for (acc, v) in lanes.iter_mut().zip(block) {
            *acc += f64::from(*v) * f64::from(*v);
        }
    }
    let mut width = SQUARE_LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            lanes[j] += lanes[j + width];
        }
    }
    let tail: f64 = blocks
        .remainder()
        .iter()
        .map(|v| f64::from(*v) * f64::from(*v))
        .sum();
    lanes[0] + tail
}

multiversion! {
    fn update_chunk = update_chunk_body(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: Coeffs);
}

/// [`update`] on one chunk, compiled per instruction set (element-wise
/// IEEE operations: every width gives the same bits).
#[inline(always)]
fn update_chunk_body(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: Coeffs) {
    for (((p, m), v), g) in p.iter_mut().zip(m).zip(v).zip(g) {
        let g = g * k.gscale;
        *m = k.b1 * *m + (1.0 - k.b1) * g;
        *v = k.b2 * *v + (1.0 - k.b2) * g * g;
        *p *= k.decay;
        *p -= k.step_size * *m / (v.sqrt() / k.bc2_sqrt + k.eps);
    }
}

/// [`update`] on a variable's own storage (no copy of the weights).
struct InPlace<'a> {
    m: std::sync::Mutex<&'a mut [f32]>,
    v: std::sync::Mutex<&'a mut [f32]>,
    g: &'a [f32],
    k: Coeffs,
    writer: Option<&'a dyn RowWriter>,
}

impl InplaceOp1 for InPlace<'_> {
    fn name(&self) -> &'static str {
        "adamw"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (CpuStorage::F32(data), Some((a, b))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("adamw: a contiguous f32 parameter expected");
        };
        let lock_err = || candle_core::Error::Msg("adamw: moments lock poisoned".into());
        let mut m = self.m.lock().map_err(|_| lock_err())?;
        let mut v = self.v.lock().map_err(|_| lock_err())?;
        update(&mut data[a..b], &mut m, &mut v, self.g, self.k, self.writer);
        Ok(())
    }
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            step: 0,
            layout: FlatLayout::default(),
            m: Vec::new(),
            v: Vec::new(),
            started: Vec::new(),
            pending: HashMap::new(),
        }
    }

    /// Takes the gradients' layout at the first step (placing moments
    /// read from a checkpoint); refuses a different one later.
    fn adopt(&mut self, layout: &FlatLayout) -> Result<()> {
        if self.layout == *layout {
            return Ok(());
        }
        if !self.layout.segments.is_empty() {
            return Err(Error::Input(
                "the parameters changed between optimiser steps".into(),
            ));
        }
        self.layout = layout.clone();
        self.m = vec![0.0; layout.len()];
        self.v = vec![0.0; layout.len()];
        self.started = vec![false; layout.segments.len()];
        let pending = std::mem::take(&mut self.pending);
        for (name, (m, v)) in pending {
            match layout.find(&name) {
                Some(i) => {
                    let seg = &layout.segments[i];
                    if m.len() != seg.len || v.len() != seg.len {
                        return Err(Error::Input(format!(
                            "optimizer state: `{name}` has {} / {} moments for {} values",
                            m.len(),
                            v.len(),
                            seg.len
                        )));
                    }
                    self.m[seg.range()].copy_from_slice(&m);
                    self.v[seg.range()].copy_from_slice(&v);
                    self.started[i] = true;
                }
                None => {
                    self.pending.insert(name, (m, v));
                }
            }
        }
        Ok(())
    }

    /// Applies one update at rate `lr` from the accumulated gradients
    /// (averaged over micro-batches); returns the global gradient norm
    /// before clipping. The moments are each one flat buffer, the
    /// gradients read where the accumulator holds them; the weights are
    /// updated in their variables' storage.
    pub fn step(&mut self, params: &ParamStore, acc: GradAccumulator, lr: f64) -> Result<f64> {
        self.step_with(params, acc, lr, None)
    }

    /// [`AdamW::step`], handing each updated weight to `sink` as it is
    /// written.
    pub fn step_with(
        &mut self,
        params: &ParamStore,
        acc: GradAccumulator,
        lr: f64,
        sink: Option<&dyn UpdateSink>,
    ) -> Result<f64> {
        self.adopt(&acc.layout)?;
        let scale_acc = 1.0 / acc.micro_batches.max(1) as f64;
        let norm = acc.norm(scale_acc).sqrt();
        if !norm.is_finite() {
            return Err(Error::Diverged {
                what: "gradient norm",
                value: norm,
                step: self.step + 1,
                last_good: None,
            });
        }
        let clip = match self.config.max_grad_norm {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        let coeffs = Coeffs {
            gscale: (scale_acc * clip) as f32,
            b1: c.beta1 as f32,
            b2: c.beta2 as f32,
            eps: c.eps as f32,
            decay: 1.0,
            step_size: (lr / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
        };
        for (i, ((name, var), seg)) in params.vars().zip(&self.layout.segments).enumerate() {
            if !acc.present[i] {
                continue;
            }
            if name != seg.name {
                return Err(Error::Input(format!(
                    "the optimiser's parameter {i} is `{}`, the model's `{name}`",
                    seg.name
                )));
            }
            self.started[i] = true;
            let k = Coeffs {
                decay: if decays(name) {
                    (1.0 - lr * c.weight_decay) as f32
                } else {
                    1.0
                },
                ..coeffs
            };
            let Some(g) = acc.segment(i) else {
                return Err(Error::Input(format!(
                    "internal: the gradient of `{name}` is no longer readable"
                )));
            };
            let (m, v, g) = (&mut self.m[seg.range()], &mut self.v[seg.range()], &*g);
            let tensor = var.as_tensor();
            let version = weight_written(tensor);
            let writer = sink.and_then(|s| s.writer(tensor, version));
            if tensor.device().is_cpu() && tensor.dtype() == DType::F32 {
                tensor.inplace_op1(&InPlace {
                    m: std::sync::Mutex::new(m),
                    v: std::sync::Mutex::new(v),
                    g,
                    k,
                    writer: writer.as_deref(),
                })?;
            } else {
                let mut p = tensor.flatten_all()?.to_vec1::<f32>()?;
                update(&mut p, m, v, g, k, writer.as_deref());
                var.set(&Tensor::from_vec(p, tensor.shape(), tensor.device())?)?;
            }
            if let Some(writer) = writer {
                writer.finish();
            }
        }
        Ok(norm)
    }

    /// The moments as tensors (`{name}.exp_avg`, `{name}.exp_avg_sq`) for a
    /// checkpoint.
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let dev = &candle_core::Device::Cpu;
        let mut out = HashMap::new();
        let mut put = |name: &str, m: &[f32], v: &[f32]| -> Result<()> {
            out.insert(
                format!("{name}.exp_avg"),
                Tensor::from_slice(m, m.len(), dev)?,
            );
            out.insert(
                format!("{name}.exp_avg_sq"),
                Tensor::from_slice(v, v.len(), dev)?,
            );
            Ok(())
        };
        for (seg, _) in self
            .layout
            .segments
            .iter()
            .zip(&self.started)
            .filter(|(_, s)| **s)
        {
            put(&seg.name, &self.m[seg.range()], &self.v[seg.range()])?;
        }
        for (name, (m, v)) in &self.pending {
            put(name, m, v)?;
        }
        Ok(out)
    }

    /// Restores the moments written by [`AdamW::state_tensors`] (placed in
    /// the flat buffers at the next step).
    pub fn load_state(&mut self, step: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.step = step;
        self.layout = FlatLayout::default();
        self.m.clear();
        self.v.clear();
        self.started.clear();
        self.pending.clear();
        for (key, m) in tensors {
            let Some(name) = key.strip_suffix(".exp_avg") else {
                continue;
            };
            let v = tensors.get(&format!("{name}.exp_avg_sq")).ok_or_else(|| {
                Error::Input(format!("optimizer state: `{name}.exp_avg_sq` is missing"))
            })?;
            self.pending.insert(
                name.to_string(),
                (m.flatten_all()?.to_vec1()?, v.flatten_all()?.to_vec1()?),
            );
        }
        Ok(())
    }
}
