//! `bertha embed` / `similarity` with `--prompt-name`, `--prompt` and
//! `--dimensions` on the sentence-transformers 6 fixture
//! (`tests/fixtures/st-embedding`), against sentence-transformers' own
//! embeddings.

mod common;

use common::{assert_mentions, failure, fixtures, ok_lines, reference, run_model};

fn dir() -> std::path::PathBuf {
    fixtures().join("st-embedding")
}

fn anchors() -> Vec<String> {
    let inputs = common::read_json(&dir().join("inputs.json"));
    serde_json::from_value(inputs["anchors"].clone()).unwrap()
}

/// Row `i` of the fixture's tensor `name`.
fn expected(name: &str, i: usize) -> Vec<f32> {
    reference("st-embedding/expected.safetensors")[name]
        .get(i)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// `bertha CMD --model <fixture> FLAGS... <anchors>`, as JSON lines.
fn on_anchors(cmd: &str, flags: &[&str]) -> Vec<serde_json::Value> {
    let texts = anchors();
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(texts.iter().map(String::as_str));
    ok_lines(&run_model(cmd, &dir(), &args))
}

#[track_caller]
fn assert_rows(lines: &[serde_json::Value], name: &str) {
    assert_eq!(lines.len(), 4);
    for (i, line) in lines.iter().enumerate() {
        let got: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
        let want = expected(name, i);
        assert_eq!(got.len(), want.len(), "{name}.{i}");
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff <= 1e-5, "{name}.{i}: max abs diff {diff:e}");
    }
}

#[test]
fn embed_prompt_name_prompt_and_dimensions_match_sentence_transformers() {
    assert_rows(&on_anchors("embed", &[]), "embeddings.anchor");
    assert_rows(
        &on_anchors("embed", &["--prompt-name", "query"]),
        "embeddings.query_prompt.anchor",
    );
    assert_rows(
        &on_anchors("embed", &["--prompt", "query: "]),
        "embeddings.query_prompt.anchor",
    );
    assert_rows(
        &on_anchors("embed", &["--dimensions", "16"]),
        "embeddings.anchor_dim16",
    );
}

#[test]
fn similarity_uses_the_prompt_and_the_dimensions() {
    let cosine = |a: &[f32], b: &[f32]| -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (n(a) * n(b))
    };
    for (flags, name) in [
        (
            &["--prompt-name", "query"][..],
            "embeddings.query_prompt.anchor",
        ),
        (&["--dimensions", "16"][..], "embeddings.anchor_dim16"),
    ] {
        let lines = on_anchors("similarity", flags);
        let m: Vec<Vec<f32>> = serde_json::from_value(lines[0]["similarity"].clone()).unwrap();
        for (i, row) in m.iter().enumerate() {
            for (j, got) in row.iter().enumerate() {
                let want = cosine(&expected(name, i), &expected(name, j));
                assert!(
                    (got - want).abs() <= 1e-5,
                    "{name} [{i}][{j}]: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn bad_prompts_and_dimensions_fail_with_the_flag_named() {
    let err = failure(&run_model(
        "embed",
        &dir(),
        &["--prompt-name", "passage", "hi"],
    ));
    assert_mentions(&err, &["--prompt-name", "`passage`", "`document`, `query`"]);

    let err = failure(&run_model(
        "embed",
        &dir(),
        &["--prompt-name", "query", "--prompt", "q: ", "hi"],
    ));
    assert_mentions(&err, &["--prompt-name", "--prompt"]);

    for d in ["0", "65"] {
        let err = failure(&run_model(
            "similarity",
            &dir(),
            &["--dimensions", d, "a", "b"],
        ));
        assert_mentions(&err, &["--dimensions", d, "64 dimensions"]);
    }

    let err = failure(&run_model(
        "embed",
        &dir(),
        &["--pooling", "none", "--dimensions", "8", "hi"],
    ));
    assert_mentions(&err, &["--dimensions", "pooling `none`"]);

    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let err = failure(&run_model(
        "embed",
        &dir(),
        &[
            "--prompt",
            &"word ".repeat(40),
            "--output",
            common::s(&out),
            "hi",
        ],
    ));
    assert_mentions(&err, &["--prompt", "max length 32"]);
    assert!(!out.exists(), "nothing is written on an error");
}
