//! The BERT family on the tiny transformers checkpoints (RoBERTa,
//! DistilBERT, ALBERT, DeBERTa-v2, each with its MLM head): logits,
//! every hidden state and attention map at non-padded positions within
//! 1e-4, the MLM loss within 1e-5 relative, and the gradients of the
//! listed parameters within 1e-4 of the tensor's max abs value.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use bertha::fast::PackedBert;
use bertha::model::BertForMaskedLM;
use bertha::{
    BertConfig, BertForTask, BertHead, BertInput, DType, Device, ForwardOptions, HeadInit,
    HeadKind, Tensor,
};
use candle_nn::{VarBuilder, VarMap};
use common::{fixtures, load_safetensors, read_json};

const FAMILY: [&str; 4] = [
    "roberta-mlm",
    "distilbert-mlm",
    "albert-mlm",
    "deberta-v2-mlm",
];

struct Case {
    input: BertInput,
    lens: Vec<usize>,
    labels: Tensor,
    expected: HashMap<String, Tensor>,
    grad_params: Vec<String>,
    dir: PathBuf,
}

fn case(name: &str) -> Case {
    let dir = fixtures().join("tiny").join(name);
    let inputs = read_json(&dir.join("inputs.json"));
    let get = |k: &str| common::input_rows(&inputs, k);
    let ids = get("input_ids").unwrap();
    let mask = get("attention_mask").unwrap();
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    let labels: Vec<Vec<i64>> = serde_json::from_value(inputs["labels"]["labels"].clone()).unwrap();
    Case {
        input: BertInput {
            input_ids: flat(&ids),
            token_type_ids: get("token_type_ids").as_ref().map(flat),
            attention_mask: Some(flat(&mask)),
        },
        lens: mask
            .iter()
            .map(|m| m.iter().filter(|&&x| x == 1).count())
            .collect(),
        labels: Tensor::from_vec(labels.concat(), (b, t), &Device::Cpu).unwrap(),
        expected: load_safetensors(&dir.join("expected.safetensors")),
        grad_params: serde_json::from_value(inputs["grad_params"].clone()).unwrap(),
        dir,
    }
}

fn all_outputs() -> ForwardOptions {
    ForwardOptions {
        output_hidden_states: true,
        output_attentions: true,
        train: false,
    }
}

/// Returns the worst differences (logits, hidden, attentions, loss rel).
fn check(name: &str) -> (f32, f32, f32, f32) {
    let c = case(name);
    let m = BertForMaskedLM::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let out = m
        .forward(&c.input, Some(&c.labels), all_outputs())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let want_hidden = &c.expected["hidden_states"]; // [L+1, B, T, D]
    let want_att = &c.expected["attentions"]; // [L, B, H, T, T]
    let hidden = out.hidden_states.expect("hidden states");
    let att = out.attentions.expect("attentions");
    assert_eq!(
        hidden.len(),
        want_hidden.dim(0).unwrap(),
        "{name}: hidden states"
    );
    assert_eq!(att.len(), want_att.dim(0).unwrap(), "{name}: attentions");
    let hidden = Tensor::stack(&hidden, 0).unwrap().transpose(0, 1).unwrap();
    let att = Tensor::stack(&att, 0).unwrap().transpose(0, 1).unwrap();
    let want_hidden = want_hidden.transpose(0, 1).unwrap(); // [B, L+1, T, D]
    let want_att = want_att.transpose(0, 1).unwrap(); // [B, L, H, T, T]
    assert_eq!(
        out.logits.dims(),
        c.expected["logits"].dims(),
        "{name}: logits"
    );
    assert_eq!(hidden.dims(), want_hidden.dims(), "{name}: hidden");
    assert_eq!(att.dims(), want_att.dims(), "{name}: attentions");
    let (mut dl, mut dh, mut da) = (0f32, 0f32, 0f32);
    for (b, &n) in c.lens.iter().enumerate() {
        dl = dl.max(common::diff_unpadded(
            &out.logits,
            &c.expected["logits"],
            b,
            n,
            &[0],
        ));
        dh = dh.max(common::diff_unpadded(&hidden, &want_hidden, b, n, &[1]));
        da = da.max(common::diff_unpadded(&att, &want_att, b, n, &[2, 3]));
    }
    let got_loss = common::scalar(&out.loss.expect("loss"));
    let want_loss = common::scalar(&c.expected["loss"]);
    let rel = ((got_loss - want_loss) / want_loss).abs();
    (dl, dh, da, rel)
}

#[test]
fn family_mlm_outputs_match_transformers() {
    let mut failures = Vec::new();
    for name in FAMILY {
        let (dl, dh, da, rel) = check(name);
        println!(
            "{name}: logits {dl:.2e}, hidden {dh:.2e}, attentions {da:.2e}, loss rel {rel:.2e}"
        );
        if dl > 1e-4 || dh > 1e-4 || da > 1e-4 || rel > 1e-5 {
            failures.push(format!(
                "{name}: logits {dl:e}, hidden {dh:e}, attentions {da:e}, loss rel {rel:e}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn family_checkpoints_pick_their_head_and_the_packed_path_but_deberta() {
    for name in FAMILY {
        let dir = fixtures().join("tiny").join(name);
        let m = BertForTask::from_dir(&dir, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
        assert_eq!(m.kind(), HeadKind::MaskedLM, "{name}");
        // The packed fast path runs the families with BERT's layers
        // (tests/family_fast_inference.rs); DeBERTa-v2's relative
        // attention runs on the candle modules.
        assert_eq!(
            PackedBert::from_model(m.bert()).unwrap().is_some(),
            name != "deberta-v2-mlm",
            "{name}"
        );
        // These MLM checkpoints have no classifier: a clear error names it.
        let err = BertForTask::from_dir(
            &dir,
            Some(HeadKind::TokenClassification),
            HeadInit::FromCheckpoint,
            &Device::Cpu,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ForTokenClassification") && err.contains("classifier.weight"),
            "{name}: {err}"
        );
    }
}

#[test]
fn roberta_positions_count_from_the_padding_index() {
    // Rows: no padding; padding in the middle; right padding.
    let ids = Tensor::from_vec(vec![0u32, 5, 6, 0, 1, 7, 2, 1, 1], (3, 3), &Device::Cpu).unwrap();
    let pos = bertha::model::roberta_position_ids(&ids, 1)
        .unwrap()
        .to_vec2::<u32>()
        .unwrap();
    assert_eq!(pos, vec![vec![2, 3, 4], vec![2, 1, 3], vec![2, 1, 1]]);
}

/// Every parameter listed in `inputs.json` (embeddings, encoder and head)
/// gets transformers' gradient for the MLM loss.
#[test]
fn family_gradients_match_transformers() {
    let mut failures = Vec::new();
    for name in FAMILY {
        let c = case(name);
        let config = BertConfig::from_file(&c.dir.join("config.json")).unwrap();
        let mut varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let m = BertForMaskedLM::load(vb, config).unwrap();
        varmap.load(c.dir.join("model.safetensors")).unwrap();
        let opts = ForwardOptions::default();
        let loss = m
            .forward(&c.input, Some(&c.labels), opts)
            .unwrap()
            .loss
            .unwrap();
        let grads = loss.backward().unwrap();
        let vars = varmap.data().lock().unwrap();
        failures.extend(common::gradient_failures(
            name,
            &grads,
            &vars,
            &c.grad_params,
            &c.expected,
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// fill-mask on every family checkpoint: the mask token of its
/// vocabulary (`[MASK]`, or RoBERTa's `<mask>` with `<s>`/`</s>` around
/// the text), candidates in descending order, and each score the softmax
/// of the MLM logits at the mask, computed here from the model directly.
#[test]
fn fill_mask_runs_on_the_family() {
    use bertha::tasks::FillMask;
    for (name, text) in [
        ("roberta-mlm", "tok5 <mask> tok7 tok8"),
        ("distilbert-mlm", "the [MASK] of the world"),
        ("albert-mlm", "the [MASK] of the world"),
        ("deberta-v2-mlm", "the [MASK] of the world"),
    ] {
        let dir = fixtures().join("tiny").join(name);
        let fm = FillMask::from_dir(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        let enc = fm.tokenizer().encode(text).unwrap();
        if name == "roberta-mlm" {
            assert_eq!(fm.mask_token(), "<mask>");
            // <s> tok5 <mask> tok7 tok8 </s>
            assert_eq!(enc.input_ids, vec![0, 10, 4, 12, 13, 2]);
        }
        let pos = enc
            .tokens
            .iter()
            .position(|t| t == fm.mask_token())
            .unwrap();
        let got = fm.fill(text, 5).unwrap();
        assert_eq!(got.len(), 1, "{name}: one mask");
        let m = BertForMaskedLM::from_dir(&dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
        let n = enc.input_ids.len();
        let input = BertInput {
            input_ids: Tensor::from_vec(enc.input_ids.clone(), (1, n), &Device::Cpu).unwrap(),
            token_type_ids: None,
            attention_mask: None,
        };
        let logits = m
            .forward(&input, None, ForwardOptions::default())
            .unwrap()
            .logits;
        let row = logits
            .get(0)
            .unwrap()
            .get(pos)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        let mut last = f32::INFINITY;
        for p in &got[0] {
            let want = ((row[p.token as usize] as f64 - max).exp() / sum) as f32;
            assert!((p.score - want).abs() < 1e-6, "{name}: {p:?} vs {want}");
            assert!(p.score <= last, "{name}: order");
            last = p.score;
        }
        let err = fm.fill("no mask here", 5).unwrap_err().to_string();
        assert!(err.contains(fm.mask_token()), "{name}: {err}");
    }
}
