//! Fine-tuning per task: the tiny checkpoints of `tests/fixtures/tiny/`
//! overfit a handful of examples of classification, sentence pairs, NER
//! and QA; the dev metrics equal counts made here from the predictions;
//! checkpoints have transformers' names and shapes and reload to the same
//! predictions. The loop itself (engines, resuming, dropout, fresh heads,
//! early stopping) is tested in `finetune_loop.rs`.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use bertha::data::{DataOptions, Task, TaskData};
use bertha::metrics::{normalize_answer, squad_f1};
use bertha::tasks::{
    Evaluation, FinetunedModel, InferenceOptions, Predictions, TRAINING_ARGS_FILE,
};
use bertha::training::{Event, FinetuneOptions, Finetuner, StepMetrics, EVAL_RESULTS_FILE};
use bertha::{BertConfig, Device};
use common::finetune::{options, run, trainer, values, write, SENTIMENT};
use common::load_safetensors;
use common::runs::{squad_json, tiny, CONLL};

/// A temporary folder holding `name` (with `body`), and the options of a
/// run of `epochs` into its `out/`.
fn scratch(name: &str, body: &str, epochs: f64) -> (tempfile::TempDir, PathBuf, FinetuneOptions) {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(tmp.path(), name, body);
    let mut opts = options(&tmp.path().join("out"));
    opts.epochs = epochs;
    (tmp, file, opts)
}

/// Each named score of `ev` within `tol` of the value counted by hand.
fn assert_scores(ev: &Evaluation, want: &[(&str, f64)], tol: f64) {
    for (name, value) in want {
        assert!((ev.scores[*name] - value).abs() < tol, "{name}: {ev:?}");
    }
}

fn mean(v: &[StepMetrics]) -> f64 {
    v.iter().map(|m| m.loss).sum::<f64>() / v.len() as f64
}

/// Sorted (name, shape) pairs of a safetensors file.
fn names_and_shapes(path: &Path) -> Vec<(String, Vec<usize>)> {
    let mut v: Vec<(String, Vec<usize>)> = load_safetensors(&path.to_path_buf())
        .into_iter()
        .map(|(k, t)| (k, t.dims().to_vec()))
        .collect();
    v.sort();
    v
}

/// The checkpoint in `out` has the fixture's tensor names and shapes, the
/// task's class and the run's labels, and scores `dev` exactly as the
/// trainer did.
fn check_round_trip(task: Task, t: &Finetuner, fixture: &str, dev: &TaskData) {
    let out = t.options().out.clone();
    assert_eq!(
        names_and_shapes(&out.join("model.safetensors")),
        names_and_shapes(&tiny(fixture).join("model.safetensors")),
        "{fixture}"
    );
    let written = BertConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(written.architectures, [task.head().architecture()]);
    assert_eq!(written.id2label, t.labels().id2label());
    let json = common::read_json(&out.join("config.json"));
    for (name, id) in t.labels().label2id() {
        assert_eq!(json["label2id"][&name], id, "{json}");
    }
    assert!(out.join("vocab.txt").is_file());
    assert!(out.join(TRAINING_ARGS_FILE).is_file());
    // On the candle modules, as the run evaluated: bit for bit.
    let exact = InferenceOptions {
        fast_f32: false,
        ..InferenceOptions::default()
    };
    let model = FinetunedModel::from_dir(task, &out, &exact, &Device::Cpu).unwrap();
    let again = model.evaluate(dev).unwrap();
    let before = t.evaluate_on(dev).unwrap();
    assert_eq!(again.predictions, before.predictions);
    assert_eq!(again.scores, before.scores);
    assert_eq!(again.loss, before.loss);
    assert_eq!(model.predict(dev).unwrap(), before.predictions);
    // fp32 on the fast path (the default): the same loss to rounding.
    let fast =
        FinetunedModel::from_dir(task, &out, &InferenceOptions::default(), &Device::Cpu).unwrap();
    let (got, want) = (fast.evaluate(dev).unwrap().loss, before.loss);
    let (got, want) = (got.unwrap(), want.unwrap());
    assert!(
        (got - want).abs() <= 1e-5 * want.abs().max(1e-3),
        "{got} vs {want}"
    );
}

// ---------------------------------------------------------------- classification

/// Accuracy and macro-F1 counted from the predicted ids.
fn hand_accuracy_and_macro_f1(pred: &[usize], gold: &[usize]) -> (f64, f64) {
    let right = pred.iter().zip(gold).filter(|(p, g)| p == g).count();
    let classes: BTreeSet<usize> = pred.iter().chain(gold).copied().collect();
    let mut f1s = Vec::new();
    for c in &classes {
        let tp = pred
            .iter()
            .zip(gold)
            .filter(|(p, g)| *p == c && *g == c)
            .count() as f64;
        let fp = pred
            .iter()
            .zip(gold)
            .filter(|(p, g)| *p == c && *g != c)
            .count() as f64;
        let fn_ = pred
            .iter()
            .zip(gold)
            .filter(|(p, g)| *p != c && *g == c)
            .count() as f64;
        f1s.push(if tp == 0.0 {
            0.0
        } else {
            2.0 * tp / (2.0 * tp + fp + fn_)
        });
    }
    (
        right as f64 / gold.len() as f64,
        f1s.iter().sum::<f64>() / f1s.len() as f64,
    )
}

fn class_ids(ev: &Evaluation) -> Vec<usize> {
    match &ev.predictions {
        Predictions::Classification(p) => p.iter().map(|p| p.id).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn classification_overfits_and_checkpoints_round_trip() {
    let (_tmp, file, opts) = scratch("train.tsv", SENTIMENT, 20.0);
    let out = opts.out.clone();
    let mut t = trainer(Task::Classification, &tiny("bert-seqcls"), &file, opts);
    // The checkpoint's names cover the data's: its ids (and head) are kept.
    assert_eq!(t.labels().names(), ["negative", "neutral", "positive"]);
    assert_eq!(t.steps_per_epoch(), 3);
    assert_eq!(t.total_steps(), 60);
    let ck = load_safetensors(&tiny("bert-seqcls").join("model.safetensors"));
    assert_eq!(
        values(&t.params().tensors()["classifier.weight"]),
        values(&ck["classifier.weight"])
    );

    // The metrics of the untrained model, counted by hand.
    let dev = t.read_data(&file, &DataOptions::default()).unwrap();
    let gold = match &dev {
        TaskData::Classification(d) => d.class_ids().unwrap(),
        _ => unreachable!(),
    };
    assert_eq!(gold, [2, 2, 2, 0, 0, 0]);
    let ev0 = t.evaluate().unwrap().unwrap();
    let (acc, f1) = hand_accuracy_and_macro_f1(&class_ids(&ev0), &gold);
    assert_eq!(ev0.scores["accuracy"], acc);
    assert!((ev0.scores["macro_f1"] - f1).abs() < 1e-12);
    assert_eq!(ev0.main_score(), Some(acc));

    let (steps, events) = run(&mut t);
    assert_eq!(steps.len(), 60);
    let first = mean(&steps[..3]);
    let last = mean(&steps[steps.len() - 3..]);
    println!("loss: first epoch {first:.4}, last epoch {last:.4}");
    assert!(last < 0.05 && last < first / 10.0, "{first} → {last}");
    // An evaluation per epoch, the last one perfect.
    let evals: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Eval(e) => Some(e.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(evals.len(), 20);
    assert_eq!(evals.last().unwrap().scores["accuracy"], 1.0);
    assert_eq!(evals.last().unwrap().scores["macro_f1"], 1.0);
    let ev = t.evaluate().unwrap().unwrap();
    assert_eq!(class_ids(&ev), gold);
    match &ev.predictions {
        Predictions::Classification(p) => {
            assert_eq!(p[0].label, "positive");
            assert!(p.iter().all(|p| p.score > 0.5 && p.score <= 1.0));
        }
        _ => unreachable!(),
    }

    // metrics.jsonl: a line per step and per evaluation.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 80);
    for key in ["loss", "lr", "grad_norm", "tokens_per_s", "epoch"] {
        assert!(lines[0][key].as_f64().unwrap().is_finite(), "{key}");
    }
    let eval_line = &lines[lines.len() - 1];
    assert_eq!(eval_line["step"], 60);
    assert_eq!(eval_line["metric"], "accuracy");
    assert_eq!(eval_line["accuracy"], 1.0);
    for f in [
        "loss.png",
        "metric.png",
        EVAL_RESULTS_FILE,
        "checkpoint-60/trainer_state.json",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    // Only the newest resumable checkpoint is kept.
    assert!(!out.join("checkpoint-57").exists());
    check_round_trip(Task::Classification, &t, "bert-seqcls", &dev);
}

#[test]
fn sentence_pairs_need_both_texts() {
    // The first sentences are the same: only the second tells the labels apart.
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        "pairs.tsv",
        "sentence1\tsentence2\tlabel\n\
         the film was good\tthe film was good\tentailment\n\
         the film was good\tthe film was bad\tcontradiction\n\
         the film was good\tthe house was white\tneutral\n\
         the song was great\tthe song was great\tentailment\n\
         the song was great\tthe song was dark\tcontradiction\n\
         the song was great\tthe king of france met mary\tneutral\n",
    );
    let out = tmp.path().join("out");
    let mut opts = options(&out);
    opts.epochs = 15.0;
    let mut t = trainer(Task::Classification, &tiny("bert-seqcls"), &file, opts);
    // The data's labels are not the checkpoint's: a fresh head, the data's ids.
    assert_eq!(
        t.labels().names(),
        ["contradiction", "entailment", "neutral"]
    );
    let ck = load_safetensors(&tiny("bert-seqcls").join("model.safetensors"));
    let fresh = values(&t.params().tensors()["classifier.weight"]);
    assert_ne!(fresh, values(&ck["classifier.weight"]));
    assert!(values(&t.params().tensors()["classifier.bias"])
        .iter()
        .all(|&b| b == 0.0));
    let (steps, _) = run(&mut t);
    let ev = t.evaluate().unwrap().unwrap();
    println!(
        "pairs: loss {:.4} → {:.4}, accuracy {}",
        steps[0].loss,
        steps.last().unwrap().loss,
        ev.scores["accuracy"]
    );
    assert_eq!(ev.scores["accuracy"], 1.0);
    let written = BertConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(written.label_name(0), "contradiction");
}

// ---------------------------------------------------------------- NER

/// Entities as seqeval's default mode chunks them: (sentence, type, start, end).
fn chunks(tags: &[Vec<String>]) -> BTreeSet<(usize, String, usize, usize)> {
    let mut out = BTreeSet::new();
    for (s, sent) in tags.iter().enumerate() {
        let mut open: Option<(String, usize)> = None;
        for (i, tag) in sent
            .iter()
            .chain(std::iter::once(&"O".to_string()))
            .enumerate()
        {
            let (prefix, ty) = match tag.split_once('-') {
                Some((p, t)) => (p, t.to_string()),
                None => ("O", String::new()),
            };
            let continues = prefix == "I" && open.as_ref().is_some_and(|(t, _)| *t == ty);
            if !continues {
                if let Some((t, start)) = open.take() {
                    out.insert((s, t, start, i));
                }
                if prefix != "O" {
                    open = Some((ty, i));
                }
            }
        }
    }
    out
}

#[test]
fn ner_overfits_and_entity_scores_match_hand_counts() {
    let (_tmp, file, opts) = scratch("train.conll", CONLL, 20.0);
    let mut t = trainer(Task::Ner, &tiny("bert-tokcls"), &file, opts);
    assert_eq!(
        t.labels().names(),
        ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    );
    let dev = t.read_data(&file, &DataOptions::default()).unwrap();
    let gold = match &dev {
        TaskData::Ner(d) => d.tags(),
        _ => unreachable!(),
    };
    let hand = |ev: &Evaluation| {
        let pred = match &ev.predictions {
            Predictions::Ner(p) => p.clone(),
            other => panic!("{other:?}"),
        };
        let (g, p) = (chunks(&gold), chunks(&pred));
        let right = g.intersection(&p).count() as f64;
        let (prec, rec) = (
            if p.is_empty() {
                0.0
            } else {
                right / p.len() as f64
            },
            right / g.len() as f64,
        );
        let f1 = if prec + rec == 0.0 {
            0.0
        } else {
            2.0 * prec * rec / (prec + rec)
        };
        (prec, rec, f1)
    };
    let ev0 = t.evaluate().unwrap().unwrap();
    let (p0, r0, f0) = hand(&ev0);
    println!("untrained: P {p0:.3} R {r0:.3} F1 {f0:.3}");
    assert_scores(
        &ev0,
        &[("precision", p0), ("recall", r0), ("f1", f0)],
        1e-12,
    );

    let (steps, _) = run(&mut t);
    let ev = t.evaluate().unwrap().unwrap();
    println!(
        "ner: loss {:.4} → {:.4}, {:?}",
        mean(&steps[..3]),
        mean(&steps[steps.len() - 3..]),
        ev.scores
    );
    assert_eq!(hand(&ev), (1.0, 1.0, 1.0));
    assert_eq!(ev.scores["f1"], 1.0);
    assert_eq!(ev.scores["token_accuracy"], 1.0);
    assert!(mean(&steps[steps.len() - 3..]) < 0.05);
    check_round_trip(Task::Ner, &t, "bert-tokcls", &dev);
}

// ---------------------------------------------------------------- QA

#[test]
fn qa_overfits_and_squad_scores_match_hand_counts() {
    let (_tmp, file, mut opts) = scratch("squad.json", &squad_json(), 16.0);
    // Windows of 24 tokens sharing 8: every context is cut in two or three.
    opts.max_length = 24;
    let mut t = trainer(Task::Qa, &tiny("bert-qa"), &file, opts);
    let (questions, windows) = t.train_size();
    assert_eq!(questions, 5);
    assert!(windows > 5, "{windows}");
    let dev = t.read_data(&file, &DataOptions::default()).unwrap();
    let golds: HashMap<String, String> = match &dev {
        TaskData::Qa(d) => d
            .examples
            .iter()
            .map(|e| (e.id.clone(), e.answers[0].text.clone()))
            .collect(),
        _ => unreachable!(),
    };
    let hand = |ev: &Evaluation| {
        let preds = match &ev.predictions {
            Predictions::Qa(p) => p.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(preds.len(), golds.len());
        let n = preds.len() as f64;
        let em = preds
            .iter()
            .filter(|p| normalize_answer(&p.text) == normalize_answer(&golds[&p.id]))
            .count() as f64;
        let f1: f64 = preds.iter().map(|p| squad_f1(&p.text, &golds[&p.id])).sum();
        (100.0 * em / n, 100.0 * f1 / n)
    };
    let ev0 = t.evaluate().unwrap().unwrap();
    let (em0, f10) = hand(&ev0);
    assert_scores(&ev0, &[("exact_match", em0), ("f1", f10)], 1e-9);

    let (steps, _) = run(&mut t);
    let ev = t.evaluate().unwrap().unwrap();
    println!(
        "qa: loss {:.4} → {:.4}, untrained EM {em0:.1} F1 {f10:.1}, trained {:?}",
        steps[0].loss,
        steps.last().unwrap().loss,
        ev.scores
    );
    assert_eq!(hand(&ev), (100.0, 100.0));
    assert_eq!(ev.scores["exact_match"], 100.0);
    match &ev.predictions {
        Predictions::Qa(p) => assert_eq!(p[1].text, "london"),
        _ => unreachable!(),
    }
    check_round_trip(Task::Qa, &t, "bert-qa", &dev);
}
