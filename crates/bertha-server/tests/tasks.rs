//! The task routes (`/predict`, `/rerank`, `/fill-mask`, `/ner`, `/qa`)
//! on the tiny checkpoints: the same answers as the library's pipelines.

mod common;

use bertha::tasks::{
    Classifier, FillMask, PipelineOptions, QaOptions, QuestionAnswerer, TokenClassifier,
};
use bertha::Device;
use bertha_server::ServerConfig;
use serde_json::{json, Value};

use common::{as_sent, fixtures, minilm, tiny_dir, Server};

/// Serves the tiny checkpoint `name` for one `POST path body`: its status
/// and body.
async fn post_once(name: &str, path: &str, body: Value) -> (u16, Value) {
    let server = Server::start(ServerConfig::new(tiny_dir(name))).await;
    let reply = server.post(path, body).await;
    server.stop().await;
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_and_rerank_match_the_classifier() {
    // Sequence classification: /predict and /rerank.
    let server = Server::start(ServerConfig::new(tiny_dir("bert-seqcls"))).await;
    let lib = Classifier::from_dir(&tiny_dir("bert-seqcls"), &Device::Cpu).unwrap();
    let want = lib.classify("the cat sat", None, None).unwrap();
    let (status, got) = server
        .post("/predict", json!({ "inputs": "the cat sat" }))
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got[0]["label"], want[0].label.as_str());
    assert!((got[0]["score"].as_f64().unwrap() as f32 - want[0].score).abs() < 1e-6);
    let pair = lib.classify("the cat", Some("sat down"), None).unwrap();
    let (_, got) = server
        .post("/predict", json!({ "inputs": ["the cat", "sat down"] }))
        .await;
    assert_eq!(got[0]["label"], pair[0].label.as_str());
    let (_, batch) = server
        .post(
            "/predict",
            json!({ "inputs": [["the cat", "sat down"], "the cat sat"] }),
        )
        .await;
    assert_eq!(batch.as_array().unwrap().len(), 2);
    assert_eq!(batch[1][0]["label"], want[0].label.as_str());
    let (_, ranked) = server.post("/rerank", json!({ "query": "the cat", "texts": ["sat down", "a dog", "the mat"], "return_text": true })).await;
    let ranked = ranked.as_array().unwrap();
    assert_eq!(ranked.len(), 3);
    assert!(ranked
        .windows(2)
        .all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
    let last_label = lib.labels().last().cloned().unwrap();
    for r in ranked {
        let i = r["index"].as_u64().unwrap() as usize;
        let text = ["sat down", "a dog", "the mat"][i];
        assert_eq!(r["text"], text);
        let s = lib.classify("the cat", Some(text), None).unwrap();
        let want = s.iter().find(|x| x.label == last_label).unwrap().score;
        assert!((r["score"].as_f64().unwrap() as f32 - want).abs() < 1e-6);
    }
    server.stop().await;
}

/// huggingface_hub's `text_classification` posts to `/` with a
/// `parameters` object (`{}` when empty): top_k and function_to_apply, as
/// the text-classification pipeline takes them; it reads the answer as the
/// Inference API's list of one list per input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_takes_the_pipeline_parameters() {
    let server = Server::start(ServerConfig::new(tiny_dir("bert-seqcls"))).await;
    let lib = Classifier::from_dir(&tiny_dir("bert-seqcls"), &Device::Cpu).unwrap();
    let scores = |v: &Value| -> Vec<(String, f32)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["label"].as_str().unwrap().to_string(),
                    s["score"].as_f64().unwrap() as f32,
                )
            })
            .collect()
    };
    let lib_scores = |top_k, f| -> Vec<(String, f32)> {
        lib.classify_with("the cat sat", None, top_k, f)
            .unwrap()
            .into_iter()
            .map(|s| (s.label, s.score))
            .collect()
    };
    let close = |a: &[(String, f32)], b: &[(String, f32)]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-6)
    };
    use bertha::tasks::ScoreFunction as F;
    for (path, params, top_k, f) in [
        ("/", json!({}), None, lib.function()),
        ("/predict", json!({ "top_k": 1 }), Some(1), lib.function()),
        ("/", json!({ "function_to_apply": "none" }), None, F::None),
        (
            "/",
            json!({ "function_to_apply": "sigmoid", "top_k": 2 }),
            Some(2),
            F::Sigmoid,
        ),
    ] {
        let body = json!({ "inputs": "the cat sat", "parameters": params });
        let (status, got) = server.post(path, body.clone()).await;
        assert_eq!(status, 200, "{body}: {got}");
        let want = lib_scores(top_k, f);
        assert_eq!(
            got.as_array().unwrap().len(),
            1,
            "a list of one list: {got}"
        );
        assert!(close(&scores(&got[0]), &want), "{body}: {got} vs {want:?}");
    }
    // `raw_scores` is `function_to_apply: none`; both at once, a typo, or
    // top_k 0 are refused.
    let (_, raw) = server
        .post(
            "/predict",
            json!({ "inputs": "the cat sat", "raw_scores": true }),
        )
        .await;
    assert!(close(&scores(&raw), &lib_scores(None, F::None)));
    for body in [
        json!({ "inputs": "x", "raw_scores": true, "parameters": { "function_to_apply": "softmax" } }),
        json!({ "inputs": "x", "parameters": { "topk": 1 } }),
        json!({ "inputs": "x", "parameters": { "function_to_apply": "tanh" } }),
        json!({ "inputs": "x", "parameters": { "top_k": 0 } }),
    ] {
        let (status, got) = server.post("/predict", body.clone()).await;
        assert_eq!(status, 422, "{body}: {got}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_mask_matches_the_pipeline() {
    // Masked LM: /fill-mask.
    let server = Server::start(ServerConfig::new(tiny_dir("bert-mlm"))).await;
    let lib = FillMask::from_dir(&tiny_dir("bert-mlm"), &Device::Cpu).unwrap();
    let want = lib.fill("the [MASK] sat", 3).unwrap();
    let (status, got) = server
        .post(
            "/fill-mask",
            json!({ "inputs": "the [MASK] sat", "top_k": 3 }),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, as_sent(&want));
    let (status, _) = server
        .post("/fill-mask", json!({ "inputs": "no mask here" }))
        .await;
    assert_eq!(status, 422);
    server.stop().await;
}

/// `precision` applies to the task pipelines too: the server at int8
/// answers as the int8 pipeline, whose scores are not fp32's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_pipelines_run_at_the_server_precision() {
    let mut config = ServerConfig::new(tiny_dir("bert-mlm"));
    config.precision = bertha::fast::Precision::Int8;
    let server = Server::start(config).await;
    let opts = PipelineOptions {
        precision: bertha::fast::Precision::Int8,
        ..Default::default()
    };
    let lib = FillMask::from_dir_with(&tiny_dir("bert-mlm"), &Device::Cpu, &opts).unwrap();
    let want = lib.fill("the [MASK] sat", 3).unwrap();
    let exact = FillMask::from_dir(&tiny_dir("bert-mlm"), &Device::Cpu).unwrap();
    assert_ne!(
        as_sent(&want),
        as_sent(&exact.fill("the [MASK] sat", 3).unwrap())
    );
    let (status, got) = server
        .post(
            "/fill-mask",
            json!({ "inputs": "the [MASK] sat", "top_k": 3 }),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, as_sent(&want));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ner_matches_the_pipeline() {
    // Token classification: /ner.
    let lib = TokenClassifier::from_dir(&tiny_dir("bert-tokcls"), &Device::Cpu).unwrap();
    let want = lib
        .entities("the cat sat on the mat", "simple".parse().unwrap())
        .unwrap();
    let (_, got) = post_once(
        "bert-tokcls",
        "/ner",
        json!({ "inputs": "the cat sat on the mat" }),
    )
    .await;
    assert_eq!(got, as_sent(&want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qa_matches_the_pipeline() {
    // Question answering: /qa.
    let lib = QuestionAnswerer::from_dir(&tiny_dir("bert-qa"), &Device::Cpu).unwrap();
    let want = lib
        .answer(
            "where is the cat",
            "the cat sat on the mat",
            &QaOptions::default(),
        )
        .unwrap();
    let (_, got) = post_once(
        "bert-qa",
        "/qa",
        json!({ "question": "where is the cat", "context": "the cat sat on the mat" }),
    )
    .await;
    assert_eq!(got, as_sent(&want[0]));
}

/// A mask past the truncation point is a 422 naming it, even when other
/// masks survive (never a 200 with fewer answers than masks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_mask_answers_every_mask_or_errors() {
    let words = "the year ".repeat(28);
    let text = format!("[MASK] {words} [MASK] [MASK] [MASK] [MASK] [MASK] [MASK] [MASK] [MASK]");
    let (status, body) = post_once("bert-mlm", "/fill-mask", json!({ "inputs": text })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error_type"], "Validation");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("masks 7 to 9 of 9 were cut off by truncation at 64 tokens"),
        "{message}"
    );
}

/// Issue 46, case 4: `/predict` and `/rerank` with `"truncate": false`
/// scored the cut text with a 200. Now a 413 as on `/embed`, and
/// `"truncate": true` cuts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_and_rerank_refuse_over_long_inputs_unless_truncate() {
    let server = Server::start(ServerConfig::new(tiny_dir("bert-seqcls"))).await;
    let lib = Classifier::from_dir(&tiny_dir("bert-seqcls"), &Device::Cpu).unwrap();
    let long = "the cat sat on the mat ".repeat(400);
    for body in [
        json!({ "inputs": long, "truncate": false }),
        json!({ "inputs": long }),
        json!({ "inputs": ["hi", long] }),
    ] {
        let (status, got) = server.post("/predict", body).await;
        assert_eq!(status, 413, "{got}");
        assert!(
            got["error"]
                .as_str()
                .unwrap()
                .contains("set `truncate` to true"),
            "{got}"
        );
    }
    for body in [
        json!({ "query": "the cat", "texts": ["short", long], "truncate": false }),
        json!({ "query": "the cat", "texts": ["short", long] }),
    ] {
        let (status, got) = server.post("/rerank", body).await;
        assert_eq!(status, 413, "{got}");
        assert!(
            got["error"].as_str().unwrap().contains("inputs[1]"),
            "{got}"
        );
    }
    let (status, got) = server
        .post("/predict", json!({ "inputs": long, "truncate": true }))
        .await;
    assert_eq!(status, 200, "{got}");
    let want = lib.classify(&long, None, None).unwrap();
    assert!((got[0]["score"].as_f64().unwrap() as f32 - want[0].score).abs() < 1e-6);
    let (status, got) = server
        .post(
            "/rerank",
            json!({ "query": "the cat", "texts": [long], "truncate": true }),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    server.stop().await;
}

/// Issue 46, cases 5 and 13: `/ner` on a sequence classifier answered
/// per-token "entities" from the sequence head's weights; a route on a
/// model without its head answered 422 with the server's absolute path.
/// Now a 400 naming the missing head, and no path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_routes_answer_only_for_the_head_the_checkpoint_has() {
    let server = Server::start(ServerConfig::new(tiny_dir("bert-seqcls"))).await;
    let (status, got) = server
        .post("/ner", json!({ "inputs": "the cat sat" }))
        .await;
    assert_eq!(status, 400, "{got}");
    let message = got["error"].as_str().unwrap();
    assert!(
        message.contains("no BertForTokenClassification head"),
        "{message}"
    );
    assert!(
        message.contains("BertForSequenceClassification"),
        "{message}"
    );
    assert!(
        !message.contains(&*fixtures().display().to_string()),
        "{message}"
    );
    assert!(!message.contains(".safetensors"), "{message}");
    server.stop().await;
    let server = Server::start(ServerConfig::new(minilm())).await;
    for (path, body) in [
        ("/ner", json!({ "inputs": "the cat sat" })),
        ("/fill-mask", json!({ "inputs": "the [MASK] sat" })),
        (
            "/qa",
            json!({ "question": "who?", "context": "the cat sat" }),
        ),
        ("/predict", json!({ "inputs": "the cat sat" })),
    ] {
        let (status, got) = server.post(path, body).await;
        assert_eq!(status, 400, "{path}: {got}");
        let message = got["error"].as_str().unwrap();
        assert!(message.contains("head"), "{path}: {message}");
        assert!(
            !message.contains(&*minilm().display().to_string()),
            "{path}: {message}"
        );
        assert!(!message.contains('/'), "{path}: {message}");
    }
    server.stop().await;
}

/// Issue 46, case 9: `/decode` took any number of id lists (10,000 ran
/// past a minute) on the async runtime. Now at most
/// `--max-client-batch-size` lists, decoded off the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_takes_at_most_the_client_batch_size() {
    let mut config = ServerConfig::new(tiny_dir("bert-mlm"));
    config.max_client_batch_size = 4;
    let server = Server::start(config).await;
    let lists: Vec<Vec<u32>> = (0..5).map(|i| vec![5 + i, 6 + i]).collect();
    let (status, got) = server.post("/decode", json!({ "ids": lists })).await;
    assert_eq!(status, 422, "{got}");
    assert!(
        got["error"]
            .as_str()
            .unwrap()
            .contains("batch size 5 > maximum allowed batch size 4"),
        "{got}"
    );
    let (status, got) = server.post("/decode", json!({ "ids": &lists[..4] })).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got.as_array().unwrap().len(), 4);
    let tok = server.state.embedder.tokenizer().clone();
    assert_eq!(got[1], tok.decode(&lists[1], true).unwrap());
    server.stop().await;
}

/// Issue 46, case 10: `/qa` on a long context with a small `doc_stride`
/// (90k windows) ran for a minute, and on after the client had gone. Now
/// the windows are counted first against `--max-qa-windows`, and the work
/// stops between passes once the request is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qa_windows_are_bounded_and_work_stops_when_unwanted() {
    let mut config = ServerConfig::new(tiny_dir("bert-qa"));
    config.max_qa_windows = 20;
    let server = Server::start(config).await;
    let context = "the cat sat on the mat and looked out of the window. ".repeat(1500);
    let t0 = std::time::Instant::now();
    let (status, got) = server
        .post(
            "/qa",
            json!({ "question": "where is the cat", "context": context, "doc_stride": 1 }),
        )
        .await;
    assert_eq!(status, 422, "{got}");
    let message = got["error"].as_str().unwrap();
    assert!(message.contains("more than the 20 allowed"), "{message}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    let short = "the cat sat on the mat";
    let (status, _) = server
        .post(
            "/qa",
            json!({ "question": "where is the cat", "context": short }),
        )
        .await;
    assert_eq!(status, 200);
    server.stop().await;

    // The library stops between passes once told to.
    let lib = QuestionAnswerer::from_dir(&tiny_dir("bert-qa"), &Device::Cpu).unwrap();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    let bounds = bertha::tasks::QaBounds {
        max_windows: usize::MAX,
        stop: Some(Box::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 1
        })),
    };
    let opts = QaOptions {
        doc_stride: Some(1),
        ..QaOptions::default()
    };
    let err = lib
        .answer_within("where is the cat", &context, &opts, &bounds)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no longer wanted"), "{err}");
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "one pass ran"
    );
}
