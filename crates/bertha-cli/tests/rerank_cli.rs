//! Rerankers end to end with the real binary: `bertha rerank` on the
//! sentence-transformers CrossEncoder fixture (its scores), `finetune
//! --task rerank` with each loss writing a CrossEncoder folder that
//! `rerank` and `evaluate --task rerank` read back, and `mine-negatives`
//! with a tiny bi-encoder in each output format.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use common::{failure, ok, ok_lines, read_json, read_jsonl, reference, repo, run, s, with_key};

fn cross_encoder() -> PathBuf {
    repo().join("tests/fixtures/cross-encoder")
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn rerank_gives_sentence_transformers_scores_best_first() {
    let inputs = read_json(&cross_encoder().join("inputs.json"));
    let (a, b) = (strings(&inputs["pairs"][0]), strings(&inputs["pairs"][1]));
    let want: Vec<f32> = reference("cross-encoder/expected.safetensors")["predict"]
        .to_vec1()
        .unwrap();
    let ce = cross_encoder();
    for i in 0..a.len() {
        let lines = ok_lines(&run(&[
            "rerank",
            "--model",
            s(&ce),
            "--query",
            &a[i],
            &b[i],
        ]));
        assert_eq!(lines.len(), 1);
        let got = lines[0]["score"].as_f64().unwrap() as f32;
        assert!(
            (got - want[i]).abs() <= 1e-5,
            "pair {i}: {got} vs {}",
            want[i]
        );
        assert_eq!(lines[0]["text"], b[i].as_str());
    }
    let mut args = vec![
        "rerank",
        "--model",
        s(&ce),
        "--query",
        &a[0],
        "--top-k",
        "3",
    ];
    args.extend(b.iter().map(String::as_str));
    let lines = ok_lines(&run(&args));
    assert_eq!(lines.len(), 3);
    let scores: Vec<f64> = lines.iter().map(|l| l["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let err = failure(&run(&["rerank", "--model", s(&ce), "--query", "q"]));
    assert!(err.contains("no documents"), "{err}");

    // Fused with the documents' order: 1 / (61 + list rank) + 1 / (61 +
    // rank by the cross-encoder's score), ranks from 0 here.
    let mut args = vec!["rerank", "--model", s(&ce), "--query", &a[0]];
    args.extend(b.iter().map(String::as_str));
    let plain = ok_lines(&run(&args));
    args.push("--fuse-with-order");
    let fused = ok_lines(&run(&args));
    assert_eq!(fused.len(), b.len());
    let id = |l: &serde_json::Value| l["corpus_id"].as_u64().unwrap() as usize;
    let by_score: Vec<usize> = plain.iter().map(id).collect();
    for l in &fused {
        let doc = id(l);
        let rank = by_score.iter().position(|&d| d == doc).unwrap();
        let want = 1.0 / (61.0 + doc as f64) + 1.0 / (61.0 + rank as f64);
        let got = l["score"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-6, "document {doc}: {got} vs {want}");
        assert_eq!(l["reranker_score"], plain[rank]["score"]);
    }
    let fused_scores: Vec<f64> = fused.iter().map(|l| l["score"].as_f64().unwrap()).collect();
    assert!(
        fused_scores.windows(2).all(|w| w[0] >= w[1]),
        "{fused_scores:?}"
    );
}

/// The fixture's tuples (query, positive, negative) and lists as files.
fn write_data(dir: &Path) -> (PathBuf, PathBuf) {
    let inputs = read_json(&cross_encoder().join("inputs.json"));
    let (q, p, n) = (
        strings(&inputs["queries"]),
        strings(&inputs["positives"]),
        strings(&inputs["negatives"]),
    );
    let mut tuples = String::from("query\tpositive\tnegative\n");
    for i in 0..q.len() {
        tuples += &format!("{}\t{}\t{}\n", q[i], p[i], n[i]);
    }
    let lists: Vec<Vec<String>> = serde_json::from_value(inputs["lists"].clone()).unwrap();
    let labels: Vec<Vec<f64>> = serde_json::from_value(inputs["list_labels"].clone()).unwrap();
    let mut jsonl = String::new();
    for i in 0..q.len() {
        let row = serde_json::json!({"query": q[i], "documents": lists[i], "labels": labels[i]});
        jsonl += &format!("{row}\n");
    }
    let (t, l) = (dir.join("tuples.tsv"), dir.join("lists.jsonl"));
    std::fs::write(&t, tuples).unwrap();
    std::fs::write(&l, jsonl).unwrap();
    (t, l)
}

#[test]
fn finetune_rerank_writes_a_cross_encoder_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let (tuples, lists) = write_data(tmp.path());
    let ce = cross_encoder();
    for (loss, train) in [
        ("bce", &tuples),
        ("mnrl", &tuples),
        ("listnet", &lists),
        ("lambda", &lists),
    ] {
        let out = tmp.path().join(loss);
        let mut args = vec![
            "finetune",
            "--task",
            "rerank",
            "--model",
            s(&ce),
            "--train",
            s(train),
            "--dev",
            s(&lists),
            "--out",
            s(&out),
            "--batch-size",
            "2",
            "--epochs",
            "2",
            "--lr",
            "1e-3",
            "--loss",
            loss,
        ];
        if loss == "bce" {
            args.extend(["--pos-weight", "2"]);
        }
        ok(&run(&args));
        let metrics = read_jsonl(&out.join("metrics.jsonl"));
        let evals = with_key(&metrics, "mrr@10");
        assert_eq!(evals.len(), 2, "{loss}: an evaluation every epoch");
        for e in &evals {
            for k in ["mrr@10", "ndcg@10", "map"] {
                let v = e[k].as_f64().unwrap();
                assert!((0.0..=100.0).contains(&v), "{loss}: {k} {v}");
            }
        }
        let losses: Vec<f64> = with_key(&metrics, "loss")
            .iter()
            .map(|m| m["loss"].as_f64().unwrap())
            .collect();
        assert!(losses.iter().all(|l| l.is_finite()), "{loss}: {losses:?}");
        let st = read_json(&out.join("config_sentence_transformers.json"));
        assert_eq!(st["model_type"], "CrossEncoder");
        assert_eq!(st["activation_fn"], "torch.nn.modules.activation.Sigmoid");
        let modules = read_json(&out.join("modules.json"));
        assert_eq!(modules.as_array().unwrap().len(), 1);
        let config = read_json(&out.join("config.json"));
        assert_eq!(config["architectures"][0], "BertForSequenceClassification");
        assert_eq!(config["id2label"].as_object().unwrap().len(), 1);
        // The folder reranks and evaluates.
        let lines = ok_lines(&run(&[
            "rerank",
            "--model",
            s(&out),
            "--query",
            "q",
            "a",
            "b",
        ]));
        assert_eq!(lines.len(), 2);
        let ev = ok_lines(&run(&[
            "evaluate",
            "--task",
            "rerank",
            "--model",
            s(&out),
            "--data",
            s(&lists),
        ]));
        assert_eq!(ev[0]["metric"], "mrr@10");
        assert_eq!(ev[0]["examples"], 4);
        assert_eq!(ev[0]["pairs"], 12);
        for order in ["list_order", "fused_rrf"] {
            let mrr = ev[0][order]["mrr@10"].as_f64().unwrap();
            assert!((0.0..=100.0).contains(&mrr), "{order}: {mrr}");
        }
        let last = evals.last().unwrap()["mrr@10"].as_f64().unwrap();
        let now = ev[0]["mrr@10"].as_f64().unwrap();
        assert!(
            (last - now).abs() < 1e-3,
            "{loss}: training's last eval {last} vs evaluate {now}"
        );
    }
    // Flags that do not fit are refused by name.
    let out = tmp.path().join("bad");
    let err = failure(&run(&[
        "finetune",
        "--task",
        "rerank",
        "--model",
        s(&ce),
        "--train",
        s(&lists),
        "--out",
        s(&out),
        "--loss",
        "listnet",
        "--pos-weight",
        "3",
    ]));
    assert!(err.contains("--pos-weight"), "{err}");
    let err = failure(&run(&[
        "finetune",
        "--task",
        "rerank",
        "--model",
        s(&ce),
        "--train",
        s(&lists),
        "--out",
        s(&out),
        "--loss",
        "mnrl",
    ]));
    assert!(
        err.contains("mnrl trains on (query, positive, negative…) rows"),
        "{err}"
    );
}

#[test]
fn mine_negatives_follows_the_rules_in_each_format() {
    let tmp = tempfile::tempdir().unwrap();
    let bi = repo().join("tests/fixtures/st-embedding");
    let inputs = read_json(&bi.join("inputs.json"));
    let (a, p) = (strings(&inputs["anchors"]), strings(&inputs["positives"]));
    let mut pairs = String::from("anchor\tpositive\n");
    for i in 0..a.len() {
        pairs += &format!("{}\t{}\n", a[i], p[i]);
    }
    let train = tmp.path().join("pairs.tsv");
    std::fs::write(&train, pairs).unwrap();
    let mine_from = |train: &Path, format: &str, extra: &[&str]| {
        let out = tmp.path().join(format!("{format}.jsonl"));
        let mut args = vec![
            "mine-negatives",
            "--model",
            s(&bi),
            "--train",
            s(train),
            "-o",
            s(&out),
            "--output-format",
            format,
        ];
        args.extend(extra);
        ok(&run(&args));
        read_jsonl(&out)
    };
    let mine = |format: &str, extra: &[&str]| mine_from(&train, format, extra);
    let pos_of: std::collections::HashMap<&str, &str> = a
        .iter()
        .map(String::as_str)
        .zip(p.iter().map(String::as_str))
        .collect();
    let two = ["--num-negatives", "2"];
    let pairs = mine("labeled-pair", &two);
    assert_eq!(
        pairs.len(),
        a.len() * 3,
        "a positive and two negatives a query"
    );
    for row in &pairs {
        let (q, d) = (
            row["query"].as_str().unwrap(),
            row["document"].as_str().unwrap(),
        );
        let positive = pos_of[q] == d;
        assert_eq!(row["label"], u8::from(positive), "{row}");
    }
    let tuples = mine("n-tuple", &two);
    assert_eq!(tuples.len(), a.len());
    for row in &tuples {
        let q = row["query"].as_str().unwrap();
        let negs: HashSet<&str> = ["negative_1", "negative_2"]
            .iter()
            .map(|k| row[*k].as_str().unwrap())
            .collect();
        assert_eq!(negs.len(), 2);
        assert!(!negs.contains(pos_of[q]));
    }
    let lists = mine(
        "labeled-list",
        &[
            "--include-positives",
            "--range-max",
            "4",
            "--num-negatives",
            "4",
        ],
    );
    for row in &lists {
        let docs = strings(&row["documents"]);
        assert_eq!(docs.len(), 4);
        let q = row["query"].as_str().unwrap();
        let labels: Vec<u8> = serde_json::from_value(row["labels"].clone()).unwrap();
        for (d, l) in docs.iter().zip(&labels) {
            assert_eq!(*l, u8::from(d == pos_of[q]));
        }
    }
    let err = failure(&run(&[
        "mine-negatives",
        "--model",
        s(&bi),
        "--train",
        s(&train),
        "-o",
        s(&tmp.path().join("x")),
        "--include-positives",
    ]));
    assert!(err.contains("labeled-list"), "{err}");

    // Pairs read both ways: every query is some row's positive, and so in
    // the corpus; no query is mined as its own negative.
    let mut both = std::fs::read_to_string(&train).unwrap();
    for i in 0..a.len() {
        both += &format!("{}\t{}\n", p[i], a[i]);
    }
    let both_ways = tmp.path().join("both.tsv");
    std::fs::write(&both_ways, both).unwrap();
    let tuples = mine_from(&both_ways, "n-tuple", &two);
    assert_eq!(tuples.len(), 2 * a.len());
    for row in &tuples {
        let q = row["query"].as_str().unwrap();
        assert!(
            ["negative_1", "negative_2"].iter().all(|k| row[*k] != q),
            "{row}"
        );
    }
}
