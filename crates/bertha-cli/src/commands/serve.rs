//! `bertha serve`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bertha::Pooling;
use bertha_server::{AppState, Served, ServerConfig};

use crate::model_dir::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder in the Hugging Face layout, or NAME=DIR; repeat for
    /// several models (each under /models/NAME/, the first also at the top
    /// level). Default: $BERTHA_MODEL, else the fetched all-MiniLM-L6-v2.
    #[arg(long, short = 'm', env = "BERTHA_MODEL", value_name = "[NAME=]DIR")]
    model: Vec<String>,

    #[arg(long, default_value = "127.0.0.1")]
    host: String,

    #[arg(long, default_value_t = 8080)]
    port: u16,

    /// Also serve TEI's gRPC API (tei.v1: Info, Embed, Predict, Rerank,
    /// Tokenize) on this port, beside HTTP, on the same host. Needs a
    /// build with gRPC, which the default build leaves out (as TEI ships
    /// gRPC as images of its own): `cargo build --release -p bertha-cli
    /// --features grpc`.
    #[arg(long)]
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

    /// Most windows one /qa context may be cut into (each a model pass of
    /// up to 384 tokens); more is refused (422) before any model work.
    #[arg(long, default_value_t = bertha_server::state::DEFAULT_MAX_QA_WINDOWS)]
    max_qa_windows: usize,

    /// Largest request body in bytes.
    #[arg(long, default_value_t = 2_000_000)]
    payload_limit: usize,

    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "BERTHA_API_KEY")]
    api_key: Option<String>,

    /// Number format of the embedding model's multiplies: f32, bf16 or
    /// int8 (see `bertha embed --help`); /info's `model_dtype` says it.
    #[arg(long, alias = "quantize", default_value = "f32")]
    precision: bertha::fast::Precision,

    /// int8 calibration texts, one per line (default: built-in English
    /// sentences).
    #[arg(long, value_name = "FILE")]
    calibration: Option<std::path::PathBuf>,

    /// Pooling for /embed (default: the folder's, else mean); `splade` on a
    /// masked-LM checkpoint serves TEI's /embed_sparse (and `POST /`).
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
    let models = named_models(&a.model, a.served_model_name.as_deref())?;
    let pooling = a
        .pooling
        .as_deref()
        .map(str::parse::<Pooling>)
        .transpose()?;
    let mut states = Vec::with_capacity(models.len());
    for (name, dir) in &models {
        let mut config = ServerConfig::new(dir);
        config.model_id = name.clone();
        config.pooling = pooling;
        config.precision = a.precision;
        config.calibration = a.calibration.clone();
        config.max_batch_tokens = a.max_batch_tokens.max(1);
        config.max_concurrent_requests = a.max_concurrent_requests.max(1);
        config.max_client_batch_size = a.max_client_batch_size.max(1);
        config.max_input_length = a.max_input_length;
        config.max_qa_windows = a.max_qa_windows;
        config.payload_limit = a.payload_limit;
        config.api_key = a.api_key.clone();
        config.similarity_root = a.task.as_deref() == Some("sentence-similarity");
        if let Some(n) = a.max_connections {
            config.connections.max_connections = n;
        }
        config.connections.header_read_timeout = Duration::from_secs(a.header_read_timeout);
        config.connections.keep_alive_timeout = Duration::from_secs(a.keep_alive_timeout);
        // The server's own settings first: their errors are not the model's.
        config.check()?;
        let state = AppState::load(config)
            .with_context(|| format!("loading the model `{name}` from {}", dir.display()))?;
        states.push(state);
    }
    let served = Arc::new(Served::new(states)?);
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
        // The first line ends with the address (scripts and tests read it).
        // One write, and no panic if stderr is gone: a reader that hung up
        // after the address must not stop the server.
        let mut banner = format!("bertha serving on http://{}\n", listener.local_addr()?);
        for (i, (name, dir)) in models.iter().enumerate() {
            let top = if i == 0 { " and at the top level" } else { "" };
            banner += &format!("  `{name}`: {} at /models/{name}/{top}\n", dir.display());
        }
        let _ = std::io::Write::write_all(&mut std::io::stderr(), banner.as_bytes());
        #[cfg(feature = "grpc")]
        if let Some(port) = a.grpc_port {
            return serve_both(listener, &a.host, port, served).await;
        }
        bertha_server::serve_models(listener, served, bertha_server::shutdown_signal()).await?;
        Ok(())
    })
}

/// The models to serve, named: `NAME=DIR`, or `DIR` named by
/// `--served-model-name` (one model only) or its folder. A value that is an
/// existing path is a folder even if it holds a `=`.
fn named_models(values: &[String], served_name: Option<&str>) -> Result<Vec<(String, PathBuf)>> {
    if values.len() > 1 && served_name.is_some() {
        bail!("--served-model-name names one model: with several, give each as --model NAME=DIR");
    }
    if values.is_empty() {
        let dir = ModelArgs { model: None }.resolve()?;
        return Ok(vec![(name_of(&dir, served_name), dir)]);
    }
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        let (name, dir) = match v.split_once('=') {
            Some((name, dir)) if !Path::new(v).exists() => {
                if name.is_empty() || dir.is_empty() {
                    bail!("--model `{v}`: expected NAME=DIR or DIR");
                }
                (Some(name.to_string()), PathBuf::from(dir))
            }
            _ => (None, PathBuf::from(v)),
        };
        let dir = ModelArgs { model: Some(dir) }.resolve()?;
        let name = name.unwrap_or_else(|| name_of(&dir, served_name));
        out.push((name, dir));
    }
    Ok(out)
}

/// `--served-model-name`, else the folder's name with what a URL path
/// cannot hold (see [`bertha_server::served::check_name`]) as `-`.
fn name_of(dir: &Path, served_name: Option<&str>) -> String {
    served_name.map(str::to_string).unwrap_or_else(|| {
        dir.file_name()
            .map(|n| {
                n.to_string_lossy()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                            c
                        } else {
                            '-'
                        }
                    })
                    .collect()
            })
            .unwrap_or_else(|| "bertha".into())
    })
}

/// HTTP on `http`, gRPC (the first model: TEI's proto names no model) on
/// `host:grpc_port`; SIGTERM or Ctrl-C stops both, each finishing its
/// in-flight requests, and so does either one failing.
#[cfg(feature = "grpc")]
async fn serve_both(
    http: tokio::net::TcpListener,
    host: &str,
    grpc_port: u16,
    served: Arc<Served>,
) -> Result<()> {
    let state = served.default_model().clone();
    let addr = format!("{host}:{grpc_port}");
    let grpc = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--grpc-port)"))?;
    let line = format!("bertha serving gRPC (tei.v1) on {}\n", grpc.local_addr()?);
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
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
        let done =
            bertha_server::serve_models(http, served.clone(), until_stopped(stopped.clone())).await;
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
