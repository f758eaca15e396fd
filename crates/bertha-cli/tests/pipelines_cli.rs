//! `bertha fill-mask | classify | ner | qa | nsp` end to end on the tiny
//! checkpoints, against transformers' pipelines (`pipelines.json`).

mod common;

use common::{assert_mentions, failure, ok_lines, repo, run, run_model, run_stdin, tiny, tiny_dir};

use std::process::Output;

use serde_json::Value;

fn pipelines() -> Value {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/pipelines.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn assert_score(got: &Value, want: &Value) {
    let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
    assert!((g - w).abs() <= 1e-5, "score {g} vs {w}");
}

/// Asserts that one prediction is transformers': the fields `keys` equal,
/// the score within 1e-5.
fn assert_prediction(got: &Value, want: &Value, keys: &[&str]) {
    for k in keys {
        assert_eq!(got.get(k), want.get(k), "{k}");
    }
    assert_score(&got["score"], &want["score"]);
}

/// `bertha qa` on the tiny QA checkpoint, then `extra` flags.
fn qa(question: &str, context: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--question", question, "--context", context];
    args.extend(extra);
    run_model("qa", &tiny_dir("bert-qa"), &args)
}

#[test]
fn fill_mask_prints_transformers_candidates() {
    let fx = pipelines();
    let cases = fx["fill_mask"]["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let model = tiny("bert-mlm");
    let mut args = vec!["fill-mask", "--model", &model, "--top-k", "5"];
    args.extend(&texts);
    let lines = ok_lines(&run(&args));
    assert_eq!(lines.len(), cases.len());
    for (line, case) in lines.iter().zip(cases) {
        let want = case["expected"].as_array().unwrap();
        let got = line.as_array().unwrap();
        assert_eq!(got.len(), 5);
        for (g, w) in got.iter().zip(want) {
            assert_prediction(g, w, &["token", "token_str", "sequence"]);
        }
    }
    // Several masks: one list per mask.
    let lines = ok_lines(&run_model(
        "fill-mask",
        &tiny_dir("bert-mlm"),
        &["--top-k", "2", "the [MASK] of the [MASK]"],
    ));
    let masks = lines[0].as_array().unwrap();
    assert_eq!(masks.len(), 2);
    assert_eq!(masks[1].as_array().unwrap().len(), 2);
    // No mask: a clear error naming the text.
    let err = failure(&run_model("fill-mask", &tiny_dir("bert-mlm"), &["no mask"]));
    assert_mentions(&err, &["text 1", "no mask token"]);
}

#[test]
fn classify_top_k_all_scores_and_pairs() {
    let fx = pipelines();
    let case = &fx["classify"]["cases"][0];
    let text = case["text"].as_str().unwrap();
    let want = case["expected"].as_array().unwrap();
    let model = tiny("bert-seqcls");
    let top1 = ok_lines(&run(&["classify", "--model", &model, text]));
    assert_eq!(top1[0].as_array().unwrap().len(), 1);
    assert_eq!(top1[0][0]["label"], want[0]["label"]);
    assert_score(&top1[0][0]["score"], &want[0]["score"]);
    let top2 = ok_lines(&run(&["classify", "--model", &model, "--top-k", "2", text]));
    assert_eq!(top2[0].as_array().unwrap().len(), 2);
    let all = ok_lines(&run(&["classify", "--model", &model, "--all-scores", text]));
    for (g, w) in all[0].as_array().unwrap().iter().zip(want) {
        assert_prediction(g, w, &["label"]);
    }
    // --function: the raw logits, whose softmax is transformers' scores,
    // and their sigmoid.
    let raw = ok_lines(&run(&[
        "classify",
        "--model",
        &model,
        "--all-scores",
        "--function",
        "none",
        text,
    ]));
    let logits: Vec<(String, f64)> = raw[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap().to_string(),
                s["score"].as_f64().unwrap(),
            )
        })
        .collect();
    let z: f64 = logits.iter().map(|(_, x)| x.exp()).sum();
    for w in want {
        let x = logits.iter().find(|(l, _)| *l == w["label"]).unwrap().1;
        assert!(
            (x.exp() / z - w["score"].as_f64().unwrap()).abs() < 1e-5,
            "{logits:?}"
        );
    }
    let sig = ok_lines(&run(&[
        "classify",
        "--model",
        &model,
        "--all-scores",
        "--function",
        "sigmoid",
        text,
    ]));
    for s in sig[0].as_array().unwrap() {
        let x = logits.iter().find(|(l, _)| *l == s["label"]).unwrap().1;
        assert!((s["score"].as_f64().unwrap() - 1.0 / (1.0 + (-x).exp())).abs() < 1e-6);
    }
    let err = failure(&run(&[
        "classify",
        "--model",
        &model,
        "--function",
        "tanh",
        text,
    ]));
    assert_mentions(&err, &["--function", "softmax, sigmoid, none"]);

    let pc = &fx["classify_pair"]["cases"][0];
    let pair = ok_lines(&run(&[
        "classify",
        "--model",
        &model,
        "--all-scores",
        "--pair",
        pc["pair"].as_str().unwrap(),
        pc["text"].as_str().unwrap(),
    ]));
    for (g, w) in pair[0]
        .as_array()
        .unwrap()
        .iter()
        .zip(pc["expected"].as_array().unwrap())
    {
        assert_prediction(g, w, &["label"]);
    }
    // A headless checkpoint names the missing head.
    let err = failure(&run(&["classify", "--model", &tiny("bert-mlm"), text]));
    assert_mentions(
        &err,
        &["BertForSequenceClassification", "classifier.weight"],
    );
}

/// A file of texts runs in batches (of 2 here, texts of similar length
/// together, batches side by side where the fast path has more than one
/// core) and comes out one line a text in the file's order, each
/// transformers' scores.
#[test]
fn classify_a_file_in_batches_keeps_its_order() {
    let fx = pipelines();
    let cases: Vec<&Value> = (0..4)
        .flat_map(|_| fx["classify"]["cases"].as_array().unwrap())
        .collect();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let mut input = texts.join("\n");
    input.push('\n');
    let model = tiny("bert-seqcls");
    for batch in ["1", "2", "64"] {
        let args = [
            "classify",
            "--model",
            &model,
            "--all-scores",
            "--batch-size",
            batch,
            "--input",
            "-",
        ];
        let lines = ok_lines(&run_stdin(&args, input.as_bytes()));
        assert_eq!(lines.len(), cases.len(), "batch {batch}");
        for (line, case) in lines.iter().zip(&cases) {
            let want = case["expected"].as_array().unwrap();
            for (g, w) in line.as_array().unwrap().iter().zip(want) {
                assert_prediction(g, w, &["label"]);
            }
        }
    }
    let err = failure(&run(&[
        "classify",
        "--model",
        &model,
        "--batch-size",
        "0",
        "x",
    ]));
    assert_mentions(&err, &["--batch-size", "at least 1"]);
}

#[test]
fn ner_every_aggregation() {
    let fx = pipelines();
    for case in fx["ner"]["cases"].as_array().unwrap() {
        let lines = ok_lines(&run_model(
            "ner",
            &tiny_dir("bert-tokcls"),
            &[
                "--aggregation",
                case["aggregation"].as_str().unwrap(),
                case["text"].as_str().unwrap(),
            ],
        ));
        let got = lines[0].as_array().unwrap();
        let want = case["expected"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_prediction(
                g,
                w,
                &["entity", "entity_group", "index", "word", "start", "end"],
            );
        }
    }
    let err = failure(&run_model(
        "ner",
        &tiny_dir("bert-tokcls"),
        &["--aggregation", "most", "x"],
    ));
    assert!(err.contains("unknown aggregation `most`"), "{err}");
}

#[test]
fn qa_answers_and_errors() {
    let fx = pipelines();
    let text = |case: &Value, k: &str| case[k].as_str().unwrap().to_string();
    for case in fx["qa"]["cases"].as_array().unwrap() {
        let lines = ok_lines(&qa(&text(case, "question"), &text(case, "context"), &[]));
        assert_prediction(&lines[0], &case["expected"], &["answer", "start", "end"]);
    }
    let case = &fx["qa"]["cases"][0];
    let lines = ok_lines(&qa(
        &text(case, "question"),
        &text(case, "context"),
        &["--top-k", "3"],
    ));
    let answers = lines[0].as_array().unwrap();
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0]["answer"], case["expected"]["answer"]);
    // A long context is split into windows; the answer is still in it.
    let context = "john played the music and the company released the album. ".repeat(12);
    let lines = ok_lines(&qa("who played", &context, &["--doc-stride", "16"]));
    let (s, e) = (
        lines[0]["start"].as_u64().unwrap() as usize,
        lines[0]["end"].as_u64().unwrap() as usize,
    );
    assert_eq!(lines[0]["answer"].as_str().unwrap(), &context[s..e]);
    let err = failure(&qa(&"who played the music ".repeat(20), "john", &[]));
    assert!(err.contains("does not leave room"), "{err}");
}

#[test]
fn nsp_probabilities() {
    let lines = ok_lines(&run_model(
        "nsp",
        &tiny_dir("bert-pretraining"),
        &["john played the music", "the company released the album"],
    ));
    let (a, b) = (
        lines[0]["is_next"].as_f64().unwrap(),
        lines[0]["not_next"].as_f64().unwrap(),
    );
    assert!((a + b - 1.0).abs() < 1e-6 && a > 0.0 && b > 0.0);
    let err = failure(&run(&["nsp", "--model", &tiny("bert-qa"), "a", "b"]));
    assert!(err.contains("cls.seq_relationship.weight"), "{err}");
}

/// A mask past the truncation point fails the command naming it, even when
/// other masks survive (never a line with fewer answers than masks).
#[test]
fn fill_mask_answers_every_mask_or_fails() {
    let words = "the year ".repeat(28);
    let text = format!("[MASK] {words} [MASK] [MASK] [MASK] [MASK] [MASK] [MASK] [MASK] [MASK]");
    let err = failure(&run_model("fill-mask", &tiny_dir("bert-mlm"), &[&text]));
    assert_mentions(
        &err,
        &[
            "text 1",
            "masks 7 to 9 of 9 were cut off by truncation at 64 tokens",
        ],
    );
}

/// `--precision bf16` and `--quantize int8` on every pipeline: transformers'
/// answers (f32) with probabilities within 1e-2 (the library's tests bound
/// each precision tighter); a model the fast path does not take, or an
/// unknown precision, is a clear error.
#[test]
fn pipelines_take_a_precision() {
    let fx = pipelines();
    let text = |v: &Value| v.as_str().unwrap().to_string();
    let near = |got: &Value, want: &Value| {
        let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
        assert!((g - w).abs() <= 1e-2, "score {g} vs {w}");
    };
    let f32_nsp = ok_lines(&run_model(
        "nsp",
        &tiny_dir("bert-pretraining"),
        &["john played the music", "the company released the album"],
    ));
    for flag in [["--precision", "bf16"], ["--quantize", "int8"]] {
        let fm = &fx["fill_mask"]["cases"][0];
        let lines = ok_lines(&run_model(
            "fill-mask",
            &tiny_dir("bert-mlm"),
            &[flag[0], flag[1], "--top-k", "1", &text(&fm["text"])],
        ));
        assert_eq!(lines[0][0]["token"], fm["expected"][0]["token"], "{flag:?}");
        near(&lines[0][0]["score"], &fm["expected"][0]["score"]);

        let cl = &fx["classify"]["cases"][0];
        let lines = ok_lines(&run_model(
            "classify",
            &tiny_dir("bert-seqcls"),
            &[flag[0], flag[1], "--all-scores", &text(&cl["text"])],
        ));
        for (g, w) in lines[0]
            .as_array()
            .unwrap()
            .iter()
            .zip(cl["expected"].as_array().unwrap())
        {
            assert_eq!(g["label"], w["label"], "{flag:?}");
            near(&g["score"], &w["score"]);
        }

        let ner = fx["ner"]["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["aggregation"] == "simple")
            .unwrap();
        let lines = ok_lines(&run_model(
            "ner",
            &tiny_dir("bert-tokcls"),
            &[
                flag[0],
                flag[1],
                "--aggregation",
                "simple",
                &text(&ner["text"]),
            ],
        ));
        let want = ner["expected"].as_array().unwrap();
        assert_eq!(lines[0].as_array().unwrap().len(), want.len(), "{flag:?}");
        for (g, w) in lines[0].as_array().unwrap().iter().zip(want) {
            for k in ["entity_group", "word", "start", "end"] {
                assert_eq!(g[k], w[k], "{flag:?} {k}");
            }
            near(&g["score"], &w["score"]);
        }

        let case = &fx["qa"]["cases"][0];
        let lines = ok_lines(&qa(
            &text(&case["question"]),
            &text(&case["context"]),
            &flag,
        ));
        for k in ["answer", "start", "end"] {
            assert_eq!(lines[0][k], case["expected"][k], "{flag:?} {k}");
        }
        near(&lines[0]["score"], &case["expected"]["score"]);

        let lines = ok_lines(&run_model(
            "nsp",
            &tiny_dir("bert-pretraining"),
            &[
                flag[0],
                flag[1],
                "john played the music",
                "the company released the album",
            ],
        ));
        near(&lines[0]["is_next"], &f32_nsp[0]["is_next"]);
    }
    let err = failure(&run_model(
        "fill-mask",
        &tiny_dir("deberta-v2-mlm"),
        &["--precision", "int8", "the [MASK] of the year"],
    ));
    assert_mentions(&err, &["Int8", "fast path", "DebertaV2"]);
    let err = failure(&run_model(
        "classify",
        &tiny_dir("bert-seqcls"),
        &["--precision", "fp16", "x"],
    ));
    assert_mentions(&err, &["fp16", "f32, bf16 or int8"]);
}
