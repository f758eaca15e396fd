//! ModernBERT on the packed fast path: its weights copied into a
//! [`PackedBert`] (fused `Wqkv`, no biases where it has none, layer 0
//! without `attn_norm`, pre-norm blocks, `final_norm`), and what its
//! layers do beyond BERT's: rotary positions on Q and K with the layer's
//! base θ, a sliding window on local layers, and the GeGLU FFN.

use rayon::prelude::*;

use super::kernels::{activate_body, multiversion, Act, ROWS_PER_TASK};
use super::packed::{flat, linear_of, norm_of, Layer, PackedBert, PackedEmbeddings};
use super::rope::Rotary;
use crate::config::{AttentionKind, ModernBertOptions, NormPosition};
use crate::error::Result;
use crate::model::family::modernbert::layers::ModernBertEncoder;
use crate::model::BertModel;

multiversion! {
    fn geglu_rows = geglu_rows_body(both: &[f32], out: &mut [f32], inter: usize, act: Act);
}

/// What ModernBERT's layers need beyond the packed BERT layers.
pub(crate) struct ModernParts {
    /// Each layer's attention: global or a sliding window.
    kinds: Vec<AttentionKind>,
    global: Rotary,
    local: Rotary,
    /// `local_attention / 2`: a local layer's query `i` sees `|i − j| ≤` it.
    half_window: usize,
}

impl ModernParts {
    /// Rotates Q and K of `qkv` with layer `l`'s base θ; returns the
    /// layer's half window (`None`: global attention).
    pub(crate) fn rotate(
        &self,
        l: usize,
        qkv: &mut [f32],
        offsets: &[usize],
        num_heads: usize,
    ) -> Option<usize> {
        match self.kinds[l] {
            AttentionKind::Full => {
                self.global.apply(qkv, offsets, num_heads);
                None
            }
            AttentionKind::Sliding => {
                self.local.apply(qkv, offsets, num_heads);
                Some(self.half_window)
            }
        }
    }
}

/// The packed form of a ModernBERT `model`; `None` when its encoder is
/// not ModernBERT's stack.
pub(super) fn pack(model: &BertModel, o: &ModernBertOptions) -> Result<Option<PackedBert>> {
    let Some(stack) = model
        .encoder
        .stack()
        .and_then(|s| s.as_any())
        .and_then(|a| a.downcast_ref::<ModernBertEncoder>())
    else {
        return Ok(None);
    };
    let cfg = model.config();
    let emb = &model.embeddings;
    if emb.position_embeddings.is_some() || emb.token_type_embeddings.is_some() {
        return Ok(None);
    }
    let layers = stack
        .layers
        .iter()
        .map(|l| {
            Ok(Layer {
                qkv: linear_of(&[&l.attn.wqkv])?,
                attn_out: linear_of(&[&l.attn.wo])?,
                attn_norm: l.attn_norm.as_ref().map(norm_of).transpose()?,
                ffn_in: linear_of(&[&l.mlp.wi])?,
                ffn_out: linear_of(&[&l.mlp.wo])?,
                ffn_norm: norm_of(&l.mlp_norm)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (positions, hd) = (cfg.max_position_embeddings, cfg.head_dim());
    let embeddings = PackedEmbeddings {
        word: flat(emb.word_embeddings.embeddings())?,
        vocab: cfg.vocab_size,
        width: cfg.hidden_size,
        position: None,
        max_positions: positions,
        positions_from: None,
        token_type: None,
        ignore_types: true,
        norm: emb.layer_norm.as_ref().map(norm_of).transpose()?,
        projection: None,
    };
    Ok(Some(PackedBert {
        hidden: cfg.hidden_size,
        num_heads: cfg.num_attention_heads,
        head_dim: hd,
        act: cfg.hidden_act.into(),
        norm_position: NormPosition::Pre,
        embeddings,
        order: (0..layers.len()).collect(),
        layers,
        final_norm: Some(norm_of(&stack.final_norm)?),
        pooler: None,
        modern: Some(ModernParts {
            kinds: o.layer_types.clone(),
            global: Rotary::new(positions, hd, o.global_rope_theta),
            local: Rotary::new(positions, hd, o.local_rope_theta),
            half_window: o.half_window(),
        }),
    }))
}

/// GeGLU: rows of `both` `[n, 2·I]` (FFN-in's input half, then its gate
/// half) into `out` `[n, I]` as `act(input) · gate`, `inter` = I.
pub(crate) fn geglu(both: &[f32], out: &mut [f32], inter: usize, act: Act) {
    let rows = out.len() / inter.max(1);
    assert!(
        out.len() == rows * inter && both.len() == 2 * out.len(),
        "geglu: the input is not [{rows}, {}] and the output [{rows}, {inter}]",
        2 * inter
    );
    if rows <= ROWS_PER_TASK {
        return geglu_rows(both, out, inter, act);
    }
    out.par_chunks_mut(inter * ROWS_PER_TASK)
        .zip(both.par_chunks(2 * inter * ROWS_PER_TASK))
        .for_each(|(o, b)| geglu_rows(b, o, inter, act));
}

#[inline(always)]
fn geglu_rows_body(both: &[f32], out: &mut [f32], inter: usize, act: Act) {
    for (o, b) in out
        .chunks_exact_mut(inter)
        .zip(both.chunks_exact(2 * inter))
    {
        let (input, gate) = b.split_at(inter);
        o.copy_from_slice(input);
        activate_body(o, act);
        for (v, g) in o.iter_mut().zip(gate) {
            *v *= g;
        }
    }
}
