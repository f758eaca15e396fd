//! `/tokenize` and `/decode`: TEI's token objects, and back to text.

mod common;

use bertha_server::ServerConfig;
use serde_json::json;

use common::{minilm, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_decode() {
    let server = Server::start(ServerConfig::new(minilm())).await;
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
    server.stop().await;
}

/// As TEI, /tokenize shows every token of a text longer than
/// `max_input_length` (never a silent cut), and refuses a text over TEI's
/// character bound (250 per token of `max_input_length`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_texts_are_not_truncated() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    let long = "word ".repeat(600);
    let (status, toks) = server.post("/tokenize", json!({ "inputs": long })).await;
    assert_eq!(status, 200);
    let toks = toks[0].as_array().unwrap();
    assert_eq!(toks.len(), 602, "[CLS], 600 words, [SEP]");
    assert_eq!(toks[600]["text"], "word");
    assert_eq!(toks[600]["start"], 599 * 5);

    let limit = 256 * 250;
    let huge = "x".repeat(limit + 1);
    let (status, body) = server
        .post("/tokenize", json!({ "inputs": ["a", huge] }))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body["error"],
        format!(
            "`inputs[1]` must have less than {limit} characters. Given: {}",
            limit + 1
        )
    );
    let at_limit = "x".repeat(limit);
    assert_eq!(
        server
            .post("/tokenize", json!({ "inputs": at_limit }))
            .await
            .0,
        200
    );
    server.stop().await;
}
