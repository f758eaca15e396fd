//! What every CLI test shares: the `bertha` binary run as a real process,
//! the repository's fixtures and model, and reading its output.
//!
//! Each test binary uses part of it.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

#[path = "../../../../tests/paths.rs"]
mod paths;
#[allow(unused_imports)] // each test binary uses some
pub use paths::{fixtures, minilm, repo, tiny_dir};

/// [`tiny_dir`] as a `--model` argument.
pub fn tiny(name: &str) -> String {
    tiny_dir(name).to_string_lossy().into_owned()
}

/// The binary with `args`, on two threads, ignoring the caller's
/// `$BERTHA_MODEL`.
pub fn bertha(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bertha"));
    c.args(args)
        .env_remove("BERTHA_MODEL")
        .env("RAYON_NUM_THREADS", "2");
    c
}

/// Runs the binary with an empty stdin.
pub fn run(args: &[&str]) -> Output {
    bertha(args).stdin(Stdio::null()).output().unwrap()
}

/// Runs `bertha CMD --model MODEL ARGS...` with an empty stdin.
pub fn run_model(cmd: &str, model: &Path, args: &[&str]) -> Output {
    let mut all = vec![cmd, "--model", s(model)];
    all.extend(args);
    run(&all)
}

/// `bertha prepare-corpus` of the committed corpus slice with the tiny
/// `bert-mlm` tokenizer into `out`, in shards of about `shard_tokens`.
pub fn prepare_tiny_corpus(out: &Path, shard_tokens: usize) -> Output {
    let corpus = repo().join("tests/fixtures/corpus-wiki-slice.txt");
    let tiny = tiny_dir("bert-mlm");
    let shard_tokens = shard_tokens.to_string();
    run(&[
        "prepare-corpus",
        "--corpus",
        s(&corpus),
        "--tokenizer",
        s(&tiny),
        "--out",
        s(out),
        "--shard-tokens",
        &shard_tokens,
    ])
}

/// Runs the binary with `input` on stdin.
pub fn run_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = bertha(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Stdout of a run that must have succeeded.
#[track_caller]
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The JSON lines of a run that must have succeeded.
#[track_caller]
pub fn ok_lines(out: &Output) -> Vec<Value> {
    ok(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that `text` (an error message) says each of `parts`.
#[track_caller]
pub fn assert_mentions(text: &str, parts: &[&str]) {
    assert!(parts.iter().all(|p| text.contains(p)), "{text}");
}

/// Asserts that the run's stderr says `needle` (showing stderr if not).
#[track_caller]
pub fn assert_stderr_has(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(err.contains(needle), "{err}");
}

/// Stderr of a run that must have failed.
#[track_caller]
pub fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "should have failed");
    stderr(out)
}

/// A JSON Lines file written by a run.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The lines of a `metrics.jsonl` that have `key` (`loss` for steps,
/// `eval_loss` for evaluations, ...).
pub fn with_key<'a>(lines: &'a [Value], key: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l.get(key).is_some()).collect()
}

/// A JSON file written by a run.
pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The reference tensors transformers wrote to `tests/fixtures/NAME`.
pub fn reference(name: &str) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(fixtures().join(name), &candle_core::Device::Cpu).unwrap()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
