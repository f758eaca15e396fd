//! DeBERTa-v2 (`model_type` `deberta-v2`), as transformers'
//! `modeling_deberta_v2.py`: BERT's post-LN layers with disentangled
//! self-attention. Besides content-to-content scores, each query attends
//! to the relative position of each key (c2p: `Q·K_r`) and each key to
//! the relative position of each query (p2c: `K·Q_r`); relative distances
//! are mapped to log buckets, and the relative embeddings
//! (`encoder.rel_embeddings`, normalised by `encoder.LayerNorm` when
//! `norm_rel_ebd` says so) are projected by the layer's own query/key
//! projections when `share_att_key` is set. There are no absolute
//! positions unless `position_biased_input`.
//!
//! Weight names: `deberta.embeddings.{word_embeddings,LayerNorm}`,
//! `deberta.encoder.layer.N.attention.self.{query_proj,key_proj,value_proj}`
//! (plus `pos_key_proj` / `pos_query_proj` without shared keys), the rest
//! as BERT.

use std::any::Any;
use std::sync::Arc;

use candle_core::{Device, Module, Result, Tensor};
use candle_nn::{Embedding, Init, VarBuilder};

use super::{FirstTokenHead, Layout, MlmNames};
use crate::config::{BertConfig, DebertaOptions, NormPosition};
use crate::model::bert::{
    BertAttention, BertEncoder, BertIntermediate, BertLayer, BertOutputBlock, BertSelfAttention,
    EmbeddingLayout, PassContext, PositionIds, ScoreBias, ScoreInput,
};
use crate::model::nn::{Dense, Dropout, LayerNorm};

pub(super) struct DebertaV2<'a>(pub(super) &'a DebertaOptions);

impl Layout for DebertaV2<'_> {
    /// No absolute positions unless `position_biased_input`; `embed_proj`;
    /// padding zeroed.
    fn embeddings(&self, _cfg: &BertConfig) -> EmbeddingLayout {
        EmbeddingLayout {
            position_ids: if self.0.position_biased_input {
                PositionIds::Absolute
            } else {
                PositionIds::None
            },
            project: true,
            mask_padding: true,
            ignore_token_types: false,
        }
    }

    /// The layers with disentangled attention, and `rel_embeddings`.
    fn load_encoder(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEncoder> {
        let vb = vb.pp("encoder");
        let o = self.0;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| load_layer(vb.pp(format!("layer.{i}")), cfg, o))
            .collect::<Result<_>>()?;
        let pass_context: Option<Arc<dyn PassContext>> = if o.relative_attention {
            Some(Arc::new(RelativeEmbeddings::load(vb.clone(), cfg, o)?))
        } else {
            None
        };
        Ok(BertEncoder {
            pass_context,
            ..BertEncoder::from_layers(layers)
        })
    }

    /// `lm_predictions.lm_head` (`cls.predictions` when `legacy`).
    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        let bert = MlmNames::bert(cfg);
        if self.0.legacy {
            return bert;
        }
        MlmNames {
            root: "lm_predictions.lm_head.",
            dense: "dense",
            norm: "LayerNorm",
            ..bert
        }
    }

    fn sequence_classifier(&self) -> [&'static str; 2] {
        ["pooler.dense.weight", "classifier.weight"]
    }

    fn classifier_reads_pooler(&self) -> bool {
        false
    }

    /// ContextPooler: dropout (`pooler_dropout`) → `pooler.dense` →
    /// `pooler_hidden_act` on the first token, then dropout (`cls_dropout`,
    /// else the hidden dropout) → `classifier`.
    fn first_token_head(&self, _cfg: &BertConfig) -> Option<FirstTokenHead> {
        Some(FirstTokenHead {
            dense: "pooler.dense",
            act: self.0.pooler_hidden_act,
            dropout: Some(self.0.pooler_dropout),
            out: "classifier",
        })
    }

    fn multiple_choice_reads_pooler(&self) -> bool {
        false
    }

    /// DebertaV2ForMultipleChoice: the ContextPooler, dropout and
    /// `classifier`, as its sequence classifier, with one output per
    /// choice.
    fn multiple_choice_head(&self, cfg: &BertConfig) -> Option<FirstTokenHead> {
        self.first_token_head(cfg)
    }

    /// DeBERTa's classifier has its own `pooler`.
    fn fresh_prefixes(&self) -> &'static [&'static str] {
        &["pooler."]
    }
}

/// transformers' `make_log_bucket_position` for one distance, in f32 as
/// torch computes it.
pub fn log_bucket_position(relative_pos: i64, bucket_size: usize, max_position: usize) -> i64 {
    let mid = (bucket_size / 2) as i64;
    let sign = relative_pos.signum();
    let abs_pos = if relative_pos < mid && relative_pos > -mid {
        mid - 1
    } else {
        relative_pos.abs()
    };
    if abs_pos <= mid {
        return relative_pos;
    }
    let ratio = (abs_pos as f32 / mid as f32).ln();
    let scale = ((max_position - 1) as f32 / mid as f32).ln();
    let log_pos = (ratio / scale * (mid - 1) as f32).ceil() + mid as f32;
    (log_pos * sign as f32) as i64
}

/// transformers' `build_relative_position(q, k)`: `[q][k]` is the
/// (bucketed) distance `q - k`.
pub fn relative_positions(len: usize, opts: &DebertaOptions) -> Vec<Vec<i64>> {
    (0..len as i64)
        .map(|q| {
            (0..len as i64)
                .map(|k| {
                    let rel = q - k;
                    if opts.position_buckets > 0 && opts.max_relative_positions > 0 {
                        log_bucket_position(rel, opts.position_buckets, opts.max_relative_positions)
                    } else {
                        rel
                    }
                })
                .collect()
        })
        .collect()
}

/// What every layer's attention shares in one forward pass.
#[derive(Debug, Clone)]
pub struct RelativeContext {
    /// [2 · span, D], normalised when the model says so.
    pub rel_embeddings: Tensor,
    /// [T, T] u32: `c2p_index[i][j]` = clamp(rel(i, j) + span) — the row of
    /// the position table that query `i` reads for key `j`.
    pub c2p_index: Tensor,
    /// [T, T] u32: `p2c_index[j][i]` = clamp(-rel(j, i) + span).
    pub p2c_index: Tensor,
}

/// `encoder.rel_embeddings` and `encoder.LayerNorm`.
#[derive(Debug, Clone)]
pub struct RelativeEmbeddings {
    pub(crate) embeddings: Embedding,
    pub(crate) layer_norm: Option<LayerNorm>,
    pub(crate) opts: DebertaOptions,
}

impl RelativeEmbeddings {
    pub fn load(vb: VarBuilder, cfg: &BertConfig, opts: &DebertaOptions) -> Result<Self> {
        let rows = 2 * opts.att_span();
        let w = vb.pp("rel_embeddings").get_with_hints(
            (rows, cfg.hidden_size),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: cfg.initializer_range,
            },
        )?;
        Ok(Self {
            embeddings: Embedding::new(w, cfg.hidden_size),
            layer_norm: LayerNorm::load_optional(
                opts.norm_rel_ebd,
                &vb,
                cfg.hidden_size,
                cfg.layer_norm_eps,
            )?,
            opts: opts.clone(),
        })
    }

    /// The shared tensors for sequences of `len` tokens.
    pub fn relative_context(&self, len: usize, device: &Device) -> Result<RelativeContext> {
        let mut rel = self.embeddings.embeddings().clone();
        if let Some(ln) = &self.layer_norm {
            rel = ln.forward(&rel)?;
        }
        let span = self.opts.att_span() as i64;
        let clamp = |x: i64| x.clamp(0, 2 * span - 1) as u32;
        let pos = relative_positions(len, &self.opts);
        let mut c2p = Vec::with_capacity(len * len);
        let mut p2c = Vec::with_capacity(len * len);
        for row in &pos {
            for &r in row {
                c2p.push(clamp(r + span));
                p2c.push(clamp(-r + span));
            }
        }
        Ok(RelativeContext {
            rel_embeddings: rel,
            c2p_index: Tensor::from_vec(c2p, (len, len), device)?,
            p2c_index: Tensor::from_vec(p2c, (len, len), device)?,
        })
    }
}

impl PassContext for RelativeEmbeddings {
    fn context(&self, len: usize, device: &Device) -> Result<Box<dyn Any>> {
        Ok(Box::new(self.relative_context(len, device)?))
    }
}

/// The position terms of one layer's disentangled attention.
#[derive(Debug, Clone)]
pub struct Disentangled {
    pub(crate) c2p: bool,
    pub(crate) p2c: bool,
    /// Own projections of the positions (absent with `share_att_key`).
    pub(crate) pos_key_proj: Option<Dense>,
    pub(crate) pos_query_proj: Option<Dense>,
    /// 1 + the number of position terms: scores are divided by
    /// sqrt(head_dim · scale_factor).
    pub(crate) scale_factor: usize,
    pub(crate) relative: bool,
    pub(crate) dropout: Dropout,
}

impl Disentangled {
    pub fn load(vb: VarBuilder, cfg: &BertConfig, opts: &DebertaOptions) -> Result<Self> {
        let d = cfg.hidden_size;
        let std = cfg.initializer_range;
        let own = opts.relative_attention && !opts.share_att_key;
        Ok(Self {
            c2p: opts.c2p,
            p2c: opts.p2c,
            pos_key_proj: if own && opts.c2p {
                Some(Dense::load(vb.pp("pos_key_proj"), d, d, std)?)
            } else {
                None
            },
            pos_query_proj: if own && opts.p2c {
                Some(Dense::load(vb.pp("pos_query_proj"), d, d, std)?)
            } else {
                None
            },
            scale_factor: 1 + usize::from(opts.c2p) + usize::from(opts.p2c),
            relative: opts.relative_attention,
            dropout: Dropout::new(cfg.hidden_dropout_prob),
        })
    }
}

impl ScoreBias for Disentangled {
    fn scale_factor(&self) -> usize {
        self.scale_factor
    }

    /// The c2p + p2c scores [B, H, T, T] for `q`, `k` [B, H, T, hd].
    fn bias(&self, scores: &ScoreInput) -> Result<Option<Tensor>> {
        let ScoreInput {
            attn,
            q,
            k,
            context,
            train,
        } = *scores;
        if !self.relative || !(self.c2p || self.p2c) {
            return Ok(None);
        }
        let Some(rel) = context.downcast_ref::<RelativeContext>() else {
            candle_core::bail!("DeBERTa's attention needs its relative-position context");
        };
        let (b, h, t, hd) = q.dims4()?;
        let rel_emb = self.dropout.forward_shared(&rel.rel_embeddings, train)?;
        let rows = rel_emb.dim(0)?;
        // [2S, D] → [1, H, 2S, hd]
        let heads = |y: Tensor| -> Result<Tensor> {
            y.reshape((rows, h, hd))?
                .transpose(0, 1)?
                .contiguous()?
                .unsqueeze(0)
        };
        let scale = ((hd * self.scale_factor) as f64).sqrt();
        let mut score: Option<Tensor> = None;
        if self.c2p {
            let proj = self.pos_key_proj.as_ref().unwrap_or(&attn.key);
            let pos_key = heads(proj.forward(&rel_emb)?)?;
            let att = q.broadcast_matmul(&pos_key.t()?)?.contiguous()?; // [B,H,T,2S]
            let index = rel.c2p_index.broadcast_as((b, h, t, t))?.contiguous()?;
            let c2p = (att.gather(&index, 3)? / scale)?;
            score = Some(c2p);
        }
        if self.p2c {
            let proj = self.pos_query_proj.as_ref().unwrap_or(&attn.query);
            let pos_query = heads(proj.forward(&rel_emb)?)?;
            let att = k.broadcast_matmul(&pos_query.t()?)?.contiguous()?; // [B,H,Tk,2S]
            let index = rel.p2c_index.broadcast_as((b, h, t, t))?.contiguous()?;
            let p2c = (att.gather(&index, 3)?.transpose(2, 3)? / scale)?;
            score = Some(match score {
                Some(s) => (s + p2c)?,
                None => p2c,
            });
        }
        Ok(score)
    }
}

/// `encoder.layer.N` of DeBERTa-v2: BERT's layer with `query_proj`,
/// `key_proj`, `value_proj` and the disentangled terms.
fn load_layer(vb: VarBuilder, cfg: &BertConfig, opts: &DebertaOptions) -> Result<BertLayer> {
    let sa = vb.pp("attention").pp("self");
    let mut self_attention =
        BertSelfAttention::load_named(sa.clone(), cfg, ["query_proj", "key_proj", "value_proj"])?;
    self_attention.score_bias = Some(Arc::new(Disentangled::load(sa, cfg, opts)?));
    let out = vb.pp("attention").pp("output");
    Ok(BertLayer::post_ln(
        BertAttention::from_parts(
            self_attention,
            out.pp("dense"),
            out.pp("LayerNorm"),
            cfg,
            (cfg.hidden_dropout_prob, NormPosition::Post),
        )?,
        BertIntermediate::load(vb.pp("intermediate"), cfg)?,
        BertOutputBlock::load(vb.pp("output"), cfg)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_buckets_match_transformers() {
        // Values from transformers' make_log_bucket_position(bucket 16, max 64).
        let b = |r| log_bucket_position(r, 16, 64);
        assert_eq!((b(0), b(7), b(8), b(-8)), (0, 7, 8, -8));
        assert_eq!((b(9), b(11), b(-11)), (9, 10, -10));
        assert_eq!(b(63), 15);
    }
}
