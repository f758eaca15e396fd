//! One encoder layer's parameters ([`Layer`]: BERT's or ModernBERT's),
//! what its forward pass keeps for the backward ([`LayerTape`]), and the
//! rotary turn of a ModernBERT layer's Q and K ([`Turn`]).

use super::super::rows::Selection;
use super::super::Param;
use super::{Linear, Norm};
use crate::fast::buffers::recycle;
use crate::fast::rope::{Rotary, Span};
use crate::model::DropoutMask;

pub(super) struct Layer<'a> {
    pub(super) qkv: QkvParams<'a>,
    pub(super) attn_out: Linear<'a>,
    /// Absent in ModernBERT's layer 0 (the embeddings' norm precedes it);
    /// post-LN layers always have it.
    pub(super) attn_norm: Option<Norm<'a>>,
    pub(super) ffn_in: Linear<'a>,
    pub(super) ffn_out: Linear<'a>,
    pub(super) ffn_norm: Norm<'a>,
    /// GeGLU (ModernBERT): FFN-in makes `[input | gate]`, FFN-out reads
    /// `act(input) · gate`, and the hidden dropout falls on that product
    /// instead of FFN-out's output.
    pub(super) glu: bool,
    /// The rotary base (an index into the encoder's `thetas`) turning Q
    /// and K where they are made.
    pub(super) rotary: Option<usize>,
    /// A sliding layer's half window: query `i` sees keys `|i − j| ≤ w`.
    pub(super) window: Option<usize>,
}

/// Q, K and V's parameters: BERT's three linear layers (`query`, `key`,
/// `value`), or ModernBERT's one `Wqkv` holding them stacked.
pub(super) struct QkvParams<'a> {
    parts: Vec<Linear<'a>>,
    /// Separate layers' weights stacked `[3·D, D]` and biases `[3·D]`, for
    /// the one multiply each way (a fused `Wqkv` is read in place).
    stacked: Option<(Vec<f32>, Vec<f32>)>,
}

impl<'a> QkvParams<'a> {
    /// `parts`: Q, K and V's layers, or the one fused layer.
    pub(super) fn new(parts: Vec<Linear<'a>>) -> Self {
        let stacked = (parts.len() > 1).then(|| {
            let w: Vec<&[f32]> = parts.iter().map(|l| &l.w.data[..]).collect();
            let b: Vec<&[f32]> = parts.iter().map(|l| &l.b.data[..]).collect();
            (w.concat(), b.concat())
        });
        Self { parts, stacked }
    }

    /// The weights `[3·D, D]` and biases `[3·D]` of Q, K and V, stacked.
    pub(super) fn stacked(&self) -> (&[f32], &[f32]) {
        match (&self.stacked, self.parts.first()) {
            (Some((w, b)), _) => (w, b),
            (None, Some(fused)) => (&fused.w.data, &fused.b.data),
            (None, None) => (&[], &[]),
        }
    }

    pub(super) fn linears_mut(&mut self) -> Vec<&mut Linear<'a>> {
        self.parts.iter_mut().collect()
    }

    /// Adds the stacked gradients of Q, K and V: `dw` `[3·D, D]` and `db`
    /// `[3·D]` (a fused `Wqkv` takes them whole).
    pub(super) fn add_grads(&mut self, dw: &[f32], db: &[f32], d: usize) {
        match &mut self.parts[..] {
            [fused] => {
                fused.w.add_grad(dw);
                fused.b.add_grad(db);
            }
            parts => {
                let each = dw.chunks(d * d).zip(db.chunks(d));
                for (lin, (w, b)) in parts.iter_mut().zip(each) {
                    lin.w.add_grad(w);
                    lin.b.add_grad(b);
                }
            }
        }
    }
}

impl<'a> Layer<'a> {
    /// Its linear layers, in checkpoint order.
    pub(super) fn linears_mut(&mut self) -> Vec<&mut Linear<'a>> {
        let mut out = self.qkv.linears_mut();
        out.extend([&mut self.attn_out, &mut self.ffn_in, &mut self.ffn_out]);
        out
    }

    /// Its parameters: each linear's weight and bias, then the
    /// LayerNorms'.
    pub(super) fn params_mut(&mut self) -> Vec<&mut Param<'a>> {
        let Layer {
            qkv,
            attn_out,
            attn_norm,
            ffn_in,
            ffn_out,
            ffn_norm,
            ..
        } = self;
        let mut out = Vec::with_capacity(16);
        let mut linears = qkv.linears_mut();
        linears.extend([attn_out, ffn_in, ffn_out]);
        for lin in linears {
            out.extend([&mut lin.w, &mut lin.b]);
        }
        if let Some(n) = attn_norm {
            out.extend([&mut n.gamma, &mut n.beta]);
        }
        out.extend([&mut ffn_norm.gamma, &mut ffn_norm.beta]);
        out
    }

    /// The FFN's intermediate width (GeGLU: half of FFN-in's outputs).
    pub(super) fn intermediate(&self) -> usize {
        match self.glu {
            true => self.ffn_in.out_dim() / 2,
            false => self.ffn_in.out_dim(),
        }
    }

    /// Its rotary turn: its base's table in `tables` (the encoder's
    /// `thetas` order), with every packed row's position.
    pub(super) fn turn<'t>(&self, tables: &'t [Rotary], positions: &'t [u32]) -> Option<Turn<'t>> {
        let table = tables.get(self.rotary?)?;
        Some(Turn { table, positions })
    }

    /// The norm after attention's residual sum in a post-LN layer.
    pub(super) fn post_attn_norm(&self) -> &Norm<'a> {
        // Post-LN layers are built with it (`Encoder::of`).
        self.attn_norm
            .as_ref()
            .expect("a post-LN layer has its attention LayerNorm")
    }

    /// [`Layer::post_attn_norm`], for its backward.
    pub(super) fn post_attn_norm_mut(&mut self) -> &mut Norm<'a> {
        self.attn_norm
            .as_mut()
            .expect("a post-LN layer has its attention LayerNorm")
    }
}

/// One layer's saved activations (see the module docs).
#[derive(Default)]
pub(super) struct LayerTape {
    /// The layer's input.
    pub(super) x: Vec<f32>,
    /// Pre-LN: the attention LayerNorm's output (the Q/K/V input); post-LN
    /// reads `x`.
    pub(super) attn_in: Vec<f32>,
    /// The fused Q/K/V rows `[T, 3·D]`; in a layer with a selection, K and
    /// V `[T, 2·D]`, beside the selected rows' Q `[M, D]` and its input.
    pub(super) qkv: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) q_in: Vec<f32>,
    pub(super) probs: Vec<f32>,
    /// The attention dropout's keep bits (words of fp32 storage), as the
    /// forward drew them.
    pub(super) attn_bits: Vec<f32>,
    pub(super) ctx: Vec<f32>,
    /// attention output + residual: a LayerNorm's input in both placements.
    pub(super) s1: Vec<f32>,
    /// The FFN's input.
    pub(super) ffn_x: Vec<f32>,
    /// fp32: the FFN expansion before bias and activation; bf16: the
    /// activation's slopes `act'(f + b)` there, all its backward reads.
    /// GeGLU: `[input | gate]` with the bias, in both.
    pub(super) f: Vec<f32>,
    /// bf16: the activation's output as FFN-out's weight gradient reads
    /// it (a right operand's bf16 panels in fp32-sized words, stored by
    /// FFN-in's tiles); fp32 recomputes it from `f`.
    pub(super) g: Vec<f32>,
    /// Post-LN: FFN output + residual, the output LayerNorm's input.
    pub(super) s2: Vec<f32>,
    pub(super) masks: [Option<DropoutMask>; 3],
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

/// A rotary layer's table and each packed row's position.
#[derive(Clone, Copy)]
pub(super) struct Turn<'t> {
    pub(super) table: &'t Rotary,
    pub(super) positions: &'t [u32],
}

impl Turn<'_> {
    /// Turns Q and K where the QKV products put them (`inverse`: their
    /// gradients back): the fused rows `[T, 3·D]` in `qkv`, or, with
    /// `queries`, K in `qkv`'s `[T, 2·D]` rows and the selected rows' Q
    /// `[M, D]` in `q`.
    pub(super) fn rotate(
        &self,
        qkv: &mut [f32],
        q: &mut [f32],
        queries: Option<&Selection>,
        d: usize,
        inverse: bool,
    ) {
        let span = |width, columns| Span {
            width,
            columns,
            inverse,
        };
        match queries {
            None => self.table.rotate(qkv, self.positions, span(3 * d, 2 * d)),
            Some(sel) => {
                self.table.rotate(qkv, self.positions, span(2 * d, d));
                let at: Vec<u32> = (0..sel.len()).map(|i| sel.key(i)[1] as u32).collect();
                self.table.rotate(q, &at, span(d, d));
            }
        }
    }
}
