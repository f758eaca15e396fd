//! Route handlers. Request and response bodies follow TEI's where TEI has
//! the route, OpenAI's for `/v1/embeddings`, and transformers' pipelines
//! for the routes beyond TEI (`/fill-mask`, `/ner`, `/qa`, `/attention`);
//! OpenAI's routes are in [`crate::openai`].
//!
//! This module holds what every route shares: the JSON body extractor,
//! the input types, admission under `--max-concurrent-requests`, the batch
//! size check, tokenizing and the task pipelines' worker slots. The routes
//! are in the submodules, re-exported here:
//! - `embeddings`: `/embed`, `/embed_all` and `/similarity`.
//! - `tokens`: `/tokenize` and `/decode`.
//! - `status`: `/health`, `/info` and `/metrics`.
//! - `classification`: `/predict` and `/rerank` (the classifier head).
//! - `pipelines`: `/fill-mask`, `/ner`, `/qa` and `/attention`.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::Json;
use bertha::Encoded;
use serde::{Deserialize, Serialize};
use tokio::sync::OwnedSemaphorePermit;

use crate::error::ApiError;
use crate::object::Object;
use crate::served::Served;
use crate::state::AppState;

mod classification;
mod embeddings;
mod pipelines;
mod status;
mod tokens;

pub use classification::{
    predict, rerank, PredictInput, PredictParameters, PredictRequest, Rank, RerankRequest, Sequence,
};
pub use embeddings::{
    embed, embed_all, similarity, EmbedRequest, SimilarityInputs, SimilarityParameters,
    SimilarityRequest,
};
pub(crate) use embeddings::{pooled, prompted, tei_call};
pub use pipelines::{
    attention, fill_mask, ner, qa, AttentionRequest, AttentionResponse, FillMaskRequest,
    NerRequest, QaRequest,
};
pub(crate) use status::metrics_text;
pub use status::{health, health_all, info, info_all};
pub use tokens::{decode, tokenize_route, DecodeRequest, Ids, SimpleToken, TokenizeRequest};

// The steps of the routes that the gRPC services (feature `grpc`) answer
// with too; without the feature nothing outside these modules uses them.
#[cfg(feature = "grpc")]
pub(crate) use self::{
    classification::{classify, rank},
    embeddings::token_vectors,
    status::{model_dtype, rayon_threads},
    tokens::{decode_ids, simple_tokens},
};

pub(crate) type AppResult<T> = Result<T, ApiError>;

/// One item, or a list when the request was a batch. Responses are typed
/// (not `serde_json::Value`) so f32 numbers print in their shortest form.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}
pub(crate) type Shared = State<Arc<AppState>>;

/// `Json` of a JSON object (never an array or a scalar: [`Object`]) whose
/// rejections are 422s naming the field, in TEI's error shape. The body
/// must arrive within the header-read timeout (a 408 otherwise), so a
/// client trickling it cannot hold its connection forever.
pub struct Body<T>(pub T);

/// The state a [`Body`] is read under: it knows how long a body may take.
pub trait BodyTimeout {
    fn body_timeout(&self) -> std::time::Duration;
}

impl BodyTimeout for Arc<AppState> {
    fn body_timeout(&self) -> std::time::Duration {
        self.config.connections.header_read_timeout
    }
}

impl BodyTimeout for Arc<Served> {
    fn body_timeout(&self) -> std::time::Duration {
        self.default_model().config.connections.header_read_timeout
    }
}

impl<T, S> FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: BodyTimeout + Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = state.body_timeout();
        let read = Json::<Object<T>>::from_request(req, state);
        let Ok(read) = tokio::time::timeout(limit, read).await else {
            return Err(ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                error_type: "Validation",
                message: format!(
                    "the request body did not arrive within {} s (--header-read-timeout)",
                    limit.as_secs_f64()
                ),
            });
        };
        match read {
            Ok(Json(Object(v))) => Ok(Body(v)),
            Err(JsonRejection::MissingJsonContentType(e)) => Err(ApiError {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                error_type: "Validation",
                message: e.body_text(),
            }),
            Err(JsonRejection::BytesRejection(e)) => Err(ApiError {
                status: e.status(),
                error_type: "Validation",
                message: e.body_text(),
            }),
            Err(e) => Err(ApiError::validation(e.body_text())),
        }
    }
}

/// One string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Inputs {
    One(String),
    Many(Vec<String>),
}

impl Inputs {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            Inputs::One(s) => vec![s],
            Inputs::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub enum TruncationDirection {
    Left,
    #[default]
    Right,
}

/// Holds a slot of `--max-concurrent-requests`; refuses at once when none
/// is free.
pub(crate) fn admit(state: &AppState) -> AppResult<OwnedSemaphorePermit> {
    state
        .limit
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::overloaded())
}

pub(crate) fn check_batch(state: &AppState, n: usize) -> AppResult<()> {
    if n == 0 {
        return Err(ApiError::validation("`inputs` cannot be empty"));
    }
    let max = state.config.max_client_batch_size;
    if n > max {
        return Err(ApiError::validation(format!(
            "batch size {n} > maximum allowed batch size {max}"
        )));
    }
    Ok(())
}

/// Tokenizes off the async runtime; over-long inputs are a 413 unless
/// the request asked for truncation.
async fn tokenize(
    state: &Arc<AppState>,
    texts: Vec<String>,
    truncate: bool,
    direction: TruncationDirection,
) -> AppResult<Vec<Encoded>> {
    let st = state.clone();
    let encodings = tokio::task::spawn_blocking(move || {
        let tok = match direction {
            TruncationDirection::Right => st.embedder.tokenizer(),
            TruncationDirection::Left => &st.left_tokenizer,
        };
        tok.encode_batch(&texts)
    })
    .await
    .map_err(|e| ApiError::backend(e.to_string()))??;
    if !truncate {
        if let Some(i) = encodings.iter().position(|e| e.truncated) {
            return Err(ApiError::too_long(format!(
                "Input validation error: `inputs[{i}]` must have at most {} tokens; set `truncate` to true to cut it",
                state.max_input_length()
            )));
        }
    }
    Ok(encodings)
}

fn head_missing(what: &str, reason: String) -> ApiError {
    ApiError::not_supported(format!("this model cannot {what}: {reason}"))
}

/// Runs the task pipelines' model work off the async runtime, a few at a
/// time ([`crate::work`]).
async fn blocking<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce() -> AppResult<T> + Send + 'static,
) -> AppResult<T> {
    state.task_slots.run(f).await
}
