//! Sentence-embedding training against sentence-transformers: every loss's
//! value and gradients on the tiny encoder of `tests/fixtures/st-embedding`
//! (made by `../shared/fixtures/make_embedding_fixtures.py`), GradCache
//! equal to the plain loss, the no-duplicates sampler, and a short run
//! that writes a sentence-transformers folder.

mod common;

use std::path::{Path, PathBuf};

use bertha::data::{EmbeddingData, PairLayout};
use bertha::training::{
    EmbeddingLoss, EmbeddingOptions, EmbeddingTrainer, FinetuneOptions, LossKind,
};
use common::{fixtures, load_safetensors, max_abs, max_abs_diff, read_json};

fn fixture_dir() -> PathBuf {
    fixtures().join("st-embedding")
}

fn texts(v: &serde_json::Value, key: &str) -> Vec<String> {
    serde_json::from_value(v[key].clone()).unwrap()
}

/// The fixture's rows in the columns `cols` (anchor, positive, negative),
/// or as scored pairs.
fn data(cols: &[&str], scored: bool) -> EmbeddingData {
    let inputs = read_json(&fixture_dir().join("inputs.json"));
    let columns: Vec<Vec<String>> = cols
        .iter()
        .map(|c| texts(&inputs, &format!("{c}s")))
        .collect();
    let n = columns[0].len();
    let rows = (0..n)
        .map(|i| columns.iter().map(|c| c[i].clone()).collect())
        .collect();
    let scores: Option<Vec<f32>> = scored.then(|| {
        let s: Vec<f64> = serde_json::from_value(inputs["scores"].clone()).unwrap();
        s.into_iter().map(|v| v as f32).collect()
    });
    EmbeddingData {
        path: fixture_dir().join("inputs.json"),
        layout: if scored {
            PairLayout::Scored
        } else {
            PairLayout::Texts
        },
        columns: if scored {
            vec!["sentence1".into(), "sentence2".into()]
        } else {
            cols.iter().map(|c| c.to_string()).collect()
        },
        rows,
        scores,
        lines: (2..n + 2).collect(),
        bad_rows: Vec::new(),
    }
}

fn trainer(loss: EmbeddingLoss, data: EmbeddingData, out: &Path, mini: usize) -> EmbeddingTrainer {
    let mut train = FinetuneOptions {
        max_length: 32,
        batch_size: 4,
        out: out.to_path_buf(),
        ..FinetuneOptions::default()
    };
    train.epochs = 1.0;
    let mut opts = EmbeddingOptions::new(loss, train);
    opts.mini_batch_size = mini;
    EmbeddingTrainer::new(&fixture_dir(), data, None, opts).unwrap()
}

fn check(name: &str, loss: EmbeddingLoss, data: EmbeddingData, mini: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let t = trainer(loss, data, &tmp.path().join("out"), mini);
    let (value, grads) = t.loss_and_gradients(&[0, 1, 2, 3]).unwrap();
    let expected = load_safetensors(&fixture_dir().join("expected.safetensors"));
    let want = expected[&format!("loss.{name}")]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0] as f64;
    let rel = (value - want).abs() / want.abs().max(1e-12);
    assert!(
        rel <= 1e-5,
        "{name} (mini-batch {mini}): loss {value} vs {want} (rel {rel:e})"
    );
    let inputs = read_json(&fixture_dir().join("inputs.json"));
    let params: Vec<String> = serde_json::from_value(inputs["grad_params"].clone()).unwrap();
    for p in params {
        let want = &expected[&format!("grad.{name}.{p}")];
        let got = grads
            .get(&p)
            .unwrap_or_else(|| panic!("{name}: no gradient for {p}"));
        let err = max_abs_diff(got, want) / max_abs(want).max(1e-30);
        assert!(
            err <= 1e-4,
            "{name} (mini-batch {mini}): d/d{p} off by {err:e} of its max"
        );
    }
}

fn loss(kind: LossKind) -> EmbeddingLoss {
    EmbeddingLoss::new(kind)
}

#[test]
fn mnrl_matches_sentence_transformers() {
    check(
        "mnrl",
        loss(LossKind::Mnrl),
        data(&["anchor", "positive"], false),
        32,
    );
}

#[test]
fn mnrl_with_hard_negatives_matches() {
    check(
        "mnrl_hard",
        loss(LossKind::Mnrl),
        data(&["anchor", "positive", "negative"], false),
        32,
    );
}

#[test]
fn symmetric_mnrl_matches() {
    check(
        "mnrl_symmetric",
        loss(LossKind::MnrlSymmetric),
        data(&["anchor", "positive"], false),
        32,
    );
}

#[test]
fn cosent_matches() {
    check(
        "cosent",
        loss(LossKind::Cosent),
        data(&["anchor", "positive"], true),
        32,
    );
}

#[test]
fn cosine_mse_matches() {
    check(
        "cosine_mse",
        loss(LossKind::CosineMse),
        data(&["anchor", "positive"], true),
        32,
    );
}

#[test]
fn matryoshka_mnrl_matches() {
    let mut l = loss(LossKind::Mnrl);
    l.matryoshka = Some(vec![64, 32, 16]);
    check(
        "matryoshka_mnrl",
        l,
        data(&["anchor", "positive"], false),
        32,
    );
}

/// GradCache gives MNRL's loss and gradients, whatever the mini-batch.
#[test]
fn cached_mnrl_equals_mnrl() {
    for mini in [1, 3, 32] {
        check(
            "mnrl",
            loss(LossKind::CachedMnrl),
            data(&["anchor", "positive"], false),
            mini,
        );
        check(
            "mnrl_hard",
            loss(LossKind::CachedMnrl),
            data(&["anchor", "positive", "negative"], false),
            mini,
        );
    }
    let mut l = loss(LossKind::CachedMnrl);
    l.matryoshka = Some(vec![64, 32, 16]);
    check(
        "matryoshka_mnrl",
        l,
        data(&["anchor", "positive"], false),
        2,
    );
}

/// With dropout on, GradCache still gives MNRL's loss and gradients: a
/// row's masks depend on its column and place in the batch, not on the
/// mini-batch that encodes it.
#[test]
fn cached_mnrl_equals_mnrl_with_dropout() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    copy_dir(&fixture_dir(), &model);
    let path = model.join("config.json");
    let mut config = read_json(&path);
    config["hidden_dropout_prob"] = 0.2.into();
    config["attention_probs_dropout_prob"] = 0.2.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let run = |kind, mini| {
        let mut train = FinetuneOptions {
            max_length: 32,
            batch_size: 4,
            out: tmp.path().join(format!("out-{mini}")),
            ..FinetuneOptions::default()
        };
        train.epochs = 1.0;
        let mut opts = EmbeddingOptions::new(loss(kind), train);
        opts.mini_batch_size = mini;
        let data = data(&["anchor", "positive", "negative"], false);
        let t = EmbeddingTrainer::new(&model, data, None, opts).unwrap();
        t.loss_and_gradients(&[0, 1, 2, 3]).unwrap()
    };
    let (want, want_grads) = run(LossKind::Mnrl, 32);
    // Dropout is on: without it the loss would be the fixture's.
    let plain = load_safetensors(&fixture_dir().join("expected.safetensors"))["loss.mnrl_hard"]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0] as f64;
    assert!(
        (want - plain).abs() > 1e-4,
        "{want} vs {plain} without dropout"
    );
    for mini in [1, 3] {
        let (got, grads) = run(LossKind::CachedMnrl, mini);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "mini-batch {mini}: {got} vs {want}"
        );
        // Attention key biases aside: their gradient is zero in exact
        // arithmetic (adding one number to a softmax row changes nothing),
        // so what is left of it is rounding noise.
        for (name, g) in want_grads
            .iter()
            .filter(|(n, _)| !n.ends_with("attention.self.key.bias"))
        {
            let err = max_abs_diff(&grads[name], g) / max_abs(g).max(1e-30);
            assert!(err <= 1e-4, "mini-batch {mini}: d/d{name} off by {err:e}");
        }
    }
}

#[test]
fn losses_refuse_data_they_cannot_learn_from() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = |kind| {
        EmbeddingOptions::new(
            loss(kind),
            FinetuneOptions {
                max_length: 32,
                out: tmp.path().join("o"),
                ..FinetuneOptions::default()
            },
        )
    };
    let err = EmbeddingTrainer::new(
        &fixture_dir(),
        data(&["anchor", "positive"], false),
        None,
        opts(LossKind::Cosent),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("cosent") && err.contains("scored pairs"),
        "{err}"
    );
    let err = EmbeddingTrainer::new(
        &fixture_dir(),
        data(&["anchor", "positive"], true),
        None,
        opts(LossKind::Mnrl),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("mnrl"), "{err}");
    let mut o = opts(LossKind::Mnrl);
    o.loss.matryoshka = Some(vec![64, 128]);
    let err = EmbeddingTrainer::new(
        &fixture_dir(),
        data(&["anchor", "positive"], false),
        None,
        o,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("matryoshka") && err.contains("128"), "{err}");
}

/// A short MNRL run: the loss falls on its own training batch, the output
/// is a sentence-transformers folder whose embeddings the library reads
/// back, and the prompts are saved.
#[test]
fn a_short_run_writes_a_sentence_transformers_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let mut train = FinetuneOptions {
        max_length: 32,
        batch_size: 4,
        lr: 1e-3,
        warmup_ratio: 0.0,
        out: out.clone(),
        ..FinetuneOptions::default()
    };
    train.epochs = 8.0;
    let mut opts = EmbeddingOptions::new(loss(LossKind::Mnrl), train);
    opts.prompts.insert("query".into(), "query: ".into());
    let mut t = EmbeddingTrainer::new(
        &fixture_dir(),
        data(&["anchor", "positive"], false),
        None,
        opts,
    )
    .unwrap();
    let (before, _) = t.loss_and_gradients(&[0, 1, 2, 3]).unwrap();
    t.run(|_| {}).unwrap();
    let (after, _) = t.loss_and_gradients(&[0, 1, 2, 3]).unwrap();
    assert!(after < before * 0.5, "loss {before} -> {after}");
    for f in [
        "config.json",
        "model.safetensors",
        "modules.json",
        "1_Pooling/config.json",
        "2_Normalize/config.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "tokenizer.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let weights = load_safetensors(&out.join("model.safetensors"));
    assert!(weights.contains_key("embeddings.word_embeddings.weight"));
    let st = read_json(&out.join("config_sentence_transformers.json"));
    assert_eq!(st["prompts"]["query"], "query: ");
    // The saved model's embedding of a text, through the inference path,
    // equals the trained encoder's.
    let embedder =
        bertha::tasks::embed::Embedder::from_dir(&out, &bertha::Device::Cpu, &Default::default())
            .unwrap();
    let saved = embedder
        .embed(&["club members story"], 8, &mut |_| {})
        .unwrap();
    let norm: f32 = saved[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "normalised: {norm}");
    let original = bertha::tasks::embed::Embedder::from_dir(
        &fixture_dir(),
        &bertha::Device::Cpu,
        &Default::default(),
    )
    .unwrap()
    .embed(&["club members story"], 8, &mut |_| {})
    .unwrap();
    let moved: f32 = saved[0]
        .iter()
        .zip(&original[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(moved > 1e-3, "training changed the model");
}

/// A run stopped after a step and resumed from its checkpoint repeats the
/// uninterrupted run's losses and weights exactly, dropout and GradCache
/// included.
#[test]
fn resume_repeats_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    copy_dir(&fixture_dir(), &model);
    let config = model.join("config.json");
    let mut c = read_json(&config);
    c["hidden_dropout_prob"] = 0.1.into();
    c["attention_probs_dropout_prob"] = 0.1.into();
    std::fs::write(&config, c.to_string()).unwrap();

    let start = |out: &Path| {
        let mut train = FinetuneOptions {
            max_length: 32,
            batch_size: 2,
            lr: 1e-3,
            out: out.to_path_buf(),
            save_total_limit: None,
            save_every: Some(1),
            ..FinetuneOptions::default()
        };
        train.epochs = 2.0;
        let mut opts = EmbeddingOptions::new(loss(LossKind::CachedMnrl), train);
        opts.mini_batch_size = 1;
        EmbeddingTrainer::new(
            &model,
            data(&["anchor", "positive", "negative"], false),
            None,
            opts,
        )
        .unwrap()
    };
    let whole = tmp.path().join("whole");
    let mut a = start(&whole);
    a.run(|_| {}).unwrap();
    let parts = tmp.path().join("parts");
    let mut b = start(&parts);
    b.run_until(1, |_| {}).unwrap();
    let mut c = start(&parts);
    c.resume(&parts.join("checkpoint-1")).unwrap();
    c.run(|_| {}).unwrap();
    let losses = |t: &EmbeddingTrainer| t.history().iter().map(|m| m.loss).collect::<Vec<_>>();
    assert_eq!(losses(&a).len(), 4);
    assert_eq!(losses(&a), losses(&c));
    let (wa, wc) = (
        load_safetensors(&whole.join("model.safetensors")),
        load_safetensors(&parts.join("model.safetensors")),
    );
    for (name, t) in &wa {
        assert_eq!(max_abs_diff(t, &wc[name]), 0.0, "{name}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}
