//! Shared helpers for the parity tests: fixture paths and tensor diffs.
#![allow(dead_code)]

pub mod fast_steps;
pub mod finetune;
pub mod runs;

use std::collections::HashMap;
use std::path::PathBuf;

use bertha::{Device, Tensor};
use candle_core::backprop::GradStore;
use candle_core::Var;

/// `tests/fixtures` at the repository root (copied from transformers'
/// reference outputs; see its README.md).
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The real all-MiniLM-L6-v2 folder fetched by `scripts/fetch-model.sh`.
/// Its absence is a failure, not a skip: parity with the real checkpoint
/// is the contract.
pub fn minilm_dir() -> PathBuf {
    let dir = match std::env::var_os("BERTHA_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models/all-MiniLM-L6-v2")
        }
    };
    assert!(
        dir.join("model.safetensors").is_file(),
        "all-MiniLM-L6-v2 is missing at {}: run scripts/fetch-model.sh first",
        dir.display()
    );
    dir
}

pub fn load_safetensors(path: &PathBuf) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn read_json(path: &PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The rows of `inputs.json`'s `inputs[key]` (`input_ids`,
/// `attention_mask`, `token_type_ids`: one row per text); `None` where
/// the fixture has no such key.
pub fn input_rows(inputs: &serde_json::Value, key: &str) -> Option<Vec<Vec<u32>>> {
    inputs["inputs"]
        .get(key)
        .map(|v| serde_json::from_value(v.clone()).unwrap())
}

/// Max |a - b| over all elements; shapes must agree.
/// The first value of a tensor, as f32 (a loss).
pub fn scalar(t: &Tensor) -> f32 {
    t.to_dtype(bertha::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0]
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shape mismatch");
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Max |t| over all elements.
pub fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The gradient `grads` holds for the variable named `p` (of case `what`).
pub fn grad_of<'a>(
    grads: &'a GradStore,
    vars: &HashMap<String, Var>,
    p: &str,
    what: &str,
) -> &'a Tensor {
    let var = vars
        .get(p)
        .unwrap_or_else(|| panic!("{what}: no variable {p}"));
    grads
        .get(var.as_tensor())
        .unwrap_or_else(|| panic!("{what}: no gradient for {p}"))
}

/// The parameters of `params` whose gradient in `grads` differs from
/// transformers' (`expected["grad.<p>"]`) by more than 1e-4 of that
/// tensor's max abs value, as messages (each comparison printed).
pub fn gradient_failures(
    name: &str,
    grads: &GradStore,
    vars: &HashMap<String, Var>,
    params: &[String],
    expected: &HashMap<String, Tensor>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for p in params {
        let got = grad_of(grads, vars, p, name);
        let want = &expected[&format!("grad.{p}")];
        let scale = max_abs(want);
        let d = max_abs_diff(got, want);
        println!("{name} grad.{p}: {:.2e} of max {scale:.2e}", d / scale);
        if d > 1e-4 * scale.max(1e-12) {
            failures.push(format!(
                "{name} grad.{p}: max abs diff {d:e}, scale {scale:e}"
            ));
        }
    }
    failures
}

/// The error of `r`, which must have failed, as text.
#[track_caller]
pub fn err_text<T>(r: bertha::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    let d = max_abs_diff(got, want);
    assert!(d <= tol, "{what}: max abs diff {d:e} > {tol:e}");
}

/// Max |got − want| over sequence `b`'s first `n` positions of each axis
/// in `axes` (counted after the batch axis): the non-padded part.
pub fn diff_unpadded(got: &Tensor, want: &Tensor, b: usize, n: usize, axes: &[usize]) -> f32 {
    let (mut g, mut w) = (got.get(b).unwrap(), want.get(b).unwrap());
    for &a in axes {
        g = g.narrow(a, 0, n).unwrap();
        w = w.narrow(a, 0, n).unwrap();
    }
    max_abs_diff(&g.contiguous().unwrap(), &w.contiguous().unwrap())
}
