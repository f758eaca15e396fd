//! The real all-MiniLM-L6-v2 against transformers / sentence-transformers
//! reference outputs (`tests/fixtures/minilm.safetensors`).

mod common;

use std::sync::OnceLock;

use bertha::{
    BertInput, BertModel, Device, EmbedOptions, Embedder, ForwardOptions, Tensor, Tokenizer,
};
use common::{assert_close, fixtures, load_safetensors, max_abs_diff, minilm_dir, read_json};

struct Fixture {
    model: BertModel,
    tokenizer: Tokenizer,
    sentences: Vec<String>,
    expected: std::collections::HashMap<String, Tensor>,
}

/// `got` against the fixture's `{name}.{i}`, within 1e-4.
#[track_caller]
fn assert_expected(f: &Fixture, name: &str, i: usize, got: &Tensor) {
    let key = format!("{name}.{i}");
    assert_close(&key, got, &f.expected[&key], 1e-4);
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = minilm_dir();
        let meta = read_json(&fixtures().join("minilm.json"));
        Fixture {
            model: BertModel::from_dir(&dir, &Device::Cpu).unwrap(),
            tokenizer: Tokenizer::from_dir(&dir, 512).unwrap(),
            sentences: serde_json::from_value(meta["sentences"].clone()).unwrap(),
            expected: load_safetensors(&fixtures().join("minilm.safetensors")),
        }
    })
}

fn run_one(f: &Fixture, text: &str, opts: ForwardOptions) -> bertha::BertOutput {
    let e = f.tokenizer.encode(text).unwrap();
    let input = BertInput::from_ids(&[e.input_ids], &[e.token_type_ids], 0, &Device::Cpu).unwrap();
    f.model.forward(&input, opts).unwrap()
}

#[test]
fn last_hidden_state_and_pooler_match_per_sentence() {
    let f = fixture();
    assert_eq!(f.sentences.len(), 17);
    for (i, s) in f.sentences.iter().enumerate() {
        let out = run_one(f, s, ForwardOptions::default());
        let got = out.last_hidden_state.squeeze(0).unwrap();
        assert_expected(f, "last_hidden_state", i, &got);
        let pooled = out.pooler_output.unwrap().squeeze(0).unwrap();
        assert_expected(f, "pooler_output", i, &pooled);
    }
}

#[test]
fn all_hidden_states_and_attentions_match() {
    let f = fixture();
    let opts = ForwardOptions {
        output_hidden_states: true,
        output_attentions: true,
        train: false,
    };
    for i in 0..2 {
        let out = run_one(f, &f.sentences[i], opts);
        let hidden = Tensor::cat(&out.hidden_states.unwrap(), 0).unwrap(); // [7, T, D]
        assert_expected(f, "hidden_states", i, &hidden);
        let att = Tensor::cat(&out.attentions.unwrap(), 0).unwrap(); // [6, H, T, T]
        assert_expected(f, "attentions", i, &att);
    }
}

#[test]
fn padded_batch_matches_reference_and_single_calls() {
    let f = fixture();
    let encs = f.tokenizer.encode_batch(&f.sentences).unwrap();
    let ids: Vec<Vec<u32>> = encs.iter().map(|e| e.input_ids.clone()).collect();
    let types: Vec<Vec<u32>> = encs.iter().map(|e| e.token_type_ids.clone()).collect();
    let input = BertInput::from_ids(&ids, &types, 0, &Device::Cpu).unwrap();
    let batch = f
        .model
        .forward(&input, ForwardOptions::default())
        .unwrap()
        .last_hidden_state;
    let want = &f.expected["batch.last_hidden_state"];
    assert_eq!(batch.dims(), want.dims());
    for (i, e) in encs.iter().enumerate() {
        let n = e.len();
        let got = batch.get(i).unwrap().narrow(0, 0, n).unwrap();
        assert_close(
            &format!("batch row {i}"),
            &got,
            &want.get(i).unwrap().narrow(0, 0, n).unwrap(),
            1e-4,
        );
        // Batch-size invariance: the same states as a call on its own.
        let alone = run_one(f, &f.sentences[i], ForwardOptions::default())
            .last_hidden_state
            .squeeze(0)
            .unwrap();
        let d = max_abs_diff(&got, &alone);
        assert!(d <= 1e-5, "row {i}: batched vs alone differ by {d:e}");
    }
}

#[test]
fn long_text_is_truncated_to_512_and_matches() {
    let f = fixture();
    let tok = read_json(&fixtures().join("tokenizer.json"));
    let text = tok["long"]["text"].as_str().unwrap();
    let e = f.tokenizer.encode(text).unwrap();
    assert!(e.truncated);
    assert_eq!(e.len(), 512);
    let out = run_one(f, text, ForwardOptions::default());
    assert_close(
        "long.last_hidden_state",
        &out.last_hidden_state.squeeze(0).unwrap(),
        &f.expected["long.last_hidden_state"],
        1e-4,
    );
}

#[test]
fn sentence_embeddings_match_sentence_transformers() {
    let f = fixture();
    let embedder =
        Embedder::from_dir(&minilm_dir(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    assert_eq!(embedder.pooling(), bertha::Pooling::Mean);
    assert!(embedder.normalizes());
    assert_eq!(
        embedder.tokenizer().max_length(),
        256,
        "sentence_bert_config.json's max_seq_length"
    );
    for batch_size in [1, 4, 32] {
        let got = embedder
            .embed(&f.sentences, batch_size, &mut |_| {})
            .unwrap();
        for (i, v) in got.iter().enumerate() {
            let v = Tensor::new(v.as_slice(), &Device::Cpu).unwrap();
            assert_close(
                &format!("sentence_embedding.{i} (batch {batch_size})"),
                &v,
                &f.expected[&format!("sentence_embedding.{i}")],
                1e-5,
            );
        }
    }
}

#[test]
fn embedding_an_empty_text_works() {
    let embedder =
        Embedder::from_dir(&minilm_dir(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let v = embedder.embed(&["", "x"], 8, &mut |_| {}).unwrap();
    assert_eq!(v[0].len(), 384);
    let norm: f32 = v[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "normalised: {norm}");
    assert_ne!(v[0], v[1]);
}

#[test]
fn ten_thousand_word_text_is_truncated_and_embedded() {
    let opts = EmbedOptions {
        max_length: Some(512),
        ..Default::default()
    };
    let embedder = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &opts).unwrap();
    let long = "token ".repeat(10_000);
    let v = embedder
        .embed(&[long.as_str(), "short"], 2, &mut |_| {})
        .unwrap();
    assert_eq!(v.len(), 2);
    assert!(v[0].iter().all(|x| x.is_finite()));
}

#[test]
fn max_length_above_the_model_window_is_an_error() {
    let opts = EmbedOptions {
        max_length: Some(1000),
        ..Default::default()
    };
    let err = common::err_text(Embedder::from_dir(&minilm_dir(), &Device::Cpu, &opts));
    assert!(err.contains("max_position_embeddings"), "{err}");
}

/// Pooling `none` gives the raw last hidden state even though the folder
/// has a Normalize module (it acts on sentence vectors only, as in
/// sentence-transformers' `token_embeddings`); asking still normalises.
#[test]
fn pooling_none_is_the_raw_last_hidden_state() {
    let f = fixture();
    let opts = |normalize| EmbedOptions {
        pooling: Some(bertha::Pooling::None),
        normalize,
        ..Default::default()
    };
    let raw = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &opts(None)).unwrap();
    assert!(!raw.normalizes());
    let got = raw.embed_tokens(&f.sentences[..1], 1, &mut |_| {}).unwrap();
    let got = Tensor::new(got[0].embeddings.clone(), &Device::Cpu).unwrap();
    assert_expected(f, "last_hidden_state", 0, &got);
    let asked = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &opts(Some(true))).unwrap();
    let unit = asked
        .embed_tokens(&f.sentences[..1], 1, &mut |_| {})
        .unwrap();
    let norm: f32 = unit[0].embeddings[0]
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
}

#[test]
fn packed_fast_path_matches_candle_modules_and_is_batch_invariant() {
    let f = fixture();
    let mut embedder = Embedder::from_dir(
        &minilm_dir(),
        &Device::Cpu,
        &EmbedOptions {
            pooling: Some(bertha::Pooling::None),
            normalize: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(embedder.uses_fast_path());
    let fast = embedder
        .embed_tokens(&f.sentences, 32, &mut |_| {})
        .unwrap();
    let fast_alone: Vec<_> = f
        .sentences
        .iter()
        .map(|s| {
            embedder
                .embed_tokens(&[s], 1, &mut |_| {})
                .unwrap()
                .remove(0)
        })
        .collect();
    embedder.set_fast_path(false).unwrap();
    let slow = embedder
        .embed_tokens(&f.sentences, 32, &mut |_| {})
        .unwrap();
    for (i, ((a, b), c)) in fast.iter().zip(&slow).zip(&fast_alone).enumerate() {
        let want = &f.expected[&format!("last_hidden_state.{i}")];
        let a_t = Tensor::new(a.embeddings.clone(), &Device::Cpu).unwrap();
        assert_close(&format!("fast path, sentence {i}"), &a_t, want, 1e-4);
        let others = [(b, 1e-4, "fast", "candle"), (c, 1e-5, "batch 32", "alone")];
        for (other, tol, ours, theirs) in others {
            let pairs = a.embeddings.iter().flatten();
            for (x, y) in pairs.zip(other.embeddings.iter().flatten()) {
                assert!(
                    (x - y).abs() <= tol,
                    "sentence {i}: {ours} {x} vs {theirs} {y}"
                );
            }
        }
    }
}

#[test]
fn token_cap_splits_batches_without_changing_results() {
    let f = fixture();
    let mut embedder =
        Embedder::from_dir(&minilm_dir(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let all = embedder.embed(&f.sentences, 32, &mut |_| {}).unwrap();
    embedder.set_max_batch_tokens(20);
    let capped = embedder.embed(&f.sentences, 32, &mut |_| {}).unwrap();
    for (a, b) in all.iter().zip(&capped) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5);
        }
    }
}

#[test]
fn int8_embeddings_stay_within_cosine_0_999_of_fp32() {
    let f = fixture();
    let exact = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let opts = EmbedOptions {
        precision: bertha::fast::Precision::Int8,
        ..Default::default()
    };
    let int8 = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &opts).unwrap();
    assert_eq!(int8.precision(), bertha::fast::Precision::Int8);
    let want = exact.embed(&f.sentences, 8, &mut |_| {}).unwrap();
    let got = int8.embed(&f.sentences, 8, &mut |_| {}).unwrap();
    let cosine = |a: &[f32], b: &[f32]| {
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
    };
    let sims: Vec<f32> = got.iter().zip(&want).map(|(g, w)| cosine(g, w)).collect();
    assert!(sims.iter().all(|s| *s >= 0.999), "{sims:?}");
    // Quantization really happened: the vectors are close, not equal.
    assert!(sims.iter().any(|s| *s < 0.99999), "{sims:?}");
    // The same texts give the same vectors at any batch size.
    // Rows are quantized one by one: a text gives the same vector alone.
    let alone = int8.embed(&f.sentences[..1], 1, &mut |_| {}).unwrap();
    let diff = alone[0]
        .iter()
        .zip(&got[0])
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 1e-6, "int8 batch invariance: {diff}");
}

/// bf16 multiplies (weights and multiply inputs rounded, fp32 sums) keep
/// the embeddings within cosine 0.9999 of fp32, and a text's vector does
/// not depend on its batch (rows are rounded one by one). On a CPU without
/// AVX512-BF16 the embedder says it runs fp32, and then equals fp32.
#[test]
fn bf16_embeddings_stay_within_cosine_0_9999_of_fp32() {
    let f = fixture();
    let exact = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &EmbedOptions::default()).unwrap();
    let opts = EmbedOptions {
        precision: bertha::fast::Precision::Bf16,
        ..Default::default()
    };
    let bf16 = Embedder::from_dir(&minilm_dir(), &Device::Cpu, &opts).unwrap();
    let want = exact.embed(&f.sentences, 8, &mut |_| {}).unwrap();
    let got = bf16.embed(&f.sentences, 8, &mut |_| {}).unwrap();
    let cosine = |a: &[f32], b: &[f32]| {
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
    };
    let sims: Vec<f32> = got.iter().zip(&want).map(|(g, w)| cosine(g, w)).collect();
    if !bertha::fast::cpu::has_bf16() {
        assert_eq!(bf16.precision(), bertha::fast::Precision::F32);
        assert!(sims.iter().all(|s| *s >= 0.999999), "{sims:?}");
        return;
    }
    assert_eq!(bf16.precision(), bertha::fast::Precision::Bf16);
    assert!(sims.iter().all(|s| *s >= 0.9999), "{sims:?}");
    // Rounding really happened: close, not equal.
    assert!(sims.iter().any(|s| *s < 0.999999), "{sims:?}");
    let alone = bf16.embed(&f.sentences[..1], 1, &mut |_| {}).unwrap();
    let diff = alone[0]
        .iter()
        .zip(&got[0])
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 1e-6, "bf16 batch invariance: {diff}");
}
