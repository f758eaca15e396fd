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
    let huge = "x".repeat(3_000_000);
    let r = post(&url, Some("s3cret"), &json!({ "inputs": huge })).await;
    assert_eq!(r.status(), 413);
    server.stop().await;
}
