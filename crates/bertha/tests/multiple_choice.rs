//! Multiple-choice fine-tuning (`--task multiple-choice`, transformers'
//! `…ForMultipleChoice` and `run_swag.py`): the heads against
//! transformers' fixtures on both engines, the fast path's dropout steps
//! against the candle path's, and whole runs: the same on both engines,
//! resumed exactly, saved and scored again, learning a small set.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bertha::data::{DataOptions, Task, TaskData};
use bertha::fast::train::{FinetuneHead, HeadBatch, HeadTargets};
use bertha::model::{
    seed_dropout, BertForTask, ForwardOptions, HeadKind, HeadLabels, HeadOptions, TaskOutput,
};
use bertha::tasks::{FinetunedModel, InferenceOptions, Predictions};
use bertha::training::{Engine, Event, FinetuneOptions, Finetuner, StepMetrics};
use bertha::{BertConfig, BertInput, Family};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::fast_steps::{
    assert_fixture_gradients, assert_other_masks_differ, assert_same_gradients, expected_loss,
    fixture_model,
};
use common::runs::{swag, tiny, tiny_copy};
use common::{fixtures, load_safetensors, read_json};
use serde_json::json;

/// The fixtures of the families with a multiple-choice head, and whether
/// the fast path runs them (DeBERTa-v2 trains on candle, and so does
/// ELECTRA when its `sequence_summary` is not a first-token head).
const FAMILIES: [(&str, bool); 10] = [
    ("bert-multiple-choice", true),
    ("roberta-multiple-choice", true),
    ("albert-multiple-choice", true),
    ("distilbert-multiple-choice", true),
    ("deberta-v2-multiple-choice", false),
    ("modernbert-multiple-choice", true),
    ("modernbert-mean-multiple-choice", true),
    ("electra-multiple-choice", true),
    ("electra-mean-multiple-choice", false),
    ("electra-last-multiple-choice", false),
];

/// A fixture's batch: `[B][C][T]` ids, token types (zeros where the
/// family has none) and attention mask, and the labels.
struct Choices {
    ids: Vec<Vec<Vec<u32>>>,
    types: Vec<Vec<Vec<u32>>>,
    mask: Vec<Vec<Vec<u32>>>,
    labels: Vec<i64>,
}

impl Choices {
    fn of_fixture(dir: &Path) -> Self {
        let inputs = read_json(&dir.join("inputs.json"));
        let get = |k: &str| -> Option<Vec<Vec<Vec<u32>>>> {
            serde_json::from_value(inputs["inputs"][k].clone()).ok()
        };
        let ids = get("input_ids").unwrap();
        let mask = get("attention_mask").unwrap();
        let types = get("token_type_ids").unwrap_or_else(|| {
            ids.iter()
                .map(|e| e.iter().map(|s| vec![0; s.len()]).collect())
                .collect()
        });
        let labels = serde_json::from_value(inputs["labels"]["labels"].clone()).unwrap();
        Self {
            ids,
            types,
            mask,
            labels,
        }
    }

    /// `[B, C, T]` tensors, as transformers is given them.
    fn padded(&self) -> (BertInput, Tensor) {
        let dev = Device::Cpu;
        let (b, c, t) = (self.ids.len(), self.ids[0].len(), self.ids[0][0].len());
        let flat = |x: &Vec<Vec<Vec<u32>>>| {
            let v: Vec<u32> = x.iter().flatten().flatten().copied().collect();
            Tensor::from_vec(v, (b, c, t), &dev).unwrap()
        };
        let input = BertInput {
            input_ids: flat(&self.ids),
            token_type_ids: Some(flat(&self.types)),
            attention_mask: Some(flat(&self.mask)),
        };
        let labels = Tensor::from_vec(self.labels.clone(), b, &dev).unwrap();
        (input, labels)
    }

    /// Every choice's real tokens, example after example.
    fn sequences(&self) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
        let mut out = (Vec::new(), Vec::new());
        for ((ids, types), mask) in self.ids.iter().zip(&self.types).zip(&self.mask) {
            for ((i, t), m) in ids.iter().zip(types).zip(mask) {
                let n = m.iter().filter(|&&x| x == 1).count();
                out.0.push(i[..n].to_vec());
                out.1.push(t[..n].to_vec());
            }
        }
        out
    }
}

/// The candle head's loss, `[B, C]` logits and gradients (dropout drawn
/// from `seed`).
fn candle_step(model: &BertForTask, c: &Choices, seed: u64) -> (f64, Vec<f32>, GradStore) {
    let (input, labels) = c.padded();
    let opts = HeadOptions::from(ForwardOptions {
        train: true,
        ..ForwardOptions::default()
    });
    seed_dropout(seed, 0);
    let out = model
        .forward(&input, &HeadLabels::labels(Some(&labels)), opts)
        .unwrap();
    let loss = out.loss().unwrap();
    let TaskOutput::Logits(o) = &out else {
        panic!("multiple choice gives logits")
    };
    (
        loss.to_scalar::<f32>().unwrap() as f64,
        o.logits.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        loss.backward().unwrap(),
    )
}

/// The fast path's step on the same choices.
fn fast_step(
    model: &BertForTask,
    c: &Choices,
    seed: u64,
    train: bool,
) -> (f64, Vec<f32>, GradStore) {
    let (ids, types) = c.sequences();
    let batch = HeadBatch {
        sequences: ids
            .iter()
            .zip(&types)
            .map(|(i, t)| (&i[..], &t[..]))
            .collect(),
        targets: HeadTargets::Choices(&c.labels),
        pad_to: 0,
    };
    seed_dropout(seed, 0);
    let out = FinetuneHead::of(model)
        .unwrap()
        .expect("the fast path covers the multiple-choice head")
        .step(&batch, 1.0, train)
        .unwrap();
    (out.loss, out.logits, out.gradients)
}

/// The multiple-choice heads of BERT, RoBERTa and ALBERT (the pooler),
/// DistilBERT and DeBERTa-v2 (their first-token heads), ModernBERT (its
/// cls or mean pooling and `head`) and ELECTRA (its `sequence_summary`:
/// the first token → layer → gelu by default; the mean of every row, with
/// no layer, → tanh; the last row → layer → relu), on the candle
/// modules and, where it runs them, on the fast path, give
/// transformers' logits, loss and gradients (each choice its own sequence
/// through the encoder, a one-output classifier, the softmax over each
/// example's choices).
#[test]
fn heads_match_transformers_on_both_engines() {
    for (name, fast) in FAMILIES {
        let dir = fixtures().join("tiny").join(name);
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let want_logits = expected["logits"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(want_logits.len(), 6, "{name}: 2 examples of 3 choices");
        let want_loss = expected_loss(&expected);
        let choices = Choices::of_fixture(&dir);
        for engine in ["candle", "fast"] {
            let what = format!("{name} on {engine}");
            let (varmap, model) = fixture_model(&dir, HeadKind::MultipleChoice);
            if engine == "fast" && !fast {
                assert!(FinetuneHead::of(&model).unwrap().is_none(), "{what}");
                continue;
            }
            let (loss, logits, grads) = match engine {
                "candle" => candle_step(&model, &choices, 0),
                _ => fast_step(&model, &choices, 0, false),
            };
            let worst = logits
                .iter()
                .zip(&want_logits)
                .map(|(g, w)| (g - w).abs())
                .fold(0f32, f32::max);
            let rel = (loss - want_loss).abs() / want_loss.abs();
            println!("{what}: logits within {worst:.2e}, loss {rel:.2e} relative");
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "{what}: loss {loss} vs transformers {want_loss}"
            );
            assert_eq!(logits.len(), want_logits.len(), "{what}");
            for (i, (g, w)) in logits.iter().zip(&want_logits).enumerate() {
                assert!((g - w).abs() <= 1e-4, "{what}: logit {i}: {g} vs {w}");
            }
            assert_fixture_gradients(&what, &dir, &varmap, &grads, &expected);
        }
    }
}

/// With dropout on, a fast-path step draws the candle path's masks: the
/// same loss and every gradient, and other masks give other ones.
#[test]
fn dropout_steps_equal_the_candle_path() {
    for (name, _) in FAMILIES.iter().filter(|(_, fast)| *fast) {
        let dir = fixtures().join("tiny").join(name);
        let mut cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
        cfg.hidden_dropout_prob = 0.1;
        cfg.attention_probs_dropout_prob = 0.15;
        // ELECTRA's summary drops its input and its output.
        if let Family::Electra(o) = &mut cfg.family {
            (o.summary.first_dropout, o.summary.last_dropout) = (0.05, 0.2);
        }
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = BertForTask::load(vb, cfg, HeadKind::MultipleChoice).unwrap();
        let mut choices = Choices::of_fixture(&dir);
        // A third example without a label: its choices run, its loss does not.
        for rows in [&mut choices.ids, &mut choices.types, &mut choices.mask] {
            let first = rows[0].clone();
            rows.push(first);
        }
        choices.labels.push(-100);
        let (want_loss, _, want) = candle_step(&model, &choices, 7);
        let (loss, _, grads) = fast_step(&model, &choices, 7, true);
        assert!(
            (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{name}: loss {loss} vs candle {want_loss}"
        );
        let (other_loss, _, other) = fast_step(&model, &choices, 8, true);
        assert_other_masks_differ(name, &varmap, (other_loss, &other), (want_loss, &want));
        let checked = assert_same_gradients(name, &varmap, &grads, &want);
        // All but those whose true gradient is 0 (compared only as such):
        // the key biases (a shift of every score of a query cancels in
        // the softmax) and the classifier's bias (a shift of every choice's
        // score cancels in the softmax over the choices).
        let all = common::fast_steps::vars(&varmap).len();
        assert!(
            checked + 3 >= all,
            "{name}: only {checked} of {all} gradients compared"
        );
    }
}

fn write_data(dir: &Path) -> PathBuf {
    let p = dir.join("swag.csv");
    std::fs::write(&p, swag()).unwrap();
    p
}

fn options(out: &Path, engine: Engine) -> FinetuneOptions {
    FinetuneOptions {
        epochs: 2.0,
        lr: 5e-4,
        batch_size: 3,
        eval_batch_size: 2,
        max_length: 32,
        warmup_ratio: 0.2,
        seed: 5,
        save_total_limit: None,
        out: out.to_path_buf(),
        engine,
        ..FinetuneOptions::default()
    }
}

/// A multiple-choice run of `model` on `data` (scored on `dev`).
fn finetuner(
    model: &Path,
    data: &Path,
    dev: Option<&Path>,
    opts: FinetuneOptions,
) -> bertha::Result<Finetuner> {
    Finetuner::new(
        Task::MultipleChoice,
        model,
        data,
        dev,
        &DataOptions::default(),
        opts,
    )
}

/// The fast and the candle run (saved in `dir`'s `Fast` and `Candle`)
/// took the same steps (loss and gradient norm to 1e-5) to the same
/// weights; the fast run's weights.
fn assert_same_run(
    fast_steps: &[StepMetrics],
    candle_steps: &[StepMetrics],
    dir: &Path,
) -> HashMap<String, Tensor> {
    assert_eq!(fast_steps.len(), candle_steps.len());
    for (f, c) in fast_steps.iter().zip(candle_steps) {
        for (a, b, what) in [(f.loss, c.loss, "loss"), (f.grad_norm, c.grad_norm, "norm")] {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "step {}: {what} {a} (fast) vs {b} (candle)",
                f.step
            );
        }
    }
    let a = load_safetensors(&dir.join("Fast/model.safetensors"));
    let b = load_safetensors(&dir.join("Candle/model.safetensors"));
    assert_eq!(a.len(), b.len());
    for (name, t) in &a {
        let d = common::max_abs_diff(t, &b[name]);
        // The true gradient of the key biases and of the classifier's
        // bias is 0 (each shifts scores that a softmax compares): both
        // engines' rounding noise, normalised by AdamW, moves them by up
        // to the rate.
        let zero_gradient = name.ends_with("key.bias") || name == "classifier.bias";
        let tol = if zero_gradient { 1e-2 } else { 1e-4 };
        assert!(d <= tol, "{name}: weights differ by {d:e}");
    }
    a
}

/// The multiple-choice examples in `data`.
fn read_choices(data: &Path) -> TaskData {
    TaskData::read(
        Task::MultipleChoice,
        data,
        None,
        false,
        &DataOptions::default(),
    )
    .unwrap()
}

fn run(t: &mut Finetuner) -> Vec<StepMetrics> {
    let mut steps = Vec::new();
    t.run(|e| {
        if let Event::Step(m) = e {
            steps.push(m.clone());
        }
    })
    .unwrap();
    steps
}

/// `bertha finetune --task multiple-choice` from an MLM checkpoint (a
/// fresh pooler and classifier): the fast path and the candle modules
/// train the same run step by step (dropout on), score the dev set alike,
/// and the saved `BertForMultipleChoice` folder scores and predicts as the
/// run did.
#[test]
fn both_engines_finetune_the_same_run_and_it_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_data(tmp.path());
    let model = tiny_copy(&tiny("bert-mlm"), &tmp.path().join("model"), 0.1, None);
    let run_with = |engine: Engine| {
        let out = tmp.path().join(format!("{engine:?}"));
        let mut t = finetuner(&model, &data, Some(&data), options(&out, engine)).unwrap();
        assert_eq!(t.on_fast_path(), engine == Engine::Fast);
        assert_eq!(t.train_size(), (7, 7));
        let steps = run(&mut t);
        (t, steps)
    };
    let (fast, fast_steps) = run_with(Engine::Fast);
    let (_, candle_steps) = run_with(Engine::Candle);
    assert_eq!(fast_steps.len(), 6, "3 + 3 + 1 examples a pass, 2 passes");
    let a = assert_same_run(&fast_steps, &candle_steps, tmp.path());
    assert_eq!(a["classifier.weight"].dims(), [1, 32]);
    assert!(a.contains_key("bert.pooler.dense.weight"));

    // The folder is transformers' BertForMultipleChoice, with no labels.
    let out = tmp.path().join("Fast");
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["architectures"][0], "BertForMultipleChoice");
    assert!(config
        .get("id2label")
        .is_none_or(|m| m.as_object().unwrap().len() <= 2));
    let dev = read_choices(&data);
    let before = fast.evaluate_on(&dev).unwrap();
    let Predictions::MultipleChoice(preds) = &before.predictions else {
        panic!("{:?}", before.predictions)
    };
    assert_eq!(preds.len(), 7);
    let right = [0usize, 1, 2, 1, 0, 2, 2]
        .iter()
        .zip(preds)
        .filter(|(y, p)| **y == p.choice)
        .count();
    assert_eq!(before.scores["accuracy"], right as f64 / 7.0);
    assert!(preds
        .iter()
        .all(|p| p.score > 1.0 / 3.0 - 1e-6 && p.score <= 1.0));
    // Batched as the run's evaluation was (padding changes the last bits).
    let inference = InferenceOptions {
        batch_size: Some(2),
        fast_f32: false,
        ..InferenceOptions::default()
    };
    let saved =
        FinetunedModel::from_dir(Task::MultipleChoice, &out, &inference, &Device::Cpu).unwrap();
    let again = saved.evaluate(&dev).unwrap();
    assert_eq!(again.predictions, before.predictions);
    assert_eq!(again.scores, before.scores);
    assert_eq!(again.loss, before.loss);
    let unlabelled = saved
        .read_unlabelled(&data, &DataOptions::default())
        .unwrap();
    assert_eq!(saved.predict(&unlabelled).unwrap(), before.predictions);
}

/// `bertha finetune --task multiple-choice` from ELECTRA's discriminator
/// (a fresh `sequence_summary` and classifier, every dropout on, the
/// summary's last one included): both engines train the same run, and
/// the saved folder is transformers' `ElectraForMultipleChoice` (its
/// tensor names and `summary_*` keys) and scores as the run did. A
/// summary that is not a first-token head (`mean`) trains on candle.
#[test]
fn electra_finetunes_on_both_engines_and_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_data(tmp.path());
    let discriminator = fixtures().join("families").join("electra-discriminator");
    let model = tiny_copy(&discriminator, &tmp.path().join("model"), 0.1, None);
    let run_with = |engine: Engine| {
        let out = tmp.path().join(format!("{engine:?}"));
        let mut t = finetuner(&model, &data, Some(&data), options(&out, engine)).unwrap();
        assert_eq!(t.on_fast_path(), engine == Engine::Fast);
        let steps = run(&mut t);
        (t, steps)
    };
    let (fast, fast_steps) = run_with(Engine::Fast);
    let (_, candle_steps) = run_with(Engine::Candle);
    assert_eq!(fast_steps.len(), 6);
    let a = assert_same_run(&fast_steps, &candle_steps, tmp.path());
    let out = tmp.path().join("Fast");
    assert_eq!(a["sequence_summary.summary.weight"].dims(), [32, 32]);
    assert_eq!(a["sequence_summary.summary.bias"].dims(), [32]);
    assert_eq!(a["classifier.weight"].dims(), [1, 32]);
    assert!(!a
        .keys()
        .any(|n| n.starts_with("discriminator_predictions.")));
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["architectures"][0], "ElectraForMultipleChoice");
    for (key, value) in [
        ("summary_type", json!("first")),
        ("summary_use_proj", json!(true)),
        ("summary_activation", json!("gelu")),
        ("summary_last_dropout", json!(0.1)),
    ] {
        assert_eq!(config[key], value, "{key}");
    }
    let dev = read_choices(&data);
    let before = fast.evaluate_on(&dev).unwrap();
    let inference = InferenceOptions {
        batch_size: Some(2),
        fast_f32: false,
        ..InferenceOptions::default()
    };
    let saved =
        FinetunedModel::from_dir(Task::MultipleChoice, &out, &inference, &Device::Cpu).unwrap();
    let again = saved.evaluate(&dev).unwrap();
    assert_eq!(again.predictions, before.predictions);
    assert_eq!(again.scores, before.scores);

    // The mean of the rows is no first-token head: candle only.
    let mean = electra_copy(&tmp.path().join("mean"), json!({"summary_type": "mean"}));
    let mut t = finetuner(
        &mean,
        &data,
        None,
        options(&tmp.path().join("m"), Engine::Auto),
    )
    .unwrap();
    assert!(!t.on_fast_path());
    assert!(run(&mut t).iter().all(|m| m.loss.is_finite()));
    let e = common::err_text(finetuner(
        &mean,
        &data,
        None,
        options(&tmp.path().join("f"), Engine::Fast),
    ));
    assert!(e.contains("does not cover"), "{e}");
    // Nor does the packed encoder (no padding rows) serve it.
    let bf16 = InferenceOptions {
        precision: bertha::Precision::Bf16,
        ..InferenceOptions::default()
    };
    let e = common::err_text(FinetunedModel::from_dir(
        Task::MultipleChoice,
        &mean,
        &bf16,
        &Device::Cpu,
    ));
    assert!(e.contains("padding rows"), "{e}");
}

/// A copy of the `electra-multiple-choice` fixture in `dst` with the
/// config keys of `keys` set.
fn electra_copy(dst: &Path, keys: serde_json::Value) -> PathBuf {
    let dir = tiny_copy(&tiny("electra-multiple-choice"), dst, 0.0, None);
    let mut config = read_json(&dir.join("config.json"));
    for (k, v) in keys.as_object().unwrap() {
        config[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// A run stopped and resumed from its checkpoint on the fast path repeats
/// the uninterrupted one exactly.
#[test]
fn a_resumed_run_repeats_the_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_data(tmp.path());
    let model = tiny_copy(&tiny("bert-mlm"), &tmp.path().join("model"), 0.1, None);
    let trainer = |out: &Path| finetuner(&model, &data, None, options(out, Engine::Fast)).unwrap();
    let a = tmp.path().join("a");
    let mut straight = trainer(&a);
    assert!(straight.on_fast_path());
    let want = run(&mut straight);
    let b = tmp.path().join("b");
    let mut first = trainer(&b);
    let mut before = Vec::new();
    first
        .run_until(2, |e| {
            if let Event::Step(m) = e {
                before.push(m.clone())
            }
        })
        .unwrap();
    first.save_checkpoint(&b.join("checkpoint-2")).unwrap();
    drop(first);
    let mut resumed = trainer(&b);
    resumed.resume(&b.join("checkpoint-2")).unwrap();
    let after = run(&mut resumed);
    let key = |m: &StepMetrics| (m.step, m.loss, m.grad_norm, m.lr);
    let joined: Vec<_> = before.iter().chain(&after).map(key).collect();
    assert_eq!(joined, want.iter().map(key).collect::<Vec<_>>());
}

/// The small set is learnt: after 15 passes the training loss is well
/// under the uniform guess's ln 3 and the training set is scored right.
#[test]
fn a_small_set_is_learnt() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_data(tmp.path());
    let model = tiny_copy(&tiny("bert-mlm"), &tmp.path().join("model"), 0.0, None);
    let mut o = options(&tmp.path().join("out"), Engine::Auto);
    (o.epochs, o.lr, o.batch_size) = (15.0, 2e-3, 7);
    let mut t = finetuner(&model, &data, Some(&data), o).unwrap();
    let steps = run(&mut t);
    let (first, last) = (steps[0].loss, steps.last().unwrap().loss);
    println!("loss {first:.4} -> {last:.4}");
    assert!((first - 3f64.ln()).abs() < 0.2, "first loss {first}");
    assert!(last < 0.3, "last loss {last}");
    let ev = t.evaluate().unwrap().unwrap();
    assert_eq!(ev.scores["accuracy"], 1.0, "{ev:?}");
}

/// ELECTRA's `summary_*` keys that `ElectraForMultipleChoice` cannot run
/// are refused by name, and files that do not fit are errors naming
/// them.
#[test]
fn what_does_not_fit_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_data(tmp.path());
    let new = |model: &Path, data: &Path| {
        finetuner(
            model,
            data,
            None,
            options(&tmp.path().join("out"), Engine::Auto),
        )
        .map(|_| ())
    };
    let electra = electra_copy(&tmp.path().join("attn"), json!({"summary_type": "attn"}));
    let e = common::err_text(new(&electra, &data));
    assert!(e.contains("field `summary_type`"), "{e}");
    assert!(e.contains("`attn` is not supported"), "{e}");
    for (key, value, what) in [
        (
            "summary_activation",
            json!("silu"),
            "`silu` is not supported",
        ),
        ("summary_proj_to_labels", json!(true), "num_labels (2)"),
        ("summary_last_dropout", json!(1.0), "1 is not below 1"),
    ] {
        let dir = electra_copy(&tmp.path().join(key), json!({ key: value }));
        let e = common::err_text(FinetunedModel::from_dir(
            Task::MultipleChoice,
            &dir,
            &InferenceOptions::default(),
            &Device::Cpu,
        ));
        assert!(e.contains(&format!("field `{key}`")), "{e}");
        assert!(e.contains(what), "{e}");
        assert!(e.contains("config.json"), "{e}");
    }
    let bad = tmp.path().join("bad.csv");
    std::fs::write(&bad, "sent1,ending0,ending1,label\nx,a,b,7\n").unwrap();
    let e = common::err_text(new(&tiny("bert-mlm"), &bad));
    assert!(e.contains("bad.csv: line 2"), "{e}");
    assert!(e.contains("0 to 1"), "{e}");
}
