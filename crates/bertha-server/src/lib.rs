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
pub mod served;
pub mod sparse;
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
pub use served::Served;
pub use state::{AppState, ModelKind, ServerConfig};

use crate::error::ApiError;
use crate::metrics::{Metrics, RouteLabels, RouteOnly};

const PAGE: &str = include_str!("../static/index.html");
const OPENAPI: &str = include_str!("../static/openapi.json");

/// All routes of a one-model server, with the API-key check, body limit
/// and metrics.
pub fn router(state: Arc<AppState>) -> Router {
    router_for(Arc::new(Served::one(state)))
}

/// All routes of a server of one model or several: each model's under
/// `/models/NAME`, the default model's also at the top level (TEI's
/// routes), and OpenAI's `/v1/embeddings` choosing by `model`.
pub fn router_for(served: Arc<Served>) -> Router {
    let default = served.default_model().clone();
    let key = Arc::new(default.config.api_key.clone());
    let everyone = Router::new()
        .route("/v1/embeddings", post(openai::embeddings_any))
        .route("/v1/models", get(openai::models))
        .route("/info", get(api::info_all))
        .route(
            "/metrics",
            get(
                |State(s): State<Arc<Served>>| async move { api::metrics_text(s.render_metrics()) },
            ),
        )
        .route_layer(middleware::from_fn_with_state(key.clone(), require_key))
        .route("/health", get(api::health_all))
        .with_state(served.clone())
        .layer(middleware::from_fn_with_state(
            default.metrics.clone(),
            record,
        ));
    let mut app = model_routes(default.clone(), Place::Top, &key).merge(everyone);
    for m in served.models() {
        // `Served::new` refused such names; one model given to `router`
        // keeps its top-level routes whatever its name.
        if let Err(e) = served::check_name(&m.config.model_id) {
            tracing::warn!("no /models/NAME/ routes: {e}");
            continue;
        }
        let prefix = format!("/models/{}", m.config.model_id);
        app = app.nest(&prefix, model_routes(m.clone(), Place::Prefixed, &key));
    }
    let app = app
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
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(default.config.payload_limit));
    // `POST /models/NAME/` is `/models/NAME`: the path's trailing slash is
    // cut before routing (a nested router's `/` matches without it only).
    Router::new()
        .fallback_service(app)
        .layer(middleware::map_request(trim_trailing_slash))
}

async fn trim_trailing_slash(mut req: Request) -> Request {
    let path = req.uri().path();
    if path.len() > 1 && path.ends_with('/') {
        let trimmed = path.trim_end_matches('/');
        let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
        let rest = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        if let Ok(uri) = format!("{trimmed}{rest}").parse() {
            *req.uri_mut() = uri;
        }
    }
    req
}

/// Where a model's routes are mounted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The default model at the top level, beside the routes that speak
    /// for every model (`/info`, `/v1/models`, `/v1/embeddings`, `/metrics`,
    /// `/health`).
    Top,
    /// Under `/models/NAME`: every route, for this model alone.
    Prefixed,
}

/// One model's API routes, with its key check and metrics.
fn model_routes(state: Arc<AppState>, place: Place, key: &Arc<Option<String>>) -> Router {
    // TEI's default route, and SageMaker's: the model type's own task.
    let root = match state.kind {
        ModelKind::Embedding if state.config.similarity_root => post(api::similarity),
        ModelKind::Embedding if sparse::is_splade(&state) => post(sparse::embed_sparse),
        ModelKind::Embedding => post(api::embed),
        ModelKind::Classifier => post(api::predict),
        ModelKind::Reranker => post(api::rerank),
    };
    let mut api = Router::new()
        .route("/", root.clone())
        .route("/invocations", root)
        .route("/embed", post(api::embed))
        .route("/embed_all", post(api::embed_all))
        .route("/embed_sparse", post(sparse::embed_sparse))
        .route("/similarity", post(api::similarity))
        .route("/tokenize", post(api::tokenize_route))
        .route("/decode", post(api::decode))
        .route("/predict", post(api::predict))
        .route("/rerank", post(api::rerank))
        .route("/fill-mask", post(api::fill_mask))
        .route("/ner", post(api::ner))
        .route("/qa", post(api::qa))
        .route("/attention", post(api::attention));
    if place == Place::Prefixed {
        api = api
            .route("/v1/embeddings", post(openai::embeddings))
            .route("/v1/models", get(openai::model))
            .route("/info", get(api::info))
            .route(
                "/metrics",
                get(|State(s): State<Arc<AppState>>| async move {
                    api::metrics_text(s.metrics.render())
                }),
            );
    }
    let mut api = api.route_layer(middleware::from_fn_with_state(key.clone(), require_key));
    if place == Place::Prefixed {
        api = api.route("/health", get(api::health));
    }
    api.method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            record,
        ))
        .with_state(state)
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        error_type: "MethodNotAllowed",
        message: format!("{} is not allowed on {}", req.method(), req.uri().path()),
    }
}

/// `Authorization: Bearer KEY` when the server has an API key.
async fn require_key(State(key): State<Arc<Option<String>>>, req: Request, next: Next) -> Response {
    if let Some(key) = key.as_deref() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Counts requests by route and status and times them.
async fn record(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "other".into());
    let start = Instant::now();
    let res = next.run(req).await;
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
    serve_models(listener, Arc::new(Served::one(state)), shutdown).await
}

/// As [`serve`], for a server of several models.
pub async fn serve_models(
    listener: tokio::net::TcpListener,
    served: Arc<Served>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    bertha::fast::flush_denormals();
    let limits = served.default_model().config.connections;
    connections::serve(listener, router_for(served), limits, shutdown).await
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
