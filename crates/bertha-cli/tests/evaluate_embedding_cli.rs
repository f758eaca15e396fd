//! `bertha evaluate --task sts|retrieval` with all-MiniLM-L6-v2 on the
//! committed slices of STS-B test and Flickr8k caption pairs: the scores
//! are sentence-transformers' (`tests/fixtures/pairs/minilm-reference.json`).

mod common;

use std::path::PathBuf;

use common::{assert_mentions, failure, fixtures, minilm, ok_lines, run, s};
use serde_json::Value;

fn pairs(name: &str) -> PathBuf {
    fixtures().join("pairs").join(name)
}

fn reference(task: &str) -> Value {
    let text = std::fs::read_to_string(pairs("minilm-reference.json")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap()[task].clone()
}

/// `bertha evaluate --task TASK --model all-MiniLM-L6-v2 --data DATA EXTRA...`.
fn evaluate(task: &str, data: &str, extra: &[&str]) -> std::process::Output {
    let model = minilm();
    let data = pairs(data);
    let mut args = vec![
        "evaluate",
        "--task",
        task,
        "--model",
        s(&model),
        "--data",
        s(&data),
    ];
    args.extend(extra);
    run(&args)
}

#[track_caller]
fn assert_close(got: &Value, want: &Value, key: &str, tolerance: f64) {
    let (g, w) = (got[key].as_f64().unwrap(), want[key].as_f64().unwrap());
    assert!((g - w).abs() <= tolerance, "{key}: {g} vs {w}");
}

#[test]
fn sts_on_the_stsb_original_and_its_conversion() {
    let want = reference("sts");
    let original = ok_lines(&evaluate("sts", "sts-test-slice.csv", &["--stsb"]));
    let line = &original[0];
    assert_eq!(original.len(), 1);
    assert_eq!(line["task"], "sts");
    assert_eq!(line["examples"], 84);
    assert_eq!(line["metric"], "spearman");
    assert_close(line, &want, "spearman", 1e-4);
    assert_close(line, &want, "pearson", 1e-4);
    // The converted file gives the same pairs and scores, so the same line
    // but for the file name.
    let converted = ok_lines(&evaluate(
        "sts",
        "sts-test-slice.tsv",
        &["--batch-size", "7"],
    ));
    for key in ["examples", "spearman", "pearson"] {
        assert_eq!(converted[0][key], line[key], "{key}");
    }
}

#[test]
fn truncation_is_reported_by_line_and_column() {
    // "A girl is styling her hair." is 9 tokens with [CLS] and [SEP].
    let out = evaluate("sts", "sts-test-slice.tsv", &["--max-length", "8"]);
    ok_lines(&out);
    assert_mentions(
        &common::stderr(&out),
        &["texts were truncated to 8 tokens (first: line 2, column `sentence1`)"],
    );
}

#[test]
fn retrieval_on_caption_pairs() {
    let want = reference("retrieval");
    let lines = ok_lines(&evaluate("retrieval", "flickr8k-train-head.tsv", &[]));
    let line = &lines[0];
    assert_eq!(line["task"], "retrieval");
    assert_eq!(line["metric"], "ndcg@10");
    assert_eq!(
        (line["examples"].as_u64(), line["corpus"].as_u64()),
        (Some(200), Some(200))
    );
    for key in ["recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10"] {
        assert_close(line, &want, key, 1e-9);
    }
}

#[test]
fn wrong_layouts_and_flags_are_named() {
    let err = failure(&evaluate("sts", "flickr8k-train-head.tsv", &[]));
    assert_mentions(&err, &["flickr8k-train-head.tsv", "sts needs scored pairs"]);
    // Without --stsb the original's first line is a header of sentences.
    let err = failure(&evaluate("sts", "sts-test-slice.csv", &[]));
    assert_mentions(&err, &["no `anchor` and `positive` columns", "--stsb"]);
    let err = failure(&evaluate(
        "sts",
        "sts-test-slice.tsv",
        &["--score-column", "sim"],
    ));
    assert_mentions(
        &err,
        &["`sentence1`, `sentence2`, `score`", "--score-column"],
    );
    let err = failure(&evaluate(
        "retrieval",
        "flickr8k-train-head.tsv",
        &["--negative-prefix", ""],
    ));
    assert_mentions(&err, &["--negative-prefix must not be empty"]);
    let err = failure(&evaluate("ranking", "flickr8k-train-head.tsv", &[]));
    assert_mentions(
        &err,
        &["unknown task `ranking`", "sts, retrieval or rerank"],
    );
}
