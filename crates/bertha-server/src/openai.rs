//! OpenAI's routes: `POST /v1/embeddings` and `GET /v1/models`, with the
//! bodies the OpenAI clients send and read.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::{
    admit, check_batch, pooled, tei_call, AppResult, Body, Inputs, Shared, TruncationDirection,
};
use crate::error::ApiError;
use crate::served::Served;
use crate::state::AppState;

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiRequest {
    input: Inputs,
    model: Option<String>,
    #[serde(default)]
    encoding_format: EncodingFormat,
    #[allow(dead_code)]
    user: Option<String>,
    dimensions: Option<usize>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OpenAiVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
pub struct OpenAiEmbedding {
    object: &'static str,
    embedding: OpenAiVector,
    index: usize,
}

#[derive(Debug, Serialize)]
pub struct OpenAiUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Debug, Serialize)]
pub struct OpenAiResponse {
    object: &'static str,
    data: Vec<OpenAiEmbedding>,
    model: String,
    usage: OpenAiUsage,
}

/// `POST /v1/embeddings` (OpenAI) at the top level: the model `model`
/// names ([`Served::pick`]).
pub async fn embeddings_any(
    State(served): State<Arc<Served>>,
    Body(req): Body<OpenAiRequest>,
) -> AppResult<Json<OpenAiResponse>> {
    let state = served.pick(req.model.as_deref())?.clone();
    embed(state, req).await
}

/// `POST /models/NAME/v1/embeddings`: this model; a `model` naming
/// another is refused (the path and the body must not disagree).
pub async fn embeddings(
    State(state): Shared,
    Body(req): Body<OpenAiRequest>,
) -> AppResult<Json<OpenAiResponse>> {
    if let Some(name) = req.model.as_deref() {
        if name != state.config.model_id {
            return Err(ApiError::validation(format!(
                "`model` is `{name}` but this route serves `{}`: leave `model` out or name it",
                state.config.model_id
            )));
        }
    }
    embed(state, req).await
}

/// Normalised vectors (of the first `dimensions` values when asked),
/// `usage` in tokens.
async fn embed(state: Arc<AppState>, req: OpenAiRequest) -> AppResult<Json<OpenAiResponse>> {
    let _permit = admit(&state)?;
    let texts = req.input.into_vec();
    check_batch(&state, texts.len())?;
    crate::sparse::refuse_on_splade(&state, "/v1/embeddings")?;
    let call = tei_call(None, req.dimensions);
    let (rows, tokens) = pooled(
        &state,
        texts,
        &call,
        false,
        TruncationDirection::Right,
        true,
    )
    .await?;
    let data = rows
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match req.encoding_format {
                EncodingFormat::Float => OpenAiVector::Float(v),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    OpenAiVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            OpenAiEmbedding {
                object: "embedding",
                embedding,
                index,
            }
        })
        .collect();
    Ok(Json(OpenAiResponse {
        object: "list",
        data,
        model: req.model.unwrap_or_else(|| state.config.model_id.clone()),
        usage: OpenAiUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }))
}

/// `GET /v1/models` (OpenAI): every model served, the default first.
pub async fn models(State(served): State<Arc<Served>>) -> Json<Value> {
    let data: Vec<Value> = served.models().iter().map(|m| listed(m)).collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `GET /models/NAME/v1/models`: this model alone.
pub async fn model(State(state): Shared) -> Json<Value> {
    Json(json!({ "object": "list", "data": [listed(&state)] }))
}

fn listed(state: &AppState) -> Value {
    json!({
        "id": state.config.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "bertha",
    })
}
