//! Concurrent requests share model batches and get their own answers;
//! shutdown finishes the requests in flight.

mod common;

use std::sync::Arc;

use bertha::{Device, EmbedOptions, Embedder};
use bertha_server::batcher::Want;
use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{close, floats, minilm, Server};

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

/// A request the model cannot take (a token id past `vocab_size`) fails
/// alone with a 422, before it can join a batch: requests queued beside it
/// still get their answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_outside_the_vocabulary_fails_only_its_own_request() {
    let server = Arc::new(Server::start(ServerConfig::new(minilm())).await);
    let tokenizer = server.state.embedder.tokenizer();
    let vocab = server.state.embedder.model().config().vocab_size as u32;
    let mut bad = tokenizer.encode("the cat sat").unwrap();
    bad.input_ids[2] = vocab + 5;
    // Keep the worker busy so that what follows queues together.
    let busy = {
        let server = server.clone();
        let texts: Vec<String> = (0..32)
            .map(|i| format!("{} {i}", "a rather long sentence ".repeat(10)))
            .collect();
        tokio::spawn(async move { server.post("/embed", json!({ "inputs": texts })).await })
    };
    while server.state.limit.available_permits() == 512 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let (bad, good) = tokio::join!(
        server.state.batcher.run(vec![bad], Want::Pooled),
        server.post("/embed", json!({ "inputs": "the cat sat" })),
    );
    let err = bad.err().expect("an id past the vocabulary is refused");
    assert_eq!(err.status, 422);
    assert!(
        err.message.contains(&format!("{}", vocab + 5)),
        "{}",
        err.message
    );
    assert!(err.message.contains(&vocab.to_string()), "{}", err.message);
    assert_eq!(good.0, 200, "{}", good.1);
    assert_eq!(busy.await.unwrap().0, 200);
}
