//! `/embed`, `/embed_all`, `/similarity` and OpenAI's `/v1/embeddings`:
//! the library's vectors, in TEI's and OpenAI's shapes.

mod common;

use bertha::{Device, EmbedOptions, Embedder};
use bertha_server::ServerConfig;
use serde_json::json;

use common::{candle_core_fixture, close, floats, minilm, Server, TEXTS};

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
    server.stop().await;
}
