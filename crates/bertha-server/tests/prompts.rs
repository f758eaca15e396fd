//! Prompts (`prompt_name`) and Matryoshka `dimensions` on `/embed`,
//! `/similarity` and `/v1/embeddings`, and the prompts `/info` lists, on
//! the sentence-transformers 6 fixture (`tests/fixtures/st-embedding`),
//! against sentence-transformers' own embeddings.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine;
use bertha::tasks::EncodeOptions;
use bertha::{Device, EmbedOptions, Embedder};
use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{close, fixtures, floats, Server};

fn dir() -> PathBuf {
    fixtures().join("st-embedding")
}

fn anchors() -> Vec<String> {
    let text = std::fs::read_to_string(dir().join("inputs.json")).unwrap();
    let inputs: Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(inputs["anchors"].clone()).unwrap()
}

/// The rows of the fixture's tensor `name`.
fn expected(name: &str) -> Vec<Vec<f32>> {
    let all =
        candle_core::safetensors::load(dir().join("expected.safetensors"), &Device::Cpu).unwrap();
    all[name].to_vec2().unwrap()
}

#[track_caller]
fn assert_rows(body: &Value, want: &[Vec<f32>]) {
    let rows = body.as_array().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(rows.len(), want.len());
    for (r, w) in rows.iter().zip(want) {
        assert!(close(&floats(r), w, 1e-5), "{r} vs {w:?}");
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_takes_prompt_name_and_dimensions() {
    let server = Server::start(ServerConfig::new(dir())).await;
    let texts = anchors();
    let (status, body) = server.post("/embed", json!({ "inputs": texts })).await;
    assert_eq!(status, 200, "{body}");
    assert_rows(&body, &expected("embeddings.anchor"));
    let (_, body) = server
        .post("/embed", json!({ "inputs": texts, "prompt_name": "query" }))
        .await;
    assert_rows(&body, &expected("embeddings.query_prompt.anchor"));
    let (_, body) = server
        .post("/embed", json!({ "inputs": texts, "dimensions": 16 }))
        .await;
    assert_rows(&body, &expected("embeddings.anchor_dim16"));
    // normalize: false keeps the truncated vector as it is.
    let (_, raw) = server
        .post(
            "/embed",
            json!({ "inputs": texts[0], "dimensions": 16, "normalize": false }),
        )
        .await;
    let raw = floats(&raw[0]);
    assert_eq!(raw.len(), 16);
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    let unit: Vec<f32> = raw.iter().map(|x| x / norm).collect();
    assert!(close(&unit, &expected("embeddings.anchor_dim16")[0], 1e-5));

    // Errors are 422s that say what is wrong.
    let (status, body) = server
        .post(
            "/embed",
            json!({ "inputs": "hi", "prompt_name": "passage" }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let msg = body["error"].as_str().unwrap();
    assert!(
        msg.contains("`passage`") && msg.contains("`document`, `query`"),
        "{msg}"
    );
    for d in [0, 65] {
        let (status, body) = server
            .post("/embed", json!({ "inputs": "hi", "dimensions": d }))
            .await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("64 dimensions"),
            "{body}"
        );
    }
    // TEI has no `prompt` field: unknown fields stay rejected.
    let (status, _) = server
        .post("/embed", json!({ "inputs": "hi", "prompt": "query: " }))
        .await;
    assert_eq!(status, 422);
    let (status, body) = server
        .post("/embed_all", json!({ "inputs": "hi", "dimensions": 8 }))
        .await;
    assert_eq!(status, 422, "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn similarity_and_openai_take_the_prompt_and_dimensions() {
    let server = Server::start(ServerConfig::new(dir())).await;
    let texts = anchors();
    let inputs = json!({ "source_sentence": texts[0], "sentences": texts[1..] });
    for (extra, name) in [
        (
            json!({ "prompt_name": "query" }),
            "embeddings.query_prompt.anchor",
        ),
        (json!({ "dimensions": 16 }), "embeddings.anchor_dim16"),
    ] {
        let mut top = json!({ "inputs": inputs });
        top.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        // TEI's (and huggingface_hub's) form: the options in `parameters`.
        let tei = json!({ "inputs": inputs, "parameters": extra });
        for req in [top, tei] {
            let (status, body) = server.post("/similarity", req.clone()).await;
            assert_eq!(status, 200, "{req}: {body}");
            let want = expected(name);
            let got = floats(&body);
            let want: Vec<f32> = want[1..].iter().map(|w| cosine(&want[0], w)).collect();
            assert!(close(&got, &want, 1e-5), "{req}: {got:?} vs {want:?}");
        }
    }
    // An option in both places, or one `parameters` does not know: refused.
    for (req, says) in [
        (
            json!({ "inputs": inputs, "dimensions": 8, "parameters": { "dimensions": 16 } }),
            "given both at the top level and in `parameters`",
        ),
        (
            json!({ "inputs": inputs, "parameters": { "truncat": true } }),
            "unknown field `truncat`",
        ),
    ] {
        let (status, body) = server.post("/similarity", req).await;
        assert_eq!(status, 422, "{body}");
        assert!(body["error"].as_str().unwrap().contains(says), "{body}");
    }

    let dim16 = expected("embeddings.anchor_dim16");
    let (status, body) = server
        .post(
            "/v1/embeddings",
            json!({ "input": texts, "dimensions": 16 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for (item, w) in body["data"].as_array().unwrap().iter().zip(&dim16) {
        assert!(close(&floats(&item["embedding"]), w, 1e-5));
    }
    let (_, body) = server
        .post(
            "/v1/embeddings",
            json!({ "input": texts[0], "dimensions": 16, "encoding_format": "base64" }),
        )
        .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(body["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let got: Vec<f32> = bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(close(&got, &dim16[0], 1e-5));
    let (status, body) = server
        .post("/v1/embeddings", json!({ "input": "hi", "dimensions": 65 }))
        .await;
    assert_eq!(status, 422, "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_lists_the_prompts() {
    let server = Server::start(ServerConfig::new(dir())).await;
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(
        info["prompts"],
        json!({ "document": "passage: ", "query": "query: " })
    );
    assert_eq!(info["default_prompt_name"], Value::Null);
    assert_eq!(info["max_input_length"], 32);
    server.stop().await;
}

/// The fixture folder with `include_prompt: false` and a default prompt.
fn excluding_prompt_copy(to: &Path) {
    for entry in walk(&dir()) {
        let rel = entry.strip_prefix(dir()).unwrap();
        std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(&entry, to.join(rel)).unwrap();
    }
    std::fs::write(
        to.join("1_Pooling/config.json"),
        r#"{"embedding_dimension": 64, "pooling_mode": "mean", "include_prompt": false}"#,
    )
    .unwrap();
    let config = to.join("config_sentence_transformers.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    v["default_prompt_name"] = json!("query");
    std::fs::write(&config, v.to_string()).unwrap();
}

fn walk(d: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(d)
        .unwrap()
        .flat_map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p)
            } else {
                vec![p]
            }
        })
        .collect()
}

/// A folder whose pooling leaves the prompt out: the server's vectors are
/// the library's (whose pooling past the prompt is checked against the
/// encoder's states in the library's tests), with the default prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooling_without_the_prompt_is_served_as_the_library_computes_it() {
    let tmp = tempfile::tempdir().unwrap();
    excluding_prompt_copy(tmp.path());
    let lib = Embedder::from_dir(tmp.path(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    assert!(!lib.include_prompt());
    let texts = anchors();
    let with_default = lib.embed(&texts, 8, &mut |_| {}).unwrap();
    let document = EncodeOptions {
        prompt_name: Some("document".into()),
        ..Default::default()
    };
    let with_document = lib.embed_with(&texts, &document, 8, &mut |_| {}).unwrap();

    let server = Server::start(ServerConfig::new(tmp.path())).await;
    let (status, body) = server.post("/embed", json!({ "inputs": texts })).await;
    assert_eq!(status, 200, "{body}");
    assert_rows(&body, &with_default);
    let (_, body) = server
        .post(
            "/embed",
            json!({ "inputs": texts, "prompt_name": "document" }),
        )
        .await;
    assert_rows(&body, &with_document);
    // Cutting from the left would cut the prompt that pooling skips.
    let long = "word ".repeat(60);
    let (status, body) = server
        .post(
            "/embed",
            json!({ "inputs": long, "truncate": true, "truncation_direction": "Left" }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("include_prompt"));
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["default_prompt_name"], "query");
    server.stop().await;
}
