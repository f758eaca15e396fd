//! ModernBERT on the packed fast path against transformers 5.24
//! (`tests/fixtures/families/modernbert-*`): the last hidden state and
//! every head's logits within 1e-4 and losses within 1e-5 relative, both
//! config layouts, the 200-token input whose window (16) matters, texts
//! of several lengths packed end to end; bf16 and int8 close to fp32.
//! (That the pipelines take this path: `modernbert_parity.rs`.)
//! Run under every `BERTHA_ISA` (the products differ by rounding only).

mod common;

use std::path::PathBuf;

use bertha::fast::PackedBert;
use bertha::{
    BertForTask, BertInput, BertModel, BertOutput, Device, ForwardOptions, HeadInit, HeadLabels,
    HeadOptions, Tensor,
};
use common::{fixtures, load_safetensors, read_json};

fn dir_of(name: &str) -> PathBuf {
    fixtures().join("families").join(name)
}

/// The fixture's texts, unpadded, and its padded input.
fn texts(name: &str) -> (Vec<Vec<u32>>, BertInput) {
    let inputs = read_json(&dir_of(name).join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let (ids, mask) = (get("input_ids"), get("attention_mask"));
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    let input = BertInput {
        input_ids: flat(&ids),
        token_type_ids: None,
        attention_mask: Some(flat(&mask)),
    };
    let unpadded = ids
        .iter()
        .zip(&mask)
        .map(|(i, m)| {
            i.iter()
                .zip(m)
                .filter(|(_, &m)| m == 1)
                .map(|(&i, _)| i)
                .collect()
        })
        .collect();
    (unpadded, input)
}

fn labels(name: &str, b: usize, t: usize) -> Option<Tensor> {
    let inputs = read_json(&dir_of(name).join("inputs.json"));
    let l = &inputs.get("labels")?["labels"];
    Some(match serde_json::from_value::<Vec<Vec<i64>>>(l.clone()) {
        Ok(rows) => Tensor::from_vec(rows.concat(), (b, t), &Device::Cpu).unwrap(),
        Err(_) => {
            let ids: Vec<i64> = serde_json::from_value(l.clone()).unwrap();
            Tensor::from_vec(ids, b, &Device::Cpu).unwrap()
        }
    })
}

fn packed(model: &BertModel) -> PackedBert {
    PackedBert::from_model(model)
        .unwrap()
        .expect("ModernBERT takes the fast path")
}

fn no_types(ids: &[Vec<u32>]) -> Vec<(&[u32], &[u32])> {
    ids.iter().map(|s| (&s[..], &[][..])).collect()
}

/// The fast path's states as a padded [B, T, D] last hidden state, zeros
/// at padding.
fn padded(states: &bertha::fast::PackedStates, t: usize) -> Tensor {
    let (b, d) = (states.len(), states.hidden);
    let mut data = vec![0f32; b * t * d];
    for s in 0..b {
        let rows = states.sequence(s);
        data[s * t * d..s * t * d + rows.len()].copy_from_slice(rows);
    }
    Tensor::from_vec(data, (b, t, d), &Device::Cpu).unwrap()
}

/// Every head fixture (both config layouts): the encoder's output against
/// transformers' last hidden state, then the head on it against its
/// logits and loss.
#[test]
fn modernbert_fast_heads_match_transformers() {
    let mut failures = Vec::new();
    for name in [
        "modernbert-mlm",
        "modernbert-mlm-legacy",
        "modernbert-seqcls",
        "modernbert-tokcls",
    ] {
        let dir = dir_of(name);
        let m = BertForTask::from_dir(&dir, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let (ids, input) = texts(name);
        let (b, t) = input.input_ids.dims2().unwrap();
        let states = packed(m.bert()).forward(&no_types(&ids)).unwrap();
        let hidden = &expected["hidden_states"];
        let last = hidden.get(hidden.dim(0).unwrap() - 1).unwrap();
        let got = padded(&states, t);
        let mut dh = 0f32;
        for (s, seq) in ids.iter().enumerate() {
            dh = dh.max(common::diff_unpadded(&got, &last, s, seq.len(), &[0]));
        }
        let pooler_output = m
            .bert()
            .pooled(&got, input.attention_mask.as_ref())
            .unwrap();
        let encoded = BertOutput {
            last_hidden_state: got,
            pooler_output,
            hidden_states: None,
            attentions: None,
        };
        let labels = labels(name, b, t);
        let out = m
            .forward_encoded(
                &input,
                &encoded,
                &HeadLabels::labels(labels.as_ref()),
                HeadOptions::default(),
            )
            .unwrap();
        let bertha::model::TaskOutput::Logits(out) = out else {
            panic!("{name}: not a logits head")
        };
        let want = &expected["logits"];
        let mut dl = 0f32;
        if out.logits.rank() == 3 {
            for (s, seq) in ids.iter().enumerate() {
                dl = dl.max(common::diff_unpadded(&out.logits, want, s, seq.len(), &[0]));
            }
        } else {
            dl = common::max_abs_diff(&out.logits, want);
        }
        let (got_loss, want_loss) = (
            common::scalar(&out.loss.unwrap()),
            common::scalar(&expected["loss"]),
        );
        let rel = ((got_loss - want_loss) / want_loss).abs();
        println!("{name}: last hidden {dh:.2e}, logits {dl:.2e}, loss rel {rel:.2e}");
        if dh > 1e-4 || dl > 1e-4 || rel > 1e-5 {
            failures.push(format!(
                "{name}: hidden {dh:e}, logits {dl:e}, loss rel {rel:e}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// 200 tokens, window 16: the banded local layers against transformers;
/// packed beside two shorter texts (one inside a window, one across a
/// few), each against the candle modules on it alone; and `forward_at`
/// rows equal to the whole pass's.
#[test]
fn modernbert_fast_long_input_matches_transformers() {
    let name = "modernbert-long";
    let dir = dir_of(name);
    let m = BertModel::from_dir(&dir, &Device::Cpu).unwrap();
    let expected = load_safetensors(&dir.join("expected.safetensors"));
    let (ids, _) = texts(name);
    assert_eq!(ids[0].len(), 200);
    let fast = packed(&m);
    let texts = vec![ids[0][..37].to_vec(), ids[0].clone(), ids[0][..5].to_vec()];
    let states = fast.forward(&no_types(&texts)).unwrap();
    let want = expected["last_hidden_state"].get(0).unwrap();
    let got = Tensor::from_slice(states.sequence(1), (200, 32), &Device::Cpu).unwrap();
    let d = common::max_abs_diff(&got, &want);
    println!("{name}: last hidden {d:.2e}");
    assert!(d <= 1e-4, "long input: {d:e}");
    for s in [0, 2] {
        let n = texts[s].len();
        let input = BertInput {
            input_ids: Tensor::from_slice(&texts[s], (1, n), &Device::Cpu).unwrap(),
            token_type_ids: None,
            attention_mask: None,
        };
        let want = m
            .forward(&input, ForwardOptions::default())
            .unwrap()
            .last_hidden_state
            .squeeze(0)
            .unwrap();
        let got = Tensor::from_slice(states.sequence(s), (n, 32), &Device::Cpu).unwrap();
        let d = common::max_abs_diff(&got, &want);
        assert!(d <= 1e-4, "{n} tokens packed beside others: {d:e}");
    }
    let rows = [36, 0, 4];
    let at = fast.forward_at(&no_types(&texts), &rows).unwrap();
    for (s, &r) in rows.iter().enumerate() {
        assert_eq!(at.sequence(s), &states.sequence(s)[r * 32..(r + 1) * 32]);
    }
}

/// bf16 and int8 run ModernBERT too, close to fp32 (cosine of each
/// token's state); fill-mask takes int8.
#[test]
fn modernbert_fast_reduced_precisions_stay_close() {
    let dir = dir_of("modernbert-long");
    let m = BertModel::from_dir(&dir, &Device::Cpu).unwrap();
    let (ids, _) = texts("modernbert-long");
    let texts = vec![ids[0].clone(), ids[0][..20].to_vec()];
    let seqs = no_types(&texts);
    let want = packed(&m).forward(&seqs).unwrap();
    let mut bf16 = packed(&m);
    bf16.to_bf16();
    let mut int8 = packed(&m);
    int8.quantize_int8(&seqs).unwrap();
    for (what, fast, floor) in [("bf16", &bf16, 0.999), ("int8", &int8, 0.99)] {
        let got = fast.forward(&seqs).unwrap();
        let mut worst = 1f32;
        for (g, w) in got.data.chunks(32).zip(want.data.chunks(32)) {
            let dot: f32 = g.iter().zip(w).map(|(x, y)| x * y).sum();
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            worst = worst.min(dot / (norm(g) * norm(w)));
        }
        println!("{what}: worst token cosine {worst}");
        assert!(worst >= floor, "{what}: cosine {worst}");
    }
}
