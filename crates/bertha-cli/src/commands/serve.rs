//! `bertha serve`

use std::time::Duration;

use anyhow::{Context, Result};
use bertha::Pooling;
use bertha_server::{AppState, ServerConfig};

use crate::model_dir::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    #[arg(long, default_value = "127.0.0.1")]
    host: String,

    #[arg(long, default_value_t = 8080)]
    port: u16,

    /// Also serve TEI's gRPC API (tei.v1: Info, Embed, Predict, Rerank,
    /// Tokenize) on this port, beside HTTP, on the same host (needs a build
    /// with the cargo feature `grpc`).
    #[arg(long, hide = cfg!(not(feature = "grpc")))]
    grpc_port: Option<u16>,

    /// Most tokens run in one model batch.
    #[arg(long, default_value_t = 16384)]
    max_batch_tokens: usize,

    /// Requests in flight at once; more are refused with 429.
    #[arg(long, default_value_t = 512)]
    max_concurrent_requests: usize,

    /// Most inputs in one request.
    #[arg(long, default_value_t = 32)]
    max_client_batch_size: usize,

    /// Longest input in tokens (default: the model's limit).
    #[arg(long)]
    max_input_length: Option<usize>,

    /// Largest request body in bytes.
    #[arg(long, default_value_t = 2_000_000)]
    payload_limit: usize,

    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "BERTHA_API_KEY")]
    api_key: Option<String>,

    /// Pooling for /embed (default: the folder's, else mean).
    #[arg(long)]
    pooling: Option<String>,

    /// TEI's TASK: `sentence-similarity` makes `POST /` answer /similarity
    /// for an embedding model; other values keep TEI's default (the model
    /// type's route).
    #[arg(long, env = "TASK")]
    task: Option<String>,

    /// Name reported by /info, /v1/models and OpenAI's `model` (default:
    /// the folder name). TEI's flag; `--model-id` is bertha's older name.
    #[arg(long, alias = "model-id")]
    served_model_name: Option<String>,

    /// Open connections at most; more wait in the listen queue, and a
    /// warning is logged (default: 10000, lowered to fit the open-file
    /// limit).
    #[arg(long)]
    max_connections: Option<usize>,

    /// Seconds a client has to send a request's head, from its first byte
    /// (slowloris); its body then gets as long again.
    #[arg(long, default_value_t = 30)]
    header_read_timeout: u64,

    /// Seconds an idle connection (no request in flight, nothing sent) is
    /// kept open.
    #[arg(long, default_value_t = 60)]
    keep_alive_timeout: u64,
}

pub fn run(a: Args) -> Result<()> {
    if cfg!(not(feature = "grpc")) && a.grpc_port.is_some() {
        anyhow::bail!(
            "--grpc-port needs bertha built with gRPC: `cargo build --release -p bertha-cli \
             --features grpc`"
        );
    }
    let dir = a.model.resolve()?;
    let mut config = ServerConfig::new(&dir);
    if let Some(id) = a.served_model_name {
        config.model_id = id;
    }
    config.pooling = a
        .pooling
        .as_deref()
        .map(str::parse::<Pooling>)
        .transpose()?;
    config.max_batch_tokens = a.max_batch_tokens.max(1);
    config.max_concurrent_requests = a.max_concurrent_requests.max(1);
    config.max_client_batch_size = a.max_client_batch_size.max(1);
    config.max_input_length = a.max_input_length;
    config.payload_limit = a.payload_limit;
    config.api_key = a.api_key;
    config.similarity_root = a.task.as_deref() == Some("sentence-similarity");
    if let Some(n) = a.max_connections {
        config.connections.max_connections = n;
    }
    config.connections.header_read_timeout = Duration::from_secs(a.header_read_timeout);
    config.connections.keep_alive_timeout = Duration::from_secs(a.keep_alive_timeout);
    let state = AppState::load(config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!(
            "bertha serving {} on http://{}",
            dir.display(),
            listener.local_addr()?
        );
        #[cfg(feature = "grpc")]
        if let Some(port) = a.grpc_port {
            return serve_both(listener, &a.host, port, state).await;
        }
        bertha_server::serve(listener, state, bertha_server::shutdown_signal()).await?;
        Ok(())
    })
}

/// HTTP on `http`, gRPC on `host:grpc_port`, over one state; SIGTERM or
/// Ctrl-C stops both, each finishing its in-flight requests, and so does
/// either one failing.
#[cfg(feature = "grpc")]
async fn serve_both(
    http: tokio::net::TcpListener,
    host: &str,
    grpc_port: u16,
    state: std::sync::Arc<bertha_server::AppState>,
) -> Result<()> {
    let addr = format!("{host}:{grpc_port}");
    let grpc = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--grpc-port)"))?;
    eprintln!("bertha serving gRPC (tei.v1) on {}", grpc.local_addr()?);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stop = std::sync::Arc::new(stop);
    let on_signal = stop.clone();
    tokio::spawn(async move {
        bertha_server::shutdown_signal().await;
        on_signal.send_replace(true);
    });
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let http = async {
        let done = bertha_server::serve(http, state.clone(), until_stopped(stopped.clone())).await;
        stop.send_replace(true);
        done.context("serving HTTP")
    };
    let grpc = async {
        let done =
            bertha_server::grpc::serve(grpc, state.clone(), until_stopped(stopped.clone())).await;
        stop.send_replace(true);
        done.context("serving gRPC")
    };
    let (http, grpc) = tokio::join!(http, grpc);
    http.and(grpc)
}
