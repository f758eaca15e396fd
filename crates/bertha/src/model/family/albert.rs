//! ALBERT (`model_type` `albert`): factorised embeddings (`embedding_size`
//! wide, projected to `hidden_size` by
//! `encoder.embedding_hidden_mapping_in`) and cross-layer sharing: the
//! `num_hidden_layers` steps reuse `num_hidden_groups` groups of
//! `inner_group_num` layers, step i running group
//! `⌊i / (num_hidden_layers / num_hidden_groups)⌋`.
//!
//! A layer is `albert.encoder.albert_layer_groups.G.albert_layers.I` with
//! `attention.{query,key,value,dense,LayerNorm}`, `ffn`, `ffn_output` and
//! `full_layer_layer_norm` — BERT's post-LN layer under other names. The
//! MLM head is `predictions.{dense,LayerNorm,decoder,bias}`, mapping the
//! hidden size back to `embedding_size` before the tied decoder.

use candle_core::Result;
use candle_nn::VarBuilder;

use super::{Layout, MlmNames};
use crate::config::{AlbertOptions, BertConfig, NormPosition};
use crate::model::bert::{
    BertAttention, BertEncoder, BertIntermediate, BertLayer, BertOutputBlock, BertSelfAttention,
};
use crate::model::nn::Dense;

pub(super) struct Albert<'a>(pub(super) &'a AlbertOptions);

impl Layout for Albert<'_> {
    /// The shared layer groups and `embedding_hidden_mapping_in`.
    fn load_encoder(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEncoder> {
        let vb = vb.pp("encoder");
        let a = self.0;
        let (layers, steps) = load_layers(vb.clone(), cfg, a)?;
        let input_projection = Dense::load(
            vb.pp("embedding_hidden_mapping_in"),
            a.embedding_size,
            cfg.hidden_size,
            cfg.initializer_range,
        )?;
        Ok(BertEncoder {
            steps,
            input_projection: Some(input_projection),
            ..BertEncoder::from_layers(layers)
        })
    }

    /// `albert.pooler` is the dense layer itself (`AlbertModel.pooler`
    /// is an `nn.Linear`).
    fn pooler_dense(&self) -> &'static str {
        "pooler"
    }

    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        MlmNames {
            root: "predictions.",
            dense: "dense",
            norm: "LayerNorm",
            width: self.0.embedding_size,
            ..MlmNames::bert(cfg)
        }
    }
}

/// One `albert_layers.I`.
fn load_layer(vb: VarBuilder, cfg: &BertConfig) -> Result<BertLayer> {
    let att = vb.pp("attention");
    Ok(BertLayer::post_ln(
        BertAttention::from_parts(
            BertSelfAttention::load(att.clone(), cfg)?,
            att.pp("dense"),
            att.pp("LayerNorm"),
            cfg,
            (cfg.hidden_dropout_prob, NormPosition::Post),
        )?,
        BertIntermediate::load_at(vb.pp("ffn"), cfg)?,
        BertOutputBlock::load_at(vb.pp("ffn_output"), vb.pp("full_layer_layer_norm"), cfg)?,
    ))
}

/// The group index of step `i`, as transformers computes it.
pub fn group_of_step(i: usize, num_layers: usize, num_groups: usize) -> usize {
    let per_group = num_layers as f64 / num_groups as f64;
    ((i as f64 / per_group) as usize).min(num_groups - 1)
}

/// All distinct layers (group-major) and, per step, the layers it runs.
fn load_layers(
    vb: VarBuilder,
    cfg: &BertConfig,
    a: &AlbertOptions,
) -> Result<(Vec<BertLayer>, Vec<Vec<usize>>)> {
    let mut layers = Vec::with_capacity(a.num_hidden_groups * a.inner_group_num);
    for g in 0..a.num_hidden_groups {
        for i in 0..a.inner_group_num {
            layers.push(load_layer(
                vb.pp(format!("albert_layer_groups.{g}.albert_layers.{i}")),
                cfg,
            )?);
        }
    }
    let steps = (0..cfg.num_hidden_layers)
        .map(|s| {
            let g = group_of_step(s, cfg.num_hidden_layers, a.num_hidden_groups);
            (g * a.inner_group_num..(g + 1) * a.inner_group_num).collect()
        })
        .collect();
    Ok((layers, steps))
}

#[cfg(test)]
mod tests {
    use super::group_of_step;

    #[test]
    fn steps_share_groups_like_transformers() {
        let groups: Vec<usize> = (0..12).map(|i| group_of_step(i, 12, 1)).collect();
        assert_eq!(groups, vec![0; 12]);
        let groups: Vec<usize> = (0..6).map(|i| group_of_step(i, 6, 2)).collect();
        assert_eq!(groups, vec![0, 0, 0, 1, 1, 1]);
        let groups: Vec<usize> = (0..5).map(|i| group_of_step(i, 5, 2)).collect();
        assert_eq!(groups, vec![0, 0, 0, 1, 1]);
    }
}
