//! Failures get TEI's status codes and `{error, error_type}` bodies: 401,
//! 413, 422, 429, a missing head, an over-large body.

mod common;

use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{minilm, Server};

/// POSTs `body` to `url`, with `key` as the bearer token when given.
async fn post(url: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = reqwest::Client::new().post(url).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_tei_status_codes_and_shapes() {
    let mut config = ServerConfig::new(minilm());
    config.max_client_batch_size = 2;
    config.api_key = Some("s3cret".into());
    // A small limit: the over-limit body below then fits the socket's
    // buffer, so the client finishes writing before the 413 closes the
    // connection (a body larger than the buffer can meet a broken pipe).
    config.payload_limit = 10_000;
    let server = Server::start(config).await;
    let url = format!("{}/embed", server.base);

    // 401 without or with a wrong key; the key works.
    let r = post(&url, None, &json!({ "inputs": "hi" })).await;
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error_type"], "Unauthorized");
    let r = post(&url, Some("nope"), &json!({ "inputs": "hi" })).await;
    assert_eq!(r.status(), 401);
    let call = |body: Value| {
        let url = url.clone();
        async move {
            let r = post(&url, Some("s3cret"), &body).await;
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
    let r = reqwest::Client::new()
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
    let r = post(
        &format!("{}/fill-mask", server.base),
        Some("s3cret"),
        &json!({ "inputs": "a [MASK]" }),
    )
    .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("BertForMaskedLM"),
        "{body}"
    );

    // A body over the payload limit.
    let huge = "x".repeat(20_000);
    let r = post(&url, Some("s3cret"), &json!({ "inputs": huge })).await;
    assert_eq!(r.status(), 413);
    server.stop().await;
}

/// A misspelt field is a 422 naming it on every route, never silently
/// ignored (a typo such as `topk` would otherwise change the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_rejected_on_every_route() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    // Each case: the route, the misspelt field, the body.
    let cases = [
        r#"/embed normalise {"inputs": "hi", "normalise": true}"#,
        r#"/embed_all normalise {"inputs": "hi", "normalise": true}"#,
        r#"/similarity truncat {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "truncat": true}"#,
        r#"/similarity sentence {"inputs": {"source_sentence": "a", "sentences": ["b"], "sentence": "c"}}"#,
        r#"/tokenize add_special {"inputs": "hi", "add_special": false}"#,
        r#"/decode skip_special {"ids": [101], "skip_special": false}"#,
        r#"/predict rawscores {"inputs": "hi", "rawscores": true}"#,
        r#"/rerank returntext {"query": "a", "texts": ["b"], "returntext": true}"#,
        r#"/fill-mask topk {"inputs": "a [MASK]", "topk": 3}"#,
        r#"/ner aggregation {"inputs": "hi", "aggregation": "none"}"#,
        r#"/qa topk {"question": "q", "context": "c", "topk": 3}"#,
        r#"/attention layers {"inputs": "hi", "layers": 0}"#,
        r#"/v1/embeddings inputs {"input": "hi", "inputs": "hi"}"#,
    ];
    for case in cases {
        let mut parts = case.splitn(3, ' ');
        let (path, field) = (parts.next().unwrap(), parts.next().unwrap());
        let body: Value = serde_json::from_str(parts.next().unwrap()).unwrap();
        let (status, reply) = server.post(path, body.clone()).await;
        assert_eq!(status, 422, "{path} {body}: {reply}");
        assert_eq!(reply["error_type"], "Validation", "{path}: {reply}");
        let message = reply["error"].as_str().unwrap();
        assert!(
            message.contains(&format!("unknown field `{field}`")),
            "{path}: {message}"
        );
    }
    server.stop().await;
}

/// A request body, or a nested object such as /similarity's `inputs`, that
/// is a JSON array or a scalar is a 422, never read as the struct's fields
/// in order (serde's derive accepts `["hi", true]` for `{inputs, normalize}`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_array_is_not_a_request_object() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    let cases = [
        ("/", json!(["hi"])),
        ("/invocations", json!(["hi"])),
        ("/embed", json!(["hi", true])),
        ("/embed_all", json!(["hi"])),
        ("/similarity", json!([["a", ["b"]]])),
        ("/similarity", json!({ "inputs": ["a", ["b"]] })),
        ("/tokenize", json!(["hi"])),
        ("/decode", json!([[101, 102]])),
        ("/predict", json!(["hi"])),
        ("/rerank", json!(["a", ["b"]])),
        ("/fill-mask", json!(["a [MASK]"])),
        ("/ner", json!(["hi"])),
        ("/qa", json!(["q", "c"])),
        ("/attention", json!(["hi"])),
        ("/v1/embeddings", json!(["hi"])),
        ("/embed", json!("hi")),
        ("/embed", json!(5)),
        ("/embed", json!(null)),
    ];
    for (path, body) in cases {
        let (status, reply) = server.post(path, body.clone()).await;
        assert_eq!(status, 422, "{path} {body}: {reply}");
        assert_eq!(reply["error_type"], "Validation", "{path}: {reply}");
        let message = reply["error"].as_str().unwrap();
        assert!(
            message.contains("expected a JSON object"),
            "{path} {body}: {message}"
        );
    }
    server.stop().await;
}

/// A 500 tells the client what failed in one line; the backtrace that
/// candle appends (with the server's source paths) stays in the log.
#[tokio::test]
async fn server_errors_send_no_backtrace() {
    use axum::response::IntoResponse;
    let message = "index-select invalid index 30527 with dim size 30522\n\
                   \x20  0: candle_core::error::Error::bt\n\
                   \x20            at /home/u/.cargo/registry/src/candle-core-0.9.1/src/error.rs:264:25";
    let response = bertha_server::error::ApiError::backend(message).into_response();
    assert_eq!(response.status(), 500);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        body,
        json!({
            "error": "index-select invalid index 30527 with dim size 30522",
            "error_type": "Backend"
        })
    );
}

/// An empty (or blank) API key is refused when the server starts, rather
/// than answering 401 to every call.
#[test]
fn an_empty_api_key_is_refused_at_start() {
    for key in ["", "  "] {
        let mut config = ServerConfig::new(minilm());
        config.api_key = Some(key.into());
        let err = bertha_server::AppState::load(config)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("api_key is empty"), "{err}");
    }
}
