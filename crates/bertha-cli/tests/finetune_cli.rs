//! `bertha finetune`, `evaluate` and `predict` end to end on the committed
//! SST-2 slice with a tiny checkpoint: evaluate's accuracy is the one
//! counted from predict's output, and the dev score logged by training.

mod common;

use std::path::Path;
use std::process::Output;

use common::{failure, ok, ok_lines, read_json, read_jsonl, repo, run, s, tiny, with_key};

use serde_json::Value;

/// `bertha finetune` of a classification head on `train` from `model`
/// into `out`, then `extra` flags.
fn finetune_classifier(model: &Path, train: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "finetune",
        "--task",
        "classification",
        "--model",
        s(model),
        "--train",
        s(train),
        "--out",
        s(out),
    ];
    args.extend(extra);
    run(&args)
}

/// [`finetune_classifier`] for two epochs of `data` (dev set too), then
/// `extra` flags.
fn finetune_sst2(model: &Path, data: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--dev",
        s(data),
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--max-length",
        "32",
        "--lr",
        "1e-3",
    ];
    args.extend(extra);
    finetune_classifier(model, data, out, &args)
}

/// `bertha evaluate` or `predict` (`cmd`) of `task` on `model` and
/// `data`, then `extra` flags.
fn on_checkpoint(cmd: &str, task: &str, model: &Path, data: &Path, extra: &[&str]) -> Output {
    let mut args = vec![cmd, "--task", task, "--model", s(model), "--data", s(data)];
    args.extend(extra);
    run(&args)
}

#[test]
fn finetune_then_evaluate_and_predict_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sst2");
    let data = repo().join("tests/fixtures/finetune/sst2-dev-head.tsv");
    let tiny = repo().join("tests/fixtures/tiny/bert-seqcls");
    let o = finetune_sst2(&tiny, &data, &out, &[]);
    ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("40 training examples"), "{stderr}");
    // 40 examples in batches of 8: 5 steps an epoch, an evaluation each.
    let metrics = read_jsonl(&out.join("metrics.jsonl"));
    let steps = with_key(&metrics, "loss");
    let evals = with_key(&metrics, "eval_loss");
    assert_eq!(steps.len(), 10);
    assert_eq!(evals.len(), 2);
    assert_eq!(evals[1]["step"], 10);
    for key in ["loss", "lr", "grad_norm", "tokens_per_s"] {
        assert!(steps[0][key].as_f64().unwrap().is_finite(), "{key}");
    }
    // lr: 10 % warmup of 10 steps is one step from 0.
    assert_eq!(steps[0]["lr"], 0.0);
    assert_eq!(steps[1]["lr"], 1e-3);
    for f in ["loss.png", "metric.png"] {
        let png = std::fs::read(out.join(f)).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{f}");
    }
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["architectures"][0], "BertForSequenceClassification");
    assert_eq!(config["id2label"]["1"], "1");
    assert_eq!(config["label2id"]["0"], 0);
    assert_eq!(config["problem_type"], "single_label_classification");

    // evaluate: one JSON line.
    let line = ok(&on_checkpoint(
        "evaluate",
        "classification",
        &out,
        &data,
        &[],
    ));
    assert_eq!(line.lines().count(), 1);
    let ev: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(ev["task"], "classification");
    assert_eq!(ev["examples"], 40);
    assert_eq!(ev["metric"], "accuracy");
    let acc = ev["accuracy"].as_f64().unwrap();
    assert!(ev["macro_f1"].as_f64().unwrap().is_finite());
    assert!(ev["eval_loss"].as_f64().unwrap().is_finite());
    // The final model is the last one: the training log's last dev score.
    assert_eq!(evals[1]["accuracy"].as_f64().unwrap(), acc);
    // evaluate runs fp32 on the packed fast path, the run's evaluation on
    // the candle modules: the same loss to rounding (1e-5 relative).
    let (got, want) = (
        ev["eval_loss"].as_f64().unwrap(),
        evals[1]["eval_loss"].as_f64().unwrap(),
    );
    assert!((got - want).abs() <= 1e-5 * want.abs(), "{got} vs {want}");

    // predict: a label and a score per example; counted against the gold
    // labels, the same accuracy.
    let pred_file = tmp.path().join("pred.jsonl");
    ok(&on_checkpoint(
        "predict",
        "classification",
        &out,
        &data,
        &["--output", s(&pred_file)],
    ));
    let preds = read_jsonl(&pred_file);
    assert_eq!(preds.len(), 40);
    let gold: Vec<String> = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.rsplit('\t').next().unwrap().to_string())
        .collect();
    let mut right = 0;
    for (p, g) in preds.iter().zip(&gold) {
        let label = p["label"].as_str().unwrap();
        assert!(label == "0" || label == "1", "{p}");
        let score = p["score"].as_f64().unwrap();
        assert!((0.5..=1.0).contains(&score), "{p}");
        right += usize::from(label == g);
    }
    assert_eq!(right as f64 / 40.0, acc);

    // At bf16 and int8 (the encoder on the fast path, the head in fp32):
    // f32's label wherever f32 is not a near tie, its score within 2e-2.
    for precision in ["bf16", "int8"] {
        let path = tmp.path().join(format!("pred-{precision}.jsonl"));
        let extra = ["--precision", precision, "--output", s(&path)];
        ok(&on_checkpoint(
            "predict",
            "classification",
            &out,
            &data,
            &extra,
        ));
        let reduced = read_jsonl(&path);
        assert_eq!(reduced.len(), preds.len());
        for (r, p) in reduced.iter().zip(&preds) {
            let (rs, ps) = (r["score"].as_f64().unwrap(), p["score"].as_f64().unwrap());
            if r["label"] == p["label"] {
                assert!((rs - ps).abs() <= 2e-2, "{precision}: {r} vs {p}");
            } else {
                assert!(ps < 0.52 && rs < 0.52, "{precision}: {r} vs {p}");
            }
        }
        if precision == "int8" {
            assert!(reduced
                .iter()
                .zip(&preds)
                .any(|(r, p)| r["score"] != p["score"]));
        }
    }

    // The checkpoint is a transformers BertForSequenceClassification folder
    // that the classify pipeline loads.
    let line = ok(&run(&["classify", "--model", s(&out), "a good film"]));
    let scores: Value = serde_json::from_str(line.trim()).unwrap();
    assert!(["0", "1"].contains(&scores[0]["label"].as_str().unwrap()));

    // Resuming the finished run from its last checkpoint has nothing left to do.
    let o = finetune_sst2(&tiny, &data, &out, &["--resume", s(&out)]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("at step 10"));
}

#[test]
fn qa_predictions_are_squads_predictions_file() {
    // Any QA checkpoint predicts: the tiny random one, on the SQuAD slice.
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("tests/fixtures/finetune/squad-dev-slice.json");
    let qa = repo().join("tests/fixtures/tiny/bert-qa");
    let common = [
        "--task",
        "qa",
        "--model",
        s(&qa),
        "--data",
        s(&data),
        "--max-length",
        "64",
        "--doc-stride",
        "16",
    ];
    let pred_file = tmp.path().join("predictions.json");
    let mut args = vec!["predict"];
    args.extend_from_slice(&common);
    args.extend_from_slice(&["--output", s(&pred_file)]);
    ok(&run(&args));
    let preds = read_json(&pred_file);
    let preds = preds.as_object().unwrap();
    assert_eq!(preds.len(), 81);
    assert!(preds.contains_key("56be4db0acb8001400a502ec"));
    assert!(preds.values().all(Value::is_string));

    let mut args = vec!["evaluate"];
    args.extend_from_slice(&common);
    let ev: Value = serde_json::from_str(ok(&run(&args)).trim()).unwrap();
    assert_eq!(ev["examples"], 81);
    assert_eq!(ev["metric"], "f1");
    let (em, f1) = (
        ev["exact_match"].as_f64().unwrap(),
        ev["f1"].as_f64().unwrap(),
    );
    assert!(
        (0.0..=100.0).contains(&em) && em <= f1 && f1 <= 100.0,
        "{ev}"
    );
}

/// `bertha finetune --task multiple-choice` on SWAG's columns, then
/// `predict` (a `{"choice", "score"}` line per example) and `evaluate`,
/// whose accuracy is the one counted from the predictions.
#[test]
fn multiple_choice_finetunes_predicts_and_evaluates() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("tests/fixtures/finetune/swag-style.csv");
    let out = tmp.path().join("mc");
    let mut args = vec!["finetune", "--task", "multiple-choice", "--model"];
    let model = tiny("bert-mlm");
    args.extend_from_slice(&[&model, "--train", s(&data), "--out", s(&out)]);
    args.extend_from_slice(&["--epochs", "2", "--batch-size", "4", "--max-length", "32"]);
    let o = run(&args);
    ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("on the fast path"), "{stderr}");
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["architectures"][0], "BertForMultipleChoice");

    let preds = ok_lines(&on_checkpoint(
        "predict",
        "multiple-choice",
        &out,
        &data,
        &[],
    ));
    assert_eq!(preds.len(), 7);
    let labels = [0, 1, 2, 1, 0, 2, 2];
    let mut right = 0;
    for (p, y) in preds.iter().zip(labels) {
        let choice = p["choice"].as_u64().unwrap();
        let score = p["score"].as_f64().unwrap();
        assert!(
            choice < 3 && (1.0 / 3.0 - 1e-6..=1.0).contains(&score),
            "{p}"
        );
        right += usize::from(choice == y);
    }
    let ev = on_checkpoint("evaluate", "multiple-choice", &out, &data, &[]);
    let ev: Value = serde_json::from_str(ok(&ev).trim()).unwrap();
    assert_eq!(ev["examples"], 7);
    assert_eq!(ev["metric"], "accuracy");
    assert_eq!(ev["accuracy"].as_f64().unwrap(), right as f64 / 7.0, "{ev}");
}

/// `--engine fast` and `--engine candle` train the same steps (a tiny BERT
/// with dropout off: the fixture's config), each saying which ran; an
/// unknown engine is refused.
#[test]
fn finetune_engines_train_the_same_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("tests/fixtures/finetune/sst2-dev-head.tsv");
    let tiny = repo().join("tests/fixtures/tiny/bert-seqcls");
    let losses = |engine: &str| -> Vec<f64> {
        let out = tmp.path().join(engine);
        let o = finetune_sst2(&tiny, &data, &out, &["--engine", engine]);
        ok(&o);
        let on = if engine == "fast" {
            "fast path"
        } else {
            "candle modules"
        };
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(&format!("on the {on}")), "{stderr}");
        with_key(&read_jsonl(&out.join("metrics.jsonl")), "loss")
            .iter()
            .map(|m| m["loss"].as_f64().unwrap())
            .collect()
    };
    let (fast, candle) = (losses("fast"), losses("candle"));
    assert_eq!(fast.len(), 10);
    assert_eq!(fast.len(), candle.len());
    for (step, (f, c)) in fast.iter().zip(&candle).enumerate() {
        assert!((f - c).abs() <= 1e-5 * c.abs(), "step {step}: {f} vs {c}");
    }
    let err = failure(&finetune_classifier(
        &tiny,
        &data,
        &tmp.path().join("x"),
        &["--engine", "gpu"],
    ));
    assert!(err.contains("--engine") && err.contains("gpu"), "{err}");
}

#[test]
fn bad_input_is_a_one_line_error() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = repo().join("tests/fixtures/tiny/bert-seqcls");
    let data = repo().join("tests/fixtures/finetune/bad-rows.tsv");
    let err = failure(&finetune_classifier(
        &tiny,
        &data,
        &tmp.path().join("o"),
        &[],
    ));
    assert!(err.contains("bad-rows.tsv: line 3"), "{err}");
    // Library options are reported by the flags that set them.
    let train = repo().join("tests/fixtures/finetune/sst2-dev-head.tsv");
    let out = tmp.path().join("p");
    let finetune = |extra: &[&str]| failure(&finetune_classifier(&tiny, &train, &out, extra));
    let err = finetune(&["--max-length", "100"]);
    assert!(
        err.contains("--max-length 100") && err.contains("64"),
        "{err}"
    );
    let err = finetune(&["--early-stop", "2"]);
    assert!(err.contains("--early-stop needs a dev set"), "{err}");
    let err = failure(&on_checkpoint("evaluate", "sentiment", &tiny, &data, &[]));
    assert!(
        err.contains("expected classification, ner, qa, multiple-choice, sts, retrieval or rerank"),
        "{err}"
    );
    let err = failure(&on_checkpoint("predict", "sts", &tiny, &data, &[]));
    assert!(
        err.contains("expected classification, ner, qa or multiple-choice"),
        "{err}"
    );
}

/// Every family fine-tunes from the CLI (RoBERTa, DistilBERT and
/// DeBERTa-v2 with their own sequence classifiers, ALBERT with its
/// pooler), saves its head under the names transformers reads (ALBERT's
/// pooler is `albert.pooler`, an `nn.Linear`, not BERT's
/// `pooler.dense`), and `evaluate` reads the folder back to the accuracy
/// training logged.
#[test]
fn every_family_finetunes_and_saves_transformers_names() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("tests/fixtures/finetune/sst2-dev-head.tsv");
    let cases = [
        (
            "roberta-seqcls",
            "classifier.out_proj.weight",
            "roberta.pooler.",
        ),
        (
            "distilbert-seqcls",
            "pre_classifier.weight",
            "distilbert.pooler",
        ),
        (
            "deberta-v2-seqcls",
            "pooler.dense.weight",
            "deberta.pooler.",
        ),
        ("albert-mlm", "albert.pooler.weight", "albert.pooler.dense."),
    ];
    for (name, expected, absent) in cases {
        let tiny = repo().join("tests/fixtures/tiny").join(name);
        let out = tmp.path().join(name);
        ok(&finetune_sst2(&tiny, &data, &out, &[]));
        let names: Vec<String> = candle_core::safetensors::load(
            out.join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap()
        .into_keys()
        .collect();
        assert!(names.iter().any(|n| n == expected), "{name}: {names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with(absent)),
            "{name}: {names:?}"
        );
        let logged = read_json(&out.join("eval_results.json"))["accuracy"]
            .as_f64()
            .unwrap();
        let eval = ok(&on_checkpoint(
            "evaluate",
            "classification",
            &out,
            &data,
            &[],
        ));
        let scores: Value = serde_json::from_str(eval.lines().last().unwrap()).unwrap();
        let read_back = scores["accuracy"].as_f64().unwrap();
        assert!(
            (read_back - logged).abs() < 1e-9,
            "{name}: {read_back} vs {logged}"
        );
    }
}
