//! `embeddings`: word + learned position (+ token type), LayerNorm, dropout.
//! What a family varies is an [`EmbeddingLayout`]: offset positions
//! (RoBERTa), none, a projection and a padding mask (DeBERTa); ALBERT's
//! narrower width comes from `embedding_size`.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{Embedding, Init, VarBuilder};

use crate::config::BertConfig;
use crate::model::nn::{Dense, Dropout, LayerNorm};

/// `nn.Embedding(padding_idx=...)`: the rows of `ids`, where positions
/// holding `padding_idx` read a detached copy of its row, so that no
/// gradient reaches it (the values are the same).
fn lookup(table: &Embedding, ids: &Tensor, padding_idx: u32) -> Result<Tensor> {
    let ids = ids.to_dtype(DType::U32)?;
    let live = table.forward(&ids)?;
    let is_pad = ids.eq(padding_idx)?;
    if is_pad.max_all()?.to_scalar::<u8>()? == 0 {
        return Ok(live);
    }
    let frozen = Embedding::new(table.embeddings().detach(), live.dim(D::Minus1)?).forward(&ids)?;
    is_pad
        .unsqueeze(D::Minus1)?
        .broadcast_as(live.shape())?
        .where_cond(&frozen, &live)
}

/// How position ids are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionIds {
    /// `0..T` (BERT, DistilBERT, ALBERT).
    Absolute,
    /// RoBERTa's `create_position_ids_from_input_ids`: non-padding tokens
    /// count from `padding_idx + 1`, padding tokens get `padding_idx`.
    FromPadding { padding_idx: u32 },
    /// No position embeddings (DeBERTa with `position_biased_input` false).
    None,
}

/// RoBERTa's position ids for `input_ids` [B, T]: each non-padding token
/// gets `padding_idx` + its 1-based rank among the non-padding tokens of
/// its row; padding tokens get `padding_idx`.
pub fn roberta_position_ids(input_ids: &Tensor, padding_idx: u32) -> Result<Tensor> {
    let (b, t) = input_ids.dims2()?;
    let ids = input_ids.to_dtype(DType::U32)?.to_vec2::<u32>()?;
    let mut out = Vec::with_capacity(b * t);
    for row in ids {
        let mut count = 0u32;
        for id in row {
            if id == padding_idx {
                out.push(padding_idx);
            } else {
                count += 1;
                out.push(padding_idx + count);
            }
        }
    }
    Tensor::from_vec(out, (b, t), input_ids.device())
}

/// The choices a family makes about its embeddings (BERT's: the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingLayout {
    pub position_ids: PositionIds,
    /// An `embed_proj` from `embedding_size` to `hidden_size` before the
    /// LayerNorm, when they differ (DeBERTa).
    pub project: bool,
    /// Zero the embeddings of padding tokens (DeBERTa).
    pub mask_padding: bool,
    /// Read all token types as 0 (RoBERTa-style models whose tokenizers
    /// give none).
    pub ignore_token_types: bool,
}

impl Default for EmbeddingLayout {
    fn default() -> Self {
        Self {
            position_ids: PositionIds::Absolute,
            project: false,
            mask_padding: false,
            ignore_token_types: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BertEmbeddings {
    pub(crate) word_embeddings: Embedding,
    /// Absent for DeBERTa without `position_biased_input`.
    pub(crate) position_embeddings: Option<Embedding>,
    pub(crate) position_ids: PositionIds,
    /// DeBERTa's `embed_proj` (before the LayerNorm), when
    /// `embedding_size` differs from `hidden_size`.
    pub(crate) projection: Option<Dense>,
    /// DeBERTa zeroes the embeddings of padding tokens.
    pub(crate) mask_padding: bool,
    /// RoBERTa-style models whose tokenizers give no token types: type
    /// ids from a WordPiece pair encoding are ignored (all 0).
    pub(crate) ignore_token_types: bool,
    /// transformers' `padding_idx` of the word embeddings: lookups of this
    /// id pass no gradient back to its row.
    pub(crate) padding_idx: u32,
    /// Absent when `type_vocab_size` is 0 (the seed's mini BERT).
    pub(crate) token_type_embeddings: Option<Embedding>,
    /// Absent when `embedding_layer_norm` is false.
    pub(crate) layer_norm: Option<LayerNorm>,
    pub(crate) dropout: Dropout,
    max_positions: usize,
}

fn embedding(vb: VarBuilder, rows: usize, dim: usize, std: f64) -> Result<Embedding> {
    let w = vb.get_with_hints(
        (rows, dim),
        "weight",
        Init::Randn {
            mean: 0.0,
            stdev: std,
        },
    )?;
    Ok(Embedding::new(w, dim))
}

impl BertEmbeddings {
    /// BERT's embeddings.
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Self::load_with(vb, cfg, EmbeddingLayout::default())
    }

    /// The embeddings as a family lays them out.
    pub fn load_with(vb: VarBuilder, cfg: &BertConfig, layout: EmbeddingLayout) -> Result<Self> {
        let d = cfg.hidden_size;
        let e = cfg.embedding_size();
        let std = cfg.initializer_range;
        let position_ids = layout.position_ids;
        let projection = if layout.project && e != d {
            let w = vb.pp("embed_proj").get_with_hints(
                (d, e),
                "weight",
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            )?;
            Some(Dense::new(w, None))
        } else {
            None
        };
        // The LayerNorm is over the embedding width, before any projection
        // (ALBERT's projection lives in its encoder); DeBERTa projects first.
        let norm_dim = if projection.is_some() { d } else { e };
        Ok(Self {
            word_embeddings: embedding(vb.pp("word_embeddings"), cfg.vocab_size, e, std)?,
            position_embeddings: if position_ids == PositionIds::None {
                None
            } else {
                Some(embedding(
                    vb.pp("position_embeddings"),
                    cfg.max_position_embeddings,
                    e,
                    std,
                )?)
            },
            position_ids,
            projection,
            mask_padding: layout.mask_padding,
            ignore_token_types: layout.ignore_token_types,
            padding_idx: cfg.pad_token_id,
            token_type_embeddings: if cfg.type_vocab_size > 0 {
                Some(embedding(
                    vb.pp("token_type_embeddings"),
                    cfg.type_vocab_size,
                    e,
                    std,
                )?)
            } else {
                None
            },
            layer_norm: LayerNorm::load_optional(
                cfg.embedding_layer_norm,
                &vb,
                norm_dim,
                cfg.layer_norm_eps,
            )?,
            dropout: Dropout::new(cfg.hidden_dropout_prob),
            max_positions: cfg.max_position_embeddings,
        })
    }

    /// Word embeddings only (no positions, no token types), then an
    /// optional LayerNorm and dropout: a family that loads its own
    /// (ModernBERT's `tok_embeddings` and bias-free `norm`).
    pub(crate) fn words_only(
        word_embeddings: Embedding,
        layer_norm: Option<LayerNorm>,
        dropout: Dropout,
        padding_idx: u32,
    ) -> Self {
        Self {
            word_embeddings,
            position_embeddings: None,
            position_ids: PositionIds::None,
            projection: None,
            mask_padding: false,
            ignore_token_types: false,
            padding_idx,
            token_type_embeddings: None,
            layer_norm,
            dropout,
            max_positions: usize::MAX,
        }
    }

    /// The word-embedding matrix [vocab, hidden] (tied to the MLM decoder).
    pub fn word_embeddings(&self) -> &Tensor {
        self.word_embeddings.embeddings()
    }

    /// `input_ids` and `token_type_ids` are [batch, seq] u32.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor> {
        self.forward_masked(input_ids, token_type_ids, None, train)
    }

    /// As [`forward`](Self::forward), with the attention mask [B, T]
    /// (1 for tokens, 0 for padding) for the models that use it here.
    pub fn forward_masked(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor> {
        let (_, seq_len) = input_ids.dims2()?;
        let mut x = lookup(&self.word_embeddings, input_ids, self.padding_idx)?;
        if let Some(pe) = &self.position_embeddings {
            match self.position_ids {
                PositionIds::FromPadding { padding_idx } => {
                    let positions = roberta_position_ids(input_ids, padding_idx)?;
                    let last = padding_idx as usize + seq_len;
                    if last >= self.max_positions {
                        candle_core::bail!(
                            "sequence of {seq_len} tokens needs position {last}, beyond max_position_embeddings {}",
                            self.max_positions
                        );
                    }
                    // RoBERTa's position table has the same padding_idx.
                    x = (x + lookup(pe, &positions, padding_idx)?)?;
                }
                _ => {
                    if seq_len > self.max_positions {
                        candle_core::bail!(
                            "sequence of {seq_len} tokens is longer than max_position_embeddings {}",
                            self.max_positions
                        );
                    }
                    let positions = Tensor::arange(0u32, seq_len as u32, input_ids.device())?;
                    x = x.broadcast_add(&pe.forward(&positions)?)?;
                }
            }
        }
        if let Some(tt) = &self.token_type_embeddings {
            let types = match token_type_ids {
                Some(t) if !self.ignore_token_types => t.to_dtype(DType::U32)?,
                _ => input_ids.zeros_like()?.to_dtype(DType::U32)?,
            };
            x = (x + tt.forward(&types)?)?;
        }
        if let Some(p) = &self.projection {
            x = p.forward(&x)?;
        }
        if let Some(ln) = &self.layer_norm {
            x = ln.forward(&x)?;
        }
        if self.mask_padding {
            if let Some(m) = attention_mask {
                x = x.broadcast_mul(&m.to_dtype(x.dtype())?.unsqueeze(2)?)?;
            }
        }
        self.dropout.forward(&x, train)
    }
}
