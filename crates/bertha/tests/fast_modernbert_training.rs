//! ModernBERT on the training fast engine: rotary Q and K, the sliding
//! layers' window, GeGLU, layer 0 without `attn_norm`, no biases, the MLM
//! head's `head` and tied decoder, the classifiers' `head` on the first
//! token, the mean of the tokens or every token. A step's loss and
//! gradients equal transformers' (the fixtures) and the candle path's,
//! with dropout on.

mod common;

use bertha::fast::train::{Compute, FinetuneHead, HeadBatch, HeadTargets, MlmHead};
use bertha::model::{seed_dropout, BertForTask, HeadKind, HeadLabels};
use bertha::BertConfig;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::fast_steps::{
    assert_fixture_gradients, assert_other_masks_differ, assert_same_directions,
    assert_same_gradients, candle_head_step, expected_loss, fixture_model, fixture_rows,
    head_labels, random_rows, rel_diff, sequences, span_positions, vars, Rows,
};
use common::{fixtures, load_safetensors, read_json};

/// Both config layouts of the MLM fixture: the fast step's loss and the
/// named gradients equal transformers'.
#[test]
fn mlm_steps_match_transformers_in_both_config_layouts() {
    for name in ["modernbert-mlm", "modernbert-mlm-legacy"] {
        let dir = fixtures().join("families").join(name);
        let (varmap, model) = fixture_model(&dir, HeadKind::MaskedLM);
        let rows = fixture_rows(&dir);
        let out = MlmHead::of(&model)
            .unwrap()
            .unwrap_or_else(|| panic!("the fast path covers {name}"))
            .step(&rows.batch(), [1.0, 1.0], false)
            .unwrap();
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let want = expected_loss(&expected);
        assert!(
            (out.mlm_loss - want).abs() <= 1e-5 * want.abs(),
            "{name}: loss {} vs transformers {want}",
            out.mlm_loss
        );
        assert_fixture_gradients(name, &dir, &varmap, &out.gradients, &expected);
    }
}

/// The fixture's shape with dropout everywhere transformers has it
/// (embeddings, attention probabilities, `Wo`'s output, the gated
/// product), as a fresh MLM model.
fn dropout_model(dir: &str) -> (VarMap, BertForTask, BertConfig) {
    let path = fixtures().join("families").join(dir).join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in ["embedding_dropout", "attention_dropout", "mlp_dropout"] {
        json[key] = serde_json::json!(0.125);
    }
    let cfg = BertConfig::from_json_str(&json.to_string(), &path).unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = BertForTask::load(vb, cfg.clone(), HeadKind::MaskedLM).unwrap();
    (varmap, model, cfg)
}

/// One fast MLM step (dropout seeded as the candle step's) against the
/// candle path's: loss to 1e-5 relative, every gradient to 1e-4 of its
/// tensor's max; another seed must move the gradients.
fn fast_step_equals_candle(what: &str, varmap: &VarMap, model: &BertForTask, rows: &Rows) {
    let (_, labels, _) = rows.padded();
    let (want_loss, want) = candle_head_step(model, rows, &HeadLabels::labels(Some(&labels)), 5);
    seed_dropout(5, 0);
    let out = MlmHead::of(model)
        .unwrap()
        .expect("covered")
        .step(&rows.batch(), [1.0, 1.0], true)
        .unwrap();
    assert!(
        (out.mlm_loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "{what}: loss {} vs candle {want_loss}",
        out.mlm_loss
    );
    seed_dropout(6, 0);
    let other = MlmHead::of(model)
        .unwrap()
        .unwrap()
        .step(&rows.batch(), [1.0, 1.0], true)
        .unwrap();
    let apart = vars(varmap)
        .values()
        .filter_map(|var| {
            let g = other.gradients.get(var.as_tensor())?;
            Some(rel_diff(g, want.get(var.as_tensor())?).0)
        })
        .fold(0f32, f32::max);
    assert!(
        apart > 1e-2,
        "{what}: another seed moved nothing ({apart:e})"
    );
    let checked = assert_same_gradients(what, varmap, &out.gradients, &want);
    // Every tensor of the model: 4 layers' 7 (6 in layer 0), embeddings,
    // their norm, final_norm, head.dense, head.norm, decoder.bias.
    let all = vars(varmap).len();
    assert!(
        checked == all,
        "{what}: {checked} of {all} gradients compared"
    );
}

/// With dropout on, on sequences longer than the window (and one of a
/// single token): a fast step equals the candle path's. The MLM head reads
/// the masked rows only, so the last layer's queries are a selection,
/// rotated apart from its keys.
#[test]
fn dropout_steps_equal_the_candle_path() {
    let (varmap, model, cfg) = dropout_model("modernbert-mlm");
    let rows = random_rows(cfg.vocab_size as u32, false);
    fast_step_equals_candle("modernbert-mlm", &varmap, &model, &rows);
}

/// The long fixture's shape (window 16) on a 200-token and a 77-token
/// sequence: most keys lie outside the sliding layers' windows.
#[test]
fn long_sequences_equal_the_candle_path() {
    let (varmap, model, cfg) = dropout_model("modernbert-long");
    let vocab = cfg.vocab_size as u64;
    let mut rows = Rows {
        ids: vec![],
        types: vec![],
        labels: vec![],
        nsp: None,
    };
    for (s, len) in [200usize, 77].into_iter().enumerate() {
        let id = |p: usize| (1 + (p * 7919 + s * 31) as u64 % (vocab - 1)) as u32;
        rows.ids.push((0..len).map(id).collect());
        rows.types.push(vec![0; len]);
        let label = |p: usize| match p % 6 {
            0 => ((p * 13) as u64 % vocab) as i64,
            _ => -100,
        };
        rows.labels.push((0..len).map(label).collect());
    }
    fast_step_equals_candle("modernbert-long", &varmap, &model, &rows);
}

/// bf16 products (fp32 sums; rotary, GeGLU, norms and softmax in fp32)
/// track the fp32 step: the loss within 0.2 %, every gradient's cosine
/// ≥ 0.999.
#[test]
fn bf16_steps_track_the_fp32_step() {
    if !bertha::fast::cpu::has_bf16() {
        println!("no fast bf16 products here (cpu::has_bf16): bf16 training runs in fp32");
        return;
    }
    let dir = fixtures().join("families").join("modernbert-mlm");
    let (varmap, model) = fixture_model(&dir, HeadKind::MaskedLM);
    let rows = random_rows(model.config().vocab_size as u32, false);
    let step = |compute: Compute| {
        MlmHead::of(&model)
            .unwrap()
            .unwrap()
            .with_compute(compute)
            .step(&rows.batch(), [1.0, 1.0], false)
            .unwrap()
    };
    let (exact, bf16) = (step(Compute::F32), step(Compute::Bf16));
    let (a, b) = (exact.mlm_loss, bf16.mlm_loss);
    assert!((a - b).abs() <= 2e-3 * a, "loss {b} (bf16) vs {a} (fp32)");
    assert_ne!(a, b, "the bf16 products did not run");
    let checked = assert_same_directions(&varmap, &bf16.gradients, &exact.gradients);
    assert!(checked >= 25, "only {checked} gradients compared");
}

/// The heads of the fixtures (sequence classification with mean pooling,
/// token classification and QA with `head` on every token; QA's batch
/// padded, its padding rows past the sliding window's reach): the fast
/// step's loss, logits and named gradients equal transformers'.
#[test]
fn classifier_steps_match_transformers() {
    for (name, kind) in [
        ("modernbert-seqcls", HeadKind::SequenceClassification),
        ("modernbert-tokcls", HeadKind::TokenClassification),
        ("modernbert-qa", HeadKind::QuestionAnswering),
    ] {
        let dir = fixtures().join("families").join(name);
        let (varmap, model) = fixture_model(&dir, kind);
        let rows = fixture_rows_unlabelled(&dir);
        let inputs = read_json(&dir.join("inputs.json"));
        let labels = inputs["labels"]["labels"].clone();
        let classes: Vec<i64>;
        let tokens: Vec<Vec<i64>>;
        let spans: Vec<(i64, i64)>;
        let mut pad_to = 0;
        let targets = match kind {
            HeadKind::SequenceClassification => {
                classes = serde_json::from_value(labels).unwrap();
                HeadTargets::Classes(&classes)
            }
            HeadKind::QuestionAnswering => {
                let positions = |k: &str| -> Vec<i64> {
                    serde_json::from_value(inputs["labels"][k].clone()).unwrap()
                };
                let (starts, ends) = (positions("start_positions"), positions("end_positions"));
                spans = starts.into_iter().zip(ends).collect();
                // As transformers ran it: every sequence padded to the batch's rows.
                pad_to = inputs["inputs"]["input_ids"][0].as_array().unwrap().len();
                HeadTargets::Spans(&spans)
            }
            _ => {
                let padded: Vec<Vec<i64>> = serde_json::from_value(labels).unwrap();
                tokens = padded
                    .into_iter()
                    .zip(&rows.ids)
                    .map(|(l, i)| l[..i.len()].to_vec())
                    .collect();
                HeadTargets::Tokens(tokens.iter().map(|l| &l[..]).collect())
            }
        };
        let batch = HeadBatch {
            sequences: sequences(&rows.ids, &rows.types),
            targets,
            pad_to,
        };
        let out = FinetuneHead::of(&model)
            .unwrap()
            .unwrap_or_else(|| panic!("the fast path covers {name}"))
            .step(&batch, 1.0, false)
            .unwrap();
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let want = expected_loss(&expected);
        assert!(
            (out.loss - want).abs() <= 1e-5 * want.abs(),
            "{name}: loss {} vs transformers {want}",
            out.loss
        );
        assert_fixture_gradients(name, &dir, &varmap, &out.gradients, &expected);
    }
}

/// A fixture's sequences (cut at their attention masks), without labels.
fn fixture_rows_unlabelled(dir: &std::path::Path) -> Rows {
    let inputs = read_json(&dir.join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let ids: Vec<Vec<u32>> = get("input_ids")
        .into_iter()
        .zip(get("attention_mask"))
        .map(|(r, m)| r[..m.iter().filter(|&&x| x == 1).count()].to_vec())
        .collect();
    Rows {
        types: ids.iter().map(|r| vec![0; r.len()]).collect(),
        labels: ids.iter().map(|r| vec![-100; r.len()]).collect(),
        ids,
        nsp: None,
    }
}

/// With dropout everywhere (the classifier's too), a fine-tuning step of
/// sequence classification (first-token and mean pooling), token
/// classification and QA (padded to the longest sequence, as the candle
/// path's batch is) equals the candle path's.
#[test]
fn classifier_dropout_steps_equal_the_candle_path() {
    let path = fixtures().join("families/modernbert-seqcls/config.json");
    let mut json = read_json(&path);
    for key in [
        "embedding_dropout",
        "attention_dropout",
        "mlp_dropout",
        "classifier_dropout",
    ] {
        json[key] = serde_json::json!(0.125);
    }
    let dev = Device::Cpu;
    for (kind, pooling) in [
        (HeadKind::SequenceClassification, "mean"),
        (HeadKind::SequenceClassification, "cls"),
        (HeadKind::TokenClassification, "cls"),
        (HeadKind::QuestionAnswering, "cls"),
    ] {
        json["classifier_pooling"] = serde_json::json!(pooling);
        let cfg = BertConfig::from_json_str(&json.to_string(), &path).unwrap();
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let model = BertForTask::load(vb, cfg.clone(), kind).unwrap();
        let c = cfg.num_labels();
        let rows = random_rows(cfg.vocab_size as u32, false);
        let l = head_labels(&rows, c);
        let n = rows.ids.len();
        let classes = Tensor::from_vec(l.classes.clone(), n, &dev).unwrap();
        let (_, padded, _) = Rows {
            labels: l.tokens.clone(),
            ..rows.clone()
        }
        .padded();
        let spans: Vec<(i64, i64)> = (0..n as i64).map(|s| (s, 2 * s + 1)).collect();
        let (starts, ends) = span_positions(&spans);
        let (targets, labels) = match kind {
            HeadKind::QuestionAnswering => (
                HeadTargets::Spans(&spans),
                HeadLabels::spans(&starts, &ends),
            ),
            HeadKind::TokenClassification => (
                HeadTargets::Tokens(l.tokens.iter().map(|t| &t[..]).collect()),
                HeadLabels::labels(Some(&padded)),
            ),
            _ => (
                HeadTargets::Classes(&l.classes),
                HeadLabels::labels(Some(&classes)),
            ),
        };
        let what = format!("{kind:?} ({pooling} pooling)");
        let (want_loss, want) = candle_head_step(&model, &rows, &labels, 3);
        let longest = rows.ids.iter().map(Vec::len).max().unwrap();
        let batch = HeadBatch {
            sequences: sequences(&rows.ids, &rows.types),
            targets,
            pad_to: if kind == HeadKind::QuestionAnswering {
                longest
            } else {
                0
            },
        };
        let step = |seed: u64| {
            seed_dropout(seed, 0);
            FinetuneHead::of(&model)
                .unwrap()
                .expect("covered")
                .step(&batch, 1.0, true)
                .unwrap()
        };
        let out = step(3);
        assert!(
            (out.loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{what}: loss {} vs candle {want_loss}",
            out.loss
        );
        let other = step(4);
        assert_other_masks_differ(
            &what,
            &varmap,
            (other.loss, &other.gradients),
            (want_loss, &want),
        );
        let checked = assert_same_gradients(&what, &varmap, &out.gradients, &want);
        // QA's `classifier.bias` gets none (0 on both paths): each
        // position's softmax gradient sums to 0.
        let zero = usize::from(kind == HeadKind::QuestionAnswering);
        let all = vars(&varmap).len();
        assert_eq!(checked + zero, all, "{what}: gradients compared");
    }
}
