//! TEI's root routes: `POST /` and `/invocations` run the loaded model's
//! task (embed, predict or rerank), `GET /` stays the playground; OpenAI's
//! `GET /v1/models`; every error in TEI's `{error, error_type}` shape.

mod common;

use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{minilm, tiny_dir, Server};

/// `POST path` and `POST /`, `/invocations` with the same body answer the
/// same.
async fn root_is(server: &Server, path: &str, body: Value) {
    let (status, want) = server.post(path, body.clone()).await;
    assert_eq!(status, 200, "{want}");
    for root in ["/", "/invocations"] {
        let (status, got) = server.post(root, body.clone()).await;
        assert_eq!(status, 200, "{root}: {got}");
        assert_eq!(got, want, "{root} is {path}");
    }
}

/// The TEI error shape, with `status` and `error_type`.
#[track_caller]
fn assert_error(status: u16, body: &str, want_status: u16, error_type: &str) {
    assert_eq!(status, want_status, "{body}");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body:?}"));
    assert_eq!(body["error_type"], error_type, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
}

async fn send(request: reqwest::RequestBuilder) -> (u16, String) {
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_embeds_for_an_embedding_model_and_errors_have_tei_shape() {
    let mut config = ServerConfig::new(minilm());
    config.model_id = "my-minilm".into();
    // Small enough that the over-limit body below fits the socket's buffer
    // (a larger one can meet a broken pipe when the 413 closes first).
    config.payload_limit = 10_000;
    let server = Server::start(config).await;
    root_is(&server, "/embed", json!({ "inputs": ["a cat", "a bank"] })).await;
    let (status, page) = server.get("/").await;
    assert_eq!(status, 200);
    assert!(page.contains("<title>bertha playground</title>"));

    let (status, models) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "my-minilm");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["owned_by"], "bertha");
    assert!(models["data"][0]["created"].as_u64().unwrap() > 1_600_000_000);

    let (_, openapi) = server.get("/openapi.json").await;
    let openapi: Value = serde_json::from_str(&openapi).unwrap();
    for route in ["/", "/invocations", "/v1/models"] {
        assert!(openapi["paths"].get(route).is_some(), "{route}");
    }

    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.base);
    let (status, body) = server.get("/no-such-route").await;
    assert_error(status, &body, 404, "NotFound");
    let (status, body) = send(client.put(url("/"))).await;
    assert_error(status, &body, 405, "MethodNotAllowed");
    let (status, body) = server.get("/embed").await;
    assert_error(status, &body, 405, "MethodNotAllowed");
    let (status, body) = send(client.post(url("/embed")).body("{\"inputs\": \"x\"}")).await;
    assert_error(status, &body, 415, "Validation");
    let huge = json!({ "inputs": "x".repeat(20_000) });
    let (status, body) = send(client.post(url("/")).json(&huge)).await;
    assert_error(status, &body, 413, "Validation");
    let (status, body) = send(client.post(url("/")).json(&json!({ "input": "x" }))).await;
    assert_error(status, &body, 422, "Validation");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_needs_the_key_but_the_page_does_not() {
    let mut config = ServerConfig::new(minilm());
    config.api_key = Some("s3cret".into());
    let server = Server::start(config).await;
    let (status, body) = server.post("/", json!({ "inputs": "hi" })).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        server
            .post("/invocations", json!({ "inputs": "hi" }))
            .await
            .0,
        401
    );
    assert_eq!(server.get("/").await.0, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_predicts_for_a_classifier() {
    let server = Server::start(ServerConfig::new(tiny_dir("bert-seqcls"))).await;
    root_is(&server, "/predict", json!({ "inputs": "the cat sat" })).await;
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(
        info["model_type"]["classifier"]["id2label"]["2"],
        "positive"
    );
    assert_eq!(info["model_type"]["classifier"]["label2id"]["neutral"], 1);
    server.stop().await;
}

/// A copy of the tiny sequence classifier cut to one output: a reranker
/// (cross-encoder), as TEI tells them apart.
fn one_label_classifier() -> tempfile::TempDir {
    let src = tiny_dir("bert-seqcls");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("vocab.txt"), tmp.path().join("vocab.txt")).unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["id2label"] = json!({ "0": "LABEL_0" });
    config["label2id"] = json!({ "LABEL_0": 0 });
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let device = bertha::Device::Cpu;
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &device).unwrap();
    for name in ["classifier.weight", "classifier.bias"] {
        let t = tensors[name].narrow(0, 0, 1).unwrap().contiguous().unwrap();
        tensors.insert(name.to_string(), t);
    }
    candle_core::safetensors::save(&tensors, tmp.path().join("model.safetensors")).unwrap();
    tmp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_reranks_for_a_one_label_classifier() {
    let dir = one_label_classifier();
    let server = Server::start(ServerConfig::new(dir.path())).await;
    let body = json!({ "query": "the cat", "texts": ["sat down", "a dog"] });
    root_is(&server, "/rerank", body).await;
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["model_type"]["reranker"]["id2label"]["0"], "LABEL_0");
    server.stop().await;
}

/// TEI's `TASK=sentence-similarity`: the root answers `/similarity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_compares_sentences_for_the_similarity_task() {
    let mut config = ServerConfig::new(minilm());
    config.similarity_root = true;
    let server = Server::start(config).await;
    let inputs = json!({ "source_sentence": "a cat", "sentences": ["a dog", "a bank"] });
    root_is(&server, "/similarity", json!({ "inputs": inputs })).await;
    server.stop().await;
}
