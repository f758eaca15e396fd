//! `bertha finetune --task embedding` end to end on the tiny
//! sentence-transformers fixture: a short MNRL run with a prompt writes a
//! sentence-transformers folder scored on an STS dev file; flags that do
//! not fit are refused with the flag's name.

mod common;

use std::path::{Path, PathBuf};

use common::{failure, ok, read_json, read_jsonl, repo, run, s, with_key};

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/st-embedding")
}

/// The fixture's rows as (anchor, positive) pairs and as scored pairs.
fn write_data(dir: &Path) -> (PathBuf, PathBuf) {
    let inputs = read_json(&fixture().join("inputs.json"));
    let col = |k: &str| -> Vec<String> { serde_json::from_value(inputs[k].clone()).unwrap() };
    let (a, p, n) = (col("anchors"), col("positives"), col("negatives"));
    let scores: Vec<f64> = serde_json::from_value(inputs["scores"].clone()).unwrap();
    let mut pairs = String::from("anchor\tpositive\n");
    let mut scored = String::from("sentence1\tsentence2\tscore\n");
    for i in 0..a.len() {
        pairs += &format!("{}\t{}\n", a[i], p[i]);
        scored += &format!("{}\t{}\t{}\n", a[i], p[i], scores[i]);
        scored += &format!("{}\t{}\t0.05\n", a[i], n[i]);
    }
    let (t, d) = (dir.join("pairs.tsv"), dir.join("sts.tsv"));
    std::fs::write(&t, pairs).unwrap();
    std::fs::write(&d, scored).unwrap();
    (t, d)
}

fn train(train: &Path, dev: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let model = fixture();
    let mut args = vec![
        "finetune",
        "--task",
        "embedding",
        "--model",
        s(&model),
        "--train",
        s(train),
        "--dev",
        s(dev),
        "--out",
        s(out),
        "--batch-size",
        "4",
        "--max-length",
        "32",
    ];
    args.extend(extra);
    run(&args)
}

#[test]
fn trains_a_sentence_transformers_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let (pairs, sts) = write_data(tmp.path());
    let out = tmp.path().join("out");
    let done = train(
        &pairs,
        &sts,
        &out,
        &["--epochs", "3", "--lr", "1e-3", "--prompt", "query=query: "],
    );
    ok(&done);
    let metrics = read_jsonl(&out.join("metrics.jsonl"));
    let steps = with_key(&metrics, "loss");
    assert_eq!(steps.len(), 3, "one step an epoch");
    let evals = with_key(&metrics, "spearman");
    assert_eq!(evals.len(), 3, "an STS evaluation every epoch");
    for e in &evals {
        assert_eq!(e["metric"], "spearman");
        let sp = e["spearman"].as_f64().unwrap();
        assert!((-100.0..=100.0).contains(&sp), "{sp}");
    }
    let st = read_json(&out.join("config_sentence_transformers.json"));
    assert_eq!(st["prompts"]["query"], "query: ");
    let modules = read_json(&out.join("modules.json"));
    assert_eq!(modules.as_array().unwrap().len(), 3, "{modules}");
    let args = read_json(&out.join("training_args.json"));
    assert_eq!(args["loss"]["kind"], "mnrl");

    // The trained folder embeds with the query prompt through `embed`.
    let line = ok(&run(&["embed", "--model", s(&out), "club members story"]));
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let emb = v["embedding"].as_array().unwrap();
    assert_eq!(emb.len(), 64);
}

#[test]
fn refuses_what_does_not_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let (pairs, sts) = write_data(tmp.path());
    let out = tmp.path().join("out");
    let err = failure(&train(&pairs, &sts, &out, &["--loss", "cosent"]));
    assert!(
        err.contains("cosent") && err.contains("scored pairs"),
        "{err}"
    );
    let err = failure(&train(&pairs, &sts, &out, &["--loss", "bogus"]));
    assert!(
        err.contains("mnrl-symmetric") && err.contains("cached-mnrl"),
        "{err}"
    );
    let err = failure(&train(&pairs, &sts, &out, &["--matryoshka", "32,100"]));
    assert!(err.contains("matryoshka") && err.contains("100"), "{err}");
    let err = failure(&train(&pairs, &sts, &out, &["--prompt", "query"]));
    assert!(err.contains("NAME=TEXT"), "{err}");
    let model = fixture();
    let err = failure(&run(&[
        "finetune",
        "--task",
        "classification",
        "--model",
        s(&model),
        "--train",
        s(&pairs),
        "--out",
        s(&out),
        "--loss",
        "mnrl",
    ]));
    assert!(
        err.contains("--loss applies to --task embedding or rerank only"),
        "{err}"
    );
}

/// Issue 46, case 8: `--task embedding --skip-bad-rows` stopped at the
/// first bad row (the flag was classification's only). Now bad rows are
/// skipped and counted; without the flag the first one stops the run.
#[test]
fn skip_bad_rows_skips_malformed_pairs() {
    let tmp = tempfile::tempdir().unwrap();
    let (pairs, sts) = write_data(tmp.path());
    let text = std::fs::read_to_string(&pairs).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let total = lines.len() - 1;
    // Line 3: one field; line 5: three fields.
    lines.insert(2, "only an anchor");
    lines.insert(4, "a\tb\tc");
    let broken = tmp.path().join("broken.tsv");
    std::fs::write(&broken, lines.join("\n") + "\n").unwrap();
    let out = tmp.path().join("out");
    let err = failure(&train(&broken, &sts, &out, &[]));
    assert!(err.contains("broken.tsv: line 3"), "{err}");
    let done = train(&broken, &sts, &out, &["--skip-bad-rows", "--epochs", "1"]);
    let err = String::from_utf8_lossy(&done.stderr).into_owned();
    ok(&done);
    assert!(
        err.contains(&format!(
            "data: {total} rows of anchor, positive (2 malformed rows skipped)"
        )),
        "{err}"
    );
}
