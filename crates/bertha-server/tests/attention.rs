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
