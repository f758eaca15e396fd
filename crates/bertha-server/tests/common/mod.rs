//! What every server test shares: the real server on a loopback port
//! (started per test, stopped gracefully), an HTTP client for it, the
//! fixtures, and float comparisons.
#![allow(dead_code)]

use std::sync::Arc;

use bertha::Device;
use bertha_server::{AppState, ServerConfig};
use serde_json::Value;

#[path = "../../../../tests/paths.rs"]
mod paths;
#[allow(unused_imports)] // each test binary uses some
pub use paths::{fixtures, minilm, repo, tiny_dir};

/// A server on `127.0.0.1:0`, serving `state` until [`Server::stop`].
pub struct Server {
    pub base: String,
    pub state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    pub async fn start(config: ServerConfig) -> Self {
        Self::start_models(vec![config]).await
    }

    /// A server of several models, the first the default; `state` is its.
    pub async fn start_models(configs: Vec<ServerConfig>) -> Self {
        let states: Vec<Arc<AppState>> = configs
            .into_iter()
            .map(|c| AppState::load(c).unwrap())
            .collect();
        let state = states[0].clone();
        let served = Arc::new(bertha_server::Served::new(states).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(bertha_server::serve_models(listener, served, async {
            let _ = rx.await;
        }));
        Self {
            base,
            state,
            stop: Some(stop),
            done: Some(done),
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{path}", self.base)).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.done.take().unwrap().await.unwrap().unwrap();
    }
}

/// The JSON the server would send for `v` (f32 fields as serialised).
pub fn as_sent(v: &impl serde::Serialize) -> Value {
    serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap()
}

pub fn floats(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

pub fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

pub const TEXTS: [&str; 3] = [
    "The cat sat on the mat.",
    "I went to the bank to deposit money.",
    "",
];

/// transformers' outputs for MiniLM (`tests/fixtures/minilm.safetensors`).
pub fn candle_core_fixture() -> std::collections::HashMap<String, bertha::Tensor> {
    candle_core::safetensors::load(fixtures().join("minilm.safetensors"), &Device::Cpu).unwrap()
}
