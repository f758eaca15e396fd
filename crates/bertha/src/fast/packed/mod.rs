//! The inference fast path: the same BERT, run on packed sequences.
//!
//! Tokens of all texts in a batch are laid end to end ([tokens, D], no
//! padding); matrix multiplies run on all of them at once with the bias
//! fused in, Q/K/V come from one multiply, attention runs per (text,
//! head) over that text's tokens only, and residual + LayerNorm and
//! bias + GELU are single parallel passes. Weights are copied out of the
//! candle model once, transposed for the multiplies. Used for inference
//! on the CPU; training and optional outputs (hidden states, attentions)
//! go through the candle modules. The families with BERT's layers
//! (`fast::bert_layout`) differ in their [`embeddings`] only, and ALBERT
//! in running its shared layers again and again (`PackedBert::order`).
//! ModernBERT runs on the same layers with what its own adds
//! (`fast::modernbert`: rotary positions, windows, GeGLU).
//! [`reduced`] switches the linears to bf16 or int8 and to and from their
//! stored form.

mod embeddings;
mod reduced;

use candle_core::Tensor;

use super::bert_layout::bert_layout;
use super::kernels::{self, Act};
use super::matmul::{PackedBf16, PackedF32, PackedI8, QuantScratch};
use super::modernbert::{geglu, ModernParts};
use super::site::Site;
use crate::config::{Family, NormPosition};
use crate::error::{Error, Result};
use crate::model::{BertModel, Dense, LayerNorm};

pub(crate) use embeddings::PackedEmbeddings;

pub(super) struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

pub(super) struct Linear {
    weights: Weights,
    bias: Vec<f32>,
    out_dim: usize,
}

/// What calibration watches: `(layer, site, input rows)` of each
/// quantizable multiply.
type Observer<'a> = dyn FnMut(usize, Site, &[f32]) + 'a;

enum Weights {
    F32(PackedF32),
    Bf16(PackedBf16),
    I8(PackedI8),
}

pub(super) struct Layer {
    pub(super) qkv: Linear,
    pub(super) attn_out: Linear,
    /// `None`: the attention reads the layer input as it is (ModernBERT's
    /// layer 0, whose input the embeddings' norm has just normalised).
    pub(super) attn_norm: Option<Norm>,
    /// With GeGLU (ModernBERT) `[D, 2·I]`: the input half, then the gate.
    pub(super) ffn_in: Linear,
    pub(super) ffn_out: Linear,
    pub(super) ffn_norm: Norm,
}

pub struct PackedBert {
    pub(super) hidden: usize,
    pub(super) num_heads: usize,
    pub(super) head_dim: usize,
    pub(super) act: Act,
    pub(super) norm_position: NormPosition,
    pub(super) embeddings: PackedEmbeddings,
    /// The stored layers; ALBERT's are shared across steps.
    pub(super) layers: Vec<Layer>,
    /// The stored layer each step runs, in order (`0..L` but for ALBERT).
    pub(super) order: Vec<usize>,
    pub(super) final_norm: Option<Norm>,
    pub(super) pooler: Option<Linear>,
    /// ModernBERT's rotary positions, windows and GeGLU.
    pub(super) modern: Option<ModernParts>,
}

/// Packed hidden states: sequence `s` owns rows `offsets[s]..offsets[s+1]`.
pub struct PackedStates {
    pub data: Vec<f32>,
    pub offsets: Vec<usize>,
    pub hidden: usize,
}

impl PackedStates {
    pub fn sequence(&self, s: usize) -> &[f32] {
        &self.data[self.offsets[s] * self.hidden..self.offsets[s + 1] * self.hidden]
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub(super) fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

pub(super) fn linear_of(parts: &[&Dense]) -> Result<Linear> {
    // Stack the [out_i, in] weights of several projections into one
    // [Σout, in] (for fused QKV), then transpose to [in, Σout].
    let w = Tensor::cat(
        &parts.iter().map(|p| p.weight().clone()).collect::<Vec<_>>(),
        0,
    )?;
    let (out_dim, in_dim) = w.dims2()?;
    let w_t = flat(&w.t()?.contiguous()?)?;
    let mut bias = Vec::with_capacity(out_dim);
    for p in parts {
        match p.bias() {
            Some(b) => bias.extend(flat(b)?),
            None => bias.extend(std::iter::repeat_n(0.0, p.weight().dim(0)?)),
        }
    }
    Ok(Linear {
        weights: Weights::F32(PackedF32::new(&w_t, in_dim, out_dim)),
        bias,
        out_dim,
    })
}

pub(super) fn norm_of(ln: &LayerNorm) -> Result<Norm> {
    Ok(Norm {
        gamma: flat(&ln.weight)?,
        beta: flat(&ln.bias)?,
        eps: ln.eps as f32,
    })
}

impl PackedBert {
    /// Copies the weights of `model`; `None` when the model cannot run on
    /// this path (not on the CPU).
    pub fn from_model(model: &BertModel) -> Result<Option<Self>> {
        if !model.device().is_cpu() {
            return Ok(None);
        }
        let cfg = model.config();
        if let Family::ModernBert(o) = &cfg.family {
            return super::modernbert::pack(model, o);
        }
        // BERT's layers (BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT); the
        // relative attention of DeBERTa-v2 runs on the candle modules.
        let Some(layout) = bert_layout(model) else {
            return Ok(None);
        };
        let emb = &model.embeddings;
        let layers = model
            .encoder
            .layers
            .iter()
            .map(|l| {
                let sa = &l.attention.self_attention;
                Ok(Layer {
                    qkv: linear_of(&[&sa.query, &sa.key, &sa.value])?,
                    attn_out: linear_of(&[&l.attention.dense])?,
                    attn_norm: Some(norm_of(&l.attention.layer_norm)?),
                    ffn_in: linear_of(&[&l.intermediate.dense])?,
                    ffn_out: linear_of(&[&l.output.dense])?,
                    ffn_norm: norm_of(&l.output.layer_norm)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embeddings = PackedEmbeddings {
            word: flat(emb.word_embeddings.embeddings())?,
            vocab: cfg.vocab_size,
            width: cfg.embedding_size(),
            position: Some(flat(layout.position.embeddings())?),
            max_positions: cfg.max_position_embeddings,
            positions_from: layout.positions_from,
            token_type: match &emb.token_type_embeddings {
                Some(t) => Some((flat(t.embeddings())?, cfg.type_vocab_size)),
                None => None,
            },
            ignore_types: emb.ignore_token_types,
            norm: emb.layer_norm.as_ref().map(norm_of).transpose()?,
            projection: layout.projection.map(|p| linear_of(&[p])).transpose()?,
        };
        Ok(Some(Self {
            hidden: cfg.hidden_size,
            num_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim(),
            act: Act::from(cfg.hidden_act),
            norm_position: cfg.norm_position,
            embeddings,
            layers,
            order: layout.order,
            final_norm: model
                .encoder
                .final_layer_norm
                .as_ref()
                .map(norm_of)
                .transpose()?,
            pooler: match &model.pooler {
                Some(p) => Some(linear_of(&[&p.dense])?),
                None => None,
            },
            modern: None,
        }))
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    /// Runs the encoder on `sequences` of (input ids, token type ids).
    pub fn forward(&self, sequences: &[(&[u32], &[u32])]) -> Result<PackedStates> {
        crate::fast::on_pool(|| self.forward_observed(sequences, None, None))
    }

    /// [`forward`](Self::forward) for a reader of one row per sequence
    /// (`[CLS]` pooling, the pooler): the states of row `rows[s]` of each
    /// sequence `s` only, one row per sequence. The last layer runs its
    /// Q/K/V on every row (the row attends over all of them) and the rest
    /// (attention, output projection, FFN, LayerNorms) on those rows alone.
    pub fn forward_at(
        &self,
        sequences: &[(&[u32], &[u32])],
        rows: &[usize],
    ) -> Result<PackedStates> {
        if rows.len() != sequences.len() {
            return Err(Error::Input(format!(
                "{} rows asked for {} sequences",
                rows.len(),
                sequences.len()
            )));
        }
        for (s, (&r, (ids, _))) in rows.iter().zip(sequences).enumerate() {
            if r >= ids.len() {
                return Err(Error::Input(format!(
                    "row {r} asked of text {s}, which has {} tokens",
                    ids.len()
                )));
            }
        }
        if self.order.is_empty() || self.modern.is_some() {
            // The embeddings are the output, or (ModernBERT) the last
            // layer's rotary positions and window run on the whole pass:
            // keep the rows asked for.
            let states = self.forward(sequences)?;
            let d = self.hidden;
            let mut data = Vec::with_capacity(rows.len() * d);
            for (s, &r) in rows.iter().enumerate() {
                data.extend_from_slice(&states.sequence(s)[r * d..(r + 1) * d]);
            }
            return Ok(PackedStates {
                data,
                offsets: (0..=rows.len()).collect(),
                hidden: d,
            });
        }
        crate::fast::on_pool(|| self.forward_observed(sequences, Some(rows), None))
    }

    /// [`PackedBert::forward`] (or [`forward_at`](Self::forward_at)
    /// `rows`), showing `observe(layer, site, rows)` the input of the
    /// quantizable multiplies when given.
    fn forward_observed(
        &self,
        sequences: &[(&[u32], &[u32])],
        at: Option<&[usize]>,
        mut observer: Option<&mut Observer>,
    ) -> Result<PackedStates> {
        let watched = observer.is_some();
        let mut observe = |l: usize, site: Site, x: &[f32]| {
            if let Some(f) = observer.as_mut() {
                f(l, site, x);
            }
        };
        let d = self.hidden;
        let mut offsets = Vec::with_capacity(sequences.len() + 1);
        offsets.push(0);
        let most = self.embeddings.max_tokens();
        for (s, (ids, _)) in sequences.iter().enumerate() {
            if ids.len() > most {
                return Err(Error::Input(format!(
                    "text {s} has {} tokens, more than the model takes ({most}, from \
                     max_position_embeddings {}); truncate it",
                    ids.len(),
                    self.embeddings.max_positions
                )));
            }
            offsets.push(offsets[s] + ids.len());
        }
        let n = *offsets.last().expect("offsets start with 0");
        let mut x = vec![0f32; n * d];
        self.embeddings.embed(sequences, &mut x)?;
        let ffn = self.layers.first().map_or(0, |l| l.ffn_in.out_dim);
        let mut qkv = vec![0f32; n * 3 * d];
        let mut ctx = vec![0f32; n * d];
        let mut tmp = vec![0f32; n * d];
        let mut inter = vec![0f32; n * ffn];
        // GeGLU's product of FFN-in's halves (BERT's FFN has none).
        let mut glu = vec![
            0f32;
            if self.modern.is_some() {
                n * ffn / 2
            } else {
                0
            }
        ];
        let mut inter_pairs = Vec::new();
        let mut q = QuantScratch::default();
        for (step, &l) in self.order.iter().enumerate() {
            let layer = &self.layers[l];
            if let (Some(rows), true) = (at, step + 1 == self.order.len()) {
                let buffers = (&mut qkv[..], &mut tmp[..]);
                let mut y = self.last_layer_at(&mut q, layer, &x, (&offsets, rows), buffers);
                if let Some(f) = &self.final_norm {
                    kernels::add_layer_norm(&mut y, None, &f.gamma, &f.beta, f.eps);
                }
                return Ok(PackedStates {
                    data: y,
                    offsets: (0..=rows.len()).collect(),
                    hidden: d,
                });
            }
            match self.norm_position {
                NormPosition::Post => {
                    observe(l, Site::Qkv, &x);
                    self.attend(&mut q, l, &x, &mut qkv, &mut ctx, &offsets);
                    observe(l, Site::AttnOut, &ctx);
                    run(&mut q, &layer.attn_out, &ctx, &mut tmp, n);
                    add_attn_norm(layer, &mut tmp, &x);
                    std::mem::swap(&mut x, &mut tmp);
                    observe(l, Site::FfnIn, &x);
                    let pairs = &mut inter_pairs;
                    if watched || !self.ffn_bf16_pairs(&mut q, layer, &x, pairs, &mut tmp, n) {
                        let h = self.ffn_in(&mut q, layer, &x, (&mut inter, &mut glu), n);
                        observe(l, Site::FfnOut, h);
                        run(&mut q, &layer.ffn_out, h, &mut tmp, n);
                    }
                    let fnn = &layer.ffn_norm;
                    kernels::add_layer_norm(&mut tmp, Some(&x), &fnn.gamma, &fnn.beta, fnn.eps);
                    std::mem::swap(&mut x, &mut tmp);
                }
                NormPosition::Pre => {
                    self.attn_input(layer, &x, &mut tmp);
                    observe(l, Site::Qkv, &tmp);
                    self.attend(&mut q, l, &tmp, &mut qkv, &mut ctx, &offsets);
                    observe(l, Site::AttnOut, &ctx);
                    run(&mut q, &layer.attn_out, &ctx, &mut tmp, n);
                    kernels::add_in_place(&mut x, &tmp);
                    let fnn = &layer.ffn_norm;
                    kernels::layer_norm_into(&x, &mut tmp, &fnn.gamma, &fnn.beta, fnn.eps);
                    observe(l, Site::FfnIn, &tmp);
                    // The FFN reads tmp and writes ctx (free since the
                    // attention output), then the two swap.
                    let pairs = &mut inter_pairs;
                    if watched || !self.ffn_bf16_pairs(&mut q, layer, &tmp, pairs, &mut ctx, n) {
                        let h = self.ffn_in(&mut q, layer, &tmp, (&mut inter, &mut glu), n);
                        observe(l, Site::FfnOut, h);
                        run(&mut q, &layer.ffn_out, h, &mut ctx, n);
                    }
                    std::mem::swap(&mut tmp, &mut ctx);
                    kernels::add_in_place(&mut x, &tmp);
                }
            }
        }
        if let Some(f) = &self.final_norm {
            kernels::add_layer_norm(&mut x, None, &f.gamma, &f.beta, f.eps);
        }
        Ok(PackedStates {
            data: x,
            offsets,
            hidden: d,
        })
    }

    /// With bf16 weights in both FFN linears: FFN-in's activation stored
    /// straight as bf16 pairs (bit-equal to rounding its fp32 output, which
    /// FFN-out would do first), FFN-out on them, into `y`. False (nothing
    /// done) otherwise. Calibration, which watches FFN-out's fp32 input,
    /// does not call it.
    fn ffn_bf16_pairs(
        &self,
        q: &mut QuantScratch,
        layer: &Layer,
        x: &[f32],
        pairs: &mut Vec<u32>,
        y: &mut [f32],
        n: usize,
    ) -> bool {
        let (Weights::Bf16(w_in), Weights::Bf16(w_out), None) =
            (&layer.ffn_in.weights, &layer.ffn_out.weights, &self.modern)
        else {
            // (GeGLU's product of two columns does not fit the tile store.)
            return false;
        };
        let (b_in, b_out) = (&layer.ffn_in.bias, &layer.ffn_out.bias);
        w_in.matmul_to_pairs(x, b_in, pairs, n, q.bf16_pairs(), Some(self.act));
        let k2 = layer.ffn_in.out_dim.div_ceil(2);
        w_out.matmul_pairs(&pairs[..n * k2], b_out, y, n, None);
        true
    }

    /// The last layer at one row per sequence (`rows[s]` of sequence
    /// `s`), from the layer input `x` (every row): Q/K/V on every row, the
    /// rest on the selected rows. Returns their states `[sequences, D]`
    /// before any final LayerNorm. `qkv` and `normed` are the pass's
    /// `[T, 3·D]` and `[T, D]` buffers.
    fn last_layer_at(
        &self,
        q: &mut QuantScratch,
        layer: &Layer,
        x: &[f32],
        (offsets, rows): (&[usize], &[usize]),
        (qkv, normed): (&mut [f32], &mut [f32]),
    ) -> Vec<f32> {
        let (d, m) = (self.hidden, rows.len());
        let n = *offsets.last().expect("offsets start with 0");
        let pre = self.norm_position == NormPosition::Pre;
        let input = if pre {
            self.attn_input(layer, x, normed);
            &*normed
        } else {
            x
        };
        run(q, &layer.qkv, input, qkv, n);
        let mut ctx = vec![0f32; m * d];
        kernels::attention_at_rows(qkv, &mut ctx, offsets, rows, self.num_heads, self.head_dim);
        // The residual: the layer input at the selected rows.
        let mut h = Vec::with_capacity(m * d);
        for (s, &r) in rows.iter().enumerate() {
            let row = offsets[s] + r;
            h.extend_from_slice(&x[row * d..(row + 1) * d]);
        }
        let mut a = vec![0f32; m * d];
        run(q, &layer.attn_out, &ctx, &mut a, m);
        let ffn = layer.ffn_in.out_dim;
        let (mut inter, mut pairs, mut o) = (vec![0f32; m * ffn], Vec::new(), vec![0f32; m * d]);
        let fnn = &layer.ffn_norm;
        if pre {
            kernels::add_in_place(&mut h, &a);
            kernels::layer_norm_into(&h, &mut a, &fnn.gamma, &fnn.beta, fnn.eps);
            self.ffn(q, layer, &a, (&mut inter, &mut pairs), &mut o, m);
            kernels::add_in_place(&mut h, &o);
            h
        } else {
            add_attn_norm(layer, &mut a, &h);
            self.ffn(q, layer, &a, (&mut inter, &mut pairs), &mut o, m);
            kernels::add_layer_norm(&mut o, Some(&a), &fnn.gamma, &fnn.beta, fnn.eps);
            o
        }
    }

    /// The FFN of `layer` on `n` rows of `x` into `y`: through bf16 pairs
    /// where both its linears are bf16, else through `inter`.
    fn ffn(
        &self,
        q: &mut QuantScratch,
        layer: &Layer,
        x: &[f32],
        (inter, pairs): (&mut [f32], &mut Vec<u32>),
        y: &mut [f32],
        n: usize,
    ) {
        if !self.ffn_bf16_pairs(q, layer, x, pairs, y, n) {
            let mut glu = Vec::new();
            let h = self.ffn_in(q, layer, x, (inter, &mut glu), n);
            run(q, &layer.ffn_out, h, y, n);
        }
    }

    /// FFN-in of `layer` on `n` rows of `x` and its activation: GELU
    /// fused into the multiply's tiles into `inter`, or with GeGLU the
    /// product of the two halves of `inter` into `glu` (resized to fit).
    /// Returns FFN-out's input.
    fn ffn_in<'a>(
        &self,
        q: &mut QuantScratch,
        layer: &Layer,
        x: &[f32],
        (inter, glu): (&'a mut [f32], &'a mut Vec<f32>),
        n: usize,
    ) -> &'a [f32] {
        let out = layer.ffn_in.out_dim;
        if self.modern.is_none() {
            run_act(q, &layer.ffn_in, x, inter, n, Some(self.act));
            return &inter[..n * out];
        }
        run(q, &layer.ffn_in, x, &mut inter[..n * out], n);
        glu.resize(n * out / 2, 0.0);
        geglu(&inter[..n * out], glu, out / 2, self.act);
        &glu[..]
    }

    /// The attention's input: `x` through the layer's `attn_norm`, or `x`
    /// itself where the layer has none.
    fn attn_input(&self, layer: &Layer, x: &[f32], out: &mut [f32]) {
        match &layer.attn_norm {
            Some(an) => kernels::layer_norm_into(x, out, &an.gamma, &an.beta, an.eps),
            None => out.copy_from_slice(x),
        }
    }

    /// One layer's attention before its output projection: Q/K/V of
    /// `input` in one multiply, then attention per (text, head) into `ctx`.
    fn attend(
        &self,
        q: &mut QuantScratch,
        l: usize,
        input: &[f32],
        qkv: &mut [f32],
        ctx: &mut [f32],
        offsets: &[usize],
    ) {
        let layer = &self.layers[l];
        let n = *offsets.last().expect("offsets start with 0");
        run(q, &layer.qkv, input, qkv, n);
        // ModernBERT: rotary positions on the Q and K just made, and the
        // layer's window.
        let window = match &self.modern {
            Some(m) => m.rotate(l, qkv, offsets, self.num_heads),
            None => None,
        };
        // bf16 and int8 weights: the attention products on bf16 tiles
        // (no loss of agreement with fp32 measured at either precision).
        let bf16 = !matches!(layer.qkv.weights, Weights::F32(_));
        let heads = (self.num_heads, self.head_dim);
        kernels::packed_attention(qkv, ctx, offsets, heads, bf16, window);
    }

    /// The BERT pooler (dense + tanh) on each sequence's first token.
    pub fn pool(&self, states: &PackedStates) -> Result<Option<Vec<Vec<f32>>>> {
        let Some(p) = &self.pooler else {
            return Ok(None);
        };
        let d = self.hidden;
        let mut cls = Vec::with_capacity(states.len() * d);
        for s in 0..states.len() {
            cls.extend_from_slice(&states.sequence(s)[..d]);
        }
        let mut out = vec![0f32; states.len() * p.out_dim];
        run(
            &mut QuantScratch::default(),
            p,
            &cls,
            &mut out,
            states.len(),
        );
        Ok(Some(
            out.chunks(p.out_dim)
                .map(|r| r.iter().map(|v| v.tanh()).collect())
                .collect(),
        ))
    }
}

/// A post-norm layer's `x = attn_norm(x + residual)` (without a norm,
/// the sum alone).
fn add_attn_norm(layer: &Layer, x: &mut [f32], residual: &[f32]) {
    match &layer.attn_norm {
        Some(an) => kernels::add_layer_norm(x, Some(residual), &an.gamma, &an.beta, an.eps),
        None => kernels::add_in_place(x, residual),
    }
}

fn run(q: &mut QuantScratch, l: &Linear, x: &[f32], y: &mut [f32], rows: usize) {
    run_act(q, l, x, y, rows, None);
}

/// `run`, then `act` on the output (fused into the multiply's tiles).
fn run_act(
    q: &mut QuantScratch,
    l: &Linear,
    x: &[f32],
    y: &mut [f32],
    rows: usize,
    act: Option<Act>,
) {
    match &l.weights {
        Weights::F32(w) => w.matmul(x, &l.bias, y, rows, act),
        Weights::Bf16(w) => w.matmul(x, &l.bias, y, rows, q.bf16_pairs(), act),
        Weights::I8(w) => w.matmul(x, &l.bias, y, rows, q, act),
    }
}
