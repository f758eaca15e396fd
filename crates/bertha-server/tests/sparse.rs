//! TEI's `/embed_sparse` on SPLADE models (the SparseEncoder folder of
//! `tests/fixtures/splade`, and `--pooling splade` on the tiny MLM
//! checkpoint): the library's sparse vectors in TEI's `[[{index, value}]]`
//! shape, `POST /` and `/invocations` dispatching to it, `/info`'s pooling,
//! what the other embedding routes do on a SPLADE model (as TEI), the 4xx
//! answers, and concurrent requests sharing batches without sharing a
//! bad one's failure.

mod common;

use std::sync::Arc;

use bertha::{Device, EmbedOptions, Embedder, Encoded, Pooling, SparseVector};
use bertha_server::batcher::{Output, Want};
use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{as_sent, fixtures, minilm, tiny_dir, Server};

fn st_folder() -> std::path::PathBuf {
    fixtures().join("splade/st-folder")
}

fn texts() -> Vec<String> {
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("splade/expected.json")).unwrap(),
    )
    .unwrap();
    serde_json::from_value(v["texts"].clone()).unwrap()
}

fn library(dir: &std::path::Path, pooling: Option<Pooling>) -> Embedder {
    let opts = EmbedOptions {
        pooling,
        ..EmbedOptions::default()
    };
    Embedder::from_dir(dir, &Device::Cpu, &opts).unwrap()
}

/// The server's answer for one input against the library's vector: the
/// same indices, values within 1e-5 (the MLM head's matrix product can
/// differ in the last bit with the rows it runs together).
#[track_caller]
fn assert_vector(got: &Value, want: &SparseVector) {
    let got: SparseVector = serde_json::from_value(got.clone())
        .unwrap_or_else(|e| panic!("not [{{index, value}}]: {e}: {got}"));
    assert_eq!(got.indices(), want.indices());
    for (g, w) in got.0.iter().zip(&want.0) {
        assert!(
            (g.value - w.value).abs() <= 1e-5,
            "index {}: {} vs {}",
            g.index,
            g.value,
            w.value
        );
    }
}

#[track_caller]
fn assert_vectors(body: &Value, want: &[SparseVector]) {
    let rows = body
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {body}"));
    assert_eq!(rows.len(), want.len(), "{body}");
    for (r, w) in rows.iter().zip(want) {
        assert_vector(r, w);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_sparse_answers_the_library_vectors_and_is_the_root_route() {
    let server = Server::start(ServerConfig::new(st_folder())).await;
    let lib = library(&st_folder(), None);
    let texts = texts();
    // The long text (over 64 tokens) needs `truncate`.
    let want = lib.embed_sparse(&texts, 8, &mut |_| {}).unwrap();
    let body = json!({ "inputs": texts, "truncate": true });
    let (status, got) = server.post("/embed_sparse", body.clone()).await;
    assert_eq!(status, 200, "{got}");
    assert_vectors(&got, &want);
    // Entries are TEI's {index, value}, by increasing index.
    let first = &got[0][0];
    assert!(
        first["index"].is_u64() && first["value"].is_f64(),
        "{first}"
    );
    assert_eq!(got[0], as_sent(&want[0]));
    // One string is a list of one.
    let (status, one) = server
        .post("/embed_sparse", json!({ "inputs": texts[1] }))
        .await;
    assert_eq!(status, 200, "{one}");
    assert_vectors(&one, &want[1..2]);
    // TEI's other fields: a prompt of the folder, `null` truncate, a
    // direction.
    let (status, same) = server
        .post(
            "/embed_sparse",
            json!({ "inputs": [texts[0]], "prompt_name": "query", "truncate": null,
                    "truncation_direction": "Left" }),
        )
        .await;
    assert_eq!(status, 200, "{same}");
    assert_vectors(&same, &want[..1]);

    // POST / and /invocations are /embed_sparse for a SPLADE model.
    for root in ["/", "/invocations"] {
        let (status, got) = server.post(root, body.clone()).await;
        assert_eq!(status, 200, "{root}: {got}");
        assert_vectors(&got, &want);
    }
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(
        info["model_type"]["embedding"]["pooling"], "splade",
        "{info}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooling_splade_on_a_masked_lm_checkpoint() {
    let mut config = ServerConfig::new(tiny_dir("bert-mlm"));
    config.pooling = Some(Pooling::Splade);
    let server = Server::start(config).await;
    let lib = library(&tiny_dir("bert-mlm"), Some(Pooling::Splade));
    let texts = &texts()[..3];
    let want = lib.embed_sparse(texts, 8, &mut |_| {}).unwrap();
    let (status, got) = server.post("/", json!({ "inputs": texts })).await;
    assert_eq!(status, 200, "{got}");
    assert_vectors(&got, &want);
    server.stop().await;
}

/// The other embedding routes on a SPLADE model, as TEI: `/embed` gives the
/// dense vocabulary-sized vector with `normalize: false` and refuses
/// normalising (TEI's default), `/embed_all` and OpenAI's (normalised)
/// route are refused, `/similarity` works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_embedding_routes_on_a_splade_model_do_as_tei() {
    let server = Server::start(ServerConfig::new(st_folder())).await;
    let lib = library(&st_folder(), None);
    let texts = &texts()[..2];
    let sparse = lib.embed_sparse(texts, 8, &mut |_| {}).unwrap();

    let (status, dense) = server
        .post("/embed", json!({ "inputs": texts, "normalize": false }))
        .await;
    assert_eq!(status, 200, "{dense}");
    for (row, s) in dense.as_array().unwrap().iter().zip(&sparse) {
        let row: Vec<f32> = serde_json::from_value(row.clone()).unwrap();
        assert_eq!(row.len(), 1024);
        let want = s.to_dense(1024).unwrap();
        assert!(row.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5));
    }
    let (status, cut) = server
        .post(
            "/embed",
            json!({ "inputs": texts[0], "normalize": false, "dimensions": 5 }),
        )
        .await;
    assert_eq!(status, 200, "{cut}");
    assert_eq!(cut[0].as_array().unwrap().len(), 5);

    for (path, body, needle) in [
        ("/embed", json!({ "inputs": "a" }), "`normalize`"),
        (
            "/embed",
            json!({ "inputs": "a", "normalize": true }),
            "`normalize`",
        ),
        ("/embed_all", json!({ "inputs": "a" }), "`embed_all`"),
        ("/v1/embeddings", json!({ "input": "a" }), "/v1/embeddings"),
    ] {
        let (status, reply) = server.post(path, body).await;
        assert_eq!(status, 424, "{path}: {reply}");
        assert_eq!(reply["error_type"], "Backend", "{path}: {reply}");
        let message = reply["error"].as_str().unwrap();
        assert!(
            message.contains(needle) && message.contains("SPLADE"),
            "{path}: {message}"
        );
    }

    let (status, sims) = server
        .post(
            "/similarity",
            json!({ "inputs": { "source_sentence": texts[0], "sentences": [texts[0], texts[1]] } }),
        )
        .await;
    assert_eq!(status, 200, "{sims}");
    let sims: Vec<f32> = serde_json::from_value(sims).unwrap();
    let cosine =
        sparse[0].dot(&sparse[1]) / (sparse[0].dot(&sparse[0]) * sparse[1].dot(&sparse[1])).sqrt();
    assert!(
        (sims[0] - 1.0).abs() < 1e-5 && (sims[1] - cosine).abs() < 1e-5,
        "{sims:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_sparse_refusals() {
    let mut config = ServerConfig::new(st_folder());
    config.max_client_batch_size = 2;
    let server = Server::start(config).await;
    let long = texts()[3].clone();
    let cases = [
        // (body, status, words the message has)
        (json!({ "inputs": [] }), 422, "cannot be empty"),
        (json!({ "inputs": ["a", "b", "c"] }), 422, "batch size 3"),
        (json!({ "inputs": long }), 413, "truncate"),
        (
            json!({ "inputs": "a", "prompt_name": "nope" }),
            422,
            "`nope`",
        ),
        (
            json!({ "inputs": "a", "normalize": false }),
            422,
            "unknown field `normalize`",
        ),
        (json!({ "inputs": 5 }), 422, "inputs"),
        (json!(["a"]), 422, "expected a JSON object"),
        (
            json!({ "inputs": "a", "truncation_direction": "Middle" }),
            422,
            "Middle",
        ),
    ];
    for (body, status, needle) in cases {
        let (got, reply) = server.post("/embed_sparse", body.clone()).await;
        assert_eq!(got, status, "{body}: {reply}");
        assert_eq!(reply["error_type"], "Validation", "{body}: {reply}");
        let message = reply["error"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    // The long text is cut when asked.
    let (status, _) = server
        .post("/embed_sparse", json!({ "inputs": long, "truncate": true }))
        .await;
    assert_eq!(status, 200);
    server.stop().await;

    // A model that is not SPLADE: TEI's 424, and POST / stays /embed.
    let server = Server::start(ServerConfig::new(minilm())).await;
    let (status, reply) = server.post("/embed_sparse", json!({ "inputs": "a" })).await;
    assert_eq!(status, 424, "{reply}");
    assert_eq!(
        reply,
        json!({
            "error": "Model is not an embedding model with SPLADE pooling",
            "error_type": "Backend"
        })
    );
    let (status, root) = server.post("/", json!({ "inputs": "a" })).await;
    assert_eq!(status, 200);
    assert_eq!(root[0].as_array().unwrap().len(), 384);
    server.stop().await;
}

/// Sparse requests share batches; a request the model fails on (here: an
/// input over the 64 positions, handed to the batcher directly) gets its
/// error alone while the others of its batch get their vectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sparse_requests_share_batches_but_not_failures() {
    let server = Arc::new(Server::start(ServerConfig::new(st_folder())).await);
    let lib = library(&st_folder(), None);
    let texts: Vec<String> = (0..16)
        .map(|i| {
            format!(
                "the city {} was known for its {i} university",
                ["north", "south"][i % 2]
            )
        })
        .collect();
    let want = lib.embed_sparse(&texts, 32, &mut |_| {}).unwrap();
    let tokenizer = lib.tokenizer().clone();
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let server = server.clone();
        let mine: Vec<String> = texts[chunk * 2..chunk * 2 + 2].to_vec();
        tasks.push(tokio::spawn(async move {
            server
                .post("/embed_sparse", json!({ "inputs": mine }))
                .await
        }));
    }
    let mut bad = tokenizer.encode("the city").unwrap();
    bad.input_ids = vec![9; 100];
    bad.token_type_ids = vec![0; 100];
    bad.attention_mask = vec![1; 100];
    let good: Encoded = tokenizer.encode(&texts[0]).unwrap();
    let (bad, good) = {
        let state = &server.state;
        tokio::join!(
            state.batcher.run(vec![bad], Want::Sparse),
            state.batcher.run(vec![good], Want::Sparse)
        )
    };
    let err = bad.err().expect("100 tokens do not fit 64 positions");
    assert!(err.message.contains("100"), "{}", err.message);
    let Ok(Output::Sparse(good)) = good else {
        panic!("the good request failed with the bad one");
    };
    assert_vector(&as_sent(&good[0]), &want[0]);
    for (chunk, t) in tasks.into_iter().enumerate() {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_vectors(&body, &want[chunk * 2..chunk * 2 + 2]);
    }
}
