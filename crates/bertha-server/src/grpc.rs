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

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bertha::tasks::{Classifier, LabelScore, ScoreFunction};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Code, Request, Response, Status, Streaming};

use crate::api::{self, TruncationDirection};
use crate::connections::{ConnectionLimits, Slots};
use crate::error::{public_message, ApiError};
use crate::state::{AppState, ModelKind};

/// The code generated from `proto/tei.proto` by `scripts/gen-grpc.sh`:
/// the messages, a server trait and a client per service (the clients run
/// over any HTTP/2 service; tonic's transport is not built in).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!("grpc/tei.v1.rs");
}

use pb::embed_server::{Embed, EmbedServer};
use pb::info_server::{Info, InfoServer};
use pb::predict_server::{Predict, PredictServer};
use pb::rerank_server::{Rerank, RerankServer};
use pb::tokenize_server::{Tokenize, TokenizeServer};

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

/// Accepts connections for tonic, at most `max_connections` open at once,
/// until tonic stops listening. A failed accept (out of file descriptors)
/// is logged and retried, where tonic's own listener would stop serving.
async fn accept(
    listener: TcpListener,
    limits: ConnectionLimits,
    tx: mpsc::Sender<io::Result<Slotted>>,
) {
    let slots = Slots::new(limits, "gRPC connection");
    while let Some((stream, slot)) = slots.accept(&listener, tx.closed()).await {
        let _ = stream.set_nodelay(true);
        if tx
            .send(Ok(Slotted {
                stream,
                _slot: slot,
            }))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A client connection holding its slot of `--max-connections`.
struct Slotted {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Slotted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Slotted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Slotted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
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

/// TEI's mapping of its error types to status codes.
impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        e.log();
        let code = match e.error_type {
            "Overloaded" => Code::ResourceExhausted,
            "Unauthorized" => Code::Unauthenticated,
            "Unhealthy" => Code::Unavailable,
            "NotFound" => Code::NotFound,
            // TEI answers its backend's (the model's) errors so.
            "Backend" => Code::FailedPrecondition,
            _ => Code::InvalidArgument,
        };
        Status::new(code, public_message(&e.message))
    }
}

fn direction(value: i32) -> Result<TruncationDirection, Status> {
    match pb::TruncationDirection::try_from(value) {
        Ok(pb::TruncationDirection::Right) => Ok(TruncationDirection::Right),
        Ok(pb::TruncationDirection::Left) => Ok(TruncationDirection::Left),
        Err(_) => Err(Status::invalid_argument(format!(
            "`truncation_direction` {value} is unknown (0: TRUNCATION_DIRECTION_RIGHT, 1: \
             TRUNCATION_DIRECTION_LEFT)"
        ))),
    }
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What TEI's `Metadata` carries that bertha measures: the characters and
/// tokens (0 where the classifier does the tokenizing) and the time taken.
fn metadata(chars: usize, tokens: usize, start: Instant) -> Option<pb::Metadata> {
    Some(pb::Metadata {
        compute_chars: u32_of(chars),
        compute_tokens: u32_of(tokens),
        total_time_ns: u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
        ..Default::default()
    })
}

/// The classifier head, or `FailedPrecondition` (TEI's answer to a model
/// of the wrong type) naming why there is none.
fn classifier(state: &AppState, what: &str) -> Result<Arc<Classifier>, Status> {
    state.classifier().map_err(|reason| {
        let message = format!("this model cannot {what}: {}", public_message(&reason));
        tracing::info!("{message}");
        Status::failed_precondition(message)
    })
}

fn score_function(classifier: &Classifier, raw_scores: bool) -> ScoreFunction {
    if raw_scores {
        ScoreFunction::None
    } else {
        classifier.function()
    }
}

fn predictions(scores: Vec<LabelScore>) -> Vec<pb::Prediction> {
    scores
        .into_iter()
        .map(|s| pb::Prediction {
            score: s.score,
            label: s.label,
        })
        .collect()
}

fn ranks(ranked: Vec<api::Rank>) -> Vec<pb::Rank> {
    ranked
        .into_iter()
        .map(|r| pb::Rank {
            index: u32_of(r.index),
            text: r.text,
            score: r.score,
        })
        .collect()
}

/// PredictPair's `inputs`: one text, or a pair.
fn pair(inputs: Vec<String>) -> Result<(String, Option<String>), Status> {
    let n = inputs.len();
    let mut it = inputs.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(a), b, None) => Ok((a, b)),
        _ => Err(Status::invalid_argument(format!(
            "`inputs` must have a single or two elements. Given: {n}"
        ))),
    }
}

impl Tei {
    async fn embed_one(&self, req: pb::EmbedRequest) -> Result<pb::EmbedResponse, Status> {
        let start = Instant::now();
        let dir = direction(req.truncation_direction)?;
        let chars = req.inputs.chars().count();
        // As `/embed`: the folder's Normalize module decides when the
        // request does not (TEI: true).
        let norm = req.normalize.unwrap_or(self.state.normalize_default);
        let dimensions = req.dimensions.map(|d| d as usize);
        let call = api::tei_call(req.prompt_name, dimensions);
        let (mut rows, tokens) = api::pooled(
            &self.state,
            vec![req.inputs],
            &call,
            req.truncate,
            dir,
            norm,
        )
        .await?;
        let embeddings = rows
            .pop()
            .ok_or_else(|| ApiError::backend("the model answered with no vector"))?;
        Ok(pb::EmbedResponse {
            embeddings,
            metadata: metadata(chars, tokens, start),
        })
    }

    async fn embed_all_one(
        &self,
        req: pb::EmbedAllRequest,
    ) -> Result<pb::EmbedAllResponse, Status> {
        let start = Instant::now();
        let dir = direction(req.truncation_direction)?;
        let chars = req.inputs.chars().count();
        let call = api::tei_call(req.prompt_name, None);
        let (mut rows, tokens) = api::token_vectors(
            &self.state,
            vec![req.inputs],
            &call,
            req.truncate,
            dir,
            false,
        )
        .await?;
        let vectors = rows
            .pop()
            .ok_or_else(|| ApiError::backend("the model answered with no vectors"))?;
        Ok(pb::EmbedAllResponse {
            token_embeddings: vectors
                .into_iter()
                .map(|embeddings| pb::TokenEmbedding { embeddings })
                .collect(),
            metadata: metadata(chars, tokens, start),
        })
    }

    /// EmbedSparse, as `/embed_sparse`: a SPLADE model's non-zero entries
    /// in index order (no normalisation); other models are refused as TEI
    /// refuses them (its 424 is `FailedPrecondition` here).
    async fn embed_sparse_one(
        &self,
        req: pb::EmbedSparseRequest,
    ) -> Result<pb::EmbedSparseResponse, Status> {
        let start = Instant::now();
        let dir = direction(req.truncation_direction)?;
        let chars = req.inputs.chars().count();
        let (mut vectors, tokens) = crate::sparse::sparse_vectors(
            &self.state,
            vec![req.inputs],
            req.prompt_name,
            req.truncate,
            dir,
        )
        .await?;
        let vector = vectors
            .pop()
            .ok_or_else(|| ApiError::backend("the model answered with no vector"))?;
        Ok(pb::EmbedSparseResponse {
            sparse_embeddings: vector
                .0
                .into_iter()
                .map(|v| pb::SparseValue {
                    index: v.index,
                    value: v.value,
                })
                .collect(),
            metadata: metadata(chars, tokens, start),
        })
    }

    async fn predict_one(
        &self,
        (text, pair): (String, Option<String>),
        truncate: bool,
        truncation_direction: i32,
        raw_scores: bool,
    ) -> Result<pb::PredictResponse, Status> {
        let start = Instant::now();
        let dir = direction(truncation_direction)?;
        let classifier = classifier(&self.state, "classify")?;
        let function = score_function(&classifier, raw_scores);
        let chars = text.chars().count() + pair.as_deref().map_or(0, |p| p.chars().count());
        let seqs = vec![(text, pair)];
        let mut scores = api::classify(
            &self.state,
            classifier,
            seqs,
            None,
            function,
            truncate.then_some(dir),
        )
        .await?;
        let scores = scores
            .pop()
            .ok_or_else(|| ApiError::backend("the classifier answered with no scores"))?;
        Ok(pb::PredictResponse {
            predictions: predictions(scores),
            metadata: metadata(chars, 0, start),
        })
    }

    async fn tokenize_one(&self, req: pb::EncodeRequest) -> Result<pb::EncodeResponse, Status> {
        // As TEI: the named prompt, else the folder's default one, comes
        // first, and the offsets are into the prompted text.
        let call = api::tei_call(req.prompt_name, None);
        let text = match self.state.embedder.prompt(&call).map_err(ApiError::from)? {
            Some(p) => format!("{}{}", p.text, req.inputs),
            None => req.inputs,
        };
        let tokens = api::simple_tokens(&self.state, vec![text], req.add_special_tokens)
            .await?
            .pop()
            .unwrap_or_default();
        Ok(pb::EncodeResponse {
            tokens: tokens
                .into_iter()
                .map(|t| pb::SimpleToken {
                    id: t.id,
                    text: t.text,
                    special: t.special,
                    start: t.start.map(u32_of),
                    stop: t.stop.map(u32_of),
                })
                .collect(),
        })
    }

    fn decode_one(&self, req: pb::DecodeRequest) -> Result<pb::DecodeResponse, Status> {
        let text = api::decode_ids(&self.state, &req.ids, req.skip_special_tokens)?;
        Ok(pb::DecodeResponse { text })
    }

    /// Answers each message of `requests` with `answer`, in their order,
    /// up to `--max-client-batch-size` at once (the batcher packs them);
    /// with `permits`, each holds a slot of `--max-concurrent-requests`
    /// while it runs, waiting for one. The first error ends the stream; a
    /// client that goes away cancels the work still queued.
    fn in_order<Req, Res, F, Fut>(
        &self,
        request: Request<Streaming<Req>>,
        permits: bool,
        answer: F,
    ) -> Answers<Res>
    where
        Req: Send + 'static,
        Res: Send + 'static,
        F: Fn(Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Res, Status>> + Send + 'static,
    {
        let mut requests = request.into_inner();
        let in_flight = self.state.config.max_client_batch_size.max(1);
        let limit = permits.then(|| self.state.limit.clone());
        let (order_tx, mut order_rx) =
            mpsc::channel::<oneshot::Receiver<Result<Res, Status>>>(in_flight);
        let (tx, rx) = mpsc::channel(in_flight);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = requests.message() => next,
                    _ = order_tx.closed() => return,
                };
                let (done_tx, done_rx) = oneshot::channel();
                let ended = match next {
                    Ok(Some(req)) => {
                        let permit = match &limit {
                            Some(limit) => tokio::select! {
                                permit = limit.clone().acquire_owned() => permit.ok(),
                                _ = order_tx.closed() => return,
                            },
                            None => None,
                        };
                        let work = answer(req);
                        tokio::spawn(async move {
                            let mut done_tx = done_tx;
                            tokio::select! {
                                result = work => {
                                    let _ = done_tx.send(result);
                                }
                                _ = done_tx.closed() => {}
                            }
                            drop(permit);
                        });
                        false
                    }
                    Ok(None) => return,
                    Err(status) => {
                        let _ = done_tx.send(Err(status));
                        true
                    }
                };
                if order_tx.send(done_rx).await.is_err() || ended {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(done) = order_rx.recv().await {
                let result = done
                    .await
                    .unwrap_or_else(|_| Err(Status::internal("a stream's answer was lost")));
                let failed = result.is_err();
                if tx.send(result).await.is_err() || failed {
                    return;
                }
            }
        });
        ReceiverStream::new(rx)
    }
}

#[tonic::async_trait]
impl Info for Tei {
    async fn info(&self, _req: Request<pb::InfoRequest>) -> Reply<pb::InfoResponse> {
        let state = &self.state;
        let c = &state.config;
        let model_type = match state.kind {
            ModelKind::Embedding => pb::ModelType::Embedding,
            ModelKind::Classifier => pb::ModelType::Classifier,
            ModelKind::Reranker => pb::ModelType::Reranker,
        };
        Ok(Response::new(pb::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            sha: None,
            docker_label: None,
            model_id: c.model_id.clone(),
            model_sha: None,
            model_dtype: api::model_dtype(state).into(),
            model_type: model_type.into(),
            max_concurrent_requests: u32_of(c.max_concurrent_requests),
            max_input_length: u32_of(state.max_input_length()),
            max_batch_tokens: u32_of(c.max_batch_tokens),
            max_batch_requests: None,
            max_client_batch_size: u32_of(c.max_client_batch_size),
            tokenization_workers: u32_of(api::rayon_threads()),
        }))
    }
}

#[tonic::async_trait]
impl Embed for Tei {
    async fn embed(&self, req: Request<pb::EmbedRequest>) -> Reply<pb::EmbedResponse> {
        let _permit = api::admit(&self.state)?;
        Ok(Response::new(self.embed_one(req.into_inner()).await?))
    }

    type EmbedStreamStream = Answers<pb::EmbedResponse>;

    async fn embed_stream(
        &self,
        req: Request<Streaming<pb::EmbedRequest>>,
    ) -> Reply<Self::EmbedStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, true, move |r| {
            let tei = tei.clone();
            async move { tei.embed_one(r).await }
        })))
    }

    async fn embed_sparse(
        &self,
        req: Request<pb::EmbedSparseRequest>,
    ) -> Reply<pb::EmbedSparseResponse> {
        let _permit = api::admit(&self.state)?;
        Ok(Response::new(
            self.embed_sparse_one(req.into_inner()).await?,
        ))
    }

    type EmbedSparseStreamStream = Answers<pb::EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        req: Request<Streaming<pb::EmbedSparseRequest>>,
    ) -> Reply<Self::EmbedSparseStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, true, move |r| {
            let tei = tei.clone();
            async move { tei.embed_sparse_one(r).await }
        })))
    }

    async fn embed_all(&self, req: Request<pb::EmbedAllRequest>) -> Reply<pb::EmbedAllResponse> {
        let _permit = api::admit(&self.state)?;
        Ok(Response::new(self.embed_all_one(req.into_inner()).await?))
    }

    type EmbedAllStreamStream = Answers<pb::EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        req: Request<Streaming<pb::EmbedAllRequest>>,
    ) -> Reply<Self::EmbedAllStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, true, move |r| {
            let tei = tei.clone();
            async move { tei.embed_all_one(r).await }
        })))
    }
}

#[tonic::async_trait]
impl Predict for Tei {
    async fn predict(&self, req: Request<pb::PredictRequest>) -> Reply<pb::PredictResponse> {
        let _permit = api::admit(&self.state)?;
        let r = req.into_inner();
        let input = (r.inputs, None);
        let answer = self
            .predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
            .await?;
        Ok(Response::new(answer))
    }

    async fn predict_pair(
        &self,
        req: Request<pb::PredictPairRequest>,
    ) -> Reply<pb::PredictResponse> {
        let r = req.into_inner();
        let input = pair(r.inputs)?;
        let _permit = api::admit(&self.state)?;
        let answer = self
            .predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
            .await?;
        Ok(Response::new(answer))
    }

    type PredictStreamStream = Answers<pb::PredictResponse>;

    async fn predict_stream(
        &self,
        req: Request<Streaming<pb::PredictRequest>>,
    ) -> Reply<Self::PredictStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(
            req,
            true,
            move |r: pb::PredictRequest| {
                let tei = tei.clone();
                async move {
                    let input = (r.inputs, None);
                    tei.predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
                        .await
                }
            },
        )))
    }

    type PredictPairStreamStream = Answers<pb::PredictResponse>;

    async fn predict_pair_stream(
        &self,
        req: Request<Streaming<pb::PredictPairRequest>>,
    ) -> Reply<Self::PredictPairStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(
            req,
            true,
            move |r: pb::PredictPairRequest| {
                let tei = tei.clone();
                async move {
                    let input = pair(r.inputs)?;
                    tei.predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
                        .await
                }
            },
        )))
    }
}

#[tonic::async_trait]
impl Rerank for Tei {
    async fn rerank(&self, req: Request<pb::RerankRequest>) -> Reply<pb::RerankResponse> {
        let _permit = api::admit(&self.state)?;
        let start = Instant::now();
        let r = req.into_inner();
        if r.texts.is_empty() {
            return Err(Status::invalid_argument("`texts` cannot be empty"));
        }
        api::check_batch(&self.state, r.texts.len())?;
        let dir = direction(r.truncation_direction)?;
        let classifier = classifier(&self.state, "rerank")?;
        let function = score_function(&classifier, r.raw_scores);
        let query_chars = r.query.chars().count();
        let chars = r
            .texts
            .iter()
            .map(|t| query_chars + t.chars().count())
            .sum();
        let pairs = r.texts.into_iter().map(|t| (r.query.clone(), t)).collect();
        let truncation = r.truncate.then_some(dir);
        let ranked = api::rank(
            &self.state,
            classifier,
            pairs,
            r.return_text,
            function,
            truncation,
        )
        .await?;
        Ok(Response::new(pb::RerankResponse {
            ranks: ranks(ranked),
            metadata: metadata(chars, 0, start),
        }))
    }

    /// (query, text) pairs streamed in, one ranking out; `raw_scores` and
    /// `return_text` are the first message's (as TEI), and a stream takes
    /// at most `--max-client-batch-size` pairs, as a Rerank call.
    async fn rerank_stream(
        &self,
        req: Request<Streaming<pb::RerankStreamRequest>>,
    ) -> Reply<pb::RerankResponse> {
        let _permit = api::admit(&self.state)?;
        let start = Instant::now();
        let classifier = classifier(&self.state, "rerank")?;
        let mut requests = req.into_inner();
        let mut first: Option<(ScoreFunction, bool)> = None;
        let (mut ranked, mut chars) = (Vec::new(), 0);
        while let Some(r) = requests.message().await? {
            api::check_batch(&self.state, ranked.len() + 1)?;
            let (function, return_text) = *first
                .get_or_insert_with(|| (score_function(&classifier, r.raw_scores), r.return_text));
            let dir = direction(r.truncation_direction)?;
            chars += r.query.chars().count() + r.text.chars().count();
            let truncation = r.truncate.then_some(dir);
            let pairs = vec![(r.query, r.text)];
            let one = api::rank(
                &self.state,
                classifier.clone(),
                pairs,
                return_text,
                function,
                truncation,
            )
            .await?;
            let index = ranked.len();
            ranked.extend(one.into_iter().map(|rank| api::Rank { index, ..rank }));
        }
        if ranked.is_empty() {
            return Err(Status::invalid_argument(
                "the stream sent no (query, text) pair",
            ));
        }
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(Response::new(pb::RerankResponse {
            ranks: ranks(ranked),
            metadata: metadata(chars, 0, start),
        }))
    }
}

#[tonic::async_trait]
impl Tokenize for Tei {
    async fn tokenize(&self, req: Request<pb::EncodeRequest>) -> Reply<pb::EncodeResponse> {
        Ok(Response::new(self.tokenize_one(req.into_inner()).await?))
    }

    type TokenizeStreamStream = Answers<pb::EncodeResponse>;

    async fn tokenize_stream(
        &self,
        req: Request<Streaming<pb::EncodeRequest>>,
    ) -> Reply<Self::TokenizeStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, false, move |r| {
            let tei = tei.clone();
            async move { tei.tokenize_one(r).await }
        })))
    }

    async fn decode(&self, req: Request<pb::DecodeRequest>) -> Reply<pb::DecodeResponse> {
        Ok(Response::new(self.decode_one(req.into_inner())?))
    }

    type DecodeStreamStream = Answers<pb::DecodeResponse>;

    async fn decode_stream(
        &self,
        req: Request<Streaming<pb::DecodeRequest>>,
    ) -> Reply<Self::DecodeStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, false, move |r| {
            let tei = tei.clone();
            async move { tei.decode_one(r) }
        })))
    }
}
