//! bertha's HTTP server: TEI- and OpenAI-compatible embedding routes,
//! transformers-style task routes, dynamic batching, limits, metrics and a
//! web playground.
//!
//! Layout, after TEI: `api` (routes) → `batcher` (queue and batching, model
//! work on its own thread) → the `bertha` library (tokenizer, model). With
//! the cargo feature `grpc`, `grpc` serves TEI's gRPC API over the same
//! state on a port of its own.

pub mod api;
pub mod batcher;
pub mod connections;
pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod metrics;
pub mod object;
pub mod openai;
pub mod state;
pub mod work;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use connections::ConnectionLimits;
pub use state::{AppState, ModelKind, ServerConfig};

use crate::error::ApiError;
use crate::metrics::{RouteLabels, RouteOnly};

const PAGE: &str = include_str!("../static/index.html");
const OPENAPI: &str = include_str!("../static/openapi.json");

/// All routes, with the API-key check, body limit and metrics.
pub fn router(state: Arc<AppState>) -> Router {
    // TEI's default route, and SageMaker's: the model type's own task.
    let root = match state.kind {
        ModelKind::Embedding if state.config.similarity_root => post(api::similarity),
        ModelKind::Embedding => post(api::embed),
        ModelKind::Classifier => post(api::predict),
        ModelKind::Reranker => post(api::rerank),
    };
    let api = Router::new()
        .route("/", root.clone())
        .route("/invocations", root)
        .route("/embed", post(api::embed))
        .route("/embed_all", post(api::embed_all))
        .route("/similarity", post(api::similarity))
        .route("/tokenize", post(api::tokenize_route))
        .route("/decode", post(api::decode))
        .route("/predict", post(api::predict))
        .route("/rerank", post(api::rerank))
        .route("/fill-mask", post(api::fill_mask))
        .route("/ner", post(api::ner))
        .route("/qa", post(api::qa))
        .route("/attention", post(api::attention))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/models", get(openai::models))
        .route("/info", get(api::info))
        .route("/metrics", get(api::metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(api)
        .route("/health", get(api::health))
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .fallback(|| async {
            ApiError {
                status: StatusCode::NOT_FOUND,
                error_type: "NotFound",
                message: "no such route".into(),
            }
        })
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                error_type: "MethodNotAllowed",
                message: format!("{} is not allowed on {}", req.method(), req.uri().path()),
            }
        })
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .layer(DefaultBodyLimit::max(state.config.payload_limit))
        .with_state(state)
}

/// `Authorization: Bearer KEY` when the server has an API key.
async fn require_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Counts requests by route and status and times them.
async fn record(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "other".into());
    let start = Instant::now();
    let res = next.run(req).await;
    let m = &state.metrics;
    m.requests
        .get_or_create(&RouteLabels {
            route: route.clone(),
            status: res.status().as_u16(),
        })
        .inc();
    m.latency
        .get_or_create(&RouteOnly { route })
        .observe(start.elapsed().as_secs_f64());
    res
}

/// Serves until `shutdown` resolves, then finishes in-flight requests,
/// within the state's [`ConnectionLimits`] (see [`connections`]).
/// Subnormal floats are flushed to zero first
/// ([`bertha::fast::flush_denormals`]), as the `bertha` command does.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    bertha::fast::flush_denormals();
    let limits = state.config.connections;
    connections::serve(listener, router(state), limits, shutdown).await
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
