//! The transformers pipelines beyond TEI: `/fill-mask`, `/ner`, `/qa` and
//! `/attention`, each run off the async runtime in the task slots.

use axum::extract::State;
use axum::Json;
use bertha::tasks::{Aggregation, Answer, Entity, MaskPrediction, QaBounds, QaOptions};
use serde::{Deserialize, Serialize};

use super::{
    admit, blocking, head_missing, tokenize, AppResult, Body, OneOrMany, Shared,
    TruncationDirection,
};
use crate::error::ApiError;
use crate::work::StopOnDrop;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FillMaskRequest {
    inputs: String,
    #[serde(default = "five")]
    top_k: usize,
}

fn five() -> usize {
    5
}

/// `POST /fill-mask` → per mask, the `top_k` candidates (transformers'
/// fill-mask fields: score, token, token_str, sequence).
pub async fn fill_mask(
    State(state): Shared,
    Body(req): Body<FillMaskRequest>,
) -> AppResult<Json<Vec<Vec<MaskPrediction>>>> {
    let _permit = admit(&state)?;
    let fm = state
        .fill_mask()
        .map_err(|e| head_missing("fill masks", e))?;
    let out = blocking(&state, move || {
        fm.fill(&req.inputs, req.top_k).map_err(ApiError::from)
    })
    .await?;
    Ok(Json(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NerRequest {
    inputs: String,
    #[serde(default)]
    aggregation_strategy: Option<String>,
}

/// `POST /ner` → entities (transformers' token-classification fields).
pub async fn ner(
    State(state): Shared,
    Body(req): Body<NerRequest>,
) -> AppResult<Json<Vec<Entity>>> {
    let _permit = admit(&state)?;
    let tc = state.ner().map_err(|e| head_missing("tag entities", e))?;
    let agg: Aggregation = req
        .aggregation_strategy
        .as_deref()
        .unwrap_or("simple")
        .parse()
        .map_err(|e: bertha::Error| ApiError::validation(e.to_string()))?;
    let out = blocking(&state, move || {
        tc.entities(&req.inputs, agg).map_err(ApiError::from)
    })
    .await?;
    Ok(Json(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QaRequest {
    question: String,
    context: String,
    #[serde(default = "one")]
    top_k: usize,
    #[serde(default = "fifteen")]
    max_answer_len: usize,
    doc_stride: Option<usize>,
}

fn one() -> usize {
    1
}

fn fifteen() -> usize {
    15
}

/// Most answers one /qa request may ask for: the answers kept while a long
/// context is read grow with it, and so does the response.
const MAX_QA_TOP_K: usize = 1000;

/// `POST /qa` → `{answer, score, start, end}` (a list when `top_k` > 1).
pub async fn qa(
    State(state): Shared,
    Body(req): Body<QaRequest>,
) -> AppResult<Json<OneOrMany<Answer>>> {
    let _permit = admit(&state)?;
    if req.top_k > MAX_QA_TOP_K {
        return Err(ApiError::validation(format!(
            "`top_k` must be at most {MAX_QA_TOP_K}; given {}",
            req.top_k
        )));
    }
    let model = state
        .qa()
        .map_err(|e| head_missing("answer questions", e))?;
    let opts = QaOptions {
        top_k: req.top_k,
        max_answer_len: req.max_answer_len,
        doc_stride: req.doc_stride,
        max_seq_len: None,
    };
    // A long context with a small stride is many windows: at most
    // --max-qa-windows, and the work stops when the client goes.
    let gone = StopOnDrop::new();
    let bounds = QaBounds {
        max_windows: state.config.max_qa_windows,
        stop: Some(Box::new(gone.stopped())),
    };
    let answers = blocking(&state, move || {
        model
            .answer_within(&req.question, &req.context, &opts, &bounds)
            .map_err(ApiError::from)
    })
    .await?;
    drop(gone);
    Ok(Json(if req.top_k == 1 && answers.len() == 1 {
        OneOrMany::One(answers.into_iter().next().expect("one answer"))
    } else {
        OneOrMany::Many(answers)
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionRequest {
    inputs: String,
    layer: Option<usize>,
    head: Option<usize>,
    /// As /embed: an over-long input is a 413 unless this is set.
    #[serde(default)]
    truncate: bool,
}

/// `POST /attention` → `{tokens, layers, heads, attentions}`: attention
/// probabilities `[layer][head][query][key]` (or one layer / head).
#[derive(Debug, Serialize)]
pub struct AttentionResponse {
    tokens: Vec<String>,
    layers: usize,
    heads: usize,
    /// `[layer][head][query][key]`, only the requested layer / head if any.
    attentions: Vec<Vec<Vec<Vec<f32>>>>,
    /// Whether the input lost tokens to `truncate`.
    truncated: bool,
}

pub async fn attention(
    State(state): Shared,
    Body(req): Body<AttentionRequest>,
) -> AppResult<Json<AttentionResponse>> {
    let _permit = admit(&state)?;
    let e = tokenize(
        &state,
        vec![req.inputs],
        req.truncate,
        TruncationDirection::Right,
    )
    .await?
    .pop()
    .ok_or_else(|| ApiError::backend("the tokenizer answered with no encoding"))?;
    let truncated = e.truncated;
    let st = state.clone();
    let out = blocking(&state, move || {
        let maps = st
            .attention()
            .attend_ids(&e.input_ids, Some(&e.token_type_ids), e.tokens)?;
        let (n_layers, n_heads) = (
            maps.num_layers(),
            st.embedder.model().config().num_attention_heads,
        );
        let pick = |i: usize, max: usize, what: &str| -> AppResult<()> {
            (i < max).then_some(()).ok_or_else(|| {
                ApiError::validation(format!("{what} {i} is out of range (0..{max})"))
            })
        };
        if let Some(l) = req.layer {
            pick(l, n_layers, "layer")?;
        }
        if let Some(h) = req.head {
            pick(h, n_heads, "head")?;
        }
        let attentions = maps
            .attentions
            .into_iter()
            .enumerate()
            .filter(|(l, _)| req.layer.is_none_or(|x| x == *l))
            .map(|(_, heads)| {
                heads
                    .into_iter()
                    .enumerate()
                    .filter(|(h, _)| req.head.is_none_or(|x| x == *h))
                    .map(|(_, m)| m)
                    .collect()
            })
            .collect();
        Ok(AttentionResponse {
            tokens: maps.tokens,
            layers: n_layers,
            heads: n_heads,
            attentions,
            truncated,
        })
    })
    .await?;
    Ok(Json(out))
}
