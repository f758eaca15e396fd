//! Several models in one server: `/models/NAME/...`, OpenAI's `model`
//! field, `/info` and `/v1/models` listing them, a batcher and metrics each.

mod common;

use bertha::{Device, EmbedOptions, Embedder};
use bertha_server::{AppState, Served, ServerConfig};
use serde_json::{json, Value};

use common::{close, floats, minilm, tiny_dir, Server, TEXTS};

fn named(dir: std::path::PathBuf, name: &str) -> ServerConfig {
    let mut c = ServerConfig::new(dir);
    c.model_id = name.into();
    c
}

fn library(dir: &std::path::Path) -> Vec<Vec<f32>> {
    let opts = EmbedOptions {
        normalize: Some(true),
        ..Default::default()
    };
    let lib = Embedder::from_dir(dir, &Device::Cpu, &opts).unwrap();
    lib.embed(&TEXTS, 8, &mut |_| {}).unwrap()
}

fn rows(body: &Value) -> Vec<Vec<f32>> {
    body.as_array().unwrap().iter().map(floats).collect()
}

fn same(got: &[Vec<f32>], want: &[Vec<f32>]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| close(g, w, 1e-6))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_answers_under_its_name_and_by_openai_model() {
    let server = Server::start_models(vec![
        named(minilm(), "minilm"),
        named(tiny_dir("bert-mlm"), "org/tiny-mlm"),
        named(tiny_dir("bert-seqcls"), "cls"),
    ])
    .await;
    let (minilm_want, tiny_want) = (library(&minilm()), library(&tiny_dir("bert-mlm")));
    assert_ne!(minilm_want[0].len(), tiny_want[0].len());

    // The default model at the top level (TEI's routes), each under its name.
    let embed = json!({ "inputs": TEXTS });
    for (path, want) in [
        ("/embed", &minilm_want),
        ("/models/minilm/embed", &minilm_want),
        ("/models/org/tiny-mlm/embed", &tiny_want),
        ("/models/org/tiny-mlm", &tiny_want), // its root: an embedding model's /embed
    ] {
        let (status, body) = server.post(path, embed.clone()).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(same(&rows(&body), want), "{path}");
    }
    // The classifier's root is /predict, as TEI's for its model type.
    let (status, body) = server
        .post("/models/cls", json!({ "inputs": "hello" }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body[0]["label"].is_string(), "{body}");

    // OpenAI's `model` picks; none is the default; an unknown one is a 404.
    let openai = |model: Option<&str>| {
        let mut b = json!({ "input": TEXTS });
        if let Some(m) = model {
            b["model"] = m.into();
        }
        b
    };
    let vectors = |body: &Value| -> Vec<Vec<f32>> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| floats(&d["embedding"]))
            .collect()
    };
    let (status, body) = server
        .post("/v1/embeddings", openai(Some("org/tiny-mlm")))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "org/tiny-mlm");
    assert!(same(&vectors(&body), &tiny_want));
    let (_, body) = server.post("/v1/embeddings", openai(None)).await;
    assert!(same(&vectors(&body), &minilm_want));
    let (status, body) = server
        .post("/v1/embeddings", openai(Some("tiny-mlm")))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error_type"], "ModelNotFound");
    let msg = body["error"].as_str().unwrap();
    assert!(msg.contains("minilm, org/tiny-mlm, cls"), "{msg}");
    // Under a prefix the body must not name another model.
    let (status, body) = server
        .post("/models/minilm/v1/embeddings", openai(Some("cls")))
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = server
        .post("/models/org/tiny-mlm/v1/embeddings", openai(None))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(same(&vectors(&body), &tiny_want));
    let (status, body) = server.post("/models/nope/embed", embed.clone()).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error_type"], "NotFound");
    let (status, _) = server.get("/models/minilm/embed").await;
    assert_eq!(status, 405);

    // /v1/models and /info list every model, the default first.
    let (_, list) = server.get("/v1/models").await;
    let list: Value = serde_json::from_str(&list).unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["minilm", "org/tiny-mlm", "cls"]);
    let (_, one) = server.get("/models/cls/v1/models").await;
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one["data"][0]["id"], "cls");
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    let (_, info) = server.get("/info").await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["model_id"], "minilm");
    let models = info["models"].as_array().unwrap();
    assert_eq!(models.len(), 3);
    assert_eq!(models[1]["model_id"], "org/tiny-mlm");
    assert!(models[2]["model_type"]["classifier"].is_object(), "{info}");
    // Each model has its own limits: the tiny model's positions, not MiniLM's.
    let (_, tiny_info) = server.get("/models/org/tiny-mlm/info").await;
    let tiny_info: Value = serde_json::from_str(&tiny_info).unwrap();
    assert_eq!(info["max_input_length"], 256);
    assert_eq!(tiny_info["max_input_length"], models[1]["max_input_length"]);
    assert_ne!(tiny_info["max_input_length"], 256);

    // Health of all, and of each; metrics of each under its label.
    assert_eq!(server.get("/health").await.0, 200);
    assert_eq!(server.get("/models/cls/health").await.0, 200);
    let (_, metrics) = server.get("/metrics").await;
    for label in [
        "model=\"minilm\"",
        "model=\"org/tiny-mlm\"",
        "model=\"cls\"",
    ] {
        assert!(metrics.contains(label), "{label} missing:\n{metrics}");
    }
    assert!(
        metrics.contains(
            "bertha_requests_total{model=\"org/tiny-mlm\",route=\"/models/org/tiny-mlm/embed\",status=\"200\"} 1"
        ),
        "{metrics}"
    );
    let (_, own) = server.get("/models/cls/metrics").await;
    assert!(!own.contains("model=\""), "{own}");
    server.stop().await;
}

#[test]
fn names_must_be_unique_and_fit_a_path() {
    let load = |dir, name| AppState::load(named(dir, name)).unwrap();
    let a = load(tiny_dir("bert-mlm"), "a");
    let e = Served::new(vec![a.clone(), load(tiny_dir("bert-seqcls"), "a")])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("`a` is given to two models"), "{e}");
    let e = Served::new(vec![a.clone(), load(tiny_dir("bert-seqcls"), "b c")])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("model name `b c`"), "{e}");
    let mut keyed = named(tiny_dir("bert-seqcls"), "b");
    keyed.api_key = Some("k".into());
    let e = Served::new(vec![a, AppState::load(keyed).unwrap()])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("server-wide settings"), "{e}");
    assert!(Served::new(vec![]).is_err());
}

/// Issue 46, case 3: `a` and `a/embed` (or `a/health`, `a/invocations`)
/// passed, and the router panicked on the overlapping routes after
/// "serving on". Now refused up front, naming both.
#[test]
fn names_that_nest_inside_another_are_refused() {
    let load = |dir, name| AppState::load(named(dir, name)).unwrap();
    let a = load(tiny_dir("bert-mlm"), "a");
    for inner in ["a/embed", "a/health", "a/invocations", "a/x/y"] {
        let e = Served::new(vec![a.clone(), load(tiny_dir("bert-seqcls"), inner)])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("the names `a` and `{inner}` overlap")),
            "{e}"
        );
        // Either order.
        let e = Served::new(vec![load(tiny_dir("bert-seqcls"), inner), a.clone()])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("overlap"), "{e}");
    }
    // A shared beginning that is not a path prefix is fine, and routes.
    let served = Served::new(vec![a, load(tiny_dir("bert-seqcls"), "ab")]).unwrap();
    let _ = bertha_server::router_for(std::sync::Arc::new(served));
}

/// Issue 46, case 14: `POST /models/NAME/` was a 404, and the unknown
/// `model` 404 echoed a 100 KB name whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailing_slash_routes_and_long_names_are_not_echoed() {
    let server = Server::start_models(vec![
        named(tiny_dir("bert-mlm"), "tiny"),
        named(tiny_dir("bert-seqcls"), "cls"),
    ])
    .await;
    let want = library(&tiny_dir("bert-mlm"));
    for path in ["/models/tiny/", "/models/tiny/embed/", "/embed/"] {
        let (status, body) = server.post(path, json!({ "inputs": TEXTS })).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(same(&rows(&body), &want), "{path}");
    }
    let long = "m".repeat(100_000);
    let (status, body) = server
        .post("/v1/embeddings", json!({ "input": "hi", "model": long }))
        .await;
    assert_eq!(status, 404, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(message.len() < 300, "{} bytes", message.len());
    assert!(message.contains("(100000 bytes)"), "{message}");
    assert!(message.contains("served: tiny, cls"), "{message}");
    server.stop().await;
}
