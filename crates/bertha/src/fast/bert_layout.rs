//! Which models the fast paths run on BERT's layers, and what they read
//! of them beyond BERT's: one rule for the packed inference model
//! (`fast::packed`) and the training encoder (`fast::train`), so that
//! `--engine auto` means the same families at inference and in training.
//!
//! Covered: BERT itself, RoBERTa (positions counted from the padding id,
//! token types ignored when it has one type), DistilBERT (no token
//! types), ELECTRA (embeddings projected to the hidden size when
//! narrower) and ALBERT (embeddings projected, layers shared across
//! steps). Not covered: DeBERTa-v2 (relative attention through the layers'
//! pass context, padding masked in the embeddings) and ModernBERT, which
//! has its own layers and its own packing (`fast::modernbert`).

use candle_nn::Embedding;

use crate::config::Family;
use crate::model::{BertModel, Dense, PositionIds};

/// What a covered model's encoder reads besides BERT's tables and layers.
pub(crate) struct BertLayout<'a> {
    /// The stored layer each step runs, in order: `0..L` for BERT, the
    /// shared layers again and again for ALBERT.
    pub(crate) order: Vec<usize>,
    /// RoBERTa: each non-padding token's position is `padding_idx` + its
    /// rank (from 1), a padding token's `padding_idx`.
    pub(crate) positions_from: Option<u32>,
    /// ELECTRA's `embeddings_project` / ALBERT's
    /// `embedding_hidden_mapping_in`, after the embeddings' LayerNorm.
    pub(crate) projection: Option<&'a Dense>,
    pub(crate) position: &'a Embedding,
}

/// The layout of `model` when its family is covered (see the module's
/// documentation); `None` otherwise. The device is the caller's to check.
pub(crate) fn bert_layout(model: &BertModel) -> Option<BertLayout<'_>> {
    let family = &model.config().family;
    let projects = matches!(family, Family::Electra(_) | Family::Albert(_));
    let covered =
        family.is_bert() || projects || matches!(family, Family::Roberta | Family::DistilBert(_));
    let encoder = &model.encoder;
    if !covered || (encoder.input_projection.is_some() && !projects) {
        return None;
    }
    let order = encoder.layer_order()?;
    let emb = &model.embeddings;
    let position = emb.position_embeddings.as_ref()?;
    if emb.projection.is_some() || emb.mask_padding {
        return None;
    }
    let positions_from = match emb.position_ids {
        PositionIds::Absolute => None,
        PositionIds::FromPadding { padding_idx } if padding_idx == emb.padding_idx => {
            Some(padding_idx)
        }
        _ => return None,
    };
    Some(BertLayout {
        order,
        positions_from,
        projection: encoder.input_projection.as_ref(),
        position,
    })
}

/// The position of token `id` at index `p` of its text: `p`, or with
/// RoBERTa's positions (`from`: its padding id) `padding_idx` for the
/// padding id and `padding_idx` + its rank among the text's other tokens
/// (`rank`: those seen so far, counted here) for the rest.
pub(crate) fn position(from: Option<u32>, id: u32, p: usize, rank: &mut usize) -> usize {
    match from {
        Some(pad) if id == pad => pad as usize,
        Some(pad) => {
            *rank += 1;
            pad as usize + *rank
        }
        None => p,
    }
}
