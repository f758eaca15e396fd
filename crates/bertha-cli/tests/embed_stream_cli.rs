//! `bertha embed` streams: chunk by chunk in input order, through
//! `OUT.partial`, resumable after an interruption; and a closed stdout ends
//! a command quietly.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

use common::*;

/// 2,500 texts of varied lengths (chunks growing from 2 to 1,024 at `--batch-size 2`).
fn texts() -> Vec<String> {
    (0..2500)
        .map(|i| {
            let words = [
                "the", "cat", "sat", "on", "a", "mat", "bank", "river", "money",
            ];
            (0..1 + (i * 7) % 23)
                .map(|k| words[(i + k * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn embed(input: &Path, output: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "embed",
        "--model",
        "",
        "--batch-size",
        "2",
        "--input",
        s(input),
        "--output",
        s(output),
    ];
    let model = tiny("bert-mlm");
    args[2] = &model;
    args.extend(extra);
    run(&args)
}

fn vectors(path: &Path) -> Vec<Vec<f32>> {
    read_jsonl(path)
        .iter()
        .map(|l| serde_json::from_value(l["embedding"].clone()).unwrap())
        .collect()
}

#[test]
fn streamed_chunks_keep_input_order_and_equal_the_library() {
    let tmp = tempfile::tempdir().unwrap();
    let texts = texts();
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, texts.join("\n")).unwrap();
    let output = tmp.path().join("out.jsonl");
    ok(&embed(&input, &output, &[]));
    assert!(!tmp.path().join("out.jsonl.partial").exists());

    let embedder = bertha::Embedder::from_dir(
        &tiny_dir("bert-mlm"),
        &candle_core::Device::Cpu,
        &bertha::EmbedOptions::default(),
    )
    .unwrap();
    let want = embedder.embed(&texts, 8, &mut |_| {}).unwrap();
    let got = vectors(&output);
    assert_eq!(got.len(), texts.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d <= 1e-5, "text {}: {d:e}", i + 1);
    }
}

#[test]
fn resume_output_goes_on_after_the_last_complete_line() {
    let tmp = tempfile::tempdir().unwrap();
    let texts = texts();
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, texts.join("\n")).unwrap();
    let full = tmp.path().join("full.jsonl");
    ok(&embed(&input, &full, &[]));
    let whole = std::fs::read_to_string(&full).unwrap();
    let lines: Vec<&str> = whole.lines().collect();

    // An interrupted run: 1,500 whole lines and half of the next one.
    let output = tmp.path().join("out.jsonl");
    let partial = tmp.path().join("out.jsonl.partial");
    let half = &lines[1500][..lines[1500].len() / 2];
    std::fs::write(&partial, format!("{}\n{half}", lines[..1500].join("\n"))).unwrap();
    let out = embed(&input, &output, &["--resume-output"]);
    assert_stderr_has(&out, "resuming after the 1500 lines already written");
    assert_eq!(std::fs::read_to_string(&output).unwrap(), whole);
    assert!(!partial.exists());

    // A complete output and the same input: nothing left to do, same file.
    ok(&embed(&input, &output, &["--resume-output"]));
    assert_eq!(std::fs::read_to_string(&output).unwrap(), whole);

    // Not this command's output: refused, and left as it was.
    std::fs::write(&partial, "a line of text\n").unwrap();
    let out = embed(&input, &output, &["--resume-output"]);
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(&out, "line 1 is not JSON");
    assert_eq!(
        std::fs::read_to_string(&partial).unwrap(),
        "a line of text\n"
    );

    // More lines than texts: the output belongs to another input.
    std::fs::remove_file(&partial).unwrap();
    let short = tmp.path().join("short.txt");
    std::fs::write(&short, "one\ntwo\n").unwrap();
    let out = embed(&short, &output, &["--resume-output"]);
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(
        &out,
        "already holds 2500 lines but the input has only 2 texts",
    );
    // Issue 46, case 2: the refusal renamed OUT to OUT.partial.
    assert_eq!(std::fs::read_to_string(&output).unwrap(), whole);
    assert!(!partial.exists());

    let out = run(&[
        "embed",
        "--model",
        &tiny("bert-mlm"),
        "--resume-output",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Issue 46, case 7: the kept lines were not checked (only the last one
/// had to be JSON): lines of another model, text, `{"foo":1}` counted as
/// finished texts. Each kept line must be this run's kind of line.
#[test]
fn resume_keeps_only_this_runs_kind_of_line() {
    let tmp = tempfile::tempdir().unwrap();
    let texts = texts();
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, texts[..40].join("\n")).unwrap();
    let full = tmp.path().join("full.jsonl");
    ok(&embed(&input, &full, &[]));
    let whole = std::fs::read_to_string(&full).unwrap();
    let lines: Vec<&str> = whole.lines().collect();
    let dim = vectors(&full)[0].len();
    let output = tmp.path().join("out.jsonl");
    let partial = tmp.path().join("out.jsonl.partial");
    let short_vector = format!("{{\"embedding\":[{}]}}", vec!["0.5"; dim / 2].join(","));
    let text_value = format!(
        "{{\"embedding\":[\"a\",{}]}}",
        vec!["0.5"; dim - 1].join(",")
    );
    for (bad, says) in [
        (
            short_vector.as_str(),
            format!("has {} values, this run writes {dim}", dim / 2),
        ),
        (
            "{\"foo\":1}",
            "fields [\"foo\"], expected [\"embedding\"]".to_string(),
        ),
        ("not json", "line 4 is not JSON".to_string()),
        (text_value.as_str(), "not a number".to_string()),
    ] {
        let body = format!("{}\n{bad}\n{}\n", lines[..3].join("\n"), lines[3]);
        std::fs::write(&partial, &body).unwrap();
        let out = embed(&input, &output, &["--resume-output"]);
        assert_eq!(out.status.code(), Some(1), "{bad}: {}", stderr(&out));
        assert_stderr_has(&out, &says);
        assert_stderr_has(&out, "line 4");
        assert_eq!(
            std::fs::read_to_string(&partial).unwrap(),
            body,
            "left as it was"
        );
        assert!(!output.exists());
    }
    // A complete output of another model (another dimension): refused too.
    std::fs::remove_file(&partial).unwrap();
    std::fs::write(&output, format!("{short_vector}\n")).unwrap();
    let out = embed(&input, &output, &["--resume-output"]);
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(&out, "this run writes");
    assert_eq!(
        std::fs::read_to_string(&output).unwrap(),
        format!("{short_vector}\n")
    );
    // This run's own lines are kept.
    std::fs::remove_file(&output).unwrap();
    std::fs::write(&partial, format!("{}\n", lines[..5].join("\n"))).unwrap();
    let out = embed(&input, &output, &["--resume-output"]);
    assert_stderr_has(&out, "resuming after the 5 lines already written");
    assert_eq!(std::fs::read_to_string(&output).unwrap(), whole);
}

#[test]
fn a_failure_keeps_the_partial_output_for_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let mut body = texts().join("\n").into_bytes();
    body.extend_from_slice(b"\nbroken \xff line\n");
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, &body).unwrap();
    let output = tmp.path().join("out.jsonl");
    let out = embed(&input, &output, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(&out, "in.txt: line 2501: invalid UTF-8");
    assert!(!output.exists(), "OUT appears only when complete");
    let kept = read_jsonl(&tmp.path().join("out.jsonl.partial"));
    // Chunks of 2, 4, ..., 512 texts (the first a batch, each next twice
    // the last), then 1,024 and 1,024: the bad line is in the next chunk.
    assert_eq!(kept.len(), 2046, "the whole chunks before the bad line");
}

/// `bertha tokenize … | head -1`: the reader hangs up; the command ends by
/// SIGPIPE, as other Unix tools do, without a panic message.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, "a few words here\n".repeat(200_000)).unwrap();
    let mut child = bertha(&[
        "tokenize",
        "--model",
        &tiny("bert-mlm"),
        "--input",
        s(&input),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("input_ids"), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    const SIGPIPE: i32 = 13;
    assert_eq!(out.status.signal(), Some(SIGPIPE), "{err}");
}
