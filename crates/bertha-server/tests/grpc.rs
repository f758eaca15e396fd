//! TEI's gRPC API (feature `grpc`): tonic's clients generated from the
//! same `proto/tei.proto`, over a real HTTP/2 connection to the server on a
//! loopback port, get the library's values; errors carry TEI's status
//! codes.
#![cfg(feature = "grpc")]

mod common;

use std::sync::Arc;

use bertha::tasks::{Classifier, EncodeOptions, ScoreFunction};
use bertha::{Device, EmbedOptions, Embedder};
use bertha_server::grpc::pb;
use bertha_server::{AppState, ServerConfig};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::codegen::http::Uri;
use tonic::{Code, Request, Status, Streaming};

use common::{candle_core_fixture, close, fixtures, minilm, tiny_dir, TEXTS};

use pb::embed_client::EmbedClient;
use pb::info_client::InfoClient;
use pb::predict_client::PredictClient;
use pb::rerank_client::RerankClient;
use pb::tokenize_client::TokenizeClient;

/// An HTTP/2 connection pool to the server: what tonic's `Channel` would
/// be, from hyper-util (no tonic client stack in the build).
type Channel = Client<HttpConnector, tonic::body::Body>;

/// The gRPC server on `127.0.0.1:0`, serving until [`Grpc::stop`].
struct Grpc {
    origin: Uri,
    channel: Channel,
    state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Grpc {
    async fn start(config: ServerConfig) -> Self {
        let state = AppState::load(config).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(bertha_server::grpc::serve(listener, state.clone(), async {
            let _ = rx.await;
        }));
        let channel = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http();
        Self {
            origin,
            channel,
            state,
            stop: Some(stop),
            done: Some(done),
        }
    }

    fn embed(&self) -> EmbedClient<Channel> {
        EmbedClient::with_origin(self.channel.clone(), self.origin.clone())
    }

    fn info(&self) -> InfoClient<Channel> {
        InfoClient::with_origin(self.channel.clone(), self.origin.clone())
    }

    fn predict(&self) -> PredictClient<Channel> {
        PredictClient::with_origin(self.channel.clone(), self.origin.clone())
    }

    fn rerank(&self) -> RerankClient<Channel> {
        RerankClient::with_origin(self.channel.clone(), self.origin.clone())
    }

    fn tokenize(&self) -> TokenizeClient<Channel> {
        TokenizeClient::with_origin(self.channel.clone(), self.origin.clone())
    }

    /// Stops the server and waits for it to finish (graceful shutdown).
    async fn stop(mut self) {
        drop(self.channel);
        let _ = self.stop.take().unwrap().send(());
        self.done.take().unwrap().await.unwrap().unwrap();
    }
}

fn embed_request(text: &str) -> pb::EmbedRequest {
    pb::EmbedRequest {
        inputs: text.into(),
        ..Default::default()
    }
}

/// Every message of a response stream, or the status that ended it.
async fn all<T>(mut stream: Streaming<T>) -> (Vec<T>, Option<Status>) {
    let mut out = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(m)) => out.push(m),
            Ok(None) => return (out, None),
            Err(status) => return (out, Some(status)),
        }
    }
}

#[track_caller]
fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, says: &str) -> Status {
    let status = result.expect_err("an error");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(says),
        "`{}` does not say `{says}`",
        status.message()
    );
    status
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_and_embed_stream_match_the_library() {
    let server = Grpc::start(ServerConfig::new(minilm())).await;
    let lib = Embedder::from_dir(&minilm(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let want = lib.embed(&TEXTS, 8, &mut |_| {}).unwrap();
    let mut client = server.embed();

    // Embed: one text per call, normalised by default for this folder.
    for (text, w) in TEXTS.iter().zip(&want) {
        let r = client
            .embed(embed_request(text))
            .await
            .unwrap()
            .into_inner();
        assert!(close(&r.embeddings, w, 1e-6), "{text:?}");
        let m = r.metadata.unwrap();
        assert_eq!(m.compute_chars as usize, text.chars().count());
        assert_eq!(
            m.compute_tokens as usize,
            lib.tokenizer().encode(text).unwrap().len()
        );
        assert!(m.total_time_ns > 0);
    }
    // normalize: false gives the raw pooled vector; dimensions keep its
    // first values, then normalise.
    let raw = client
        .embed(pb::EmbedRequest {
            normalize: Some(false),
            ..embed_request(TEXTS[0])
        })
        .await
        .unwrap()
        .into_inner()
        .embeddings;
    assert!((raw.iter().map(|x| x * x).sum::<f32>().sqrt() - 1.0).abs() > 1e-3);
    assert!(close(&unit(&raw), &want[0], 1e-6));
    let short = client
        .embed(pb::EmbedRequest {
            dimensions: Some(64),
            ..embed_request(TEXTS[0])
        })
        .await
        .unwrap()
        .into_inner()
        .embeddings;
    assert!(close(&short, &unit(&raw[..64]), 1e-6));

    // EmbedStream: each request answered, in order.
    let texts: Vec<&str> = TEXTS.iter().chain(TEXTS.iter().rev()).copied().collect();
    let requests = tokio_stream::iter(texts.iter().map(|t| embed_request(t)).collect::<Vec<_>>());
    let stream = client.embed_stream(requests).await.unwrap().into_inner();
    let (answers, ended) = all(stream).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(answers.len(), texts.len());
    for (a, t) in answers.iter().zip(&texts) {
        let i = TEXTS.iter().position(|x| x == t).unwrap();
        assert!(close(&a.embeddings, &want[i], 1e-6), "{t:?}");
    }

    // EmbedAll: every token's vector, the model's last hidden state.
    let all_tokens = client
        .embed_all(pb::EmbedAllRequest {
            inputs: TEXTS[0].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let want_states: Vec<Vec<f32>> = candle_core_fixture()["last_hidden_state.0"]
        .to_vec2()
        .unwrap();
    assert_eq!(all_tokens.token_embeddings.len(), want_states.len());
    for (t, w) in all_tokens.token_embeddings.iter().zip(&want_states) {
        assert!(close(&t.embeddings, w, 1e-4));
    }
    server.stop().await;
}

/// `prompt_name` on the sentence-transformers fixture: the library's
/// vectors with the same prompt, and Tokenize shows the prompted text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_as_the_library() {
    let dir = fixtures().join("st-embedding");
    let server = Grpc::start(ServerConfig::new(&dir)).await;
    let lib = Embedder::from_dir(&dir, &Device::Cpu, &EmbedOptions::default()).unwrap();
    let query = EncodeOptions {
        prompt_name: Some("query".into()),
        ..Default::default()
    };
    let want = lib.embed_with(&TEXTS[..2], &query, 8, &mut |_| {}).unwrap();
    let mut client = server.embed();
    for (text, w) in TEXTS.iter().zip(&want) {
        let r = client
            .embed(pb::EmbedRequest {
                prompt_name: Some("query".into()),
                ..embed_request(text)
            })
            .await
            .unwrap()
            .into_inner();
        assert!(close(&r.embeddings, w, 1e-6), "{text:?}");
    }
    let status = client
        .embed(pb::EmbedRequest {
            prompt_name: Some("nope".into()),
            ..embed_request("x")
        })
        .await;
    assert_code(status, Code::InvalidArgument, "`nope` is not one of");

    let tokens = server
        .tokenize()
        .tokenize(pb::EncodeRequest {
            inputs: "The cat".into(),
            add_special_tokens: true,
            prompt_name: Some("query".into()),
        })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    let enc = lib.tokenizer().encode("query: The cat").unwrap();
    let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
    assert_eq!(ids, enc.input_ids);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_decode_and_info() {
    let server = Grpc::start(ServerConfig::new(minilm())).await;
    let lib = Embedder::from_dir(&minilm(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let mut client = server.tokenize();
    let tokens = client
        .tokenize(pb::EncodeRequest {
            inputs: "The cat".into(),
            add_special_tokens: true,
            prompt_name: None,
        })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    let tok = |id: u32, text: &str, span: Option<(u32, u32)>| pb::SimpleToken {
        id,
        text: text.into(),
        special: span.is_none(),
        start: span.map(|s| s.0),
        stop: span.map(|s| s.1),
    };
    assert_eq!(
        tokens,
        vec![
            tok(101, "[CLS]", None),
            tok(1996, "the", Some((0, 3))),
            tok(4937, "cat", Some((4, 7))),
            tok(102, "[SEP]", None),
        ]
    );
    let enc = lib.tokenizer().encode(TEXTS[1]).unwrap();
    let tokens = client
        .tokenize(pb::EncodeRequest {
            inputs: TEXTS[1].into(),
            add_special_tokens: true,
            prompt_name: None,
        })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(
        tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
        enc.input_ids
    );
    assert_eq!(
        tokens.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
        enc.tokens
    );
    // proto3's default is false: no [CLS] / [SEP] unless asked (as TEI).
    let bare = client
        .tokenize(pb::EncodeRequest {
            inputs: "The cat".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(bare.iter().map(|t| t.id).collect::<Vec<_>>(), [1996, 4937]);

    // Decode, and the streams of both.
    let decode = |ids: Vec<u32>, skip| pb::DecodeRequest {
        ids,
        skip_special_tokens: skip,
    };
    let text = client
        .decode(decode(enc.input_ids.clone(), true))
        .await
        .unwrap()
        .into_inner()
        .text;
    assert_eq!(text, lib.tokenizer().decode(&enc.input_ids, true).unwrap());
    let with_special = lib.tokenizer().decode(&enc.input_ids, false).unwrap();
    assert!(with_special.starts_with("[CLS]"), "{with_special}");
    let requests = vec![
        decode(enc.input_ids.clone(), false),
        decode(vec![101, 1996, 4937, 102], true),
    ];
    let stream = client
        .decode_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let (texts, ended) = all(stream).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(
        texts.into_iter().map(|d| d.text).collect::<Vec<_>>(),
        [with_special.as_str(), "the cat"]
    );
    let requests = TEXTS.map(|t| pb::EncodeRequest {
        inputs: t.into(),
        add_special_tokens: true,
        prompt_name: None,
    });
    let stream = client
        .tokenize_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let (encoded, ended) = all(stream).await;
    assert!(ended.is_none(), "{ended:?}");
    for (e, t) in encoded.iter().zip(TEXTS) {
        let want = lib.tokenizer().encode(t).unwrap().input_ids;
        assert_eq!(e.tokens.iter().map(|t| t.id).collect::<Vec<_>>(), want);
    }
    let bad = client.decode(decode(vec![1 << 30], true)).await;
    assert_code(bad, Code::InvalidArgument, "outside the vocabulary");

    // Info.
    let info = server
        .info()
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.model_id, "all-MiniLM-L6-v2");
    assert_eq!(info.model_type(), pb::ModelType::Embedding);
    assert_eq!(info.max_input_length, 256);
    assert_eq!(info.max_client_batch_size, 32);
    assert_eq!(info.max_concurrent_requests, 512);
    assert_eq!(info.max_batch_tokens, 16384);
    assert_eq!(info.model_dtype, "float32");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_and_rerank_match_the_classifier() {
    let dir = tiny_dir("bert-seqcls");
    let server = Grpc::start(ServerConfig::new(&dir)).await;
    let lib = Classifier::from_dir(&dir, &Device::Cpu).unwrap();
    let mut client = server.predict();

    let same = |got: &[pb::Prediction], want: &[bertha::tasks::LabelScore]| {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.label, w.label);
            assert!((g.score - w.score).abs() <= 1e-6, "{g:?} vs {w:?}");
        }
    };
    let predict = |text: &str, raw_scores| pb::PredictRequest {
        inputs: text.into(),
        raw_scores,
        ..Default::default()
    };
    let got = client
        .predict(predict("the cat sat", false))
        .await
        .unwrap()
        .into_inner();
    same(
        &got.predictions,
        &lib.classify("the cat sat", None, None).unwrap(),
    );
    let raw = client
        .predict(predict("the cat sat", true))
        .await
        .unwrap()
        .into_inner();
    let want_raw = lib
        .classify_with("the cat sat", None, None, ScoreFunction::None)
        .unwrap();
    same(&raw.predictions, &want_raw);
    let pair = |inputs: &[&str]| pb::PredictPairRequest {
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let got = client
        .predict_pair(pair(&["the cat", "sat down"]))
        .await
        .unwrap()
        .into_inner();
    same(
        &got.predictions,
        &lib.classify("the cat", Some("sat down"), None).unwrap(),
    );
    let three = client.predict_pair(pair(&["a", "b", "c"])).await;
    assert_code(
        three,
        Code::InvalidArgument,
        "`inputs` must have a single or two elements. Given: 3",
    );

    // PredictStream and PredictPairStream: in order.
    let texts = ["the cat sat", "a dog", "the mat", "the cat sat"];
    let stream = client
        .predict_stream(tokio_stream::iter(texts.map(|t| predict(t, false))))
        .await
        .unwrap()
        .into_inner();
    let (answers, ended) = all(stream).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(answers.len(), texts.len());
    for (a, t) in answers.iter().zip(texts) {
        same(&a.predictions, &lib.classify(t, None, None).unwrap());
    }
    let stream = client
        .predict_pair_stream(tokio_stream::iter([
            pair(&["the cat", "sat down"]),
            pair(&["a dog"]),
        ]))
        .await
        .unwrap()
        .into_inner();
    let (answers, ended) = all(stream).await;
    assert!(ended.is_none(), "{ended:?}");
    same(
        &answers[0].predictions,
        &lib.classify("the cat", Some("sat down"), None).unwrap(),
    );
    same(
        &answers[1].predictions,
        &lib.classify("a dog", None, None).unwrap(),
    );

    // Too long: refused unless `truncate`, then the classifier's own cut.
    let long = "the cat sat on the mat ".repeat(20);
    let refused = client.predict(predict(&long, false)).await;
    assert_code(refused, Code::InvalidArgument, "set `truncate` to true");
    let cut = client
        .predict(pb::PredictRequest {
            truncate: true,
            ..predict(&long, false)
        })
        .await
        .unwrap()
        .into_inner();
    same(&cut.predictions, &lib.classify(&long, None, None).unwrap());

    // Rerank: the probability of the last label, best first, as /rerank.
    let docs = ["sat down", "a dog", "the mat"];
    let relevant = lib.labels().last().cloned().unwrap();
    let score = |query: &str, text: &str| {
        let s = lib.classify(query, Some(text), None).unwrap();
        s.into_iter().find(|x| x.label == relevant).unwrap().score
    };
    let mut rerank = server.rerank();
    let ranked = rerank
        .rerank(pb::RerankRequest {
            query: "the cat".into(),
            texts: docs.map(String::from).to_vec(),
            return_text: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .ranks;
    assert_eq!(ranked.len(), docs.len());
    assert!(ranked.windows(2).all(|w| w[0].score >= w[1].score));
    for r in &ranked {
        let text = docs[r.index as usize];
        assert_eq!(r.text.as_deref(), Some(text));
        assert!((r.score - score("the cat", text)).abs() <= 1e-6);
    }
    // RerankStream: pairs streamed in, one ranking; return_text from the
    // first message.
    let pairs = [("the cat", "sat down"), ("a dog", "the mat")];
    let requests = pairs.map(|(q, t)| pb::RerankStreamRequest {
        query: q.into(),
        text: t.into(),
        ..Default::default()
    });
    let ranked = rerank
        .rerank_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner()
        .ranks;
    assert_eq!(ranked.len(), 2);
    assert!(ranked.windows(2).all(|w| w[0].score >= w[1].score));
    for r in &ranked {
        let (q, t) = pairs[r.index as usize];
        assert_eq!(r.text, None);
        assert!((r.score - score(q, t)).abs() <= 1e-6);
    }
    // An empty batch, and more texts than --max-client-batch-size.
    let empty = rerank
        .rerank(pb::RerankRequest {
            query: "q".into(),
            ..Default::default()
        })
        .await;
    assert_code(empty, Code::InvalidArgument, "`texts` cannot be empty");
    let none = rerank
        .rerank_stream(tokio_stream::iter(Vec::<pb::RerankStreamRequest>::new()))
        .await;
    assert_code(none, Code::InvalidArgument, "no (query, text) pair");
    let many = rerank
        .rerank(pb::RerankRequest {
            query: "q".into(),
            texts: vec!["t".into(); 33],
            ..Default::default()
        })
        .await;
    assert_code(
        many,
        Code::InvalidArgument,
        "batch size 33 > maximum allowed batch size 32",
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_tei_status_codes() {
    let server = Grpc::start(ServerConfig::new(minilm())).await;
    let mut client = server.embed();
    let long = "word ".repeat(300);

    // Too long: InvalidArgument unless `truncate`.
    let refused = client.embed(embed_request(&long)).await;
    assert_code(
        refused,
        Code::InvalidArgument,
        "`inputs[0]` must have at most 256 tokens; set `truncate` to true",
    );
    let cut = client
        .embed(pb::EmbedRequest {
            truncate: true,
            ..embed_request(&long)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cut.embeddings.len(), 384);
    assert_eq!(cut.metadata.unwrap().compute_tokens, 256);

    // Other validation: dimensions, truncation_direction.
    let zero = client
        .embed(pb::EmbedRequest {
            dimensions: Some(0),
            ..embed_request("x")
        })
        .await;
    assert_code(zero, Code::InvalidArgument, "0 is out of range");
    let odd = client
        .embed(pb::EmbedRequest {
            truncation_direction: 7,
            ..embed_request("x")
        })
        .await;
    assert_code(odd, Code::InvalidArgument, "`truncation_direction` 7");

    // A stream ends at its first error, after the answers before it.
    let requests = [embed_request("a"), embed_request(&long), embed_request("b")];
    let stream = client
        .embed_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let (answers, ended) = all(stream).await;
    assert_eq!(answers.len(), 1);
    assert_eq!(ended.unwrap().code(), Code::InvalidArgument);

    // No SPLADE model: EmbedSparse is refused, as TEI's 424.
    let sparse = client
        .embed_sparse(pb::EmbedSparseRequest {
            inputs: "x".into(),
            ..Default::default()
        })
        .await;
    assert_code(sparse, Code::FailedPrecondition, "SPLADE");

    // A headless model cannot classify or rerank: FailedPrecondition.
    let predict = server
        .predict()
        .predict(pb::PredictRequest {
            inputs: "x".into(),
            ..Default::default()
        })
        .await;
    assert_code(predict, Code::FailedPrecondition, "cannot classify");
    let rerank = server
        .rerank()
        .rerank(pb::RerankRequest {
            query: "q".into(),
            texts: vec!["t".into()],
            ..Default::default()
        })
        .await;
    assert_code(rerank, Code::FailedPrecondition, "cannot rerank");

    // Every --max-concurrent-requests slot taken: ResourceExhausted at
    // once (as HTTP's 429).
    let slots = server.state.config.max_concurrent_requests as u32;
    let held = server.state.limit.clone().acquire_many_owned(slots).await;
    let busy = client.embed(embed_request("x")).await;
    assert_code(busy, Code::ResourceExhausted, "overloaded");
    drop(held);
    client.embed(embed_request("x")).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_asked_for() {
    let mut config = ServerConfig::new(tiny_dir("bert-seqcls"));
    config.api_key = Some("sesame".into());
    let server = Grpc::start(config).await;
    let mut info = server.info();
    let call = |key: Option<&str>| {
        let mut req = Request::new(pb::InfoRequest {});
        if let Some(k) = key {
            req.metadata_mut()
                .insert("authorization", k.parse().unwrap());
        }
        req
    };
    let missing = info.info(call(None)).await;
    assert_code(missing, Code::Unauthenticated, "API key");
    let wrong = info.info(call(Some("Bearer nope"))).await;
    assert_code(wrong, Code::Unauthenticated, "API key");
    let answer = info
        .info(call(Some("Bearer sesame")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.model_type(), pb::ModelType::Classifier);
    // Every service asks, streams too.
    let stream = server
        .embed()
        .embed_stream(tokio_stream::iter([embed_request("x")]))
        .await;
    assert_code(stream, Code::Unauthenticated, "API key");
    server.stop().await;
}

/// EmbedSparse and its stream on a SPLADE folder: the library's sparse
/// vectors (the same indices; values to 1e-5, as the MLM head's product
/// can differ in the last bit with the rows it runs beside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_sparse_matches_the_library() {
    let dir = fixtures().join("splade/st-folder");
    let server = Grpc::start(ServerConfig::new(&dir)).await;
    let lib = Embedder::from_dir(&dir, &Device::Cpu, &EmbedOptions::default()).unwrap();
    let want = lib.embed_sparse(&TEXTS, 8, &mut |_| {}).unwrap();
    let same = |got: &[pb::SparseValue], want: &bertha::SparseVector| {
        got.len() == want.0.len()
            && got
                .iter()
                .zip(&want.0)
                .all(|(g, w)| g.index == w.index && (g.value - w.value).abs() <= 1e-5)
    };
    let mut client = server.embed();
    let request = |text: &str| pb::EmbedSparseRequest {
        inputs: text.into(),
        ..Default::default()
    };
    for (text, w) in TEXTS.iter().zip(&want) {
        let r = client
            .embed_sparse(request(text))
            .await
            .unwrap()
            .into_inner();
        assert!(!w.0.is_empty() || text.is_empty());
        assert!(same(&r.sparse_embeddings, w), "{text:?}");
    }
    let stream = client
        .embed_sparse_stream(tokio_stream::iter(TEXTS.map(request)))
        .await
        .unwrap()
        .into_inner();
    let (answers, ended) = all(stream).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(answers.len(), TEXTS.len());
    for (a, w) in answers.iter().zip(&want) {
        assert!(same(&a.sparse_embeddings, w));
    }
    server.stop().await;
}
