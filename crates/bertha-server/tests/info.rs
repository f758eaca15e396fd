//! `/health`, `/info`, `/metrics`, `/openapi.json` and the playground
//! page.

mod common;

use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{minilm, Server, TEXTS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_info_metrics_openapi_and_the_page() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    // One /embed request, for /metrics to count.
    server.post("/embed", json!({ "inputs": TEXTS })).await;
    assert_eq!(server.get("/health").await.0, 200);
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
    assert_eq!(info["max_input_length"], 256);
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("bertha_requests_total{route=\"/embed\",status=\"200\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("bertha_batch_size"));
    let (_, openapi) = server.get("/openapi.json").await;
    let openapi: Value = serde_json::from_str(&openapi).unwrap();
    for route in [
        "/embed",
        "/embed_all",
        "/predict",
        "/rerank",
        "/v1/embeddings",
        "/qa",
        "/attention",
    ] {
        assert!(
            openapi["paths"].get(route).is_some(),
            "{route} missing from openapi.json"
        );
    }
    let (status, page) = server.get("/").await;
    assert_eq!(status, 200);
    assert!(page.contains("<title>bertha playground</title>"));
    server.stop().await;
}
