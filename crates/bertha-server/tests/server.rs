//! The real server on a loopback port, called over HTTP with a real
//! client; bodies are checked against the library's own outputs and
//! TEI's documented shapes.

use std::path::PathBuf;
use std::sync::Arc;

use bertha::tasks::{Classifier, FillMask, QaOptions, QuestionAnswerer, TokenClassifier};
use bertha::{Device, EmbedOptions, Embedder};
use bertha_server::{AppState, ServerConfig};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn minilm() -> PathBuf {
    let dir = repo().join(".cache/models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "run scripts/fetch-model.sh first"
    );
    dir
}

fn tiny(name: &str) -> PathBuf {
    repo().join("tests/fixtures/tiny").join(name)
}

struct Server {
    base: String,
    state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    async fn start(config: ServerConfig) -> Self {
        let state = AppState::load(config).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(bertha_server::serve(listener, state.clone(), async {
            let _ = rx.await;
        }));
        Self {
            base,
            state,
            stop: Some(stop),
            done: Some(done),
        }
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
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

    async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{path}", self.base)).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.done.take().unwrap().await.unwrap().unwrap();
    }
}

/// The JSON the server would send for `v` (f32 fields as serialised).
fn as_sent(v: &impl serde::Serialize) -> Value {
    serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

const TEXTS: [&str; 3] = [
    "The cat sat on the mat.",
    "I went to the bank to deposit money.",
    "",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedding_routes_match_the_library() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    let lib = Embedder::from_dir(&minilm(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let want = lib.embed(&TEXTS, 8, &mut |_| {}).unwrap();

    // TEI /embed: a list of vectors, normalised by default for this folder.
    let (status, body) = server.post("/embed", json!({ "inputs": TEXTS })).await;
    assert_eq!(status, 200, "{body}");
    let rows = body.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (r, w) in rows.iter().zip(&want) {
        assert!(close(&floats(r), w, 1e-6));
    }
    // A single string still gives a list of one vector.
    let (_, one) = server.post("/embed", json!({ "inputs": TEXTS[0] })).await;
    assert!(close(&floats(&one[0]), &want[0], 1e-6));
    // normalize: false gives the raw mean-pooled vector.
    let (_, raw) = server
        .post("/embed", json!({ "inputs": TEXTS[0], "normalize": false }))
        .await;
    let raw = floats(&raw[0]);
    let norm: f32 = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3);
    assert!(close(
        &raw.iter().map(|x| x / norm).collect::<Vec<_>>(),
        &want[0],
        1e-6
    ));

    // /embed_all: [[[f32]]], one vector per token, the model's last state.
    let (status, all) = server
        .post("/embed_all", json!({ "inputs": [TEXTS[0]] }))
        .await;
    assert_eq!(status, 200);
    let tokens = all[0].as_array().unwrap();
    assert_eq!(tokens.len(), 9);
    let fx = candle_core_fixture();
    let want_states: Vec<Vec<f32>> = fx["last_hidden_state.0"].to_vec2().unwrap();
    for (t, w) in tokens.iter().zip(&want_states) {
        assert!(close(&floats(t), w, 1e-4));
    }

    // /similarity
    let (_, sims) = server
        .post(
            "/similarity",
            json!({ "inputs": { "source_sentence": TEXTS[0], "sentences": [TEXTS[0], TEXTS[1]] } }),
        )
        .await;
    let sims = floats(&sims);
    assert!((sims[0] - 1.0).abs() < 1e-5);
    let dot: f32 = want[0].iter().zip(&want[1]).map(|(a, b)| a * b).sum();
    assert!((sims[1] - dot).abs() < 1e-5);

    // OpenAI /v1/embeddings, float and base64.
    let (status, oa) = server
        .post(
            "/v1/embeddings",
            json!({ "input": [TEXTS[0], TEXTS[1]], "model": "m" }),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(oa["object"], "list");
    assert_eq!(oa["model"], "m");
    assert_eq!(oa["data"][1]["index"], 1);
    assert_eq!(oa["data"][0]["object"], "embedding");
    assert!(close(&floats(&oa["data"][0]["embedding"]), &want[0], 1e-6));
    let n_tokens = lib.tokenizer().encode(TEXTS[0]).unwrap().len()
        + lib.tokenizer().encode(TEXTS[1]).unwrap().len();
    assert_eq!(oa["usage"]["prompt_tokens"], n_tokens);
    assert_eq!(oa["usage"]["total_tokens"], n_tokens);
    let (_, b64) = server
        .post(
            "/v1/embeddings",
            json!({ "input": TEXTS[0], "encoding_format": "base64" }),
        )
        .await;
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(close(&decoded, &want[0], 1e-6));

    // /tokenize and /decode
    let (_, toks) = server
        .post("/tokenize", json!({ "inputs": "The cat" }))
        .await;
    assert_eq!(
        toks,
        json!([[
            { "id": 101, "text": "[CLS]", "special": true, "start": null, "stop": null },
            { "id": 1996, "text": "the", "special": false, "start": 0, "stop": 3 },
            { "id": 4937, "text": "cat", "special": false, "start": 4, "stop": 7 },
            { "id": 102, "text": "[SEP]", "special": true, "start": null, "stop": null }
        ]])
    );
    let (_, text) = server
        .post("/decode", json!({ "ids": [101, 1996, 4937, 102] }))
        .await;
    assert_eq!(text, json!(["the cat"]));

    // /health, /info, /metrics, /openapi.json and the page.
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

    // /attention: the model's probabilities (checked against transformers).
    let (_, att) = server
        .post("/attention", json!({ "inputs": TEXTS[1], "layer": 2 }))
        .await;
    assert_eq!(att["layers"], 6);
    let want_att: Vec<Vec<Vec<f32>>> = fx["attentions.1"].get(2).unwrap().to_vec3().unwrap();
    let got: Vec<Vec<Vec<f32>>> = serde_json::from_value(att["attentions"][0].clone()).unwrap();
    assert_eq!(got.len(), 12);
    for (g, w) in got.iter().flatten().zip(want_att.iter().flatten()) {
        assert!(close(g, w, 1e-4));
    }
    server.stop().await;
}

fn candle_core_fixture() -> std::collections::HashMap<String, bertha::Tensor> {
    candle_core::safetensors::load(
        repo().join("tests/fixtures/minilm.safetensors"),
        &Device::Cpu,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_tei_status_codes_and_shapes() {
    let mut config = ServerConfig::new(minilm());
    config.max_client_batch_size = 2;
    config.api_key = Some("s3cret".into());
    let server = Server::start(config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/embed", server.base);

    // 401 without or with a wrong key; the key works.
    let r = client
        .post(&url)
        .json(&json!({ "inputs": "hi" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error_type"], "Unauthorized");
    let r = client
        .post(&url)
        .bearer_auth("nope")
        .json(&json!({ "inputs": "hi" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let call = |body: Value| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let r = client
                .post(&url)
                .bearer_auth("s3cret")
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(call(json!({ "inputs": "hi" })).await.0, 200);

    // 422 naming the field for wrong types and unknown fields.
    let (status, body) = call(json!({ "inputs": 5 })).await;
    assert_eq!(status, 422);
    assert!(body["error"].as_str().unwrap().contains("inputs"), "{body}");
    assert_eq!(body["error_type"], "Validation");
    let (status, body) = call(json!({ "inputs": "hi", "normalise": true })).await;
    assert_eq!(status, 422);
    assert!(
        body["error"].as_str().unwrap().contains("normalise"),
        "{body}"
    );
    // Malformed JSON is a 422 too.
    let r = client
        .post(&url)
        .bearer_auth("s3cret")
        .header("content-type", "application/json")
        .body("{\"inputs\": \"x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    // Batch larger than --max-client-batch-size, and an empty batch.
    assert_eq!(call(json!({ "inputs": ["a", "b", "c"] })).await.0, 422);
    assert_eq!(call(json!({ "inputs": [] })).await.0, 422);

    // 413 for an over-long input unless truncate is set.
    let long = "word ".repeat(600);
    let (status, body) = call(json!({ "inputs": long })).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("256 tokens"),
        "{body}"
    );
    let text = format!("alpha {long}");
    let (status, right) = call(json!({ "inputs": text, "truncate": true })).await;
    assert_eq!(status, 200);
    let (_, left) =
        call(json!({ "inputs": text, "truncate": true, "truncation_direction": "Left" })).await;
    let (_, words) = call(json!({ "inputs": long, "truncate": true })).await;
    assert_ne!(right, left, "left truncation drops `alpha`, right keeps it");
    assert_eq!(left, words, "left truncation keeps only the repeated word");

    // 429 at once when every request slot is taken.
    let permits = server
        .state
        .limit
        .clone()
        .acquire_many_owned(512)
        .await
        .unwrap();
    let (status, body) = call(json!({ "inputs": "hi" })).await;
    assert_eq!(status, 429);
    assert_eq!(body["error_type"], "Overloaded");
    drop(permits);
    assert_eq!(call(json!({ "inputs": "hi" })).await.0, 200);

    // A head the checkpoint does not have.
    let r = client
        .post(format!("{}/fill-mask", server.base))
        .bearer_auth("s3cret")
        .json(&json!({ "inputs": "a [MASK]" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("BertForMaskedLM"),
        "{body}"
    );

    // A body over the payload limit.
    let huge = "x".repeat(3_000_000);
    let r = client
        .post(&url)
        .bearer_auth("s3cret")
        .json(&json!({ "inputs": huge }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_routes_match_the_pipelines() {
    // Sequence classification: /predict and /rerank.
    let server = Server::start(ServerConfig::new(tiny("bert-seqcls"))).await;
    let lib = Classifier::from_dir(&tiny("bert-seqcls"), &Device::Cpu).unwrap();
    let want = lib.classify("the cat sat", None, None).unwrap();
    let (status, got) = server
        .post("/predict", json!({ "inputs": "the cat sat" }))
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got[0]["label"], want[0].label.as_str());
    assert!((got[0]["score"].as_f64().unwrap() as f32 - want[0].score).abs() < 1e-6);
    let pair = lib.classify("the cat", Some("sat down"), None).unwrap();
    let (_, got) = server
        .post("/predict", json!({ "inputs": ["the cat", "sat down"] }))
        .await;
    assert_eq!(got[0]["label"], pair[0].label.as_str());
    let (_, batch) = server
        .post(
            "/predict",
            json!({ "inputs": [["the cat", "sat down"], "the cat sat"] }),
        )
        .await;
    assert_eq!(batch.as_array().unwrap().len(), 2);
    assert_eq!(batch[1][0]["label"], want[0].label.as_str());
    let (_, ranked) = server.post("/rerank", json!({ "query": "the cat", "texts": ["sat down", "a dog", "the mat"], "return_text": true })).await;
    let ranked = ranked.as_array().unwrap();
    assert_eq!(ranked.len(), 3);
    assert!(ranked
        .windows(2)
        .all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
    let last_label = lib.labels().last().cloned().unwrap();
    for r in ranked {
        let i = r["index"].as_u64().unwrap() as usize;
        let text = ["sat down", "a dog", "the mat"][i];
        assert_eq!(r["text"], text);
        let s = lib.classify("the cat", Some(text), None).unwrap();
        let want = s.iter().find(|x| x.label == last_label).unwrap().score;
        assert!((r["score"].as_f64().unwrap() as f32 - want).abs() < 1e-6);
    }
    server.stop().await;

    // Masked LM: /fill-mask.
    let server = Server::start(ServerConfig::new(tiny("bert-mlm"))).await;
    let lib = FillMask::from_dir(&tiny("bert-mlm"), &Device::Cpu).unwrap();
    let want = lib.fill("the [MASK] sat", 3).unwrap();
    let (status, got) = server
        .post(
            "/fill-mask",
            json!({ "inputs": "the [MASK] sat", "top_k": 3 }),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, as_sent(&want));
    let (status, _) = server
        .post("/fill-mask", json!({ "inputs": "no mask here" }))
        .await;
    assert_eq!(status, 422);
    server.stop().await;

    // Token classification: /ner.
    let server = Server::start(ServerConfig::new(tiny("bert-tokcls"))).await;
    let lib = TokenClassifier::from_dir(&tiny("bert-tokcls"), &Device::Cpu).unwrap();
    let want = lib
        .entities("the cat sat on the mat", "simple".parse().unwrap())
        .unwrap();
    let (_, got) = server
        .post("/ner", json!({ "inputs": "the cat sat on the mat" }))
        .await;
    assert_eq!(got, as_sent(&want));
    server.stop().await;

    // Question answering: /qa.
    let server = Server::start(ServerConfig::new(tiny("bert-qa"))).await;
    let lib = QuestionAnswerer::from_dir(&tiny("bert-qa"), &Device::Cpu).unwrap();
    let want = lib
        .answer(
            "where is the cat",
            "the cat sat on the mat",
            &QaOptions::default(),
        )
        .unwrap();
    let (_, got) = server
        .post(
            "/qa",
            json!({ "question": "where is the cat", "context": "the cat sat on the mat" }),
        )
        .await;
    assert_eq!(got, as_sent(&want[0]));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_batched_and_answered_in_order() {
    let server = Arc::new(Server::start(ServerConfig::new(minilm())).await);
    let lib = Embedder::from_dir(&minilm(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let texts: Vec<String> = (0..24)
        .map(|i| {
            format!(
                "sentence number {i} about {}",
                ["cats", "banks", "rivers"][i % 3]
            )
        })
        .collect();
    let want = lib.embed(&texts, 32, &mut |_| {}).unwrap();
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let server = server.clone();
        let mine: Vec<String> = texts[chunk * 3..chunk * 3 + 3].to_vec();
        tasks.push(tokio::spawn(async move {
            server.post("/embed", json!({ "inputs": mine })).await
        }));
    }
    for (chunk, t) in tasks.into_iter().enumerate() {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200);
        for (j, row) in body.as_array().unwrap().iter().enumerate() {
            assert!(
                close(&floats(row), &want[chunk * 3 + j], 1e-5),
                "chunk {chunk} row {j}"
            );
        }
    }
    let (_, metrics) = server.get("/metrics").await;
    assert!(metrics.contains("bertha_batch_size_count"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    let url = format!("{}/embed", server.base);
    let texts: Vec<String> = (0..32)
        .map(|i| format!("{} {i}", "a rather long sentence ".repeat(10)))
        .collect();
    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&json!({ "inputs": texts }))
            .send()
            .await
    });
    // Wait until the request holds a slot (it is in flight), then stop.
    while server.state.limit.available_permits() == 512 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    server.stop().await;
    let r = request.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body.as_array().unwrap().len(), 32);
}
