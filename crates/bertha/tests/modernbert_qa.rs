//! ModernBERT's question-answering head (`ModernBertForQuestionAnswering`:
//! `head` on every token → dropout → `classifier` with two outputs)
//! against transformers 5.24 (`tests/fixtures/families/modernbert-qa`, made
//! by `make_modernbert_qa_fixture.py`): the start and end logits of every
//! row (the padding rows too, which the loss reads, some past the sliding
//! window's reach), the loss and the gradients; then fine-tuning on both
//! engines, a saved folder in transformers' names and the QA pipeline on it.

mod common;

use std::path::PathBuf;

use bertha::data::{DataOptions, Task};
use bertha::tasks::QuestionAnswerer;
use bertha::training::{Engine, FinetuneOptions, Finetuner};
use bertha::{
    BertConfig, BertForTask, BertInput, DType, Device, HeadInit, HeadKind, HeadLabels, HeadOptions,
    Tensor,
};
use candle_nn::{VarBuilder, VarMap};
use common::{fixtures, load_safetensors, read_json};

fn dir() -> PathBuf {
    fixtures().join("families").join("modernbert-qa")
}

/// The fixture's padded batch and its answer positions.
fn batch() -> (BertInput, Tensor, Tensor) {
    let inputs = read_json(&dir().join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let (ids, mask) = (get("input_ids"), get("attention_mask"));
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    let positions = |k: &str| {
        let v: Vec<i64> = serde_json::from_value(inputs["labels"][k].clone()).unwrap();
        Tensor::from_vec(v, b, &Device::Cpu).unwrap()
    };
    let input = BertInput {
        input_ids: flat(&ids),
        token_type_ids: None,
        attention_mask: Some(flat(&mask)),
    };
    (
        input,
        positions("start_positions"),
        positions("end_positions"),
    )
}

#[test]
fn modernbert_qa_matches_transformers() {
    let dir = dir();
    let m = BertForTask::from_dir(&dir, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    assert_eq!(m.kind(), HeadKind::QuestionAnswering);
    let BertForTask::QuestionAnswering(qa) = &m else {
        panic!("not a QA head")
    };
    let (input, starts, ends) = batch();
    let out = qa
        .forward(&input, Some(&starts), Some(&ends), Default::default())
        .unwrap();
    let expected = load_safetensors(&dir.join("expected.safetensors"));
    // Every row, padding included: the loss's softmax covers them.
    let ds = common::max_abs_diff(&out.start_logits, &expected["start_logits"]);
    let de = common::max_abs_diff(&out.end_logits, &expected["end_logits"]);
    let got = common::scalar(&out.loss.unwrap());
    let want = common::scalar(&expected["loss"]);
    let rel = ((got - want) / want).abs();
    println!("start {ds:.2e}, end {de:.2e}, loss {got} vs {want} (rel {rel:.2e})");
    assert!(ds <= 1e-4 && de <= 1e-4, "start {ds:e}, end {de:e}");
    assert!(rel <= 1e-5, "loss {got} vs transformers {want}");

    // The gradients of the listed parameters (embeddings, a sliding
    // layer's `Wqkv`, `Wo`, the final norm, `head`, `classifier`).
    let config = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let mut varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let m = BertForTask::load(vb, config, HeadKind::QuestionAnswering).unwrap();
    varmap.load(dir.join("model.safetensors")).unwrap();
    let labels = HeadLabels::spans(&starts, &ends);
    let out = m.forward(&input, &labels, HeadOptions::default()).unwrap();
    let grads = out.loss().unwrap().backward().unwrap();
    let vars = varmap.data().lock().unwrap();
    let params: Vec<String> =
        serde_json::from_value(read_json(&dir.join("inputs.json"))["grad_params"].clone()).unwrap();
    assert!(params.iter().any(|p| p.starts_with("head.")));
    let failures = common::gradient_failures("modernbert-qa", &grads, &vars, &params, &expected);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Fine-tuning on SQuAD-format data: `auto` takes the fast engine, the
/// candle modules learn too, the saved folder holds transformers' names
/// (`head`, `classifier` with two outputs, `ModernBertForQuestionAnswering`)
/// and the QA pipeline answers from it.
#[test]
fn modernbert_finetunes_for_question_answering() {
    let tmp = tempfile::tempdir().unwrap();
    let squad = tmp.path().join("squad.json");
    std::fs::write(&squad, common::runs::squad_json()).unwrap();
    let model = fixtures().join("families").join("modernbert-tokcls");
    let new = |engine: Engine, name: &str| {
        let opts = FinetuneOptions {
            epochs: 12.0,
            lr: 3e-3,
            batch_size: 4,
            eval_batch_size: 8,
            max_length: 32,
            doc_stride: 8,
            seed: 0,
            engine,
            out: tmp.path().join(name),
            ..FinetuneOptions::default()
        };
        Finetuner::new(
            Task::Qa,
            &model,
            &squad,
            Some(&squad),
            &DataOptions::default(),
            opts,
        )
        .unwrap()
    };
    let mut losses = Vec::new();
    for (engine, name) in [(Engine::Auto, "fast"), (Engine::Candle, "candle")] {
        let mut t = new(engine, name);
        assert_eq!(t.on_fast_path(), engine == Engine::Auto, "{engine:?}");
        let before = t.evaluate().unwrap().unwrap().loss.unwrap();
        t.run(|_| {}).unwrap();
        let after = t.evaluate().unwrap().unwrap();
        let a = after.loss.unwrap();
        println!("{name}: dev loss {before:.4} -> {a:.4}, {:?}", after.scores);
        assert!(a < 0.5 * before, "{name}: dev loss {before} -> {a}");
        losses.push(a);
    }

    let saved = tmp.path().join("fast");
    let config = read_json(&saved.join("config.json"));
    assert_eq!(
        config["architectures"],
        serde_json::json!(["ModernBertForQuestionAnswering"])
    );
    let weights = load_safetensors(&saved.join("model.safetensors"));
    assert!(!weights.contains_key("qa_outputs.weight"));
    assert_eq!(weights["classifier.weight"].dims(), &[2, 32]);
    assert_eq!(weights["classifier.bias"].dims(), &[2]);
    assert!(weights.contains_key("head.dense.weight") && weights.contains_key("head.norm.weight"));

    let qa = QuestionAnswerer::from_dir(&saved, &Device::Cpu).unwrap();
    let context = "john played the music in the park with his band and the band was founded in london by paul";
    let answers = qa
        .answer("who played the music", context, &Default::default())
        .unwrap();
    let best = &answers[0];
    assert_eq!(&context[best.start..best.end], best.answer);
    assert!(best.score > 0.0 && best.score <= 1.0, "{best:?}");
    println!("answer: {best:?}");
}
