//! What the server says about itself: `/health` (a forward pass answers),
//! `/info` (TEI's model description) and `/metrics` (Prometheus text).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::Shared;
use crate::batcher::Want;
use crate::error::ApiError;
use crate::served::Served;
use crate::state::{AppState, ModelKind};

/// `GET /models/NAME/health`: 200 once a forward pass succeeds.
pub async fn health(State(state): Shared) -> Response {
    if answers(&state).await {
        StatusCode::OK.into_response()
    } else {
        unhealthy(&state.config.model_id)
    }
}

/// `GET /health`: 200 once every served model answers a forward pass.
pub async fn health_all(State(served): State<Arc<Served>>) -> Response {
    for m in served.models() {
        if !answers(m).await {
            return unhealthy(&m.config.model_id);
        }
    }
    StatusCode::OK.into_response()
}

async fn answers(state: &AppState) -> bool {
    match state.embedder.tokenizer().encode("") {
        Ok(e) => state.batcher.run(vec![e], Want::Pooled).await.is_ok(),
        Err(_) => false,
    }
}

fn unhealthy(model: &str) -> Response {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        error_type: "Unhealthy",
        message: format!("the model `{model}` is not answering"),
    }
    .into_response()
}

/// `GET /models/NAME/info`: TEI's `/info` of one model.
pub async fn info(State(state): Shared) -> Json<Value> {
    Json(model_info(&state))
}

/// `GET /info`: TEI's `/info` of the default model, and under `models`
/// that of every model served (the default first).
pub async fn info_all(State(served): State<Arc<Served>>) -> Json<Value> {
    let mut info = model_info(served.default_model());
    info["models"] = served.models().iter().map(|m| model_info(m)).collect();
    Json(info)
}

/// TEI's `model_dtype`: the number format the embedding model's
/// multiplies run in (bf16 on a CPU without it runs, and says, fp32).
pub(crate) fn model_dtype(state: &AppState) -> &'static str {
    match state.embedder.precision() {
        bertha::fast::Precision::F32 => "float32",
        bertha::fast::Precision::Bf16 => "bfloat16",
        bertha::fast::Precision::Int8 => "int8",
    }
}

fn model_info(state: &AppState) -> Value {
    let c = &state.config;
    let cfg = state.embedder.model().config();
    let labels = || {
        let id2label: serde_json::Map<String, Value> = (0..cfg.num_labels())
            .map(|i| (i.to_string(), cfg.label_name(i).into()))
            .collect();
        let label2id: serde_json::Map<String, Value> = (0..cfg.num_labels())
            .map(|i| (cfg.label_name(i), i.into()))
            .collect();
        json!({ "id2label": id2label, "label2id": label2id })
    };
    let model_type = match state.kind {
        ModelKind::Embedding => {
            json!({ "embedding": { "pooling": state.embedder.pooling().name() } })
        }
        ModelKind::Classifier => json!({ "classifier": labels() }),
        ModelKind::Reranker => json!({ "reranker": labels() }),
    };
    json!({
        "model_id": c.model_id,
        "model_sha": null,
        "model_dtype": model_dtype(state),
        // bertha's own: the CPU kernels that run (BERTHA_ISA lowers them).
        "isa": bertha::fast::cpu::describe(),
        "model_type": model_type,
        "architectures": cfg.architectures,
        "hidden_size": cfg.hidden_size,
        "max_concurrent_requests": c.max_concurrent_requests,
        "max_input_length": state.max_input_length(),
        "max_batch_tokens": c.max_batch_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": c.max_client_batch_size,
        "prompts": state.embedder.prompts(),
        "default_prompt_name": state.embedder.default_prompt_name(),
        "tokenization_workers": rayon_threads(),
        "version": env!("CARGO_PKG_VERSION"),
    })
}

pub(crate) fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// `GET /metrics` (Prometheus text format).
pub(crate) fn metrics_text(text: String) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}
