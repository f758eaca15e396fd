//! The packed inference path (`PackedBert`, what `embed`, `serve` and the
//! bf16 / int8 pipelines run) on the families with BERT's layers:
//! RoBERTa (positions from the padding id), DistilBERT (no token types),
//! ALBERT (narrow embeddings projected, one layer shared by every step)
//! and ELECTRA (narrow embeddings projected). Each text's last hidden
//! state equals transformers' on the tiny checkpoints within 1e-4, and
//! the one-row-per-text pass (`forward_at`) equals the full pass's rows.
//! DeBERTa-v2 stays on the candle modules.

mod common;

use std::path::Path;

use bertha::fast::PackedBert;
use bertha::{BertForTask, BertInput, Device, ForwardOptions, HeadInit, Tensor};
use common::{fixtures, load_safetensors, read_json};

/// (folder under tests/fixtures, what it exercises).
const CASES: [(&str, &str); 4] = [
    ("tiny/roberta-mlm", "positions from the padding id"),
    ("tiny/distilbert-mlm", "no token types"),
    ("tiny/albert-mlm", "projected embeddings, shared layers"),
    ("families/electra-discriminator", "projected embeddings"),
];

struct Texts {
    ids: Vec<Vec<u32>>,
    types: Vec<Vec<u32>>,
}

impl Texts {
    /// The fixture's rows without their padding.
    fn of(dir: &Path) -> Self {
        let inputs = read_json(&dir.join("inputs.json"));
        let rows = |k: &str| common::input_rows(&inputs, k);
        let mask = rows("attention_mask").unwrap();
        let lens: Vec<usize> = mask
            .iter()
            .map(|m| m.iter().sum::<u32>() as usize)
            .collect();
        let ids = rows("input_ids").unwrap();
        let types = rows("token_type_ids")
            .unwrap_or_else(|| ids.iter().map(|r| vec![0; r.len()]).collect());
        let cut = |v: Vec<Vec<u32>>| {
            v.into_iter()
                .zip(&lens)
                .map(|(r, &n)| r[..n].to_vec())
                .collect()
        };
        Self {
            ids: cut(ids),
            types: cut(types),
        }
    }

    fn pairs(&self) -> Vec<(&[u32], &[u32])> {
        self.ids
            .iter()
            .zip(&self.types)
            .map(|(i, t)| (&i[..], &t[..]))
            .collect()
    }
}

fn packed(dir: &Path) -> (BertForTask, PackedBert) {
    let m = BertForTask::from_dir(dir, None, HeadInit::FromCheckpoint, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let p = PackedBert::from_model(m.bert())
        .unwrap()
        .unwrap_or_else(|| panic!("{}: the packed path refused it", dir.display()));
    (m, p)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn packed_families_match_transformers_last_hidden_state() {
    let mut failures = Vec::new();
    for (name, what) in CASES {
        let dir = fixtures().join(name);
        let (_, p) = packed(&dir);
        let texts = Texts::of(&dir);
        let states = p.forward(&texts.pairs()).unwrap();
        let hidden = &load_safetensors(&dir.join("expected.safetensors"))["hidden_states"];
        let last = hidden.get(hidden.dim(0).unwrap() - 1).unwrap(); // [B, T, D]
        let mut worst = 0f32;
        for (b, ids) in texts.ids.iter().enumerate() {
            let want = last.get(b).unwrap().narrow(0, 0, ids.len()).unwrap();
            let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            worst = worst.max(max_diff(states.sequence(b), &want));
        }
        println!("{name} ({what}): last hidden state within {worst:.2e}");
        if worst > 1e-4 {
            failures.push(format!("{name}: {worst:e}"));
        }
        // One row per text (the [CLS] readers): the full pass's rows.
        let rows: Vec<usize> = texts.ids.iter().map(|i| i.len() / 2).collect();
        let at = p.forward_at(&texts.pairs(), &rows).unwrap();
        for (b, &r) in rows.iter().enumerate() {
            let d = p.hidden_size();
            let full = &states.sequence(b)[r * d..(r + 1) * d];
            let diff = max_diff(at.sequence(b), full);
            if diff > 1e-5 {
                failures.push(format!("{name}: forward_at row {r} of text {b}: {diff:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A RoBERTa text holding its padding id among real tokens: that token
/// takes position `padding_idx` and the count goes on after it, as
/// transformers' `create_position_ids_from_input_ids` (and the candle
/// modules) do; a text one position too long is refused, naming it.
#[test]
fn packed_roberta_positions_skip_the_padding_id() {
    let dir = fixtures().join("tiny/roberta-mlm");
    let (m, p) = packed(&dir);
    let ids = vec![0u32, 985, 1, 744, 307, 1, 947, 2];
    let types = vec![0u32; ids.len()];
    let got = p.forward(&[(&ids[..], &types[..])]).unwrap();
    let input = BertInput {
        input_ids: Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap(),
        token_type_ids: None,
        attention_mask: None,
    };
    let want = m
        .bert()
        .forward(&input, ForwardOptions::default())
        .unwrap()
        .last_hidden_state
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let diff = max_diff(got.sequence(0), &want);
    assert!(diff <= 1e-5, "padding id inside a text: {diff:e}");

    // Of the position table's rows, the first two (0, and the padding
    // id 1) are never a token's: all but two fit.
    let max = m.bert().config().max_position_embeddings;
    let fits = vec![5u32; max - 2];
    let zeros = vec![0u32; max - 1];
    assert!(p.forward(&[(&fits[..], &zeros[..max - 2])]).is_ok());
    let long = vec![5u32; max - 1];
    let Err(err) = p.forward(&[(&long[..], &zeros[..])]) else {
        panic!("{} tokens were taken", max - 1)
    };
    let err = err.to_string();
    assert!(
        err.contains(&format!("{} tokens", max - 1))
            && err.contains(&format!(
                "({}, from max_position_embeddings {max})",
                max - 2
            )),
        "{err}"
    );
}

/// int8 on ALBERT's shared layer: calibration watches every step that
/// runs it, and the quantized pass stays close to fp32 (mean-pooled
/// cosine ≥ 0.999 on each text).
#[test]
fn packed_albert_quantizes_its_shared_layer() {
    let dir = fixtures().join("tiny/albert-mlm");
    let (_, mut p) = packed(&dir);
    let texts = Texts::of(&dir);
    let f32_states = p.forward(&texts.pairs()).unwrap();
    p.quantize_int8(&texts.pairs()).unwrap();
    let i8_states = p.forward(&texts.pairs()).unwrap();
    let d = p.hidden_size();
    let mean = |s: &[f32]| -> Vec<f32> {
        let rows = s.len() / d;
        (0..d)
            .map(|j| (0..rows).map(|r| s[r * d + j]).sum::<f32>() / rows as f32)
            .collect()
    };
    for b in 0..texts.ids.len() {
        let (x, y) = (mean(f32_states.sequence(b)), mean(i8_states.sequence(b)));
        let dot: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        let cos = dot / (norm(&x) * norm(&y));
        assert!(cos >= 0.999, "text {b}: cosine {cos}");
    }
}
