//! Sentence-embedding training on the fast engine against the candle
//! path, on the tiny encoder of `tests/fixtures/st-embedding` with dropout
//! on: one step's loss and gradients for every loss the fast engine
//! covers (mean, CLS and max pooling; GradCache's mini-batches), a few
//! steps' losses, data-parallel slices (processes as threads), and the
//! runs it does not cover (falling back under `auto`, refused under
//! `fast`).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};

use bertha::data::{EmbeddingData, PairLayout};
use bertha::fast::train::Compute;
use bertha::training::distributed::shard;
use bertha::training::trainer::Engine;
use bertha::training::{
    EmbeddingLoss, EmbeddingOptions, EmbeddingTrainer, FinetuneOptions, LossKind, ProcessGroup,
};
use bertha::Pooling;
use candle_core::Tensor;
use common::{fixtures, load_safetensors, max_abs, max_abs_diff, read_json};

fn fixture_dir() -> PathBuf {
    fixtures().join("st-embedding")
}

/// The fixture's rows in the columns `cols`, or as scored pairs.
fn data(cols: &[&str], scored: bool) -> EmbeddingData {
    let inputs = read_json(&fixture_dir().join("inputs.json"));
    let columns: Vec<Vec<String>> = cols
        .iter()
        .map(|c| serde_json::from_value(inputs[format!("{c}s")].clone()).unwrap())
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

/// The fixture's model with dropout on.
fn dropout_model(tmp: &Path) -> PathBuf {
    let model = tmp.join("model");
    copy_dir(&fixture_dir(), &model);
    let path = model.join("config.json");
    let mut config = read_json(&path);
    config["hidden_dropout_prob"] = 0.1.into();
    config["attention_probs_dropout_prob"] = 0.1.into();
    std::fs::write(&path, config.to_string()).unwrap();
    model
}

/// A case: the fixture's loss name, the loss and its data.
struct Case {
    name: &'static str,
    loss: EmbeddingLoss,
    cols: &'static [&'static str],
    scored: bool,
}

fn cases() -> Vec<Case> {
    let l = EmbeddingLoss::new;
    let mut matryoshka = l(LossKind::Mnrl);
    matryoshka.matryoshka = Some(vec![64, 32, 16]);
    vec![
        Case {
            name: "mnrl",
            loss: l(LossKind::Mnrl),
            cols: &["anchor", "positive"],
            scored: false,
        },
        Case {
            name: "mnrl_hard",
            loss: l(LossKind::Mnrl),
            cols: &["anchor", "positive", "negative"],
            scored: false,
        },
        Case {
            name: "mnrl_symmetric",
            loss: l(LossKind::MnrlSymmetric),
            cols: &["anchor", "positive"],
            scored: false,
        },
        Case {
            name: "cosent",
            loss: l(LossKind::Cosent),
            cols: &["anchor", "positive"],
            scored: true,
        },
        Case {
            name: "cosine_mse",
            loss: l(LossKind::CosineMse),
            cols: &["anchor", "positive"],
            scored: true,
        },
        Case {
            name: "matryoshka_mnrl",
            loss: matryoshka,
            cols: &["anchor", "positive"],
            scored: false,
        },
    ]
}

fn options(
    loss: &EmbeddingLoss,
    engine: Engine,
    pooling: Pooling,
    out: &Path,
    batch_size: usize,
) -> EmbeddingOptions {
    let mut train = FinetuneOptions {
        max_length: 32,
        batch_size,
        lr: 1e-3,
        engine,
        out: out.to_path_buf(),
        ..FinetuneOptions::default()
    };
    train.epochs = 1.0;
    let mut opts = EmbeddingOptions::new(loss.clone(), train);
    opts.pooling = Some(pooling);
    opts
}

fn step(
    model: &Path,
    case: &Case,
    engine: Engine,
    pooling: Pooling,
    out: &Path,
) -> (f64, HashMap<String, Tensor>) {
    let opts = options(&case.loss, engine, pooling, out, 4);
    let t = EmbeddingTrainer::new(model, data(case.cols, case.scored), None, opts).unwrap();
    assert_eq!(t.on_fast_path(), engine == Engine::Fast, "{}", case.name);
    t.loss_and_gradients(&[0, 1, 2, 3]).unwrap()
}

/// Asserts the same loss (1e-5 relative) and gradients (1e-4 of each
/// tensor's largest); returns the largest relative gradient difference.
fn assert_same_step(
    what: &str,
    (got, got_grads): &(f64, HashMap<String, Tensor>),
    (want, want_grads): &(f64, HashMap<String, Tensor>),
) -> f32 {
    let rel = (got - want).abs() / want.abs().max(1e-12);
    assert!(rel <= 1e-5, "{what}: loss {got} vs {want} (rel {rel:e})");
    assert_eq!(got_grads.len(), want_grads.len(), "{what}: gradients");
    let largest = want_grads.values().map(max_abs).fold(0f32, f32::max);
    assert!(largest > 0.0, "{what}: no gradient");
    let mut worst = 0f32;
    for (name, want) in want_grads {
        let got = got_grads
            .get(name)
            .unwrap_or_else(|| panic!("{what}: no gradient for {name}"));
        let diff = max_abs_diff(got, want);
        if name.ends_with("attention.self.key.bias") {
            // Zero in exact arithmetic (a constant added to a softmax row
            // changes nothing): what is left is rounding noise, so it is
            // held to the scale of the step's other gradients.
            assert!(
                diff <= 1e-5 * largest,
                "{what}: d/d{name} off by {diff:e} (largest gradient {largest:e})"
            );
            continue;
        }
        let err = diff / max_abs(want).max(1e-30);
        assert!(err <= 1e-4, "{what}: d/d{name} off by {err:e} of its max");
        worst = worst.max(err);
    }
    worst
}

#[test]
fn one_step_equals_the_candle_path_for_every_covered_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let model = dropout_model(tmp.path());
    let expected = load_safetensors(&fixture_dir().join("expected.safetensors"));
    let out = tmp.path().join("out");
    for case in cases() {
        let want = step(&model, &case, Engine::Candle, Pooling::Mean, &out);
        let got = step(&model, &case, Engine::Fast, Pooling::Mean, &out);
        // Dropout is on: without it the loss would be the fixture's.
        let plain = expected[&format!("loss.{}", case.name)]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0] as f64;
        assert!(
            (want.0 - plain).abs() > 1e-4,
            "{}: {} vs {plain} without dropout",
            case.name,
            want.0
        );
        let worst = assert_same_step(case.name, &got, &want);
        eprintln!(
            "{} (mean): loss {} vs {} (abs diff {:e}), gradients within {worst:e} of their max",
            case.name,
            got.0,
            want.0,
            (got.0 - want.0).abs()
        );
    }
}

#[test]
fn cls_and_max_pooling_equal_the_candle_path() {
    let tmp = tempfile::tempdir().unwrap();
    let model = dropout_model(tmp.path());
    let out = tmp.path().join("out");
    for case in cases()
        .into_iter()
        .filter(|c| c.name == "mnrl_hard" || c.name == "cosent")
    {
        for pooling in [Pooling::Cls, Pooling::Max, Pooling::MeanSqrtLen] {
            let want = step(&model, &case, Engine::Candle, pooling, &out);
            let got = step(&model, &case, Engine::Fast, pooling, &out);
            let what = format!("{} ({})", case.name, pooling.name());
            let worst = assert_same_step(&what, &got, &want);
            eprintln!(
                "{what}: loss abs diff {:e}, gradients within {worst:e} of their max",
                (got.0 - want.0).abs()
            );
        }
    }
}

/// A few optimizer steps (2 epochs of 2-row batches, dropout on) give the
/// same per-step losses and the same weights on both engines.
#[test]
fn a_few_steps_equal_the_candle_path() {
    let tmp = tempfile::tempdir().unwrap();
    let model = dropout_model(tmp.path());
    for case in cases()
        .into_iter()
        .filter(|c| c.name == "mnrl_hard" || c.name == "cosent")
    {
        let run = |engine: Engine| {
            let out = tmp.path().join(format!("{}-{engine:?}", case.name));
            let mut opts = options(&case.loss, engine, Pooling::Mean, &out, 2);
            opts.train.epochs = 2.0;
            let mut t =
                EmbeddingTrainer::new(&model, data(case.cols, case.scored), None, opts).unwrap();
            assert_eq!(t.on_fast_path(), engine == Engine::Fast);
            t.run(|_| {}).unwrap();
            let losses: Vec<f64> = t.history().iter().map(|m| m.loss).collect();
            (losses, load_safetensors(&out.join("model.safetensors")))
        };
        let (want, want_weights) = run(Engine::Candle);
        let (got, got_weights) = run(Engine::Fast);
        assert_eq!(want.len(), 4, "{}: steps", case.name);
        assert_eq!(got.len(), want.len(), "{}: steps", case.name);
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            let rel = (g - w).abs() / w.abs().max(1e-12);
            assert!(
                rel <= 1e-5,
                "{} step {s}: loss {g} vs {w} (rel {rel:e})",
                case.name
            );
        }
        // The steps differ: the weights moved and dropout draws anew.
        assert!(
            want.windows(2).any(|w| w[0] != w[1]),
            "{}: {want:?}",
            case.name
        );
        // Attention key biases aside: their gradient is rounding noise
        // (see `assert_same_step`), which AdamW's m / sqrt(v) turns into
        // full-size steps of either sign on either engine.
        for (name, w) in want_weights
            .iter()
            .filter(|(n, _)| !n.ends_with("attention.self.key.bias"))
        {
            let err = max_abs_diff(&got_weights[name], w) / max_abs(w).max(1e-30);
            assert!(err <= 1e-4, "{}: weight {name} off by {err:e}", case.name);
        }
        eprintln!("{}: fast {got:?} candle {want:?}", case.name);
    }
}

/// GradCache on the fast engine (mini-batches of 3 over 4 rows: a full
/// and a partial one per column) equals GradCache on candle and the
/// uncached loss on the fast engine, with and without hard negatives.
#[test]
fn cached_mnrl_equals_the_candle_path_and_the_uncached_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let model = dropout_model(tmp.path());
    let out = tmp.path().join("out");
    for cols in [
        &["anchor", "positive"][..],
        &["anchor", "positive", "negative"],
    ] {
        let run = |kind: LossKind, engine: Engine| {
            let mut opts = options(&EmbeddingLoss::new(kind), engine, Pooling::Mean, &out, 4);
            opts.mini_batch_size = 3;
            let t = EmbeddingTrainer::new(&model, data(cols, false), None, opts).unwrap();
            assert_eq!(t.on_fast_path(), engine == Engine::Fast);
            t.loss_and_gradients(&[0, 1, 2, 3]).unwrap()
        };
        let fast = run(LossKind::CachedMnrl, Engine::Fast);
        let candle = run(LossKind::CachedMnrl, Engine::Candle);
        let uncached = run(LossKind::Mnrl, Engine::Fast);
        let what = format!("cached-mnrl, {} columns", cols.len());
        let worst = assert_same_step(&what, &fast, &candle);
        assert_same_step(&format!("{what} against mnrl"), &fast, &uncached);
        eprintln!(
            "{what}: loss {} vs candle {} (abs diff {:e}), gradients within {worst:e} of their max",
            fast.0,
            candle.0,
            (fast.0 - candle.0).abs()
        );
    }
}

/// Processes of a data-parallel run as threads of this test: each holds
/// its rank and the slots every process writes its part of a gather to.
/// Only the gather is offered: it is the one collective an embedding
/// step makes (the trainer sums the gradients afterwards, as this test
/// does).
struct ThreadGroup {
    rank: usize,
    size: usize,
    slots: Arc<(Mutex<Vec<Vec<f32>>>, Barrier)>,
}

impl ThreadGroup {
    fn all(size: usize) -> Vec<Self> {
        let slots = Arc::new((Mutex::new(vec![Vec::new(); size]), Barrier::new(size)));
        (0..size)
            .map(|rank| Self {
                rank,
                size,
                slots: slots.clone(),
            })
            .collect()
    }
}

fn gather_only() -> bertha::Error {
    bertha::Error::Distributed("the test's thread group offers gather_f32 only".into())
}

impl ProcessGroup for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn sum_f64(&self, _: &mut [f64]) -> bertha::Result<()> {
        Err(gather_only())
    }
    fn sum_f32(&self, _: &[f32], _: &mut [f32]) -> bertha::Result<()> {
        Err(gather_only())
    }
    fn broadcast_f32(&self, _: &mut [f32]) -> bertha::Result<()> {
        Err(gather_only())
    }
    fn gather_u64(&self, _: &[u64]) -> bertha::Result<Vec<u64>> {
        Err(gather_only())
    }
    fn gather_f32(&self, values: &[f32]) -> bertha::Result<Vec<Vec<f32>>> {
        let (slots, barrier) = &*self.slots;
        slots.lock().unwrap()[self.rank] = values.to_vec();
        barrier.wait();
        let all = slots.lock().unwrap().clone();
        // No process writes the next gather before every one has read.
        barrier.wait();
        Ok(all)
    }
    fn exchange_u16(&self, _: &[u16], _: usize, _: &mut [u16], _: usize) -> bertha::Result<()> {
        Err(gather_only())
    }
    fn describe(&self) -> String {
        format!("{} threads", self.size)
    }
}

/// One micro-batch of the fixture's 4 rows split over `size` processes
/// (threads), each on its own trainer: every process's loss (the whole
/// micro-batch's) and the sum of their gradients.
fn data_parallel_step(
    size: usize,
    make: &(dyn Fn() -> EmbeddingTrainer + Sync),
) -> (f64, HashMap<String, Tensor>) {
    let rows = [0, 1, 2, 3];
    let results: Vec<(f64, HashMap<String, Tensor>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = ThreadGroup::all(size)
            .into_iter()
            .map(|group| {
                scope.spawn(move || {
                    let t = make();
                    let part = shard(rows.len(), group.rank, size);
                    t.slice_loss_and_gradients(&rows, part, &group).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let loss = results[0].0;
    for (rank, (l, _)) in results.iter().enumerate() {
        assert_eq!(*l, loss, "process {rank}'s loss of the whole micro-batch");
    }
    let mut sum: HashMap<String, Tensor> = HashMap::new();
    for (_, grads) in results {
        for (name, g) in grads {
            let total = match sum.remove(&name) {
                Some(s) => (s + g).unwrap(),
                None => g,
            };
            sum.insert(name, total);
        }
    }
    (loss, sum)
}

/// Data-parallel embedding training on the fast engine: the micro-batch
/// split over 2, 3 and 5 processes (5: one has no rows, and takes part on
/// candle), embeddings gathered before the loss, gives one process's loss
/// and, summed, its gradients (1e-5 / 1e-4, dropout on: each row draws its
/// micro-batch row's masks whichever process packs it). For in-batch
/// negatives with a hard negative, a scored loss (scores gathered too) and
/// GradCache.
#[test]
fn data_parallel_slices_sum_to_one_process_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = dropout_model(tmp.path());
    let out = tmp.path().join("out");
    let runs: [(&str, LossKind, &[&str], bool); 3] = [
        (
            "mnrl",
            LossKind::Mnrl,
            &["anchor", "positive", "negative"],
            false,
        ),
        ("cosent", LossKind::Cosent, &["anchor", "positive"], true),
        (
            "cached-mnrl",
            LossKind::CachedMnrl,
            &["anchor", "positive"],
            false,
        ),
    ];
    for (name, kind, cols, scored) in runs {
        let make = || {
            let mut opts = options(
                &EmbeddingLoss::new(kind),
                Engine::Fast,
                Pooling::Mean,
                &out,
                4,
            );
            opts.mini_batch_size = 1;
            let t = EmbeddingTrainer::new(&model, data(cols, scored), None, opts).unwrap();
            assert!(t.on_fast_path(), "{name}");
            t
        };
        let one = make().loss_and_gradients(&[0, 1, 2, 3]).unwrap();
        for size in [2, 3, 5] {
            let many = data_parallel_step(size, &make);
            let what = format!("{name} on {size} processes");
            let worst = assert_same_step(&what, &many, &one);
            eprintln!(
                "{what}: loss {} vs {}, gradients within {worst:e} of their max",
                many.0, one.0
            );
        }
    }
}

/// ModernBERT's encoder (rotary Q and K, sliding windows, GeGLU, no
/// biases) under embedding training, dropout on: one step equals the
/// candle path's for an in-batch loss and a scored one.
#[test]
fn modernbert_steps_equal_the_candle_path() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("modernbert");
    copy_dir(&fixtures().join("families").join("modernbert-mlm"), &model);
    let path = model.join("config.json");
    let mut config = read_json(&path);
    for key in ["embedding_dropout", "attention_dropout", "mlp_dropout"] {
        config[key] = 0.1.into();
    }
    std::fs::write(&path, config.to_string()).unwrap();
    let out = tmp.path().join("out");
    let mut ran = 0;
    for case in cases()
        .into_iter()
        .filter(|c| c.name == "mnrl_hard" || c.name == "cosent")
    {
        let want = step(&model, &case, Engine::Candle, Pooling::Mean, &out);
        let got = step(&model, &case, Engine::Fast, Pooling::Mean, &out);
        let what = format!("modernbert {}", case.name);
        let worst = assert_same_step(&what, &got, &want);
        eprintln!("{what}: gradients within {worst:e} of their max");
        ran += 1;
    }
    assert_eq!(ran, 2);
}

#[test]
fn runs_the_fast_engine_does_not_cover_fall_back_or_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // DeBERTa-v2's disentangled attention trains on candle only.
    let deberta = fixtures().join("tiny").join("deberta-v2-mlm");
    let mnrl = EmbeddingLoss::new(LossKind::Mnrl);
    let make = |engine| {
        let opts = options(&mnrl, engine, Pooling::Mean, &tmp.path().join("o"), 4);
        EmbeddingTrainer::new(&deberta, data(&["anchor", "positive"], false), None, opts)
    };
    let auto = make(Engine::Auto).unwrap();
    assert!(!auto.on_fast_path());
    let err = make(Engine::Fast).err().unwrap().to_string();
    assert!(err.contains("engine") && err.contains("deberta"), "{err}");
    // What it covers, `auto` runs on the fast engine.
    let opts = options(&mnrl, Engine::Auto, Pooling::Mean, &tmp.path().join("p"), 4);
    let t = EmbeddingTrainer::new(
        &fixture_dir(),
        data(&["anchor", "positive"], false),
        None,
        opts,
    )
    .unwrap();
    assert!(t.on_fast_path());
    // bf16 products exist on the fast engine only.
    let mut opts = options(
        &mnrl,
        Engine::Candle,
        Pooling::Mean,
        &tmp.path().join("q"),
        4,
    );
    opts.train.precision = Compute::Bf16;
    let err = EmbeddingTrainer::new(
        &fixture_dir(),
        data(&["anchor", "positive"], false),
        None,
        opts,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("precision") && err.contains("fast engine"),
        "{err}"
    );
}
