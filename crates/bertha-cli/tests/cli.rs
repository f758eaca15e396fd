//! The `bertha` binary end to end: real processes, real files, real model.

mod common;

use common::{bertha, fixtures, minilm, ok_lines, run, run_model, run_stdin, stderr};

use std::process::Stdio;

fn reference_embedding(i: usize) -> Vec<f32> {
    let t = candle_core::safetensors::load(
        fixtures().join("minilm.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    t[&format!("sentence_embedding.{i}")].to_vec1().unwrap()
}

#[test]
fn tokenize_matches_transformers_from_vocab_only_folder() {
    let dir = fixtures().join("minilm-vocab-only");
    let out = run_model("tokenize", &dir, &["The cat sat on the mat.", ""]);
    let lines = ok_lines(&out);
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0]["input_ids"],
        serde_json::json!([101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102])
    );
    assert_eq!(lines[0]["offsets"][1], serde_json::json!([0, 3]));
    assert_eq!(lines[0]["tokens"][6], "mat");
    assert_eq!(lines[1]["input_ids"], serde_json::json!([101, 102]));
}

#[test]
fn tokenize_pairs_and_truncation_is_reported() {
    let dir = minilm();
    let out = run_model(
        "tokenize",
        &dir,
        &[
            "--pair",
            "I went to the bank to deposit money.",
            "The cat sat on the mat.",
        ],
    );
    let lines = ok_lines(&out);
    assert_eq!(
        lines[0]["token_type_ids"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| *v == 1)
            .count(),
        10
    );

    let long = "word ".repeat(100);
    let out = run_model("tokenize", &dir, &["--max-length", "16", &long]);
    let lines = ok_lines(&out);
    assert_eq!(lines[0]["input_ids"].as_array().unwrap().len(), 16);
    assert_eq!(lines[0]["truncated"], true);
    assert!(
        stderr(&out).contains("truncated to 16 tokens"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn embed_matches_sentence_transformers() {
    let dir = minilm();
    let out = run_model(
        "embed",
        &dir,
        &[
            "The cat sat on the mat.",
            "I went to the bank to deposit money.",
        ],
    );
    let lines = ok_lines(&out);
    assert_eq!(lines.len(), 2);
    for (i, line) in lines.iter().enumerate() {
        let got: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
        let want = reference_embedding(i);
        let d = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d <= 1e-5, "sentence {i}: {d:e}");
    }
}

#[test]
fn embed_reads_files_and_stdin_and_writes_files_atomically() {
    let dir = minilm();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.txt");
    std::fs::write(
        &input,
        "The cat sat on the mat.\n\nI went to the bank to deposit money.\n",
    )
    .unwrap();
    let output = tmp.path().join("out.jsonl");
    let out = run_model(
        "embed",
        &dir,
        &[
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "the empty line gets its own embedding");
    let first: Vec<f32> = serde_json::from_value(lines[0]["embedding"].clone()).unwrap();
    let want = reference_embedding(0);
    assert!(first.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5));
    // Only the output file is left in the folder: no temporary leftovers.
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let from_stdin = ok_lines(&run_stdin(
        &["embed", "--model", dir.to_str().unwrap()],
        b"The cat sat on the mat.\n",
    ));
    assert_eq!(from_stdin[0]["embedding"], lines[0]["embedding"]);
}

#[test]
fn embed_pooling_none_gives_token_vectors() {
    let dir = minilm();
    let lines = ok_lines(&run_model(
        "embed",
        &dir,
        &[
            "--pooling",
            "none",
            "--no-normalize",
            "The cat sat on the mat.",
        ],
    ));
    let tokens = lines[0]["tokens"].as_array().unwrap();
    let vectors = lines[0]["embeddings"].as_array().unwrap();
    assert_eq!(tokens.len(), 9);
    assert_eq!(vectors.len(), 9);
    assert_eq!(vectors[0].as_array().unwrap().len(), 384);
    // The un-normalised token states are the model's last hidden state.
    let t = candle_core::safetensors::load(
        fixtures().join("minilm.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let want: Vec<Vec<f32>> = t["last_hidden_state.0"].to_vec2().unwrap();
    let got: Vec<Vec<f32>> = serde_json::from_value(lines[0]["embeddings"].clone()).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!(g.iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-4));
    }
}

#[test]
fn similarity_matrix_is_symmetric_with_unit_diagonal() {
    let dir = minilm();
    let lines = ok_lines(&run_model(
        "similarity",
        &dir,
        &[
            "The film was surprisingly moving and beautifully shot.",
            "A gripping, beautifully acted drama that never lets up.",
            "I went to the bank to deposit money.",
        ],
    ));
    let m: Vec<Vec<f32>> = serde_json::from_value(lines[0]["similarity"].clone()).unwrap();
    for (i, row) in m.iter().enumerate() {
        assert!((row[i] - 1.0).abs() < 1e-5);
        for (j, v) in row.iter().enumerate() {
            assert!((v - m[j][i]).abs() < 1e-6);
        }
    }
    assert!(
        m[0][1] > m[0][2],
        "two film reviews are closer than a film review and banking: {m:?}"
    );
}

#[test]
fn invalid_utf8_input_names_the_line() {
    let dir = minilm();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("bad.txt");
    std::fs::write(&input, b"fine\nalso fine\nbroken \xc3\x28 here\n").unwrap();
    let output = tmp.path().join("out.jsonl");
    let out = run_model(
        "embed",
        &dir,
        &[
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("bad.txt: line 3: invalid UTF-8"), "{err}");
    assert!(!output.exists(), "no half-written output");

    let out = run_stdin(
        &["tokenize", "--model", dir.to_str().unwrap()],
        b"ok\n\xff\n",
    );
    assert!(
        stderr(&out).contains("stdin: line 2: invalid UTF-8"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_model_paths_are_explained() {
    let out = run(&["embed", "--model", "/nonexistent/folder", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));

    // A hub id fails at once with an explanation; nothing tries the network.
    let start = std::time::Instant::now();
    let out = run(&[
        "embed",
        "--model",
        "sentence-transformers/all-MiniLM-L6-v2",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("Hugging Face hub id"),
        "{}",
        stderr(&out)
    );
    assert!(start.elapsed().as_secs() < 30);

    let out = run(&[
        "embed",
        "--model",
        fixtures().join("sentences.txt").to_str().unwrap(),
        "hi",
    ]);
    assert!(stderr(&out).contains("not a folder"), "{}", stderr(&out));

    let out = run(&[
        "embed",
        "--model",
        fixtures().join("minilm-vocab-only").to_str().unwrap(),
        "hi",
    ]);
    assert!(
        stderr(&out).contains("config.json is missing"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn default_model_is_the_fetched_minilm() {
    minilm();
    let tmp = tempfile::tempdir().unwrap();
    let out = bertha(&["embed", "The cat sat on the mat."])
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let lines = ok_lines(&out);
    assert_eq!(lines[0]["embedding"].as_array().unwrap().len(), 384);
}

#[test]
fn bench_reports_throughput() {
    let dir = minilm();
    let lines = ok_lines(&run_model(
        "bench",
        &dir,
        &[
            "--input",
            fixtures().join("sentences.txt").to_str().unwrap(),
            "--reps",
            "1",
        ],
    ));
    assert_eq!(lines[0]["texts"], 17);
    assert!(lines[0]["texts_per_s"].as_f64().unwrap() > 0.0);
    assert!(lines[0]["tokens"].as_u64().unwrap() > 17 * 2);
}
