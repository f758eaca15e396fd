//! What every CLI test shares: the `bertha` binary run as a real process,
//! the repository's fixtures and model, and reading its output.
//!
//! Each test binary uses part of it.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

/// A tiny checkpoint of `tests/fixtures/tiny` (`bert-mlm`, `bert-qa`, ...).
pub fn tiny_dir(name: &str) -> PathBuf {
    fixtures().join("tiny").join(name)
}

/// [`tiny_dir`] as a `--model` argument.
pub fn tiny(name: &str) -> String {
    tiny_dir(name).to_string_lossy().into_owned()
}

/// The all-MiniLM-L6-v2 folder fetched by `scripts/fetch-model.sh`.
pub fn minilm() -> PathBuf {
    let dir = repo().join(".cache/models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "run scripts/fetch-model.sh first"
    );
    dir
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

/// Stderr of a run that must have failed.
#[track_caller]
pub fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "should have failed");
    stderr(out)
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
