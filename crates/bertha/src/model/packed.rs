//! The inference fast path: the same BERT, run on packed sequences.
//!
//! Tokens of all texts in a batch are laid end to end ([tokens, D], no
//! padding); matrix multiplies run on all of them at once with the bias
//! fused in, Q/K/V come from one multiply, attention runs per (text,
//! head) over that text's tokens only, and residual + LayerNorm and
//! bias + GELU are single parallel passes. Weights are copied out of the
//! candle model once, transposed for the multiplies. Used for inference
//! on the CPU; training and optional outputs (hidden states, attentions)
//! go through the candle modules.

use candle_core::Tensor;

use super::bert::BertModel;
use super::nn::{Dense, LayerNorm};
use crate::config::{Activation, NormPosition};
use crate::error::{Error, Result};
use crate::kernels::{self, Act};

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

struct Linear {
    /// [in, out], row-major.
    w_t: Vec<f32>,
    bias: Vec<f32>,
    in_dim: usize,
    out_dim: usize,
}

struct Layer {
    qkv: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    ffn_in: Linear,
    ffn_out: Linear,
    ffn_norm: Norm,
}

pub struct PackedBert {
    hidden: usize,
    num_heads: usize,
    head_dim: usize,
    max_positions: usize,
    act: Act,
    norm_position: NormPosition,
    word: Vec<f32>,
    vocab: usize,
    position: Vec<f32>,
    token_type: Option<(Vec<f32>, usize)>,
    embed_norm: Option<Norm>,
    layers: Vec<Layer>,
    final_norm: Option<Norm>,
    pooler: Option<Linear>,
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

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn linear_of(parts: &[&Dense]) -> Result<Linear> {
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
        w_t,
        bias,
        in_dim,
        out_dim,
    })
}

fn norm_of(ln: &LayerNorm) -> Result<Norm> {
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
        // Only BERT itself: the family's positions, shared layers and
        // relative attention run on the candle modules.
        if !cfg.family.is_bert() || !model.encoder.is_plain() {
            return Ok(None);
        }
        let emb = &model.embeddings;
        let Some(position_embeddings) = &emb.position_embeddings else {
            return Ok(None);
        };
        let layers = model
            .encoder
            .layers
            .iter()
            .map(|l| {
                let sa = &l.attention.self_attention;
                Ok(Layer {
                    qkv: linear_of(&[&sa.query, &sa.key, &sa.value])?,
                    attn_out: linear_of(&[&l.attention.dense])?,
                    attn_norm: norm_of(&l.attention.layer_norm)?,
                    ffn_in: linear_of(&[&l.intermediate.dense])?,
                    ffn_out: linear_of(&[&l.output.dense])?,
                    ffn_norm: norm_of(&l.output.layer_norm)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Self {
            hidden: cfg.hidden_size,
            num_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim(),
            max_positions: cfg.max_position_embeddings,
            act: match cfg.hidden_act {
                Activation::Gelu => Act::GeluErf,
                Activation::GeluTanh => Act::GeluTanh,
                Activation::Relu => Act::Relu,
            },
            norm_position: cfg.norm_position,
            word: flat(emb.word_embeddings.embeddings())?,
            vocab: cfg.vocab_size,
            position: flat(position_embeddings.embeddings())?,
            token_type: match &emb.token_type_embeddings {
                Some(t) => Some((flat(t.embeddings())?, cfg.type_vocab_size)),
                None => None,
            },
            embed_norm: emb.layer_norm.as_ref().map(norm_of).transpose()?,
            layers,
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
        let d = self.hidden;
        let mut offsets = Vec::with_capacity(sequences.len() + 1);
        offsets.push(0);
        for (s, (ids, _)) in sequences.iter().enumerate() {
            if ids.len() > self.max_positions {
                return Err(Error::Input(format!(
                    "text {s} has {} tokens, more than max_position_embeddings ({}); truncate it",
                    ids.len(),
                    self.max_positions
                )));
            }
            offsets.push(offsets[s] + ids.len());
        }
        let n = *offsets.last().expect("offsets start with 0");
        let mut x = vec![0f32; n * d];
        self.embed(sequences, &mut x)?;
        let ffn = self.layers.first().map_or(0, |l| l.ffn_in.out_dim);
        let mut qkv = vec![0f32; n * 3 * d];
        let mut ctx = vec![0f32; n * d];
        let mut tmp = vec![0f32; n * d];
        let mut inter = vec![0f32; n * ffn];
        for layer in &self.layers {
            match self.norm_position {
                NormPosition::Post => {
                    run(&layer.qkv, &x, &mut qkv, n);
                    kernels::packed_attention(
                        &qkv,
                        &mut ctx,
                        &offsets,
                        self.num_heads,
                        self.head_dim,
                    );
                    run(&layer.attn_out, &ctx, &mut tmp, n);
                    let an = &layer.attn_norm;
                    kernels::add_layer_norm(&mut tmp, Some(&x), &an.gamma, &an.beta, an.eps);
                    std::mem::swap(&mut x, &mut tmp);
                    run(&layer.ffn_in, &x, &mut inter, n);
                    kernels::activate_in_place(&mut inter, self.act);
                    run(&layer.ffn_out, &inter, &mut tmp, n);
                    let fnn = &layer.ffn_norm;
                    kernels::add_layer_norm(&mut tmp, Some(&x), &fnn.gamma, &fnn.beta, fnn.eps);
                    std::mem::swap(&mut x, &mut tmp);
                }
                NormPosition::Pre => {
                    let an = &layer.attn_norm;
                    kernels::layer_norm_into(&x, &mut tmp, &an.gamma, &an.beta, an.eps);
                    run(&layer.qkv, &tmp, &mut qkv, n);
                    kernels::packed_attention(
                        &qkv,
                        &mut ctx,
                        &offsets,
                        self.num_heads,
                        self.head_dim,
                    );
                    run(&layer.attn_out, &ctx, &mut tmp, n);
                    kernels::add_in_place(&mut x, &tmp);
                    let fnn = &layer.ffn_norm;
                    kernels::layer_norm_into(&x, &mut tmp, &fnn.gamma, &fnn.beta, fnn.eps);
                    run(&layer.ffn_in, &tmp, &mut inter, n);
                    kernels::activate_in_place(&mut inter, self.act);
                    run(&layer.ffn_out, &inter, &mut tmp, n);
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

    fn embed(&self, sequences: &[(&[u32], &[u32])], x: &mut [f32]) -> Result<()> {
        let d = self.hidden;
        let mut row = 0;
        for (s, (ids, types)) in sequences.iter().enumerate() {
            for (pos, &id) in ids.iter().enumerate() {
                let id = id as usize;
                if id >= self.vocab {
                    return Err(Error::Input(format!(
                        "text {s}: token id {id} is outside the vocabulary ({})",
                        self.vocab
                    )));
                }
                let out = &mut x[row * d..(row + 1) * d];
                out.copy_from_slice(&self.word[id * d..(id + 1) * d]);
                for (o, p) in out.iter_mut().zip(&self.position[pos * d..(pos + 1) * d]) {
                    *o += p;
                }
                if let Some((table, n_types)) = &self.token_type {
                    let t = types.get(pos).copied().unwrap_or(0) as usize;
                    if t >= *n_types {
                        return Err(Error::Input(format!(
                            "text {s}: token type {t} is not below type_vocab_size {n_types}"
                        )));
                    }
                    for (o, v) in out.iter_mut().zip(&table[t * d..(t + 1) * d]) {
                        *o += v;
                    }
                }
                row += 1;
            }
        }
        if let Some(f) = &self.embed_norm {
            kernels::add_layer_norm(x, None, &f.gamma, &f.beta, f.eps);
        }
        Ok(())
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
        run(p, &cls, &mut out, states.len());
        Ok(Some(
            out.chunks(p.out_dim)
                .map(|r| r.iter().map(|v| v.tanh()).collect())
                .collect(),
        ))
    }
}

fn run(l: &Linear, x: &[f32], y: &mut [f32], rows: usize) {
    kernels::linear(x, &l.w_t, &l.bias, y, rows, l.in_dim, l.out_dim);
}
