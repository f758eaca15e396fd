//! Task heads on the tiny transformers checkpoints: head outputs and the
//! training loss for the labels in `inputs.json`, against transformers.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use bertha::model::{
    BertForMaskedLM, BertForMultipleChoice, BertForNextSentencePrediction, BertForPreTraining,
    BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
};
use bertha::{
    BertForTask, BertHead, BertInput, BertModel, DType, Device, ForwardOptions, HeadInit, HeadKind,
    HeadLabels, HeadOutput, Tensor,
};
use common::{fixtures, load_safetensors, read_json};

struct Case {
    input: BertInput,
    lens: Vec<usize>,
    labels: serde_json::Value,
    expected: HashMap<String, Tensor>,
    dir: PathBuf,
}

fn case(name: &str) -> Case {
    let dir = fixtures().join("tiny").join(name);
    let inputs = read_json(&dir.join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let (ids, types, mask) = (
        get("input_ids"),
        get("token_type_ids"),
        get("attention_mask"),
    );
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    Case {
        input: BertInput {
            input_ids: flat(&ids),
            token_type_ids: Some(flat(&types)),
            attention_mask: Some(flat(&mask)),
        },
        lens: mask
            .iter()
            .map(|m| m.iter().filter(|&&x| x == 1).count())
            .collect(),
        labels: inputs["labels"].clone(),
        expected: load_safetensors(&dir.join("expected.safetensors")),
        dir,
    }
}

/// Integer labels of `inputs.json` as an i64 tensor of their own shape.
fn int_labels(v: &serde_json::Value) -> Tensor {
    let rows: Vec<serde_json::Value> = v.as_array().unwrap().clone();
    if rows[0].is_array() {
        let r: Vec<Vec<i64>> = serde_json::from_value(v.clone()).unwrap();
        let (b, t) = (r.len(), r[0].len());
        Tensor::from_vec(r.concat(), (b, t), &Device::Cpu).unwrap()
    } else {
        let r: Vec<i64> = serde_json::from_value(v.clone()).unwrap();
        let n = r.len();
        Tensor::from_vec(r, n, &Device::Cpu).unwrap()
    }
}

/// `got` vs `want` [B, T, ...] at non-padded positions (or [B, ...] when
/// `per_token` is false), within 1e-4.
fn assert_outputs(what: &str, got: &Tensor, want: &Tensor, lens: &[usize], per_token: bool) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    for (b, &n) in lens.iter().enumerate() {
        let (mut g, mut w) = (got.get(b).unwrap(), want.get(b).unwrap());
        if per_token {
            g = g.narrow(0, 0, n).unwrap();
            w = w.narrow(0, 0, n).unwrap();
        }
        let d = common::max_abs_diff(&g.contiguous().unwrap(), &w.contiguous().unwrap());
        assert!(d <= 1e-4, "{what}, sequence {b}: max abs diff {d:e}");
    }
}

fn assert_loss(what: &str, got: Option<Tensor>, want: &Tensor) {
    let got = got
        .expect("labels were given, so a loss")
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[0];
    let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0];
    let rel = ((got - want) / want).abs();
    assert!(
        rel <= 1e-5,
        "{what} loss: got {got}, want {want} (relative diff {rel:e})"
    );
}

/// The tiny checkpoints saved with a head, and their heads.
const HEAD_CASES: [(&str, HeadKind); 5] = [
    ("bert-pretraining", HeadKind::PreTraining),
    ("bert-mlm", HeadKind::MaskedLM),
    ("bert-seqcls", HeadKind::SequenceClassification),
    ("bert-tokcls", HeadKind::TokenClassification),
    ("bert-qa", HeadKind::QuestionAnswering),
];

fn opts() -> ForwardOptions {
    ForwardOptions::default()
}

/// A one-logits head loaded from case `name`: its logits (at non-padded
/// positions when `per_token`) and its loss for the case's `labels`
/// against transformers'.
fn check_logits_head<H: BertHead<Output = HeadOutput>>(
    name: &str,
    what: &str,
    per_token: bool,
) -> H {
    let c = case(name);
    let m = H::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let labels = int_labels(&c.labels["labels"]);
    let labels = HeadLabels::labels(Some(&labels));
    let out = BertHead::forward(&m, &c.input, &labels, opts().into()).unwrap();
    assert_outputs(
        "logits",
        &out.logits,
        &c.expected["logits"],
        &c.lens,
        per_token,
    );
    assert_loss(what, out.loss, &c.expected["loss"]);
    m
}

#[test]
fn pretraining_logits_and_loss() {
    let c = case("bert-pretraining");
    let m = BertForPreTraining::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let labels = int_labels(&c.labels["labels"]);
    let nsp = int_labels(&c.labels["next_sentence_label"]);
    let out = m
        .forward(&c.input, Some(&labels), Some(&nsp), opts())
        .unwrap();
    assert_outputs(
        "prediction_logits",
        &out.prediction_logits,
        &c.expected["prediction_logits"],
        &c.lens,
        true,
    );
    assert_outputs(
        "seq_relationship_logits",
        &out.seq_relationship_logits,
        &c.expected["seq_relationship_logits"],
        &c.lens,
        false,
    );
    assert_loss("pretraining", out.loss, &c.expected["loss"]);
    // Without both labels there is no total loss, as in transformers.
    let out = m.forward(&c.input, Some(&labels), None, opts()).unwrap();
    assert!(out.loss.is_none());
}

#[test]
fn masked_lm_logits_and_loss() {
    let m: BertForMaskedLM = check_logits_head("bert-mlm", "mlm", true);
    // The decoder is tied to the word embeddings (no decoder.weight saved).
    let d = common::max_abs_diff(
        m.predictions().decoder_weight(),
        m.bert().embeddings().word_embeddings(),
    );
    assert_eq!(d, 0.0);
}

#[test]
fn masked_lm_and_nsp_load_from_a_pretraining_checkpoint() {
    let c = case("bert-pretraining");
    let mlm = BertForMaskedLM::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let out = mlm.forward(&c.input, None, opts()).unwrap();
    assert!(out.loss.is_none());
    assert_outputs(
        "mlm from pretraining",
        &out.logits,
        &c.expected["prediction_logits"],
        &c.lens,
        true,
    );
    let nsp =
        BertForNextSentencePrediction::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu)
            .unwrap();
    let out = nsp.forward(&c.input, None, opts()).unwrap();
    assert_outputs(
        "nsp from pretraining",
        &out.logits,
        &c.expected["seq_relationship_logits"],
        &c.lens,
        false,
    );
    // NSP loss on its own: cross-entropy of the two logits, by hand.
    let labels = int_labels(&c.labels["next_sentence_label"]);
    let out = nsp.forward(&c.input, Some(&labels), opts()).unwrap();
    let logits = out.logits.to_vec2::<f32>().unwrap();
    let want: f64 = logits
        .iter()
        .zip([0usize, 1])
        .map(|(row, y)| {
            let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            lse - row[y] as f64
        })
        .sum::<f64>()
        / 2.0;
    let got = out.loss.unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!((got - want).abs() <= 1e-5 * want.abs(), "{got} vs {want}");
}

#[test]
fn sequence_classification_logits_and_loss() {
    let m: BertForSequenceClassification = check_logits_head("bert-seqcls", "seqcls", false);
    assert_eq!(m.num_labels(), 3);
    assert_eq!(m.config().label_name(2), "positive");
}

#[test]
fn sequence_classification_multi_label_and_regression_losses() {
    let c = case("bert-seqcls");
    let dev = Device::Cpu;
    let m =
        BertForSequenceClassification::from_dir(&c.dir, HeadInit::FromCheckpoint, &dev).unwrap();
    let logits = m
        .forward(&c.input, None, opts())
        .unwrap()
        .logits
        .to_vec2::<f32>()
        .unwrap();
    // Float labels of the logits' shape: multi-label BCE with logits.
    let y = [[1.0f32, 0.0, 1.0], [0.0, 0.0, 1.0]];
    let t = Tensor::from_vec(y.concat(), (2, 3), &dev).unwrap();
    let out = m.forward(&c.input, Some(&t), opts()).unwrap();
    let mut want = 0.0f64;
    for (row, ys) in logits.iter().zip(&y) {
        for (&x, &yy) in row.iter().zip(ys) {
            let (x, yy) = (x as f64, yy as f64);
            want += x.max(0.0) - x * yy + (1.0 + (-x.abs()).exp()).ln();
        }
    }
    want /= 6.0;
    let got = out.loss.unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!((got - want).abs() <= 1e-5 * want, "bce {got} vs {want}");

    // problem_type regression: MSE against float targets.
    let mut cfg = m.config().clone();
    cfg.problem_type = Some(bertha::ProblemType::Regression);
    let weights = bertha::Weights::from_model_dir(&c.dir).unwrap();
    let r =
        BertForSequenceClassification::from_weights(weights, cfg, HeadInit::FromCheckpoint, &dev)
            .unwrap();
    let out = r.forward(&c.input, Some(&t), opts()).unwrap();
    let want: f64 = logits
        .iter()
        .zip(&y)
        .flat_map(|(row, ys)| row.iter().zip(ys).map(|(&x, &t)| ((x - t) as f64).powi(2)))
        .sum::<f64>()
        / 6.0;
    let got = out.loss.unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!((got - want).abs() <= 1e-5 * want, "mse {got} vs {want}");

    // A class id outside 0..3 is a clear error, not a panic.
    let bad = Tensor::from_vec(vec![5i64, 0], 2, &dev).unwrap();
    let err = m
        .forward(&c.input, Some(&bad), opts())
        .unwrap_err()
        .to_string();
    assert!(err.contains("label 5") && err.contains("0..3"), "{err}");
}

#[test]
fn token_classification_logits_and_loss() {
    let _: BertForTokenClassification = check_logits_head("bert-tokcls", "tokcls", true);
}

#[test]
fn question_answering_logits_and_loss() {
    let c = case("bert-qa");
    let m =
        BertForQuestionAnswering::from_dir(&c.dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let s = int_labels(&c.labels["start_positions"]);
    let e = int_labels(&c.labels["end_positions"]);
    let out = m.forward(&c.input, Some(&s), Some(&e), opts()).unwrap();
    assert_outputs(
        "start_logits",
        &out.start_logits,
        &c.expected["start_logits"],
        &c.lens,
        true,
    );
    assert_outputs(
        "end_logits",
        &out.end_logits,
        &c.expected["end_logits"],
        &c.lens,
        true,
    );
    assert_loss("qa", out.loss, &c.expected["loss"]);
    // Positions past the sequence are clamped to its length and ignored:
    // with both ends out of range for one row, only the other row counts.
    let far = Tensor::from_vec(vec![7i64, 500], 2, &Device::Cpu).unwrap();
    let far_end = Tensor::from_vec(vec![9i64, 500], 2, &Device::Cpu).unwrap();
    let out = m
        .forward(&c.input, Some(&far), Some(&far_end), opts())
        .unwrap();
    assert!(out.loss.unwrap().to_scalar::<f32>().unwrap().is_finite());
}

#[test]
fn architectures_pick_the_head() {
    for (name, kind) in HEAD_CASES {
        let dir = fixtures().join("tiny").join(name);
        let m = BertForTask::from_dir(&dir, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
        assert_eq!(m.kind(), kind, "{name}");
    }
}

#[test]
fn headless_checkpoint_names_the_missing_head() {
    let dir = common::minilm_dir();
    // Its architectures say BertModel: no head to pick.
    let err = BertForTask::from_dir(&dir, None, HeadInit::FromCheckpoint, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("architectures") && err.contains("BertModel"),
        "{err}"
    );
    for (kind, tensor) in [
        (HeadKind::MaskedLM, "cls.predictions.transform.dense.weight"),
        (HeadKind::SequenceClassification, "classifier.weight"),
        (HeadKind::QuestionAnswering, "qa_outputs.weight"),
        (
            HeadKind::NextSentencePrediction,
            "cls.seq_relationship.weight",
        ),
    ] {
        let err = BertForTask::from_dir(&dir, Some(kind), HeadInit::FromCheckpoint, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(kind.architecture()) && err.contains(tensor),
            "{kind}: {err}"
        );
    }
    // An MLM checkpoint has no classifier either.
    let mlm = fixtures().join("tiny/bert-mlm");
    let err = BertForTokenClassification::from_dir(&mlm, HeadInit::FromCheckpoint, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("classifier.weight"), "{err}");
}

#[test]
fn fresh_heads_on_a_headless_checkpoint() {
    let dir = common::minilm_dir();
    let dev = Device::Cpu;
    let fresh = HeadInit::Fresh { seed: 7 };
    let base = BertModel::from_dir(&dir, &dev).unwrap();
    let tok = bertha::Tokenizer::from_dir(&dir, 128).unwrap();
    let enc = tok.encode("a fresh head").unwrap();
    let input = BertInput::from_ids(
        std::slice::from_ref(&enc.input_ids),
        std::slice::from_ref(&enc.token_type_ids),
        0,
        &dev,
    )
    .unwrap();
    let hidden = base
        .forward(&input, opts())
        .unwrap()
        .last_hidden_state
        .clone();

    let cls = BertForSequenceClassification::from_dir(&dir, fresh, &dev).unwrap();
    let out = cls.forward(&input, None, opts()).unwrap();
    assert_eq!(out.logits.dims(), &[1, 2]);
    // The encoder is the checkpoint's, untouched.
    let again = cls
        .bert()
        .forward(&input, opts())
        .unwrap()
        .last_hidden_state;
    assert!(common::max_abs_diff(&again, &hidden) <= 1e-6);
    // Same seed, same head; another seed, another head.
    let same = BertForSequenceClassification::from_dir(&dir, fresh, &dev).unwrap();
    let l2 = same.forward(&input, None, opts()).unwrap().logits;
    assert_eq!(common::max_abs_diff(&out.logits, &l2), 0.0);
    let other =
        BertForSequenceClassification::from_dir(&dir, HeadInit::Fresh { seed: 8 }, &dev).unwrap();
    let l3 = other.forward(&input, None, opts()).unwrap().logits;
    assert!(common::max_abs_diff(&out.logits, &l3) > 0.0);

    // A fresh MLM head ties its decoder to the word embeddings and starts
    // with a zero bias; its loss is finite.
    let mlm = BertForMaskedLM::from_dir(&dir, fresh, &dev).unwrap();
    assert_eq!(
        common::max_abs_diff(
            mlm.predictions().decoder_weight(),
            mlm.bert().embeddings().word_embeddings()
        ),
        0.0
    );
    let n = enc.input_ids.len();
    let mut labels = vec![-100i64; n];
    labels[1] = i64::from(enc.input_ids[1]);
    let labels = Tensor::from_vec(labels, (1, n), &dev).unwrap();
    let out = mlm.forward(&input, Some(&labels), opts()).unwrap();
    assert!(out.loss.unwrap().to_scalar::<f32>().unwrap().is_finite());

    for kind in HeadKind::ALL {
        // ELECTRA's discriminator is ELECTRA's own.
        if matches!(
            kind,
            HeadKind::MultipleChoice | HeadKind::ReplacedTokenDetection
        ) {
            continue;
        }
        let m = BertForTask::from_dir(&dir, Some(kind), fresh, &dev).unwrap();
        assert_eq!(m.kind(), kind);
    }
}

#[test]
fn multiple_choice_scores_each_choice() {
    // An MLM checkpoint: the pooler and the one-output classifier are fresh.
    let dir = fixtures().join("tiny/bert-mlm");
    let dev = Device::Cpu;
    let m = BertForMultipleChoice::from_dir(&dir, HeadInit::Fresh { seed: 1 }, &dev).unwrap();
    let tok = bertha::Tokenizer::from_dir(&dir, 64).unwrap();
    let choices = ["the album", "the game", "the music"];
    let encs: Vec<_> = choices
        .iter()
        .map(|c| tok.encode_pair("john played", c).unwrap())
        .collect();
    let ids: Vec<Vec<u32>> = encs.iter().map(|e| e.input_ids.clone()).collect();
    let types: Vec<Vec<u32>> = encs.iter().map(|e| e.token_type_ids.clone()).collect();
    let flat = BertInput::from_ids(&ids, &types, 0, &dev).unwrap();
    let t = flat.input_ids.dim(1).unwrap();
    let input = BertInput {
        input_ids: flat.input_ids.reshape((1, 3, t)).unwrap(),
        token_type_ids: flat
            .token_type_ids
            .as_ref()
            .map(|x| x.reshape((1, 3, t)).unwrap()),
        attention_mask: flat
            .attention_mask
            .as_ref()
            .map(|x| x.reshape((1, 3, t)).unwrap()),
    };
    let label = Tensor::from_vec(vec![2i64], 1, &dev).unwrap();
    let out = m.forward(&input, Some(&label), opts()).unwrap();
    assert_eq!(out.logits.dims(), &[1, 3]);
    let s = out.logits.to_vec2::<f32>().unwrap()[0].clone();
    let m0 = s.iter().cloned().fold(f32::MIN, f32::max);
    let lse = m0 + s.iter().map(|x| (x - m0).exp()).sum::<f32>().ln();
    let got = out.loss.unwrap().to_scalar::<f32>().unwrap();
    assert!((got - (lse - s[2])).abs() <= 1e-5, "{got}");
    // A 2-D input is a clear error.
    let err = m.forward(&flat, None, opts()).unwrap_err().to_string();
    assert!(err.contains("[batch, choices, seq]"), "{err}");
}

/// The losses train: loaded into a `VarMap` in transformers' layout, each
/// head's loss backpropagates to the gradients transformers computed for
/// every parameter listed in `inputs.json` — head, pooler, encoder and
/// embeddings (≤ 1e-4 of the tensor's max abs value).
#[test]
fn losses_backpropagate_like_transformers() {
    use candle_nn::{VarBuilder, VarMap};
    for (name, kind) in HEAD_CASES {
        let c = case(name);
        let config = bertha::BertConfig::from_file(&c.dir.join("config.json")).unwrap();
        let mut varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let m = BertForTask::load(vb, config, kind).unwrap();
        varmap.load(c.dir.join("model.safetensors")).unwrap();
        let l = |k: &str| c.labels.get(k).map(int_labels);
        let (labels, nsp) = (l("labels"), l("next_sentence_label"));
        let (start, end) = (l("start_positions"), l("end_positions"));
        let labels = HeadLabels {
            labels: labels.as_ref(),
            next_sentence_label: nsp.as_ref(),
            start_positions: start.as_ref(),
            end_positions: end.as_ref(),
        };
        let out = m.forward(&c.input, &labels, opts().into()).unwrap();
        let loss = out.loss().unwrap().clone();
        assert_loss(name, Some(loss.clone()), &c.expected["loss"]);
        let grads = loss.backward().unwrap();
        let vars = varmap.data().lock().unwrap();
        let inputs = read_json(&c.dir.join("inputs.json"));
        let mut checked = 0;
        for p in inputs["grad_params"].as_array().unwrap() {
            let p = p.as_str().unwrap();
            // Head, pooler, encoder and embedding parameters alike: the
            // attention's softmax has a backward pass.
            let got = common::grad_of(&grads, &vars, p, name);
            let want = &c.expected[&format!("grad.{p}")];
            let scale = common::max_abs(want);
            let d = common::max_abs_diff(got, want);
            if scale < 1e-6 {
                // Zero in exact arithmetic, rounding noise on both sides:
                // QA's start/end cross-entropies have gradients that sum
                // to 0 over the positions, so the last LayerNorm's bias
                // (added at every position, read by the same linear
                // qa_outputs) gets Σ_t (p_t - y_t) · W = 0 — transformers'
                // value is ~1e-8 of noise, and a relative comparison with
                // noise means nothing. Ours must be zero to the same order.
                let ours = common::max_abs(got);
                assert!(
                    ours <= 1e-6,
                    "{name} grad.{p}: transformers' gradient is zero (max {scale:e}), ours has {ours:e}"
                );
                println!("{name} grad.{p}: zero in exact arithmetic (ours {ours:e}, transformers {scale:e})");
                checked += 1;
                continue;
            }
            println!("{name} grad.{p}: {:.2e} of max {scale:.2e}", d / scale);
            assert!(
                d <= 1e-4 * scale.max(1e-12),
                "{name} grad.{p}: max abs diff {d:e}, scale {scale:e}"
            );
            checked += 1;
        }
        assert!(checked > 0, "{name}: no parameter checked");
    }
}
