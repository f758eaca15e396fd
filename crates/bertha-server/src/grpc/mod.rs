//! TEI's gRPC API (`proto/tei.proto`, package `tei.v1`; cargo feature
//! `grpc`), served on a port of its own beside HTTP over the same
//! [`AppState`]: the same batcher, limits, prompts and classifier head as
//! the HTTP routes, through the same functions of [`crate::api`].
//!
//! Services, as TEI's `router/src/grpc/server.rs` answers them:
//! - `Info`: the model and its limits.
//! - `Embed`: `Embed` (one pooled vector), `EmbedAll` (every token's),
//!   `EmbedSparse` (a SPLADE model's non-zero entries, as `/embed_sparse`),
//!   and a `*Stream` of each.
//! - `Predict`: `Predict`, `PredictPair` and their streams (the
//!   classifier head, as `/predict`).
//! - `Rerank`: `Rerank`, and `RerankStream` (pairs streamed in, one ranking
//!   out), as `/rerank`.
//! - `Tokenize`: `Tokenize`, `Decode` and their streams.
//!
//! A unary call takes a slot of `--max-concurrent-requests` or is refused
//! at once (`ResourceExhausted`); each message of a stream waits for one,
//! as TEI's streams do. A stream's answers come in the order of its
//! requests, up to `--max-client-batch-size` of them worked on at once;
//! the first error ends the stream with its status (gRPC has no
//! per-message errors). Errors map to status codes as TEI maps its error
//! types: validation (too long without `truncate`, a bad prompt name or
//! `dimensions`, batch limits) → `InvalidArgument`, overloaded →
//! `ResourceExhausted`, model failures and a model without the asked-for
//! head → `FailedPrecondition`, a missing or wrong API key →
//! `Unauthenticated`.
//!
//! The parts: `listener` accepts connections within `--max-connections`,
//! `convert` maps between bertha's types and the proto's (errors to status
//! codes), `messages` answers one message of each kind, `streams` answers
//! a stream's messages in order, and `services` implements the generated
//! service traits over those.

use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::{Request, Response, Status};

use crate::state::AppState;

mod convert;
mod listener;
mod messages;
mod services;
mod streams;

use listener::accept;

/// The code generated from `proto/tei.proto` by `scripts/gen-grpc.sh`:
/// the messages, a server trait and a client per service (the clients run
/// over any HTTP/2 service; tonic's transport is not built in).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!("tei.v1.rs");
}

use pb::embed_server::EmbedServer;
use pb::info_server::InfoServer;
use pb::predict_server::PredictServer;
use pb::rerank_server::RerankServer;
use pb::tokenize_server::TokenizeServer;

type Reply<T> = Result<Response<T>, Status>;
/// A stream's answers, in the order of its requests.
pub type Answers<T> = ReceiverStream<Result<T, Status>>;

/// The services, over the server's state.
#[derive(Clone)]
pub struct Tei {
    state: Arc<AppState>,
}

impl Tei {
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state }
    }
}

/// Serves the gRPC services on `listener` until `shutdown` resolves, then
/// finishes in-flight calls (open streams included). `--max-connections`
/// bounds this port's connections as it does HTTP's (more wait in the
/// listen queue); a connection whose peer stops answering HTTP/2 pings for
/// 20 s is closed (pings every `--keep-alive-timeout`); a message may be
/// as large as `--payload-limit`; `--api-key` is asked for as metadata
/// `authorization: Bearer KEY`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    bertha::fast::flush_denormals();
    let tei = Tei::new(state.clone());
    let key = ApiKey(state.config.api_key.as_deref().map(Arc::from));
    let size = state.config.payload_limit;
    let limits = state.config.connections;
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(accept(listener, limits, tx));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.keep_alive_timeout))
        .add_service(InterceptedService::new(
            InfoServer::new(tei.clone()).max_decoding_message_size(size),
            key.clone(),
        ))
        .add_service(InterceptedService::new(
            EmbedServer::new(tei.clone()).max_decoding_message_size(size),
            key.clone(),
        ))
        .add_service(InterceptedService::new(
            PredictServer::new(tei.clone()).max_decoding_message_size(size),
            key.clone(),
        ))
        .add_service(InterceptedService::new(
            RerankServer::new(tei.clone()).max_decoding_message_size(size),
            key.clone(),
        ))
        .add_service(InterceptedService::new(
            TokenizeServer::new(tei).max_decoding_message_size(size),
            key,
        ))
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown)
        .await
        .map_err(io::Error::other)
}

/// `authorization: Bearer KEY` on every call when the server has a key.
#[derive(Clone)]
struct ApiKey(Option<Arc<str>>);

impl Interceptor for ApiKey {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(key) = &self.0 else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given == Some(&**key) {
            Ok(req)
        } else {
            tracing::info!("gRPC call refused: missing or wrong API key");
            Err(Status::unauthenticated(
                "missing or wrong API key: send the metadata `authorization: Bearer KEY`",
            ))
        }
    }
}
