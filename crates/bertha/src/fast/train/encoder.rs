//! BERT's embeddings and encoder on packed tokens, forward with a tape of
//! what the backward reads, and backward into per-parameter gradients.
//!
//! What the tape keeps per layer, and why: the layer input and the
//! LayerNorm inputs (their backward reads them), the fused Q/K/V rows and
//! the attention probabilities (the attention backward reads both), the
//! attention context and the FFN input (weight gradients), and the FFN
//! expansion before its bias and activation. The activation's output is
//! recomputed in the backward (one cheap pass, one `T × intermediate`
//! buffer less per layer), and dropout masks are recomputed from their
//! keys rather than stored.
//!
//! When a head reads the last hidden states at some rows only (a
//! [`Selection`]: the masked rows, the `[CLS]` rows), the last layer runs
//! its keys and values on every row and everything else (queries,
//! attention output, FFN, LayerNorms) on those rows alone.

use std::sync::RwLockReadGuard;

use candle_core::Tensor;
use rayon::prelude::*;

use super::attention::{self, Heads, Packing, Qkv, QkvGrad};
use super::packs::WeightPacks;
use super::products::{self, Compute};
use super::products::{GradSink, Weight};
use super::rows::{Rows, Selection};
use super::{GradTarget, Param};
use crate::config::{Family, NormPosition};
use crate::error::{Error, Result};
use crate::fast::buffers::{add, copied, recycle, scratch, zeros};
use crate::fast::kernels::{self, Act};
use crate::fast::matmul::{as_words, as_words_mut, WeightPanels};
use crate::model::ops::{
    bias_act_backward, bias_act_forward, column_sums, grad_to_pairs, layer_norm_backward,
};
use crate::model::{BertModel, Dense, Dropout, DropoutMask, LayerNorm, PositionIds};

/// A linear layer: weight `[out, in]` (as `nn.Linear`) and bias.
pub(crate) struct Linear<'a> {
    pub w: Param<'a>,
    pub b: Param<'a>,
    /// The number format of its products.
    pub compute: Compute,
    /// The weight's bf16 panels, when the optimizer made them from its
    /// current values (held for the step: [`WeightPacks`]).
    panels: Option<RwLockReadGuard<'a, WeightPanels>>,
}

impl<'a> Linear<'a> {
    /// An fp32 linear layer.
    pub fn new(w: Param<'a>, b: Param<'a>) -> Self {
        Self {
            w,
            b,
            compute: Compute::F32,
            panels: None,
        }
    }

    /// The weight as its bf16 products read it (its panels when packed).
    pub fn weight(&self) -> Weight<'_> {
        Weight {
            data: &self.w.data,
            panels: self.panels.as_deref(),
        }
    }

    fn of(dense: &'a Dense) -> Result<Option<Self>> {
        let Some(bias) = dense.bias() else {
            return Ok(None);
        };
        Ok(Some(Self::new(
            Param::of(dense.weight())?,
            Param::of(bias)?,
        )))
    }

    pub fn out_dim(&self) -> usize {
        self.b.data.len()
    }

    /// `y = x · Wᵀ + b` on `m` rows.
    pub fn forward(&self, x: &[f32], y: &mut [f32], m: usize) {
        self.compute
            .forward(x, &self.w.data, Some(&self.b.data), y, m);
    }

    /// [`Linear::forward`] into a new buffer (not zeroed first in bf16).
    pub fn forward_new(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.compute.forward_new(x, &self.w.data, &self.b.data, m)
    }

    /// Adds the weight and bias gradients of `dy`, the gradient of the
    /// output over input `x`; writes (or adds, with `accumulate`) the
    /// input gradient into `dx` when given.
    pub fn backward(
        &mut self,
        x: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        m: usize,
        accumulate: bool,
    ) {
        let compute = self.compute;
        self.w
            .grad_product(|dw| compute.weight_grad_into(dy, x, dw, m));
        column_sums(dy, self.b.grad_mut());
        if let Some(dx) = dx {
            compute.input_grad(dy, &self.w.data, dx, m, accumulate);
        }
    }
}

/// A LayerNorm's parameters.
pub(crate) struct Norm<'a> {
    pub gamma: Param<'a>,
    pub beta: Param<'a>,
    pub eps: f32,
}

impl<'a> Norm<'a> {
    fn of(ln: &'a LayerNorm) -> Result<Self> {
        Ok(Self {
            gamma: Param::of(&ln.weight)?,
            beta: Param::of(&ln.bias)?,
            eps: ln.eps as f32,
        })
    }

    pub fn forward(&self, x: &[f32], y: &mut [f32]) {
        kernels::layer_norm_into(x, y, &self.gamma.data, &self.beta.data, self.eps);
    }

    /// `(gamma, beta, eps)`, as the fused norm passes take them.
    fn params(&self) -> (&[f32], &[f32], f32) {
        (&self.gamma.data, &self.beta.data, self.eps)
    }

    /// `dx` from the input `x` and the output gradient `dy`; adds the
    /// parameter gradients.
    pub fn backward(&mut self, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (gamma, dgamma) = self.gamma.data_and_grad();
        let grads = (dgamma, self.beta.grad_mut());
        layer_norm_backward(x, gamma, dy, dx, grads, self.eps);
    }
}

struct Layer<'a> {
    q: Linear<'a>,
    k: Linear<'a>,
    v: Linear<'a>,
    attn_out: Linear<'a>,
    attn_norm: Norm<'a>,
    ffn_in: Linear<'a>,
    ffn_out: Linear<'a>,
    ffn_norm: Norm<'a>,
    /// Q, K and V weights stacked `[3·D, D]`, and their biases.
    qkv_w: Vec<f32>,
    qkv_b: Vec<f32>,
}

impl<'a> Layer<'a> {
    /// Its six linear layers, in checkpoint order.
    fn linears_mut(&mut self) -> [&mut Linear<'a>; 6] {
        [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.attn_out,
            &mut self.ffn_in,
            &mut self.ffn_out,
        ]
    }

    /// Its parameters: each linear's weight and bias, then both
    /// LayerNorms'.
    fn params_mut(&mut self) -> Vec<&mut Param<'a>> {
        let Layer {
            q,
            k,
            v,
            attn_out,
            attn_norm,
            ffn_in,
            ffn_out,
            ffn_norm,
            ..
        } = self;
        let mut out = Vec::with_capacity(16);
        for lin in [q, k, v, attn_out, ffn_in, ffn_out] {
            out.extend([&mut lin.w, &mut lin.b]);
        }
        out.extend([&mut attn_norm.gamma, &mut attn_norm.beta]);
        out.extend([&mut ffn_norm.gamma, &mut ffn_norm.beta]);
        out
    }
}

/// One layer's saved activations (see the module docs).
#[derive(Default)]
struct LayerTape {
    /// The layer's input.
    x: Vec<f32>,
    /// Pre-LN: the attention LayerNorm's output (the Q/K/V input); post-LN
    /// reads `x`.
    attn_in: Vec<f32>,
    /// The fused Q/K/V rows `[T, 3·D]`; in a layer with a selection, K and
    /// V `[T, 2·D]`, beside the selected rows' Q `[M, D]` and its input.
    qkv: Vec<f32>,
    q: Vec<f32>,
    q_in: Vec<f32>,
    probs: Vec<f32>,
    /// The attention dropout's keep bits (words of fp32 storage), as the
    /// forward drew them.
    attn_bits: Vec<f32>,
    ctx: Vec<f32>,
    /// attention output + residual: a LayerNorm's input in both placements.
    s1: Vec<f32>,
    /// The FFN's input.
    ffn_x: Vec<f32>,
    /// fp32: the FFN expansion before bias and activation; bf16: the
    /// activation's slopes `act'(f + b)` there, all its backward reads.
    f: Vec<f32>,
    /// bf16: the activation's output as FFN-out's weight gradient reads
    /// it (a right operand's bf16 panels in fp32-sized words, stored by
    /// FFN-in's tiles); fp32 recomputes it from `f`.
    g: Vec<f32>,
    /// Post-LN: FFN output + residual, the output LayerNorm's input.
    s2: Vec<f32>,
    masks: [Option<DropoutMask>; 3],
}

impl Drop for LayerTape {
    /// The buffers go back for the next pass to overwrite.
    fn drop(&mut self) {
        let t = self;
        for v in [
            &mut t.x,
            &mut t.attn_in,
            &mut t.qkv,
            &mut t.q,
            &mut t.q_in,
            &mut t.probs,
            &mut t.attn_bits,
            &mut t.ctx,
            &mut t.s1,
            &mut t.ffn_x,
            &mut t.f,
            &mut t.g,
            &mut t.s2,
        ] {
            recycle(std::mem::take(v));
        }
    }
}

/// A forward pass's tape.
pub(crate) struct Tape {
    offsets: Vec<usize>,
    /// Each sequence's real tokens, the keys of its attention, when it
    /// ends in padding rows (empty: no padding).
    keys: Vec<usize>,
    ids: Vec<u32>,
    types: Vec<u32>,
    positions: Vec<usize>,
    /// The embeddings' sum before their LayerNorm.
    embed_sum: Vec<f32>,
    embed_mask: Option<DropoutMask>,
    /// With an input projection: its input (the embeddings after their
    /// LayerNorm and dropout).
    projected: Vec<f32>,
    layers: Vec<LayerTape>,
    /// Pre-LN with a final LayerNorm: its input.
    final_in: Vec<f32>,
    /// The rows of the last hidden states (`None`: every row).
    outputs: Option<Selection>,
}

impl Tape {
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The row of the last hidden states that holds row `position` of
    /// sequence `s`, when the pass computed it.
    pub fn output_row(&self, s: usize, position: usize) -> Option<usize> {
        match &self.outputs {
            Some(sel) => sel.index_of(s, position),
            None => {
                let (start, end) = (*self.offsets.get(s)?, *self.offsets.get(s + 1)?);
                (position < end - start).then_some(start + position)
            }
        }
    }
}

/// BERT's embeddings and encoder as plain buffers, with gradients.
pub(crate) struct Encoder<'a> {
    hidden: usize,
    /// The embeddings' width: the hidden size, or ELECTRA's and ALBERT's
    /// `embedding_size` when `projection` maps them to it.
    embed_width: usize,
    heads: Heads,
    act: Act,
    norm_position: NormPosition,
    max_positions: usize,
    pad_id: u32,
    /// RoBERTa's positions: from `padding_idx + 1` over the non-padding
    /// tokens (padding tokens at `padding_idx`, whose row learns nothing).
    positions_from: Option<u32>,
    /// Every token type read as 0 (RoBERTa's tokenizers give none).
    ignore_types: bool,
    pub word: Param<'a>,
    position: Param<'a>,
    token_type: Option<Param<'a>>,
    embed_norm: Option<Norm<'a>>,
    /// ELECTRA's `embeddings_project`, ALBERT's
    /// `embedding_hidden_mapping_in` (embedding width → hidden size).
    projection: Option<Linear<'a>>,
    /// The distinct layers.
    layers: Vec<Layer<'a>>,
    /// The layer each pass through a layer runs, in order (BERT: 0, 1, …;
    /// ALBERT: its groups' layers, shared across steps, so their
    /// parameters add the gradients of every pass).
    order: Vec<usize>,
    final_norm: Option<Norm<'a>>,
    hidden_dropout: Dropout,
    attention_dropout: Dropout,
    /// The dropout on the attention's output projection: the hidden
    /// dropout, or none (DistilBERT).
    attn_out_dropout: Dropout,
    compute: Compute,
}

impl<'a> Encoder<'a> {
    /// The encoder of `model`, when the fast path covers it: BERT itself
    /// (absolute positions, no family extras), RoBERTa's (BERT's, with
    /// positions counted from the padding id and no token types),
    /// DistilBERT's (BERT's under its own names, without token types and
    /// without dropout on the attention's output), ELECTRA's (BERT's, with
    /// its embeddings projected when narrower) or ALBERT's (embeddings
    /// projected, layers shared across steps), on the CPU, with biases and
    /// dropout rates below 1.
    pub fn of(model: &'a BertModel) -> Result<Option<Self>> {
        let cfg = model.config();
        let projects = matches!(cfg.family, Family::Electra(_) | Family::Albert(_));
        let family_covered = cfg.family.is_bert()
            || projects
            || matches!(cfg.family, Family::Roberta | Family::DistilBert(_));
        if !model.device().is_cpu() || !family_covered {
            return Ok(None);
        }
        let encoder = &model.encoder;
        let projection = match &encoder.input_projection {
            Some(p) if projects => match Linear::of(p)? {
                Some(p) => Some(p),
                None => return Ok(None),
            },
            _ => None,
        };
        let Some(order) = encoder.layer_order() else {
            return Ok(None);
        };
        if encoder.input_projection.is_some() && projection.is_none() {
            return Ok(None);
        }
        let emb = &model.embeddings;
        let Some(position) = &emb.position_embeddings else {
            return Ok(None);
        };
        if emb.projection.is_some() || emb.mask_padding {
            return Ok(None);
        }
        let positions_from = match emb.position_ids {
            PositionIds::Absolute => None,
            PositionIds::FromPadding { padding_idx } if padding_idx == emb.padding_idx => {
                Some(padding_idx)
            }
            _ => return Ok(None),
        };
        if cfg.hidden_dropout_prob >= 1.0 || cfg.attention_probs_dropout_prob >= 1.0 {
            return Ok(None);
        }
        let attn_out_dropout = match model.encoder.layers.first() {
            Some(l) => l.attention.output_dropout(),
            None => Dropout::new(cfg.hidden_dropout_prob),
        };
        let same_rate = |l: &crate::model::BertLayer| {
            l.attention.output_dropout().rate() == attn_out_dropout.rate()
        };
        if attn_out_dropout.rate() >= 1.0 || !model.encoder.layers.iter().all(same_rate) {
            return Ok(None);
        }
        let mut layers = Vec::with_capacity(model.encoder.layers.len());
        for l in &model.encoder.layers {
            let sa = &l.attention.self_attention;
            let (Some(q), Some(k), Some(v), Some(attn_out), Some(ffn_in), Some(ffn_out)) = (
                Linear::of(&sa.query)?,
                Linear::of(&sa.key)?,
                Linear::of(&sa.value)?,
                Linear::of(&l.attention.dense)?,
                Linear::of(&l.intermediate.dense)?,
                Linear::of(&l.output.dense)?,
            ) else {
                return Ok(None);
            };
            let qkv_w = [&q.w.data[..], &k.w.data, &v.w.data].concat();
            let qkv_b = [&q.b.data[..], &k.b.data, &v.b.data].concat();
            layers.push(Layer {
                q,
                k,
                v,
                attn_out,
                attn_norm: Norm::of(&l.attention.layer_norm)?,
                ffn_in,
                ffn_out,
                ffn_norm: Norm::of(&l.output.layer_norm)?,
                qkv_w,
                qkv_b,
            });
        }
        Ok(Some(Self {
            hidden: cfg.hidden_size,
            embed_width: cfg.embedding_size(),
            heads: Heads {
                count: cfg.num_attention_heads,
                dim: cfg.head_dim(),
            },
            act: cfg.hidden_act.into(),
            norm_position: cfg.norm_position,
            max_positions: cfg.max_position_embeddings,
            pad_id: emb.padding_idx,
            positions_from,
            ignore_types: emb.ignore_token_types,
            word: Param::of(emb.word_embeddings.embeddings())?,
            position: Param::of(position.embeddings())?,
            token_type: emb
                .token_type_embeddings
                .as_ref()
                .map(|t| Param::of(t.embeddings()))
                .transpose()?,
            embed_norm: emb.layer_norm.as_ref().map(Norm::of).transpose()?,
            projection,
            layers,
            order,
            final_norm: model
                .encoder
                .final_layer_norm
                .as_ref()
                .map(Norm::of)
                .transpose()?,
            hidden_dropout: Dropout::new(cfg.hidden_dropout_prob),
            attention_dropout: Dropout::new(cfg.attention_probs_dropout_prob),
            attn_out_dropout,
            compute: Compute::F32,
        }))
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Runs the encoder's matrix products (the linear layers' and
    /// attention's) in `compute`; LayerNorm, softmax and activations stay
    /// fp32.
    pub fn set_compute(&mut self, compute: Compute) {
        self.compute = compute;
        for l in &mut self.layers {
            for lin in l.linears_mut() {
                lin.compute = compute;
            }
        }
        if let Some(p) = &mut self.projection {
            p.compute = compute;
        }
    }

    /// The linear weights whose bf16 panels the optimizer can keep
    /// ([`WeightPacks`]): each layer's attention output and FFN (Q, K and
    /// V are multiplied stacked, from a copy).
    pub fn packed_weights(&self) -> Vec<&'a Tensor> {
        let packed = |l: &Layer<'a>| {
            [
                l.attn_out.w.tensor(),
                l.ffn_in.w.tensor(),
                l.ffn_out.w.tensor(),
            ]
        };
        self.layers.iter().flat_map(packed).collect()
    }

    /// Reads the packed weights' panels from `packs` where current.
    pub fn use_packs(&mut self, packs: &'a WeightPacks) {
        for l in &mut self.layers {
            for lin in [&mut l.attn_out, &mut l.ffn_in, &mut l.ffn_out] {
                lin.panels = packs.current(lin.w.tensor());
            }
        }
    }

    /// The last hidden states of the packed `sequences` (`(ids, token
    /// types)`), and the tape of the pass. With `train`, dropout draws its
    /// masks in the order the candle modules do, so both drop the same
    /// elements.
    ///
    /// With `pad_to` above 0, every sequence is padded to `max(pad_to,
    /// longest)` rows, as a padded batch runs: `[PAD]` tokens at the next
    /// positions, type 0, that attend to the sequence's tokens and that
    /// nothing attends to. Their states are what a padded batch gives at
    /// those rows (QA's loss reads them).
    ///
    /// `outputs` (`[sequence, position]`, ascending, each once) asks for the
    /// states of those rows only, `[outputs, D]` in their order ([`Tape::
    /// output_row`] finds a row); `None`, for every row `[T, D]`. The last
    /// layer then runs its keys and values on every row and the rest on
    /// those rows (see the module docs); the parameters' gradients are
    /// those of the whole pass, the rows left out having none.
    pub fn forward(
        &self,
        sequences: &[(&[u32], &[u32])],
        pad_to: usize,
        outputs: Option<Vec<[usize; 2]>>,
        train: bool,
    ) -> Result<(Vec<f32>, Tape)> {
        let (d, e) = (self.hidden, self.embed_width);
        let mut offsets = vec![0];
        let (mut ids, mut types, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        let rows = match pad_to {
            0 => 0,
            _ => sequences.iter().map(|s| s.0.len()).fold(pad_to, usize::max),
        };
        if rows > self.max_positions {
            return Err(Error::Input(format!(
                "padded to {rows} tokens, more than max_position_embeddings ({})",
                self.max_positions
            )));
        }
        let keys: Vec<usize> = match rows {
            0 => Vec::new(),
            _ => sequences.iter().map(|s| s.0.len()).collect(),
        };
        let vocab = self.word.data.len() / e;
        let n_types = self.token_type.as_ref().map_or(0, |t| t.data.len() / e);
        for (s, (seq, tt)) in sequences.iter().enumerate() {
            if seq.len() > self.max_positions {
                return Err(Error::Input(format!(
                    "sequence {s} has {} tokens, more than max_position_embeddings ({})",
                    seq.len(),
                    self.max_positions
                )));
            }
            let mut rank = 0;
            for (p, &id) in seq.iter().enumerate() {
                if id as usize >= vocab {
                    return Err(Error::Input(format!(
                        "sequence {s}: token id {id} is outside the vocabulary ({vocab})"
                    )));
                }
                let t = match self.ignore_types {
                    true => 0,
                    false => tt.get(p).copied().unwrap_or(0),
                };
                if self.token_type.is_some() && t as usize >= n_types {
                    return Err(Error::Input(format!(
                        "sequence {s}: token type {t} is not below type_vocab_size {n_types}"
                    )));
                }
                let position = match self.positions_from {
                    Some(pad) if id == pad => pad as usize,
                    Some(pad) => {
                        rank += 1;
                        pad as usize + rank
                    }
                    None => p,
                };
                if position >= self.max_positions {
                    return Err(Error::Input(format!(
                        "sequence {s} of {} tokens needs position {position}, beyond max_position_embeddings ({})",
                        seq.len(),
                        self.max_positions
                    )));
                }
                ids.push(id);
                types.push(t);
                positions.push(position);
            }
            for p in seq.len()..rows {
                ids.push(self.pad_id);
                types.push(0);
                positions.push(self.positions_from.map_or(p, |pad| pad as usize));
            }
            offsets.push(ids.len());
        }
        let n = ids.len();
        // Without layers the embeddings are the output: every row.
        let outputs = match outputs {
            Some(keys) if !self.layers.is_empty() => Some(Selection::new(keys, &offsets)?),
            _ => None,
        };
        let mask_of = |drop: &Dropout| if train { drop.next_mask(true) } else { None };
        // Embeddings: word + position (+ type), LayerNorm, dropout (and
        // ELECTRA's projection to the hidden size).
        let mut embed_sum = scratch(n * e);
        let (word, position) = (&self.word.data[..], &self.position.data[..]);
        let token_type = self.token_type.as_ref().map(|t| &t.data[..]);
        embed_sum
            .par_chunks_mut(e.max(1))
            .enumerate()
            .with_min_len(64)
            .for_each(|(r, row)| {
                let id = ids[r] as usize;
                row.copy_from_slice(&word[id * e..(id + 1) * e]);
                let p = positions[r];
                add(row, &position[p * e..(p + 1) * e]);
                if let Some(tt) = token_type {
                    let t = types[r] as usize;
                    add(row, &tt[t * e..(t + 1) * e]);
                }
            });
        let mut x = match &self.embed_norm {
            Some(norm) => {
                let mut y = scratch(n * e);
                norm.forward(&embed_sum, &mut y);
                y
            }
            None => copied(&embed_sum),
        };
        let embed_mask = mask_of(&self.hidden_dropout);
        if let Some(m) = &embed_mask {
            drop_rows(m, &mut x, &offsets, e);
        }
        let mut projected = Vec::new();
        if let Some(p) = &self.projection {
            let mut y = scratch(n * d);
            p.forward(&x, &mut y, n);
            projected = std::mem::replace(&mut x, y);
        }
        let mut tapes = Vec::with_capacity(self.order.len());
        let mut x_pairs = None;
        for (i, &l) in self.order.iter().enumerate() {
            let (layer, last) = (&self.layers[l], i + 1 == self.order.len());
            let packing = Packing::of_layer(&offsets, &keys, outputs.as_ref(), last);
            let (y, y_pairs, tape) =
                self.layer_forward(layer, (x, x_pairs), (packing, !last), &mask_of);
            tapes.push(tape);
            (x, x_pairs) = (y, y_pairs);
        }
        recycle(x_pairs.unwrap_or_default());
        let mut final_in = Vec::new();
        if let Some(norm) = &self.final_norm {
            let mut y = scratch(x.len());
            norm.forward(&x, &mut y);
            final_in = std::mem::replace(&mut x, y);
        }
        Ok((
            x,
            Tape {
                offsets,
                keys,
                ids,
                types,
                positions,
                embed_sum,
                embed_mask,
                projected,
                layers: tapes,
                final_in,
                outputs,
            },
        ))
    }

    /// One layer on every row, or, with `packing.queries`, its outputs at
    /// those rows only. In bf16, `x_pairs` are `x`'s bf16 pairs when the
    /// pass that made `x` stored them, and with `pairs_out` the output's
    /// are returned when this layer's last pass can store them (post-LN).
    fn layer_forward(
        &self,
        layer: &Layer,
        (mut x, x_pairs): (Vec<f32>, Option<Vec<f32>>),
        (packing, pairs_out): (Packing, bool),
        mask_of: &dyn Fn(&Dropout) -> Option<DropoutMask>,
    ) -> (Vec<f32>, Option<Vec<f32>>, LayerTape) {
        let (d, n) = (self.hidden, packing.offsets.last().copied().unwrap_or(0));
        let rows = packing.rows();
        let m = rows.count();
        let inter = layer.ffn_in.out_dim();
        let mut t = LayerTape::default();
        if m == 0 {
            // No output rows: nothing to compute, but the masks are drawn
            // as the candle modules draw them.
            t.masks = [
                mask_of(&self.attention_dropout),
                mask_of(&self.attn_out_dropout),
                mask_of(&self.hidden_dropout),
            ];
            t.x = x;
            recycle(x_pairs.unwrap_or_default());
            return (Vec::new(), None, t);
        }
        let (pre, bf16) = (
            self.norm_position == NormPosition::Pre,
            self.compute == Compute::Bf16,
        );
        let mut in_pairs = x_pairs.filter(|_| !pre);
        if pre {
            t.attn_in = scratch(n * d);
            match bf16 {
                true => {
                    let mut pairs = scratch(n * d.div_ceil(2));
                    let out = (&mut t.attn_in[..], as_words_mut(&mut pairs));
                    kernels::finish_norm_pairs(&mut x, out, layer.attn_norm.params(), |_, _| {});
                    in_pairs = Some(pairs);
                }
                false => layer.attn_norm.forward(&x, &mut t.attn_in),
            }
        }
        let attn_in = if pre { &t.attn_in } else { &x };
        let pairs = qkv_pairs(self.compute, self.heads);
        // Q, K and V from the input's pairs where its pass stored them.
        let project = |x: &[f32], x_pairs: Option<&[f32]>, (w, b): (&[f32], &[f32]), rows| {
            let input = match x_pairs {
                Some(p) => products::Input::Pairs(as_words(p)),
                None => products::Input::F32(x),
            };
            match (pairs, input) {
                (true, _) => products::forward_to_pairs_bf16(input, w, b, rows),
                (false, products::Input::Pairs(p)) => {
                    products::forward_pairs_bf16(p, d, w.into(), b, rows)
                }
                (false, products::Input::F32(x)) => self.compute.forward_new(x, w, b, rows),
            }
        };
        let x_words = in_pairs.as_deref();
        match packing.queries {
            None => t.qkv = project(attn_in, x_words, (&layer.qkv_w, &layer.qkv_b), n),
            Some(sel) => {
                let (w_q, w_kv) = layer.qkv_w.split_at(d * d);
                let (b_q, b_kv) = layer.qkv_b.split_at(d);
                t.qkv = project(attn_in, x_words, (w_kv, b_kv), n);
                t.q_in = sel.gather(attn_in, d);
                let q_pairs = x_words.map(|p| sel.gather(p, d.div_ceil(2)));
                t.q = project(&t.q_in, q_pairs.as_deref(), (w_q, b_q), m);
                recycle(q_pairs.unwrap_or_default());
            }
        }
        recycle(in_pairs.unwrap_or_default());
        let qkv = match packing.queries {
            None => Qkv::fused(&t.qkv, d, pairs),
            Some(_) => Qkv::split(&t.q, &t.qkv, d, pairs),
        };
        let (_, total) = attention::probability_offsets(packing, self.heads);
        t.probs = scratch(total);
        // With Q, K and V as pairs, the context is stored as pairs too.
        t.ctx = scratch(m * if pairs { d / 2 } else { d });
        t.masks[0] = mask_of(&self.attention_dropout);
        if t.masks[0].is_some() {
            t.attn_bits = scratch(attention::mask_words(packing, self.heads));
        }
        let dropout = t.masks[0]
            .as_ref()
            .map(|m| (m, as_words_mut(&mut t.attn_bits)));
        attention::forward(
            qkv,
            &mut t.ctx,
            &mut t.probs,
            packing,
            (self.heads, self.compute),
            dropout,
        );
        t.s1 = match pairs {
            true => {
                let (w, b) = (layer.attn_out.weight(), &layer.attn_out.b.data);
                products::forward_pairs_bf16(as_words(&t.ctx), d, w, b, m)
            }
            false => layer.attn_out.forward_new(&t.ctx, m),
        };
        t.masks[1] = mask_of(&self.attn_out_dropout);
        t.ffn_x = scratch(m * d);
        let norm1 = if pre {
            &layer.ffn_norm
        } else {
            &layer.attn_norm
        };
        // In bf16 the dropout, the residual add, the norm and FFN-in's
        // rounded input in one pass.
        let ffn_x_pairs = match bf16 {
            true => {
                let mut pairs = scratch(m * d.div_ceil(2));
                let (mask, out) = (
                    t.masks[1].as_ref(),
                    (&mut t.ffn_x[..], as_words_mut(&mut pairs)),
                );
                kernels::finish_norm_pairs(&mut t.s1, out, norm1.params(), |r, row| {
                    if let Some(mask) = mask {
                        mask.apply_row(mask.row_key(&rows.key(r)), row);
                    }
                    let at = rows.packed(r) * d;
                    add(row, &x[at..at + d]);
                });
                Some(pairs)
            }
            false => {
                if let Some(mask) = &t.masks[1] {
                    drop_rows_of(mask, &mut t.s1, rows, d);
                }
                match packing.queries {
                    None => add(&mut t.s1, &x),
                    Some(sel) => sel.add_gathered(&mut t.s1, &x, d),
                }
                norm1.forward(&t.s1, &mut t.ffn_x);
                None
            }
        };
        let (w_in, b_in) = (&layer.ffn_in.w.data, &layer.ffn_in.b.data);
        let mut o = match self.compute {
            Compute::F32 => {
                t.f = scratch(m * inter);
                self.compute.forward(&t.ffn_x, w_in, None, &mut t.f, m);
                let mut g = scratch(m * inter);
                bias_act_forward(&t.f, b_in, &mut g, self.act);
                let mut o = scratch(m * d);
                layer.ffn_out.forward(&g, &mut o, m);
                recycle(g);
                o
            }
            Compute::Bf16 => {
                // The activation's output exists only as FFN-out's rounded
                // input, stored by FFN-in's tiles beside the pre-activation.
                let input = match &ffn_x_pairs {
                    Some(p) => products::Input::Pairs(as_words(p)),
                    None => products::Input::F32(&t.ffn_x),
                };
                let w_in = layer.ffn_in.weight();
                let (f, g, g_panels) = products::forward_act_bf16(input, w_in, (b_in, self.act), m);
                let (w_out, b_out) = (layer.ffn_out.weight(), &layer.ffn_out.b.data);
                let o = products::forward_pairs_bf16(as_words(&g), inter, w_out, b_out, m);
                recycle(g);
                (t.f, t.g) = (f, g_panels);
                o
            }
        };
        recycle(ffn_x_pairs.unwrap_or_default());
        t.masks[2] = mask_of(&self.hidden_dropout);
        if pre || !(bf16 && pairs_out) {
            if let Some(mask) = &t.masks[2] {
                drop_rows_of(mask, &mut o, rows, d);
            }
        }
        let (y, y_pairs) = if pre {
            add(&mut o, &t.s1);
            (o, None)
        } else if bf16 && pairs_out {
            // The next layer's QKV input rounded in the norm's pass.
            let (mut y, mut pairs) = (scratch(m * d), scratch(m * d.div_ceil(2)));
            let (mask, ffn_x) = (t.masks[2].as_ref(), &t.ffn_x);
            let out = (&mut y[..], as_words_mut(&mut pairs));
            kernels::finish_norm_pairs(&mut o, out, layer.ffn_norm.params(), |r, row| {
                if let Some(mask) = mask {
                    mask.apply_row(mask.row_key(&rows.key(r)), row);
                }
                add(row, &ffn_x[r * d..(r + 1) * d]);
            });
            t.s2 = o;
            (y, Some(pairs))
        } else {
            add(&mut o, &t.ffn_x);
            t.s2 = o;
            let mut y = scratch(m * d);
            layer.ffn_norm.forward(&t.s2, &mut y);
            (y, None)
        };
        t.x = x;
        (y, y_pairs, t)
    }

    /// Adds the gradients of every parameter from `dy`, the gradient of
    /// the last hidden states. Takes the tape so that each layer's buffers
    /// go back to the step's pool once its backward is done.
    pub fn backward(&mut self, tape: Tape, mut dy: Vec<f32>) {
        let (d, e) = (self.hidden, self.embed_width);
        let Tape {
            offsets,
            keys,
            ids,
            types,
            positions,
            embed_sum,
            embed_mask,
            projected,
            layers: layer_tapes,
            final_in,
            outputs,
        } = tape;
        if let Some(norm) = &mut self.final_norm {
            let mut dx = scratch(dy.len());
            norm.backward(&final_in, &dy, &mut dx);
            recycle(std::mem::replace(&mut dy, dx));
        }
        recycle(final_in);
        let (heads, act, pre) = (
            self.heads,
            self.act,
            self.norm_position == NormPosition::Pre,
        );
        // Each layer's tape goes back (for the layers below to reuse) once
        // its backward is done.
        let passes = self.order.len();
        for (i, t) in layer_tapes.into_iter().enumerate().rev() {
            let layer = &mut self.layers[self.order[i]];
            let packing = Packing::of_layer(&offsets, &keys, outputs.as_ref(), i + 1 == passes);
            dy = layer_backward(layer, &t, dy, packing, (d, heads, act, pre));
        }
        if let Some(p) = &mut self.projection {
            let n = projected.len() / e.max(1);
            let mut dx = scratch(n * e);
            p.backward(&projected, &dy, Some(&mut dx), n, false);
            recycle(std::mem::replace(&mut dy, dx));
        }
        recycle(projected);
        if let Some(m) = &embed_mask {
            drop_rows(m, &mut dy, &offsets, e);
        }
        let de = match &mut self.embed_norm {
            Some(norm) => {
                let mut de = scratch(dy.len());
                norm.backward(&embed_sum, &dy, &mut de);
                recycle(dy);
                de
            }
            None => dy,
        };
        recycle(embed_sum);
        // The lookups' gradients: rows added into the tables (the padding
        // id's row gets none, as `nn.Embedding(padding_idx=..)`).
        let (pad, word_ids) = (self.pad_id, ids.iter().map(|&i| i as usize));
        let words = word_ids.enumerate().filter(|&(r, _)| ids[r] != pad);
        scatter_rows(&de, words, self.word.grad_mut(), e);
        // RoBERTa's position table has the padding id too: its row learns
        // nothing.
        let frozen = self.positions_from.map(|pad| pad as usize);
        let live_positions = positions.iter().copied().enumerate();
        scatter_rows(
            &de,
            live_positions.filter(|&(_, p)| Some(p) != frozen),
            self.position.grad_mut(),
            e,
        );
        if let Some(tt) = &mut self.token_type {
            scatter_rows(
                &de,
                types.iter().map(|&t| t as usize).enumerate(),
                tt.grad_mut(),
                e,
            );
        }
        recycle(de);
    }

    /// Every parameter, for returning gradients.
    pub fn params_mut(&mut self) -> Vec<&mut Param<'a>> {
        let mut out = vec![&mut self.word, &mut self.position];
        out.extend(&mut self.token_type);
        if let Some(n) = &mut self.embed_norm {
            out.extend([&mut n.gamma, &mut n.beta]);
        }
        if let Some(p) = &mut self.projection {
            out.extend([&mut p.w, &mut p.b]);
        }
        for l in &mut self.layers {
            out.extend(l.params_mut());
        }
        if let Some(n) = &mut self.final_norm {
            out.extend([&mut n.gamma, &mut n.beta]);
        }
        out
    }
}

/// One layer's backward: the gradient of its input (every row) from that
/// of its output (the query rows); adds its parameters' gradients.
fn layer_backward(
    layer: &mut Layer,
    t: &LayerTape,
    dy: Vec<f32>,
    packing: Packing,
    (d, heads, act, pre): (usize, Heads, Act, bool),
) -> Vec<f32> {
    let n = packing.offsets.last().copied().unwrap_or(0);
    let rows = packing.rows();
    let m = rows.count();
    if m == 0 {
        // No output rows: no gradient reaches the layer.
        recycle(dy);
        return zeros(n * d);
    }
    let inter = layer.ffn_in.out_dim();
    let compute = layer.ffn_in.compute;
    // The gradient of the layer's last sum (before the norm after post-LN):
    // it goes to the FFN's output (through the mask) and, as d(s1), along
    // the residual path, which collects the FFN's input gradient too.
    let ds = if pre {
        dy
    } else {
        let mut ds2 = scratch(m * d);
        layer.ffn_norm.backward(&t.s2, &dy, &mut ds2);
        recycle(dy);
        ds2
    };
    // FFN-out's backward ends at the activation's input gradient: in fp32
    // through the activation's output gradient `dg`; in bf16 as the FFN-in
    // products' pairs, made by the tiles of FFN-out's input gradient.
    let (mut dg, mut df_words, mut df_blocks) = (Vec::new(), Vec::new(), Vec::new());
    match compute {
        Compute::F32 => {
            dg = scratch(m * inter);
            let mut d_o = copied(&ds);
            if let Some(mask) = &t.masks[2] {
                drop_rows_of(mask, &mut d_o, rows, d);
            }
            // FFN output: g = act(f + b) recomputed for its weight gradient.
            let mut g = scratch(m * inter);
            bias_act_forward(&t.f, &layer.ffn_in.b.data, &mut g, act);
            layer.ffn_out.backward(&g, &d_o, Some(&mut dg), m, false);
            recycle(g);
            recycle(d_o);
        }
        Compute::Bf16 => {
            // The output gradient (through the mask) as its products'
            // pairs, read from ds, which stays d(s1); FFN-out's input as
            // the forward's tiles stored it.
            let (ffn_out, ffn_in) = (&mut layer.ffn_out, &mut layer.ffn_in);
            let dz = output_grad_pairs(&ds, t.masks[2].as_ref(), rows, ffn_out.b.grad_mut());
            let words = as_words(&dz);
            let g = (&t.g[..], inter);
            let weight_grad =
                |dw: GradSink| products::weight_grad_panels_bf16((words, d), g, dw, m);
            ffn_out.w.grad_product(weight_grad);
            // The activation's input gradient feeds only FFN-in's two
            // products (and its bias gradient, summed by the tiles).
            let (w, dbias) = (ffn_out.weight(), ffn_in.b.grad_mut());
            (df_words, df_blocks) =
                products::input_grad_act_to_pairs_bf16((words, d), w, &t.f, dbias, m);
            recycle(dz);
        }
    }
    let mut ds1 = ds;
    let mut dffn_x = scratch(m * d);
    match compute {
        Compute::F32 => {
            let mut df = scratch(m * inter);
            let ffn_in = &mut layer.ffn_in;
            let (bias, dbias) = ffn_in.b.data_and_grad();
            bias_act_backward(&t.f, bias, &dg, &mut df, dbias, act);
            ffn_in
                .w
                .grad_product(|dw| compute.weight_grad_into(&df, &t.ffn_x, dw, m));
            compute.input_grad(&df, &ffn_in.w.data, &mut dffn_x, m, false);
            recycle(df);
        }
        Compute::Bf16 => {
            let (df, ffn_in) = (as_words(&df_words), &mut layer.ffn_in);
            let df_t = (&df_blocks[..], inter);
            let weight_grad =
                |dw: GradSink| products::weight_grad_interleaved_bf16(df_t, &t.ffn_x, dw, m);
            ffn_in.w.grad_product(weight_grad);
            let w = ffn_in.weight();
            products::input_grad_pairs_bf16((df, inter), w, &mut dffn_x, m, false);
        }
    }
    recycle(dg);
    recycle(df_words);
    recycle(df_blocks);
    if pre {
        // ffn_x = LN2(s1)
        let mut tmp = scratch(m * d);
        layer.ffn_norm.backward(&t.s1, &dffn_x, &mut tmp);
        add(&mut ds1, &tmp);
        recycle(tmp);
    } else {
        // ffn_x = LN1(s1), and s2 = o + ffn_x.
        add(&mut ds1, &dffn_x);
        let mut tmp = scratch(m * d);
        layer.attn_norm.backward(&t.s1, &ds1, &mut tmp);
        recycle(std::mem::replace(&mut ds1, tmp));
    }
    recycle(dffn_x);
    // s1 = dropout(ctx · Woᵀ + bo) + x
    let pairs = qkv_pairs(compute, heads);
    let mut dctx: Vec<f32>;
    let mut dx = match compute {
        Compute::F32 => {
            dctx = scratch(m * d);
            let dx = residual_grad(&ds1, packing.queries, (n, d));
            let mut da = ds1;
            if let Some(mask) = &t.masks[1] {
                drop_rows_of(mask, &mut da, rows, d);
            }
            layer
                .attn_out
                .backward(&t.ctx, &da, Some(&mut dctx), m, false);
            recycle(da);
            dx
        }
        Compute::Bf16 => {
            let attn_out = &mut layer.attn_out;
            let da = output_grad_pairs(&ds1, t.masks[1].as_ref(), rows, attn_out.b.grad_mut());
            let words = as_words(&da);
            if pairs {
                // The context and its gradient as pairs (see attention).
                let ctx = (as_words(&t.ctx), d);
                let weight_grad =
                    |dw: GradSink| products::weight_grad_both_pairs_bf16((words, d), ctx, dw, m);
                attn_out.w.grad_product(weight_grad);
                dctx = products::input_grad_to_pairs_bf16((words, d), attn_out.weight(), m);
            } else {
                let weight_grad =
                    |dw: GradSink| products::weight_grad_pairs_bf16(words, d, &t.ctx, dw, m);
                attn_out.w.grad_product(weight_grad);
                dctx = scratch(m * d);
                let w = attn_out.weight();
                products::input_grad_pairs_bf16((words, d), w, &mut dctx, m, false);
            }
            recycle(da);
            match packing.queries {
                // ds1 is not needed any more: the residual's gradient.
                None => ds1,
                Some(_) => {
                    let dx = residual_grad(&ds1, packing.queries, (n, d));
                    recycle(ds1);
                    dx
                }
            }
        }
    };
    let attn_in = if pre { &t.attn_in } else { &t.x };
    // d(attention input), on every row: into dx directly after post-LN.
    let mut dn1 = match pre {
        true => Some(scratch(n * d)),
        false => None,
    };
    match packing.queries {
        None => {
            // Attention writes dK and dV on key rows only: padding rows'
            // stay 0.
            let mut dqkv = match packing.keys.is_empty() {
                true => scratch(n * 3 * d),
                false => zeros(n * 3 * d),
            };
            attention::backward(
                Qkv::fused(&t.qkv, d, qkv_pairs(compute, heads)),
                &t.probs,
                &dctx,
                QkvGrad::fused(&mut dqkv, d),
                packing,
                (heads, compute),
                t.masks[0].as_ref().map(|m| (m, as_words(&t.attn_bits))),
            );
            recycle(dctx);
            // Q, K, V: one multiply each way on the stacked weights.
            let (mut dw, mut db) = (scratch(3 * d * d), zeros(3 * d));
            let into = match &mut dn1 {
                Some(dn1) => (dn1.as_mut_slice(), false),
                None => (dx.as_mut_slice(), true),
            };
            linear_backward(
                compute,
                (&dqkv, attn_in),
                (&layer.qkv_w, GradSink::Overwrite(&mut dw), &mut db),
                into,
                n,
            );
            for (i, lin) in [&mut layer.q, &mut layer.k, &mut layer.v]
                .into_iter()
                .enumerate()
            {
                lin.w.add_grad(&dw[i * d * d..(i + 1) * d * d]);
                lin.b.add_grad(&db[i * d..(i + 1) * d]);
            }
            recycle(dw);
            recycle(dqkv);
        }
        Some(sel) => {
            // Q on the selected rows; K and V on every row (zero where no
            // query of their sequence looks).
            let mut dq = scratch(m * d);
            let mut dkv = zeros(n * 2 * d);
            attention::backward(
                Qkv::split(&t.q, &t.qkv, d, qkv_pairs(compute, heads)),
                &t.probs,
                &dctx,
                QkvGrad::split(&mut dq, &mut dkv, d),
                packing,
                (heads, compute),
                t.masks[0].as_ref().map(|m| (m, as_words(&t.attn_bits))),
            );
            recycle(dctx);
            let (w_q, w_kv) = layer.qkv_w.split_at(d * d);
            let mut dq_in = scratch(m * d);
            let q = &mut layer.q;
            let grads = (w_q, &mut q.w, q.b.grad_mut());
            linear_backward(compute, (&dq, &t.q_in), grads, (&mut dq_in, false), m);
            let (mut dw, mut db) = (scratch(2 * d * d), zeros(2 * d));
            let into = dn1.as_mut().unwrap_or(&mut dx);
            let grads = (w_kv, GradSink::Overwrite(&mut dw), &mut db[..]);
            linear_backward(compute, (&dkv, attn_in), grads, (into, !pre), n);
            for (i, lin) in [&mut layer.k, &mut layer.v].into_iter().enumerate() {
                lin.w.add_grad(&dw[i * d * d..(i + 1) * d * d]);
                lin.b.add_grad(&db[i * d..(i + 1) * d]);
            }
            recycle(dw);
            sel.scatter_add(&dq_in, into, d);
            recycle(dq_in);
            recycle(dq);
            recycle(dkv);
        }
    }
    if let Some(dn1) = dn1 {
        let mut tmp = scratch(n * d);
        layer.attn_norm.backward(&t.x, &dn1, &mut tmp);
        add(&mut dx, &tmp);
        recycle(dn1);
        recycle(tmp);
    }
    dx
}

/// A linear layer's backward from its output gradient `dy` and input `x`:
/// the weight and bias gradients added into `grads` (beside the weight),
/// the input gradient written, or (`into.1`) added, into `into.0`. In bf16,
/// `dy` is rounded once, into the pairs both products read, in the pass
/// that sums the bias gradient.
fn linear_backward(
    compute: Compute,
    (dy, x): (&[f32], &[f32]),
    (w, dw, db): (&[f32], impl GradTarget, &mut [f32]),
    (dx, accumulate): (&mut [f32], bool),
    m: usize,
) {
    match compute {
        Compute::F32 => {
            dw.product(|dw| compute.weight_grad_into(dy, x, dw, m));
            column_sums(dy, db);
            compute.input_grad(dy, w, dx, m, accumulate);
        }
        Compute::Bf16 => {
            let n = db.len();
            let mut words = scratch(m * n.div_ceil(2));
            grad_to_pairs(
                dy,
                as_words_mut(&mut words),
                db,
                None::<fn(usize, &[f32], &mut [f32])>,
            );
            let pairs = as_words(&words);
            dw.product(|dw| products::weight_grad_pairs_bf16(pairs, n, x, dw, m));
            products::input_grad_pairs_bf16((pairs, n), w.into(), dx, m, accumulate);
            recycle(words);
        }
    }
}

/// [`grad_to_pairs`] of a layer's output gradient on `rows`, through its
/// dropout `mask`: the pairs (the words of a step buffer), the bias
/// gradient added into `dbias`.
fn output_grad_pairs(
    dy: &[f32],
    mask: Option<&DropoutMask>,
    rows: Rows,
    dbias: &mut [f32],
) -> Vec<f32> {
    let d = dbias.len();
    let mut words = scratch(rows.count() * d.div_ceil(2));
    let masked = mask.map(|mask| {
        move |r: usize, src: &[f32], row: &mut [f32]| {
            mask.apply_row_into(mask.row_key(&rows.key(r)), src, row)
        }
    });
    grad_to_pairs(dy, as_words_mut(&mut words), dbias, masked);
    words
}

/// The gradient the residual path hands a layer's input `[n, d]`: the
/// output rows' `ds1` (every row, or the selection's scattered, 0 on the
/// other rows).
fn residual_grad(ds1: &[f32], queries: Option<&Selection>, (n, d): (usize, usize)) -> Vec<f32> {
    match queries {
        None => copied(ds1),
        Some(sel) => {
            let mut dx = zeros(n * d);
            sel.scatter_add(ds1, &mut dx, d);
            dx
        }
    }
}

/// Rows `r` of `src` (rows of `d`) added into rows `at` of `table` for
/// each `(r, at)` of `targets`: an embedding lookup's gradient. The
/// table's rows in parallel, each taking its rows in the order of `r` (the
/// order of a serial loop, so the same sums).
fn scatter_rows(
    src: &[f32],
    targets: impl Iterator<Item = (usize, usize)>,
    table: &mut [f32],
    d: usize,
) {
    let mut order: Vec<(usize, usize)> = targets.map(|(r, at)| (at, r)).collect();
    order.sort_unstable();
    // The sources of table row `t`: order[starts[t]..starts[t + 1]].
    let rows = table.len() / d.max(1);
    let mut starts = vec![0usize; rows + 1];
    for &(at, _) in &order {
        starts[at + 1] += 1;
    }
    for t in 0..rows {
        starts[t + 1] += starts[t];
    }
    table
        .par_chunks_mut(d.max(1))
        .enumerate()
        .with_min_len(256)
        .for_each(|(t, row)| {
            for &(_, r) in &order[starts[t]..starts[t + 1]] {
                add(row, &src[r * d..(r + 1) * d]);
            }
        });
}

/// Whether attention's Q, K and V are kept as the bf16 pairs their
/// product's tiles store (bf16 products, an even head width) instead of
/// fp32.
fn qkv_pairs(compute: Compute, heads: Heads) -> bool {
    compute == Compute::Bf16 && heads.dim.is_multiple_of(2)
}

/// Dropout on hidden rows `[T, D]` of packed sequences: row `(s, p)` keyed
/// as the candle modules key row `p` of batch row `s`.
/// Rows in parallel: a hash per element is a few percent of a step.
pub(crate) fn drop_rows(mask: &DropoutMask, x: &mut [f32], offsets: &[usize], d: usize) {
    drop_rows_of(mask, x, Rows::Packed(offsets), d);
}

/// [`drop_rows`] on `rows`: every packed row, or a selection's.
fn drop_rows_of(mask: &DropoutMask, x: &mut [f32], rows: Rows, d: usize) {
    x[..rows.count() * d]
        .par_chunks_mut(d.max(1))
        .enumerate()
        .with_min_len(64)
        .for_each(|(r, row)| mask.apply_row(mask.row_key(&rows.key(r)), row));
}
