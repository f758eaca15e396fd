//! The encoder's backward: from the gradient of the last hidden states,
//! each layer's in turn (top down), then the embeddings' LayerNorm and the
//! lookups' rows, into per-parameter gradients. It reads what the forward
//! pass kept on the [`Tape`] and hands each layer's buffers back to the
//! step's pool once that layer is done.

use rayon::prelude::*;

use super::{drop_rows, drop_rows_of, geglu, qkv_pairs, Encoder, Layer, LayerTape, Tape, Turn};
use crate::config::NormPosition;
use crate::fast::buffers::{add, copied, recycle, scratch, zeros};
use crate::fast::kernels::Act;
use crate::fast::matmul::{as_words, as_words_mut};
use crate::fast::train::attention::{self, Heads, Packing, Qkv, QkvGrad};
use crate::fast::train::products::{self, Compute, GradSink};
use crate::fast::train::rows::{Rows, Selection};
use crate::fast::train::GradTarget;
use crate::model::ops::{bias_act_backward, bias_act_forward, column_sums, grad_to_pairs};
use crate::model::DropoutMask;

impl<'a> Encoder<'a> {
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
            rotaries,
            rotary_positions,
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
            let packing = Packing::of_layer(&offsets, &keys, outputs.as_ref(), i + 1 == passes)
                .windowed(layer.window);
            let turn = layer.turn(&rotaries, &rotary_positions);
            dy = layer_backward(layer, &t, dy, (packing, turn), (d, heads, act, pre));
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
        if let Some(table) = &mut self.position {
            let live_positions = positions.iter().copied().enumerate();
            scatter_rows(
                &de,
                live_positions.filter(|&(_, p)| Some(p) != frozen),
                table.grad_mut(),
                e,
            );
        }
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
}

/// One layer's backward: the gradient of its input (every row) from that
/// of its output (the query rows); adds its parameters' gradients.
fn layer_backward(
    layer: &mut Layer,
    t: &LayerTape,
    dy: Vec<f32>,
    (packing, turn): (Packing, Option<Turn>),
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
    let mut ds1 = ds;
    let dffn_x = match layer.glu {
        true => glu_ffn_backward(layer, t, &ds1, rows, act),
        false => ffn_backward(layer, t, &ds1, rows, act),
    };
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
        layer.post_attn_norm_mut().backward(&t.s1, &ds1, &mut tmp);
        recycle(std::mem::replace(&mut ds1, tmp));
    }
    recycle(dffn_x);
    attention_backward(layer, t, ds1, (packing, turn), (d, heads, pre))
}

/// The FFN's backward from `ds`, the gradient of its output (before the
/// hidden dropout): its parameters' gradients, and the gradient of its
/// input returned. FFN-out's backward ends at the activation's input
/// gradient: in fp32 through the activation's output gradient `dg`; in
/// bf16 as the FFN-in products' pairs, made by the tiles of FFN-out's
/// input gradient.
fn ffn_backward(layer: &mut Layer, t: &LayerTape, ds: &[f32], rows: Rows, act: Act) -> Vec<f32> {
    let (m, d, inter) = (
        rows.count(),
        layer.ffn_norm.gamma.data.len(),
        layer.intermediate(),
    );
    let compute = layer.ffn_in.compute;
    let (mut dg, mut df_words, mut df_blocks) = (Vec::new(), Vec::new(), Vec::new());
    match compute {
        Compute::F32 => {
            dg = scratch(m * inter);
            let mut d_o = copied(ds);
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
            let dz = output_grad_pairs(ds, t.masks[2].as_ref(), rows, ffn_out.b.grad_mut());
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
    dffn_x
}

/// [`ffn_backward`] of a GeGLU FFN, in either number format: the gated
/// product recomputed from the tape's `[input | gate]` (and dropped as the
/// forward dropped it) for FFN-out's weight gradient, then GeGLU's
/// backward and FFN-in's.
fn glu_ffn_backward(
    layer: &mut Layer,
    t: &LayerTape,
    ds: &[f32],
    rows: Rows,
    act: Act,
) -> Vec<f32> {
    let (m, d, inter) = (
        rows.count(),
        layer.ffn_norm.gamma.data.len(),
        layer.intermediate(),
    );
    let mut g = scratch(m * inter);
    geglu::forward(&t.f, &mut g, inter, act);
    if let Some(mask) = &t.masks[2] {
        drop_rows_of(mask, &mut g, rows, inter);
    }
    let mut dg = scratch(m * inter);
    layer.ffn_out.backward(&g, ds, Some(&mut dg), m, false);
    recycle(g);
    if let Some(mask) = &t.masks[2] {
        drop_rows_of(mask, &mut dg, rows, inter);
    }
    let mut df = scratch(m * 2 * inter);
    geglu::backward(&t.f, &dg, &mut df, inter, act);
    recycle(dg);
    let mut dffn_x = scratch(m * d);
    layer
        .ffn_in
        .backward(&t.ffn_x, &df, Some(&mut dffn_x), m, false);
    recycle(df);
    dffn_x
}

/// The attention block's backward from `ds1`, the gradient of its
/// residual sum: its parameters' gradients, and the layer input's
/// gradient returned (every row).
fn attention_backward(
    layer: &mut Layer,
    t: &LayerTape,
    ds1: Vec<f32>,
    (packing, turn): (Packing, Option<Turn>),
    (d, heads, pre): (usize, Heads, bool),
) -> Vec<f32> {
    let n = packing.offsets.last().copied().unwrap_or(0);
    let rows = packing.rows();
    let m = rows.count();
    let compute = layer.ffn_in.compute;
    // s1 = dropout(ctx · Woᵀ + bo) + x
    let pairs = qkv_pairs(compute, heads) && turn.is_none();
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
    // Pre-LN: the attention's input was normed (but in ModernBERT's layer
    // 0).
    let normed = pre && layer.attn_norm.is_some();
    let attn_in = if normed { &t.attn_in } else { &t.x };
    // d(attention input), on every row: into dx directly without a norm.
    let mut dn1 = match normed {
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
                Qkv::fused(&t.qkv, d, pairs),
                &t.probs,
                &dctx,
                QkvGrad::fused(&mut dqkv, d),
                packing,
                (heads, compute),
                t.masks[0].as_ref().map(|m| (m, as_words(&t.attn_bits))),
            );
            recycle(dctx);
            if let Some(turn) = turn {
                turn.rotate(&mut dqkv, &mut [], None, d, true);
            }
            // Q, K, V: one multiply each way on the stacked weights.
            let (mut dw, mut db) = (scratch(3 * d * d), zeros(3 * d));
            let into = match &mut dn1 {
                Some(dn1) => (dn1.as_mut_slice(), false),
                None => (dx.as_mut_slice(), true),
            };
            linear_backward(
                compute,
                (&dqkv, attn_in),
                (layer.qkv.stacked().0, GradSink::Overwrite(&mut dw), &mut db),
                into,
                n,
            );
            layer.qkv.add_grads(&dw, &db, d);
            recycle(dw);
            recycle(dqkv);
        }
        Some(sel) => {
            // Q on the selected rows; K and V on every row (zero where no
            // query of their sequence looks).
            let mut dq = scratch(m * d);
            let mut dkv = zeros(n * 2 * d);
            attention::backward(
                Qkv::split(&t.q, &t.qkv, d, pairs),
                &t.probs,
                &dctx,
                QkvGrad::split(&mut dq, &mut dkv, d),
                packing,
                (heads, compute),
                t.masks[0].as_ref().map(|m| (m, as_words(&t.attn_bits))),
            );
            recycle(dctx);
            if let Some(turn) = turn {
                turn.rotate(&mut dkv, &mut dq, packing.queries, d, true);
            }
            // Q's gradients into the first D rows, K's and V's below.
            let (mut dw, mut db) = (scratch(3 * d * d), zeros(3 * d));
            let (w_q, w_kv) = layer.qkv.stacked().0.split_at(d * d);
            let (dw_q, dw_kv) = dw.split_at_mut(d * d);
            let (db_q, db_kv) = db.split_at_mut(d);
            let mut dq_in = scratch(m * d);
            let grads = (w_q, GradSink::Overwrite(dw_q), db_q);
            linear_backward(compute, (&dq, &t.q_in), grads, (&mut dq_in, false), m);
            let into = dn1.as_mut().unwrap_or(&mut dx);
            let grads = (w_kv, GradSink::Overwrite(dw_kv), db_kv);
            linear_backward(compute, (&dkv, attn_in), grads, (into, !normed), n);
            layer.qkv.add_grads(&dw, &db, d);
            recycle(dw);
            sel.scatter_add(&dq_in, into, d);
            recycle(dq_in);
            recycle(dq);
            recycle(dkv);
        }
    }
    if let (Some(dn1), Some(norm)) = (dn1, &mut layer.attn_norm) {
        let mut tmp = scratch(n * d);
        norm.backward(&t.x, &dn1, &mut tmp);
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
