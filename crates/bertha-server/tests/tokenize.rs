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
