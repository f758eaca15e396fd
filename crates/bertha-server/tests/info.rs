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

/// `precision` bf16: `/info` says what runs (`bfloat16`, or `float32` on a
/// CPU without fast bf16 products: `cpu::has_bf16`), and `/embed` stays within cosine 0.9999 of
/// the fp32 library's vectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bf16_precision_is_reported_and_close_to_fp32() {
    let mut config = ServerConfig::new(minilm());
    config.precision = bertha::fast::Precision::Bf16;
    let server = Server::start(config).await;
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    let want_dtype = if bertha::fast::cpu::has_bf16() {
        "bfloat16"
    } else {
        "float32"
    };
    assert_eq!(info["model_dtype"], want_dtype);
    // The kernels that run, as BERTHA_ISA leaves them (`avx2` under the
    // mask, `avx512+vnni+bf16` on an AVX-512 Zen 4, ...).
    assert_eq!(info["isa"], bertha::fast::cpu::describe());
    assert!(
        info["isa"]
            .as_str()
            .is_some_and(|s| s.starts_with(bertha::fast::cpu::isa().name())),
        "{}",
        info["isa"]
    );
    let lib = bertha::Embedder::from_dir(
        &minilm(),
        &bertha::Device::Cpu,
        &bertha::EmbedOptions::default(),
    )
    .unwrap();
    let want = lib.embed(&TEXTS, 8, &mut |_| {}).unwrap();
    let (status, body) = server.post("/embed", json!({ "inputs": TEXTS })).await;
    assert_eq!(status, 200, "{body}");
    for (got, w) in body.as_array().unwrap().iter().zip(&want) {
        let got = common::floats(got);
        // Both are unit vectors: the dot product is the cosine.
        let cos: f32 = got.iter().zip(w).map(|(a, b)| a * b).sum();
        assert!(cos >= 0.9999, "{cos}");
    }
    server.stop().await;
}
