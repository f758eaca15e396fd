//! TEI's `POST /embed_sparse`: SPLADE sparse vectors, `[[{index, value}]]`
//! (one list of nonzero vocabulary entries per input, by increasing
//! index), for a model served with pooling `splade`: a sentence-transformers
//! SparseEncoder folder, or `--pooling splade` on a masked-LM checkpoint.
//!
//! As TEI: any other model answers 424 (`Model is not an embedding model
//! with SPLADE pooling`); on a SPLADE model `POST /` and `/invocations`
//! are this route, `/embed` gives the dense vocabulary-sized vector but
//! refuses `normalize` (which TEI defaults to true), `/embed_all` and
//! OpenAI's `/v1/embeddings` (always normalised) are refused, and
//! `/similarity` (cosine) works.
//!
//! Requests go through the shared [`crate::batcher`] (`Want::Sparse`):
//! inputs of concurrent requests share model batches up to
//! `--max-batch-tokens`, one batch runs at a time, the MLM logits of a
//! batch are computed a bounded number of tokens at a time (see
//! [`bertha::splade`]) and each vector is made sparse as soon as it is
//! complete, so memory stays bounded; a failing batch is run again request
//! by request so that only the culprit gets the error.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use bertha::{Encoded, SparseVector};
use serde::Deserialize;

use crate::api::{
    admit, check_batch, prompted, tei_call, AppResult, Body, Inputs, Shared, TruncationDirection,
};
use crate::batcher::{Output, Want};
use crate::error::ApiError;
use crate::state::AppState;

/// TEI's `EmbedSparseRequest`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedSparseRequest {
    inputs: Inputs,
    /// Cut over-long inputs (absent or `null`: no, and such an input is a
    /// 413).
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: TruncationDirection,
    /// One of the folder's prompts (default: the folder's
    /// `default_prompt_name`, as `/embed`).
    prompt_name: Option<String>,
}

/// Whether the served model makes SPLADE vectors (pooling `splade`).
pub fn is_splade(state: &AppState) -> bool {
    state.embedder.is_sparse()
}

/// TEI's answer for what a model type cannot do: 424, `Backend`.
fn unavailable(message: impl Into<String>) -> ApiError {
    ApiError {
        status: StatusCode::FAILED_DEPENDENCY,
        error_type: "Backend",
        message: message.into(),
    }
}

/// `/embed_sparse` needs a SPLADE model.
fn require_splade(state: &AppState) -> AppResult<()> {
    if is_splade(state) {
        Ok(())
    } else {
        Err(unavailable(
            "Model is not an embedding model with SPLADE pooling",
        ))
    }
}

/// `/embed` on a SPLADE model: TEI refuses `normalize`, which is true
/// unless the request says `false`.
pub(crate) fn check_embed_normalize(state: &AppState, normalize: Option<bool>) -> AppResult<()> {
    if is_splade(state) && normalize != Some(false) {
        return Err(unavailable(
            "`normalize` is not available for SPLADE models: send `\"normalize\": false` for the \
             dense vocabulary-sized vector, or use /embed_sparse",
        ));
    }
    Ok(())
}

/// What TEI refuses on a SPLADE model (`/embed_all`, OpenAI's
/// normalised `/v1/embeddings`); `what` names it.
pub(crate) fn refuse_on_splade(state: &AppState, what: &str) -> AppResult<()> {
    if is_splade(state) {
        return Err(unavailable(format!(
            "`{what}` is not available for SPLADE models: use /embed_sparse"
        )));
    }
    Ok(())
}

/// `POST /embed_sparse` → `[[{index, value}]]`, one list per input (a
/// single input is a list of one, as TEI).
pub async fn embed_sparse(
    State(state): Shared,
    Body(req): Body<EmbedSparseRequest>,
) -> AppResult<Json<Vec<SparseVector>>> {
    let _permit = admit(&state)?;
    let texts = req.inputs.into_vec();
    check_batch(&state, texts.len())?;
    let (vectors, _) = sparse_vectors(
        &state,
        texts,
        req.prompt_name,
        req.truncate.unwrap_or(false),
        req.truncation_direction,
    )
    .await?;
    Ok(Json(vectors))
}

/// The SPLADE vectors of `texts` (in input order) and the tokens they
/// took: the request's prompt prepended, tokenized (an over-long text is
/// a 413 unless `truncate`), and run through the shared batcher. What a
/// handler of another protocol (gRPC's `EmbedSparse`) calls after its own
/// admission ([`crate::api::admit`]) and batch-size checks; a model that
/// is not SPLADE is TEI's 424.
pub async fn sparse_vectors(
    state: &Arc<AppState>,
    texts: Vec<String>,
    prompt_name: Option<String>,
    truncate: bool,
    direction: TruncationDirection,
) -> AppResult<(Vec<SparseVector>, usize)> {
    require_splade(state)?;
    let call = tei_call(prompt_name, None);
    let (encodings, start) = prompted(state, texts, &call, truncate, direction).await?;
    let tokens = encodings.iter().map(Encoded::len).sum();
    let out = state
        .batcher
        .run_from(encodings, start, Want::Sparse)
        .await?;
    let Output::Sparse(vectors) = out else {
        return Err(ApiError::backend("the batcher answered with dense vectors"));
    };
    Ok((vectors, tokens))
}
