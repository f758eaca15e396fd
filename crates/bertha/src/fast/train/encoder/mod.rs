//! BERT's embeddings and encoder on packed tokens (and those of the
//! families built from them, and ModernBERT's: see [`build`]), forward
//! with a tape of what the backward reads, and backward into
//! per-parameter gradients (in [`backward`]; the linear layers and
//! LayerNorms in [`parts`], one layer's parameters and tape in [`layer`],
//! GeGLU in [`geglu`]).
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

use candle_core::Tensor;
use rayon::prelude::*;

use super::attention::{self, Heads, Packing, Qkv};
use super::packs::WeightPacks;
use super::products::{self, Compute};
use super::rows::{Rows, Selection};
use super::Param;
use crate::config::NormPosition;
use crate::error::{Error, Result};
use crate::fast::bert_layout;
use crate::fast::buffers::{add, copied, recycle, scratch};
use crate::fast::kernels::{self, Act};
use crate::fast::matmul::{as_words, as_words_mut};
use crate::fast::rope::Rotary;
use crate::model::ops::bias_act_forward;
use crate::model::{Dropout, DropoutMask};

mod backward;
mod build;
mod geglu;
mod layer;
mod parts;

use layer::{Layer, LayerTape, Turn};

pub(crate) use parts::{Linear, Norm};

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
    /// With rotary layers: a table per base, as long as the longest
    /// sequence, and each row's position in its sequence.
    rotaries: Vec<Rotary>,
    rotary_positions: Vec<u32>,
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
    /// Absolute positions' table (ModernBERT has none: rotary layers).
    position: Option<Param<'a>>,
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
    /// The rotary bases the layers' `rotary` indexes.
    thetas: Vec<f64>,
    embed_dropout: Dropout,
    hidden_dropout: Dropout,
    attention_dropout: Dropout,
    /// The dropout on the attention's output projection: the hidden
    /// dropout, or none (DistilBERT).
    attn_out_dropout: Dropout,
    compute: Compute,
}

impl<'a> Encoder<'a> {
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
        self.layers.iter().flat_map(packed).flatten().collect()
    }

    /// Reads the packed weights' panels from `packs` where current.
    pub fn use_packs(&mut self, packs: &'a WeightPacks) {
        for l in &mut self.layers {
            for lin in [&mut l.attn_out, &mut l.ffn_in, &mut l.ffn_out] {
                lin.panels = lin.w.tensor().and_then(|w| packs.current(w));
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
                let position = bert_layout::position(self.positions_from, id, p, &mut rank);
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
        let word = &self.word.data[..];
        let position = self.position.as_ref().map(|p| &p.data[..]);
        let token_type = self.token_type.as_ref().map(|t| &t.data[..]);
        embed_sum
            .par_chunks_mut(e.max(1))
            .enumerate()
            .with_min_len(64)
            .for_each(|(r, row)| {
                let id = ids[r] as usize;
                row.copy_from_slice(&word[id * e..(id + 1) * e]);
                if let Some(table) = position {
                    let p = positions[r];
                    add(row, &table[p * e..(p + 1) * e]);
                }
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
        let embed_mask = mask_of(&self.embed_dropout);
        if let Some(m) = &embed_mask {
            drop_rows(m, &mut x, &offsets, e);
        }
        let mut projected = Vec::new();
        if let Some(p) = &self.projection {
            let mut y = scratch(n * d);
            p.forward(&x, &mut y, n);
            projected = std::mem::replace(&mut x, y);
        }
        // Rotary layers' tables, as long as the longest sequence.
        let (rotaries, rotary_positions) = match self.layers.iter().any(|l| l.rotary.is_some()) {
            true => {
                let longest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
                let tables = self.thetas.iter();
                let tables = tables.map(|&theta| Rotary::new(longest, self.heads.dim, theta));
                (
                    tables.collect(),
                    positions.iter().map(|&p| p as u32).collect(),
                )
            }
            false => (Vec::new(), Vec::new()),
        };
        let mut tapes = Vec::with_capacity(self.order.len());
        let mut x_pairs = None;
        for (i, &l) in self.order.iter().enumerate() {
            let (layer, last) = (&self.layers[l], i + 1 == self.order.len());
            let packing =
                Packing::of_layer(&offsets, &keys, outputs.as_ref(), last).windowed(layer.window);
            let turn = layer.turn(&rotaries, &rotary_positions);
            let (y, y_pairs, tape) =
                self.layer_forward(layer, (x, x_pairs), (packing, !last, turn), &mask_of);
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
                rotaries,
                rotary_positions,
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
        (packing, pairs_out, turn): (Packing, bool, Option<Turn>),
        mask_of: &dyn Fn(&Dropout) -> Option<DropoutMask>,
    ) -> (Vec<f32>, Option<Vec<f32>>, LayerTape) {
        let (d, n) = (self.hidden, packing.offsets.last().copied().unwrap_or(0));
        let rows = packing.rows();
        let m = rows.count();
        let inter = layer.intermediate();
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
        // Pre-LN: the attention's input is normed (but in ModernBERT's
        // layer 0).
        let pre_norm = layer.attn_norm.as_ref().filter(|_| pre);
        if let Some(norm) = pre_norm {
            t.attn_in = scratch(n * d);
            match bf16 {
                true => {
                    let mut pairs = scratch(n * d.div_ceil(2));
                    let out = (&mut t.attn_in[..], as_words_mut(&mut pairs));
                    kernels::finish_norm_pairs(&mut x, out, norm.params(), |_, _| {});
                    in_pairs = Some(pairs);
                }
                false => norm.forward(&x, &mut t.attn_in),
            }
        }
        let attn_in = if pre_norm.is_some() { &t.attn_in } else { &x };
        // Rotated Q and K are made in fp32, then rounded by the products.
        let pairs = qkv_pairs(self.compute, self.heads) && turn.is_none();
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
            None => t.qkv = project(attn_in, x_words, layer.qkv.stacked(), n),
            Some(sel) => {
                let (w, b) = layer.qkv.stacked();
                let ((w_q, w_kv), (b_q, b_kv)) = (w.split_at(d * d), b.split_at(d));
                t.qkv = project(attn_in, x_words, (w_kv, b_kv), n);
                t.q_in = sel.gather(attn_in, d);
                let q_pairs = x_words.map(|p| sel.gather(p, d.div_ceil(2)));
                t.q = project(&t.q_in, q_pairs.as_deref(), (w_q, b_q), m);
                recycle(q_pairs.unwrap_or_default());
            }
        }
        recycle(in_pairs.unwrap_or_default());
        if let Some(turn) = turn {
            turn.rotate(&mut t.qkv, &mut t.q, packing.queries, d, false);
        }
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
            layer.post_attn_norm()
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
            _ if layer.glu => {
                // GeGLU, in either number format: `[input | gate]` with
                // the bias, the gated product and its dropout.
                t.f = self.compute.forward_new(&t.ffn_x, w_in, b_in, m);
                let mut g = scratch(m * inter);
                geglu::forward(&t.f, &mut g, inter, self.act);
                t.masks[2] = mask_of(&self.hidden_dropout);
                if let Some(mask) = &t.masks[2] {
                    drop_rows_of(mask, &mut g, rows, inter);
                }
                let o = layer.ffn_out.forward_new(&g, m);
                recycle(g);
                o
            }
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
        if !layer.glu {
            t.masks[2] = mask_of(&self.hidden_dropout);
        }
        if !layer.glu && (pre || !(bf16 && pairs_out)) {
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

    /// Every parameter, for returning gradients.
    pub fn params_mut(&mut self) -> Vec<&mut Param<'a>> {
        let mut out = vec![&mut self.word];
        out.extend(&mut self.position);
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
