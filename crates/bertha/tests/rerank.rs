//! Cross-encoders against sentence-transformers 6.2
//! (`tests/fixtures/cross-encoder`): `predict`, and each ranking loss's
//! value and gradients (BCE, MNRL, LambdaLoss, ListNet) on the candle
//! modules and on the fast path.

mod common;

use std::path::{Path, PathBuf};

use bertha::data::{RerankData, RerankGroup, RerankLayout};
use bertha::tasks::{Activation, CrossEncoder, CrossEncoderOptions};
use bertha::training::trainer::{Engine, ModelSetup};
use bertha::training::{FinetuneOptions, RerankLoss, RerankOptions, RerankTrainer};
use bertha::{Device, ModelDir, Tokenizer};
use common::{fixtures, load_safetensors, max_abs, max_abs_diff, read_json};

fn dir() -> PathBuf {
    fixtures().join("cross-encoder")
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap()
}

fn numbers(v: &serde_json::Value) -> Vec<f32> {
    let x: Vec<f64> = serde_json::from_value(v.clone()).unwrap();
    x.into_iter().map(|x| x as f32).collect()
}

fn group(query: &str, documents: Vec<String>, labels: Vec<f32>) -> RerankGroup {
    RerankGroup {
        query: query.to_string(),
        documents,
        labels,
        line: 0,
    }
}

/// The fixture's training data for `loss`, in its columns.
fn data(loss: &str) -> RerankData {
    let inputs = read_json(&dir().join("inputs.json"));
    let queries = strings(&inputs["queries"]);
    let (layout, groups) = match loss {
        "bce" => {
            let (a, b) = (strings(&inputs["pairs"][0]), strings(&inputs["pairs"][1]));
            let y = numbers(&inputs["pair_labels"]);
            let g = (0..a.len())
                .map(|i| group(&a[i], vec![b[i].clone()], vec![y[i]]))
                .collect();
            (RerankLayout::LabelledPairs, g)
        }
        "mnrl" => {
            let (p, n) = (strings(&inputs["positives"]), strings(&inputs["negatives"]));
            let g = (0..queries.len())
                .map(|i| {
                    group(
                        &queries[i],
                        vec![p[i].clone(), n[i].clone()],
                        vec![1.0, 0.0],
                    )
                })
                .collect();
            (RerankLayout::Tuples, g)
        }
        _ => {
            let lists: Vec<Vec<String>> = serde_json::from_value(inputs["lists"].clone()).unwrap();
            let labels: Vec<Vec<f64>> =
                serde_json::from_value(inputs["list_labels"].clone()).unwrap();
            let g = (0..queries.len())
                .map(|i| {
                    let y = labels[i].iter().map(|&v| v as f32).collect();
                    group(&queries[i], lists[i].clone(), y)
                })
                .collect();
            (RerankLayout::Lists, g)
        }
    };
    RerankData {
        path: dir().join("inputs.json"),
        layout,
        groups,
    }
}

fn trainer(loss: &str, engine: Engine, out: &Path) -> RerankTrainer {
    let model = ModelDir::open(dir()).unwrap();
    let config = model.config().unwrap();
    let tokenizer = Tokenizer::from_dir(&dir(), 64).unwrap();
    let train = FinetuneOptions {
        max_length: 64,
        batch_size: 4,
        engine,
        out: out.to_path_buf(),
        ..FinetuneOptions::default()
    };
    let loss = match loss {
        "bce" => RerankLoss::Bce { pos_weight: None },
        other => other.parse().unwrap(),
    };
    let setup = ModelSetup {
        config,
        init: Some(model.weights().unwrap()),
        tokenizer_source: dir(),
    };
    let opts = RerankOptions { loss, train };
    RerankTrainer::from_parts(setup, &tokenizer, &data(loss.name()), None, opts).unwrap()
}

#[test]
fn losses_and_gradients_equal_sentence_transformers() {
    let expected = load_safetensors(&dir().join("expected.safetensors"));
    let inputs = read_json(&dir().join("inputs.json"));
    let params = strings(&inputs["grad_params"]);
    for engine in [Engine::Candle, Engine::Fast] {
        for loss in ["bce", "mnrl", "lambda", "listnet"] {
            let out = tempfile::tempdir().unwrap();
            let t = trainer(loss, engine, out.path());
            assert_eq!(t.on_fast_path(), engine == Engine::Fast);
            let rows: Vec<usize> = (0..t.train_units()).collect();
            let (value, grads) = t.loss_and_gradients(&rows).unwrap();
            let want = expected[&format!("loss.{loss}")]
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[0] as f64;
            let rel = (value - want).abs() / want.abs();
            assert!(
                rel <= 1e-5,
                "{engine:?} {loss}: loss {value} vs {want} (rel {rel:e})"
            );
            // LambdaLoss and ListNet see only differences of a list's
            // scores (softmax and pairwise terms are shift-invariant), so
            // the classifier bias's gradient is exactly 0 and the
            // fixture's (~1e-8) is rounding: such a tensor is compared to
            // the scale of the loss's other gradients instead of its own.
            let scale = params
                .iter()
                .map(|p| max_abs(&expected[&format!("grad.{loss}.{p}")]))
                .fold(0f32, f32::max);
            for p in &params {
                let name = p.strip_prefix("0.model.").unwrap();
                let got = grads
                    .get(name)
                    .unwrap_or_else(|| panic!("{engine:?} {loss}: no gradient for {name}"));
                let want = &expected[&format!("grad.{loss}.{p}")];
                let own = max_abs(want);
                let zero = own < 1e-6 * scale && loss != "bce" && loss != "mnrl";
                let err = max_abs_diff(got, want) / if zero { scale } else { own };
                assert!(
                    err <= 1e-4,
                    "{engine:?} {loss}: d/d{name} off by {err:e} of its max"
                );
            }
        }
    }
}

#[test]
fn predict_equals_sentence_transformers() {
    let expected = load_safetensors(&dir().join("expected.safetensors"));
    let want = expected["predict"].to_vec1::<f32>().unwrap();
    let inputs = read_json(&dir().join("inputs.json"));
    let (a, b) = (strings(&inputs["pairs"][0]), strings(&inputs["pairs"][1]));
    let pairs: Vec<(&str, &str)> = a
        .iter()
        .map(String::as_str)
        .zip(b.iter().map(String::as_str))
        .collect();
    for fast_f32 in [false, true] {
        let opts = CrossEncoderOptions {
            fast_f32,
            batch_size: 3,
            ..CrossEncoderOptions::default()
        };
        let ce = CrossEncoder::from_dir(&dir(), &Device::Cpu, &opts).unwrap();
        assert_eq!(ce.activation(), Activation::Sigmoid);
        let got = ce.scores(&pairs).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5,
                "fast {fast_f32}: pair {i}: {g} vs {w}"
            );
        }
        // rank: the same scores, best first.
        let docs: Vec<&str> = b.iter().map(String::as_str).collect();
        let ranked = ce.rank(&a[0], &docs, Some(2)).unwrap();
        assert_eq!(ranked.len(), 2);
        assert!(ranked[0].score >= ranked[1].score);
    }
}

/// A copy of the fixture whose files name `activation` where `field`
/// says (`None`: no activation named anywhere).
fn with_activation(tmp: &Path, field: Option<&str>, activation: &str) -> PathBuf {
    let d = tmp.join("ce");
    std::fs::create_dir_all(&d).unwrap();
    for f in std::fs::read_dir(dir()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), d.join(f.file_name())).unwrap();
    }
    let st = d.join("config_sentence_transformers.json");
    let mut v = read_json(&st);
    v.as_object_mut().unwrap().remove("activation_fn");
    std::fs::write(&st, v.to_string()).unwrap();
    let cfg = d.join("config.json");
    let mut c = read_json(&cfg);
    match field {
        Some("activation_fn") => {
            v["activation_fn"] = activation.into();
            std::fs::write(&st, v.to_string()).unwrap();
        }
        Some("sentence_transformers") => {
            c["sentence_transformers"] = serde_json::json!({"activation_fn": activation})
        }
        Some(other) => c[other] = activation.into(),
        None => {}
    }
    std::fs::write(&cfg, c.to_string()).unwrap();
    d
}

#[test]
fn the_folders_activation_is_found_where_sentence_transformers_looks() {
    use bertha::tasks::{Classifier, ScoreFunction};
    let tmp = tempfile::tempdir().unwrap();
    let inputs = read_json(&dir().join("inputs.json"));
    let (a, b) = (strings(&inputs["pairs"][0]), strings(&inputs["pairs"][1]));
    let pairs = [(a[0].as_str(), b[0].as_str())];
    let opts = CrossEncoderOptions::default();
    let sigmoid = CrossEncoder::from_dir(&dir(), &Device::Cpu, &opts).unwrap();
    let logit = sigmoid.logits(&pairs).unwrap()[0][0];
    for (field, path, want) in [
        (
            Some("activation_fn"),
            "torch.nn.modules.linear.Identity",
            Activation::Identity,
        ),
        (
            Some("sentence_transformers"),
            "torch.nn.modules.activation.Tanh",
            Activation::Tanh,
        ),
        (
            Some("sbert_ce_default_activation_function"),
            "torch.nn.modules.linear.Identity",
            Activation::Identity,
        ),
        (
            Some("activation_fn"),
            "my_package.Custom",
            Activation::Sigmoid,
        ),
        (None, "", Activation::Sigmoid),
    ] {
        let d = with_activation(tmp.path(), field, path);
        let ce = CrossEncoder::from_dir(&d, &Device::Cpu, &opts).unwrap();
        assert_eq!(ce.activation(), want, "{field:?} {path}");
        let score = ce.scores(&pairs).unwrap()[0];
        let expect = match want {
            Activation::Identity => logit,
            Activation::Tanh => logit.tanh(),
            _ => 1.0 / (1.0 + (-logit).exp()),
        };
        assert!(
            (score - expect).abs() < 1e-6,
            "{field:?}: {score} vs {expect}"
        );
        // /rerank's classifier scores with the same function.
        let cl = Classifier::from_dir(&d, &Device::Cpu).unwrap();
        assert_eq!(cl.function(), want.score_function());
        std::fs::remove_dir_all(&d).unwrap();
    }
    assert_eq!(Activation::Identity.score_function(), ScoreFunction::None);
}

#[test]
fn pairs_side_by_side_score_as_pairs_in_turn() {
    // On the fast path, called from outside the thread pool, batches of
    // pairs run side by side (one batch of pairs in parts); inside a
    // one-thread pool, one after another. The same bits either way.
    let inputs = read_json(&dir().join("inputs.json"));
    let (a, b) = (strings(&inputs["pairs"][0]), strings(&inputs["pairs"][1]));
    let pairs: Vec<(String, String)> = (0..30)
        .map(|i| {
            let doc = (0..1 + i % 5)
                .map(|j| b[(i + j) % b.len()].as_str())
                .collect::<Vec<_>>()
                .join(" ");
            (a[i % a.len()].clone(), doc)
        })
        .collect();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for batch_size in [3, 30] {
        let opts = CrossEncoderOptions {
            batch_size,
            ..CrossEncoderOptions::default()
        };
        let ce = CrossEncoder::from_dir(&dir(), &Device::Cpu, &opts).unwrap();
        let side_by_side = ce.logits(&pairs).unwrap();
        let in_turn = one.install(|| ce.logits(&pairs).unwrap());
        assert_eq!(side_by_side.len(), 30);
        assert_eq!(side_by_side, in_turn, "batch size {batch_size}");
        // Each pair alone (a batch of one) scores within rounding.
        for (i, pair) in pairs.iter().enumerate().step_by(7) {
            let alone = ce.logits(std::slice::from_ref(pair)).unwrap();
            for (x, y) in alone[0].iter().zip(&side_by_side[i]) {
                assert!((x - y).abs() <= 1e-5, "pair {i}: {x} vs {y}");
            }
        }
    }
}
