//! The training fast path's test helpers: rows of ids, types and labels
//! (a fixture's or random ones), the candle path's step on the same rows,
//! and gradient comparisons, for `fast_training.rs` and
//! `fast_family_training.rs`.

use std::collections::HashMap;

use bertha::fast::train::MlmBatch;
use bertha::model::{seed_dropout, BertForTask, BertInput, HeadKind, HeadLabels, HeadOptions};
use bertha::model::{ForwardOptions, IGNORE_INDEX};
use bertha::BertConfig;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use super::read_json;

/// Rows of ids / types / labels, unpadded.
#[derive(Clone)]
pub struct Rows {
    pub ids: Vec<Vec<u32>>,
    pub types: Vec<Vec<u32>>,
    pub labels: Vec<Vec<i64>>,
    pub nsp: Option<Vec<i64>>,
}

impl Rows {
    pub fn batch(&self) -> MlmBatch<'_> {
        MlmBatch {
            sequences: self
                .ids
                .iter()
                .zip(&self.types)
                .map(|(i, t)| (&i[..], &t[..]))
                .collect(),
            labels: self.labels.iter().map(|l| &l[..]).collect(),
            next_sentence: self.nsp.clone(),
        }
    }

    /// The padded batch and labels the candle path runs.
    pub fn padded(&self) -> (BertInput, Tensor, Option<Tensor>) {
        let dev = Device::Cpu;
        let input = BertInput::from_ids(&self.ids, &self.types, 0, &dev).unwrap();
        let t = self.ids.iter().map(Vec::len).max().unwrap();
        let mut flat = vec![IGNORE_INDEX; self.ids.len() * t];
        for (b, l) in self.labels.iter().enumerate() {
            flat[b * t..b * t + l.len()].copy_from_slice(l);
        }
        let labels = Tensor::from_vec(flat, (self.ids.len(), t), &dev).unwrap();
        let nsp = self
            .nsp
            .as_ref()
            .map(|n| Tensor::from_vec(n.clone(), n.len(), &dev).unwrap());
        (input, labels, nsp)
    }
}

pub fn fixture_rows(dir: &std::path::Path) -> Rows {
    let inputs = read_json(&dir.join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<i64>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let mask = get("attention_mask");
    let lens: Vec<usize> = mask
        .iter()
        .map(|m| m.iter().filter(|&&x| x == 1).count())
        .collect();
    let cut = |rows: Vec<Vec<i64>>| -> Vec<Vec<i64>> {
        rows.into_iter()
            .zip(&lens)
            .map(|(r, &n)| r[..n].to_vec())
            .collect()
    };
    let to_u32 = |rows: Vec<Vec<i64>>| -> Vec<Vec<u32>> {
        rows.into_iter()
            .map(|r| r.into_iter().map(|v| v as u32).collect())
            .collect()
    };
    let labels: Vec<Vec<i64>> = serde_json::from_value(inputs["labels"]["labels"].clone()).unwrap();
    // Padding positions carry no label in the fixtures.
    for (row, &n) in labels.iter().zip(&lens) {
        assert!(row[n..].iter().all(|&y| y == IGNORE_INDEX));
    }
    let ids = to_u32(cut(get("input_ids")));
    // RoBERTa's fixtures have no token types.
    let types = match inputs["inputs"].get("token_type_ids") {
        Some(_) => to_u32(cut(get("token_type_ids"))),
        None => ids.iter().map(|r| vec![0; r.len()]).collect(),
    };
    Rows {
        ids,
        types,
        labels: cut(labels),
        nsp: inputs["labels"]
            .get("next_sentence_label")
            .map(|v| serde_json::from_value(v.clone()).unwrap()),
    }
}

pub fn vars(varmap: &VarMap) -> HashMap<String, Var> {
    varmap.data().lock().unwrap().clone()
}

/// Max |a - b| over max |b|, and max |b|.
pub fn rel_diff(a: &Tensor, b: &Tensor) -> (f32, f32) {
    let scale = super::max_abs(b);
    (super::max_abs_diff(a, b) / scale.max(1e-12), scale)
}

/// The fixture's model as head `kind` on trainable variables.
pub fn fixture_model(dir: &std::path::Path, kind: HeadKind) -> (VarMap, BertForTask) {
    let config = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let mut varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = BertForTask::load(vb, config, kind).unwrap();
    varmap.load(dir.join("model.safetensors")).unwrap();
    (varmap, model)
}

/// The gradients of the fixture's `grad_params` against transformers', to
/// 1e-4 relative (0, but for rounding, where transformers' are: e.g. QA's
/// last LayerNorm bias, as each softmax's gradient sums to 0).
pub fn assert_fixture_gradients(
    name: &str,
    dir: &std::path::Path,
    varmap: &VarMap,
    grads: &GradStore,
    expected: &HashMap<String, Tensor>,
) {
    let inputs = read_json(&dir.join("inputs.json"));
    let vars = vars(varmap);
    let params = inputs["grad_params"].as_array().unwrap();
    // The tiny fixtures name 3 (RoBERTa's) to 9 tensors; the candle
    // comparisons below check every tensor.
    assert!(params.len() >= 3, "{name}: {} gradients", params.len());
    for p in params {
        let p = p.as_str().unwrap();
        let g = super::grad_of(grads, &vars, p, name);
        let (rel, scale) = rel_diff(g, &expected[&format!("grad.{p}")]);
        println!("{name} grad.{p}: {rel:.2e} of max {scale:.2e}");
        if scale < 1e-6 {
            assert!(super::max_abs(g) <= 1e-6, "{name} grad.{p} should be 0");
            continue;
        }
        assert!(rel <= 1e-4, "{name} grad.{p}: {rel:e} relative");
    }
}

pub fn random_rows(vocab: u32, nsp: bool) -> Rows {
    let lens = [12usize, 5, 30, 1, 17];
    let mut state = 12345u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut rows = Rows {
        ids: vec![],
        types: vec![],
        labels: vec![],
        nsp: nsp.then(Vec::new),
    };
    for (s, &n) in lens.iter().enumerate() {
        rows.ids
            .push((0..n).map(|_| 1 + next(vocab as u64 - 1) as u32).collect());
        rows.types
            .push((0..n).map(|p| u32::from(p >= n / 2)).collect());
        rows.labels.push(
            (0..n)
                .map(|_| {
                    if next(4) == 0 {
                        next(vocab as u64) as i64
                    } else {
                        IGNORE_INDEX
                    }
                })
                .collect(),
        );
        if let Some(v) = rows.nsp.as_mut() {
            v.push(if s == 1 { IGNORE_INDEX } else { (s % 2) as i64 });
        }
    }
    rows
}

pub fn sequences<'a>(ids: &'a [Vec<u32>], types: &'a [Vec<u32>]) -> Vec<(&'a [u32], &'a [u32])> {
    ids.iter()
        .zip(types)
        .map(|(i, t)| (&i[..], &t[..]))
        .collect()
}

/// Labels of every kind for the rows of `random_rows`.
pub struct HeadLabelsOf {
    pub classes: Vec<i64>,
    pub values: Vec<f32>,
    pub tokens: Vec<Vec<i64>>,
}

/// QA's answers `(start, end)` per sequence as the candle head takes them:
/// `start_positions` and `end_positions`, [N] each.
pub fn span_positions(spans: &[(i64, i64)]) -> (Tensor, Tensor) {
    let (starts, ends): (Vec<i64>, Vec<i64>) = spans.iter().copied().unzip();
    let n = spans.len();
    (
        Tensor::from_vec(starts, n, &Device::Cpu).unwrap(),
        Tensor::from_vec(ends, n, &Device::Cpu).unwrap(),
    )
}

pub fn head_labels(rows: &Rows, c: usize) -> HeadLabelsOf {
    let n = rows.ids.len();
    HeadLabelsOf {
        // One sequence without a label.
        classes: (0..n)
            .map(|s| {
                if s == 2 {
                    IGNORE_INDEX
                } else {
                    ((s * 7) % c) as i64
                }
            })
            .collect(),
        values: (0..n * c).map(|i| ((i * 5) % 3) as f32 * 0.5).collect(),
        tokens: rows
            .labels
            .iter()
            .map(|l| {
                l.iter()
                    .map(|&y| if y == IGNORE_INDEX { y } else { y % c as i64 })
                    .collect()
            })
            .collect(),
    }
}

/// The candle head's loss and gradients on `rows`, padded with the
/// model's padding id, with `labels`.
pub fn candle_head_step(
    model: &BertForTask,
    rows: &Rows,
    labels: &HeadLabels,
    seed: u64,
) -> (f64, GradStore) {
    let pad = model.config().pad_token_id;
    let input = BertInput::from_ids(&rows.ids, &rows.types, pad, &Device::Cpu).unwrap();
    let opts = HeadOptions::from(ForwardOptions {
        train: true,
        ..ForwardOptions::default()
    });
    seed_dropout(seed, 0);
    let out = model.forward(&input, labels, opts).unwrap();
    let loss = out.loss().unwrap();
    (
        loss.to_scalar::<f32>().unwrap() as f64,
        loss.backward().unwrap(),
    )
}

/// Every gradient of `want` (the candle path's) in `got`, within 1e-4
/// relative; returns how many were compared.
pub fn assert_same_gradients(
    what: &str,
    varmap: &VarMap,
    got: &GradStore,
    want: &GradStore,
) -> usize {
    let mut checked = 0;
    for (name, var) in vars(varmap) {
        let Some(w) = want.get(var.as_tensor()) else {
            continue;
        };
        let g = got
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{what}: no gradient for {name}"));
        let (rel, scale) = rel_diff(g, w);
        if scale < 1e-6 {
            assert!(super::max_abs(g) <= 1e-6, "{what} {name}: should be 0");
            continue;
        }
        assert!(
            rel <= 1e-4,
            "{what} {name}: {rel:e} relative (max {scale:e})"
        );
        checked += 1;
    }
    checked
}

/// A step with other dropout masks (`other_loss`, `other`) fails the
/// checks the step with the candle path's masks passed: its loss is off by
/// more than 1e-5 relative, or a gradient by more than 1e-4 relative.
/// Asserting this on the gradients too keeps the check from failing by
/// chance: two mask sets can give losses within 1e-4 of each other on a
/// random model (small logits), but not the same gradients.
pub fn assert_other_masks_differ(
    what: &str,
    varmap: &VarMap,
    (other_loss, other): (f64, &GradStore),
    (want_loss, want): (f64, &GradStore),
) {
    if (other_loss - want_loss).abs() > 1e-5 * want_loss.abs() {
        return;
    }
    let worst = vars(varmap)
        .values()
        .filter_map(|var| {
            let (g, w) = (other.get(var.as_tensor())?, want.get(var.as_tensor())?);
            Some(rel_diff(g, w).0)
        })
        .fold(0f32, f32::max);
    assert!(
        worst > 1e-4,
        "{what}: other masks make no difference (loss {other_loss} vs {want_loss}, gradients within {worst:e})"
    );
}

/// Every gradient of `want` (fp32) that is not ~0 points the way `got`'s
/// (bf16 products) does: cosine ≥ 0.999. Returns how many were compared.
pub fn assert_same_directions(varmap: &VarMap, got: &GradStore, want: &GradStore) -> usize {
    let mut checked = 0;
    for (name, var) in vars(varmap) {
        let (Some(g), Some(w)) = (got.get(var.as_tensor()), want.get(var.as_tensor())) else {
            continue;
        };
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (g, w) = (flat(g), flat(w));
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        if norm(&w) < 1e-6 {
            continue;
        }
        let dot: f64 = g
            .iter()
            .zip(&w)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let cos = dot / (norm(&g) * norm(&w));
        assert!(cos >= 0.999, "{name}: cosine {cos}");
        checked += 1;
    }
    checked
}

/// The scalar `loss` of a fixture's expected tensors.
pub fn expected_loss(expected: &HashMap<String, Tensor>) -> f64 {
    expected["loss"]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0] as f64
}
