//! The sequence classifiers of the families whose head is not BERT's
//! pooler, on tiny transformers checkpoints (`make_seqcls_fixtures.py`):
//! RoBERTa (dropout → `classifier.dense` → tanh → dropout →
//! `classifier.out_proj`), DistilBERT (`pre_classifier` → ReLU → dropout →
//! `classifier`), DeBERTa-v2 (ContextPooler → dropout → `classifier`) and
//! ALBERT (BERT's pooler, named `albert.pooler`).
//! Logits and every hidden state within 1e-4, the loss within 1e-5
//! relative, gradients within 1e-4 of the tensor's max, and fresh heads
//! under transformers' names.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use bertha::model::BertForSequenceClassification;
use bertha::{
    BertConfig, BertForTask, BertHead, BertInput, DType, Device, ForwardOptions, HeadInit,
    HeadKind, HeadLabels, HeadOutput, Tensor,
};
use candle_nn::{VarBuilder, VarMap};
use common::{fixtures, load_safetensors, read_json};

const CLASSIFIERS: [&str; 4] = [
    "roberta-seqcls",
    "distilbert-seqcls",
    "deberta-v2-seqcls",
    "albert-seqcls",
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
    let (ids, mask) = (get("input_ids").unwrap(), get("attention_mask").unwrap());
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    let labels: Vec<i64> = serde_json::from_value(inputs["labels"]["labels"].clone()).unwrap();
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
        labels: Tensor::from_vec(labels, b, &Device::Cpu).unwrap(),
        expected: load_safetensors(&dir.join("expected.safetensors")),
        grad_params: serde_json::from_value(inputs["grad_params"].clone()).unwrap(),
        dir,
    }
}

#[test]
fn family_classifiers_match_transformers() {
    let mut failures = Vec::new();
    for name in CLASSIFIERS {
        let c = case(name);
        let m =
            BertForSequenceClassification::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        // ALBERT's classifier reads BERT's pooler; the others their own head.
        let own_head = name != "albert-seqcls";
        assert_eq!(m.first_token().is_some(), own_head, "{name}: the head");
        let opts = ForwardOptions {
            output_hidden_states: true,
            ..ForwardOptions::default()
        };
        let out: HeadOutput = BertHead::forward(
            &m,
            &c.input,
            &HeadLabels::labels(Some(&c.labels)),
            opts.into(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let dl = common::max_abs_diff(&out.logits, &c.expected["logits"]);
        let hidden = out.hidden_states.as_ref().expect("hidden states");
        let hidden = Tensor::stack(hidden, 0).unwrap().transpose(0, 1).unwrap();
        let want_hidden = c.expected["hidden_states"].transpose(0, 1).unwrap();
        assert_eq!(hidden.dims(), want_hidden.dims(), "{name}: hidden states");
        let dh = c
            .lens
            .iter()
            .enumerate()
            .map(|(b, &n)| common::diff_unpadded(&hidden, &want_hidden, b, n, &[1]))
            .fold(0f32, f32::max);
        let (got, want) = (
            common::scalar(out.loss.as_ref().expect("a loss")),
            common::scalar(&c.expected["loss"]),
        );
        let rel = ((got - want) / want).abs();
        println!("{name}: logits {dl:.2e}, hidden {dh:.2e}, loss rel {rel:.2e}");
        if dl > 1e-4 || dh > 1e-4 || rel > 1e-5 {
            failures.push(format!(
                "{name}: logits {dl:e}, hidden {dh:e}, loss {got} vs {want}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The encoder's, the first-token head's and the classifier's gradients.
#[test]
fn family_classifier_gradients_match_transformers() {
    let mut failures = Vec::new();
    for name in CLASSIFIERS {
        let c = case(name);
        let config = BertConfig::from_file(&c.dir.join("config.json")).unwrap();
        let mut varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let m = BertForTask::load(vb, config, HeadKind::SequenceClassification).unwrap();
        varmap.load(c.dir.join("model.safetensors")).unwrap();
        let labels = HeadLabels::labels(Some(&c.labels));
        let out = m
            .forward(&c.input, &labels, ForwardOptions::default().into())
            .unwrap();
        let grads = out.loss().unwrap().backward().unwrap();
        let vars = varmap.data().lock().unwrap();
        assert!(
            c.grad_params.len() >= 6,
            "{name}: the head's tensors listed"
        );
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

/// A fresh classifier on each family's MLM checkpoint holds exactly the
/// tensors transformers' class has, so the folder bertha saves loads back
/// into it without fresh (random) layers.
#[test]
fn fresh_family_classifiers_use_transformers_names() {
    for (mlm, seqcls) in [
        ("roberta-mlm", "roberta-seqcls"),
        ("distilbert-mlm", "distilbert-seqcls"),
        ("deberta-v2-mlm", "deberta-v2-seqcls"),
        ("albert-mlm", "albert-seqcls"),
    ] {
        let dir = fixtures().join("tiny").join(mlm);
        let mut config = BertConfig::from_file(&dir.join("config.json")).unwrap();
        config.id2label = (0..3).map(|i| (i, format!("L{i}"))).collect();
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        BertForTask::load(vb, config, HeadKind::SequenceClassification).unwrap();
        let mut ours: Vec<String> = varmap.data().lock().unwrap().keys().cloned().collect();
        let theirs = load_safetensors(
            &fixtures()
                .join("tiny")
                .join(seqcls)
                .join("model.safetensors"),
        );
        let mut theirs: Vec<String> = theirs.into_keys().collect();
        // Buffers are not parameters.
        theirs.retain(|n| !n.ends_with("position_ids"));
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "{mlm}");
    }
}
