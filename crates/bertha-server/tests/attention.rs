//! `/attention`: the model's attention probabilities, checked against
//! transformers.

mod common;

use bertha_server::ServerConfig;
use serde_json::json;

use common::{candle_core_fixture, close, minilm, Server, TEXTS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attention_is_the_models_probabilities() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    let fx = candle_core_fixture();
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

/// An input over `max_input_length` is a 413 with /embed's message, not
/// silently cut; `truncate: true` cuts it and the response says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_input_needs_truncate() {
    let server = Server::start(ServerConfig::new(minilm())).await;
    let long = "word ".repeat(600);
    let (status, body) = server.post("/attention", json!({ "inputs": long })).await;
    assert_eq!(status, 413, "{body}");
    let (_, embed) = server.post("/embed", json!({ "inputs": long })).await;
    assert_eq!(body, embed);
    assert!(
        body["error"].as_str().unwrap().contains("256 tokens"),
        "{body}"
    );

    let (status, att) = server
        .post(
            "/attention",
            json!({ "inputs": long, "truncate": true, "layer": 0, "head": 0 }),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(att["truncated"], true);
    assert_eq!(att["tokens"].as_array().unwrap().len(), 256);
    assert_eq!(att["attentions"][0][0].as_array().unwrap().len(), 256);

    let (_, att) = server
        .post("/attention", json!({ "inputs": TEXTS[0], "layer": 0 }))
        .await;
    assert_eq!(att["truncated"], false);
    server.stop().await;
}
