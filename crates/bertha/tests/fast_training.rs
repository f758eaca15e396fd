//! The training fast path against transformers' fixtures and against the
//! candle path: the same losses and gradients, dropout included.

mod common;

use bertha::fast::train::{FinetuneHead, HeadBatch, HeadTargets, MlmHead};
use bertha::model::{seed_dropout, BertForTask, HeadKind, HeadLabels, HeadOptions};
use bertha::model::{ForwardOptions, TaskOutput, IGNORE_INDEX};
use bertha::{BertConfig, NormPosition, ProblemType};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::fast_steps::{
    assert_fixture_gradients, assert_other_masks_differ, assert_same_directions,
    assert_same_gradients, candle_head_step, fixture_model, fixture_rows, head_labels, random_rows,
    rel_diff, sequences, vars, Rows,
};
use common::{fixtures, load_safetensors, read_json};

#[test]
fn mlm_and_nsp_match_transformers() {
    for (name, kind) in [
        ("bert-mlm", HeadKind::MaskedLM),
        ("bert-pretraining", HeadKind::PreTraining),
        ("roberta-mlm", HeadKind::MaskedLM),
        ("distilbert-mlm", HeadKind::MaskedLM),
        ("albert-mlm", HeadKind::MaskedLM),
    ] {
        let dir = fixtures().join("tiny").join(name);
        let (varmap, model) = fixture_model(&dir, kind);
        let rows = fixture_rows(&dir);
        let head = MlmHead::of(&model)
            .unwrap()
            .unwrap_or_else(|| panic!("the fast path covers {name}"));
        let out = head.step(&rows.batch(), [1.0, 1.0], false).unwrap();
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let want = expected["loss"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0] as f64;
        let got = out.mlm_loss + out.nsp_loss;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "{name}: loss {got} vs transformers {want}"
        );
        assert_fixture_gradients(name, &dir, &varmap, &out.gradients, &expected);
    }
}

/// A small BERT with dropout, in either LayerNorm placement.
fn config(norm: NormPosition, nsp: bool) -> BertConfig {
    let mut c =
        BertConfig::from_file(&fixtures().join("tiny/bert-pretraining/config.json")).unwrap();
    c.hidden_dropout_prob = 0.1;
    c.attention_probs_dropout_prob = 0.15;
    c.norm_position = norm;
    if norm == NormPosition::Pre {
        c.final_layer_norm = true;
    }
    c.add_pooling_layer = nsp;
    c
}

/// The candle path's loss and gradients on the same rows, with the
/// dropout stream seeded as the trainer seeds it.
fn candle_step(model: &BertForTask, rows: &Rows, seed: u64) -> (f64, GradStore) {
    let (input, labels, nsp) = rows.padded();
    let head_labels = HeadLabels {
        labels: Some(&labels),
        next_sentence_label: nsp.as_ref(),
        ..HeadLabels::default()
    };
    let opts = HeadOptions {
        forward: ForwardOptions {
            train: true,
            ..ForwardOptions::default()
        },
        labelled_rows_only: true,
    };
    seed_dropout(seed, 0);
    let loss = match model.forward(&input, &head_labels, opts).unwrap() {
        TaskOutput::PreTraining(o) => o.loss.unwrap(),
        TaskOutput::Logits(o) => o.loss.unwrap(),
        TaskOutput::QuestionAnswering(_) => unreachable!(),
    };
    let value = loss.to_scalar::<f32>().unwrap() as f64;
    (value, loss.backward().unwrap())
}

#[test]
fn dropout_steps_equal_the_candle_path_in_both_norm_placements() {
    for norm in [NormPosition::Post, NormPosition::Pre] {
        for (kind, nsp) in [(HeadKind::MaskedLM, false), (HeadKind::PreTraining, true)] {
            let what = format!("{norm:?} {kind:?}");
            let cfg = config(norm, nsp);
            let varmap = VarMap::new();
            let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let model = BertForTask::load(vb, cfg.clone(), kind).unwrap();
            let rows = random_rows(cfg.vocab_size as u32, nsp);
            let (want_loss, want) = candle_step(&model, &rows, 99);
            seed_dropout(99, 0);
            let out = MlmHead::of(&model)
                .unwrap()
                .expect("covered")
                .step(&rows.batch(), [1.0, 1.0], true)
                .unwrap();
            let got_loss = out.mlm_loss + out.nsp_loss;
            assert!(
                (got_loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "{what}: loss {got_loss} vs candle {want_loss}"
            );
            // Without the same masks the gradients would differ by far
            // more than the tolerance. (Not the loss: on these randomly
            // initialised weights, 0.02 apart, the logits are nearly 0 and
            // the loss nearly ln(vocab) whatever the masks; it once moved
            // by less than 1e-3.)
            seed_dropout(100, 0);
            let other = MlmHead::of(&model)
                .unwrap()
                .unwrap()
                .step(&rows.batch(), [1.0, 1.0], true)
                .unwrap();
            let apart = vars(&varmap)
                .values()
                .filter_map(|var| {
                    let g = other.gradients.get(var.as_tensor())?;
                    Some(rel_diff(g, want.get(var.as_tensor())?).0)
                })
                .fold(0f32, f32::max);
            assert!(
                apart > 1e-2,
                "{what}: another dropout seed moved no gradient ({apart:e} relative)"
            );
            let checked = assert_same_gradients(&what, &varmap, &out.gradients, &want);
            assert!(checked >= 30, "{what}: only {checked} gradients compared");
        }
    }
}

/// bf16 products (fp32 sums, fp32 everything else) give the fp32 step's
/// loss and gradients up to bf16 rounding: every gradient tensor points the
/// same way (cosine ≥ 0.999) and the loss is within 0.2 %; post-LN and
/// pre-LN, without dropout and with the same masks in both steps.
#[test]
fn bf16_steps_track_the_fp32_step() {
    if !bertha::fast::cpu::has_bf16() {
        println!("no fast bf16 products here (cpu::has_bf16): bf16 training runs in fp32");
        return;
    }
    for (norm, train) in [
        (NormPosition::Post, false),
        (NormPosition::Pre, false),
        (NormPosition::Post, true),
        (NormPosition::Pre, true),
    ] {
        bf16_step_tracks_fp32(norm, train);
    }
}

fn bf16_step_tracks_fp32(norm: NormPosition, train: bool) {
    use bertha::fast::train::Compute;
    let cfg = config(norm, true);
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = BertForTask::load(vb, cfg.clone(), HeadKind::PreTraining).unwrap();
    let rows = random_rows(cfg.vocab_size as u32, true);
    let step = |compute: Compute| {
        seed_dropout(7, 0);
        MlmHead::of(&model)
            .unwrap()
            .unwrap()
            .with_compute(compute)
            .step(&rows.batch(), [1.0, 1.0], train)
            .unwrap()
    };
    let (exact, bf16) = (step(Compute::F32), step(Compute::Bf16));
    let (a, b) = (
        exact.mlm_loss + exact.nsp_loss,
        bf16.mlm_loss + bf16.nsp_loss,
    );
    assert!((a - b).abs() <= 2e-3 * a, "loss {b} (bf16) vs {a} (fp32)");
    assert_ne!(a, b, "the bf16 products did not run");
    let checked = assert_same_directions(&varmap, &bf16.gradients, &exact.gradients);
    assert!(checked >= 30, "only {checked} gradients compared");
}

/// Steps given the buffers a run keeps between steps (the logits and
/// their gradient, holding the previous step's values and another length)
/// give what steps with fresh buffers give, bit for bit, with more and
/// with fewer masked rows than the step before, in fp32 and in bf16.
#[test]
fn kept_buffers_change_no_step() {
    use bertha::fast::train::{Compute, MlmBuffers};
    let cfg = config(NormPosition::Post, false);
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = BertForTask::load(vb, cfg.clone(), HeadKind::MaskedLM).unwrap();
    let all = random_rows(cfg.vocab_size as u32, false);
    // The same sequences with every other target dropped: fewer rows.
    let mut fewer = all.clone();
    let mut seen = 0;
    for y in fewer.labels.iter_mut().flatten() {
        if *y != IGNORE_INDEX {
            seen += 1;
            if seen % 2 == 0 {
                *y = IGNORE_INDEX;
            }
        }
    }
    assert!(seen >= 4, "only {seen} masked rows");
    for compute in [Compute::F32, Compute::Bf16] {
        let head = || MlmHead::of(&model).unwrap().unwrap().with_compute(compute);
        let mut kept = MlmBuffers::default();
        for rows in [&fewer, &all, &fewer] {
            let got = head()
                .step_keeping(&rows.batch(), [1.0, 0.0], false, &mut kept)
                .unwrap();
            let want = head().step(&rows.batch(), [1.0, 0.0], false).unwrap();
            assert_eq!(
                got.mlm_loss.to_bits(),
                want.mlm_loss.to_bits(),
                "{compute:?}"
            );
            assert_eq!(got.masked, want.masked);
            for (name, var) in vars(&varmap) {
                let (Some(g), Some(w)) = (
                    got.gradients.get(var.as_tensor()),
                    want.gradients.get(var.as_tensor()),
                ) else {
                    continue;
                };
                let (g, w) = (
                    g.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    w.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                assert!(
                    g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{compute:?} {name}"
                );
            }
        }
    }
}

/// A fine-tuning fixture's unpadded sequences and its `labels` object.
fn fixture_sequences(dir: &std::path::Path) -> (Vec<Vec<u32>>, Vec<Vec<u32>>, serde_json::Value) {
    let inputs = read_json(&dir.join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let mask = get("attention_mask");
    let cut = |rows: Vec<Vec<u32>>| -> Vec<Vec<u32>> {
        rows.into_iter()
            .zip(&mask)
            .map(|(r, m)| r[..m.iter().filter(|&&x| x == 1).count()].to_vec())
            .collect()
    };
    (
        cut(get("input_ids")),
        cut(get("token_type_ids")),
        inputs["labels"].clone(),
    )
}

/// The fast path's loss, logits and gradients against transformers' for
/// each fine-tuning head of the tiny fixtures (QA with the fixture's
/// padding rows, which its loss reads).
#[test]
fn finetuning_heads_match_transformers() {
    for (name, kind) in [
        ("bert-seqcls", HeadKind::SequenceClassification),
        ("bert-tokcls", HeadKind::TokenClassification),
        ("bert-qa", HeadKind::QuestionAnswering),
    ] {
        let dir = fixtures().join("tiny").join(name);
        let (varmap, model) = fixture_model(&dir, kind);
        let (ids, types, labels) = fixture_sequences(&dir);
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let flat = |k: &str| expected[k].flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let classes: Vec<i64>;
        let tokens: Vec<Vec<i64>>;
        let spans: Vec<(i64, i64)>;
        let padded: usize = expected["hidden_states"].dims()[2];
        let targets = match kind {
            HeadKind::SequenceClassification => {
                classes = serde_json::from_value(labels["labels"].clone()).unwrap();
                HeadTargets::Classes(&classes)
            }
            HeadKind::TokenClassification => {
                let rows: Vec<Vec<i64>> = serde_json::from_value(labels["labels"].clone()).unwrap();
                tokens = rows
                    .into_iter()
                    .zip(&ids)
                    .map(|(l, i)| l[..i.len()].to_vec())
                    .collect();
                HeadTargets::Tokens(tokens.iter().map(|l| &l[..]).collect())
            }
            _ => {
                let get =
                    |k: &str| -> Vec<i64> { serde_json::from_value(labels[k].clone()).unwrap() };
                spans = get("start_positions")
                    .into_iter()
                    .zip(get("end_positions"))
                    .collect();
                HeadTargets::Spans(&spans)
            }
        };
        let qa = kind == HeadKind::QuestionAnswering;
        let batch = HeadBatch {
            sequences: sequences(&ids, &types),
            targets,
            pad_to: if qa { padded } else { 0 },
        };
        let head = FinetuneHead::of(&model).unwrap().expect("covered");
        let out = head.step(&batch, 1.0, false).unwrap();
        let want = flat("loss")[0] as f64;
        assert!(
            (out.loss - want).abs() <= 1e-5 * want.abs(),
            "{name}: loss {} vs transformers {want}",
            out.loss
        );
        // The fast path's logits against the fixture's (padded) ones: per
        // sequence, per real token, or (QA) per row, padding included.
        let pairs: Vec<(f32, f32)> = match kind {
            HeadKind::SequenceClassification => {
                out.logits.iter().copied().zip(flat("logits")).collect()
            }
            HeadKind::TokenClassification => {
                let (want, c) = (flat("logits"), 5);
                let mut first = 0;
                let mut v = Vec::new();
                for (s, seq) in ids.iter().enumerate() {
                    let got = &out.logits[first * c..(first + seq.len()) * c];
                    v.extend(
                        got.iter()
                            .copied()
                            .zip(want[s * padded * c..].iter().copied()),
                    );
                    first += seq.len();
                }
                v
            }
            _ => {
                assert_eq!(out.logits.len(), ids.len() * padded * 2);
                let (start, end) = (flat("start_logits"), flat("end_logits"));
                let got = |col: usize| out.logits.iter().skip(col).step_by(2).copied();
                got(0).zip(start).chain(got(1).zip(end)).collect()
            }
        };
        assert!(pairs.len() >= 6, "{name}: {} logits", pairs.len());
        for (i, (g, w)) in pairs.into_iter().enumerate() {
            assert!((g - w).abs() <= 1e-4, "{name}: logit {i}: {g} vs {w}");
        }
        assert_fixture_gradients(name, &dir, &varmap, &out.gradients, &expected);
    }
}

/// Each fine-tuning head's step with dropout on equals the candle head's
/// (QA on padding rows as the candle path pads; the other heads with and
/// without them).
#[test]
fn finetuning_dropout_steps_equal_the_candle_path() {
    for norm in [NormPosition::Post, NormPosition::Pre] {
        let cases = [
            (HeadKind::SequenceClassification, None),
            (
                HeadKind::SequenceClassification,
                Some(ProblemType::Regression),
            ),
            (
                HeadKind::SequenceClassification,
                Some(ProblemType::MultiLabelClassification),
            ),
            (HeadKind::TokenClassification, None),
            (HeadKind::QuestionAnswering, None),
        ];
        for (kind, problem) in cases {
            let what = format!("{norm:?} {kind:?} {problem:?}");
            let fixture = match kind {
                HeadKind::TokenClassification => "bert-tokcls",
                HeadKind::QuestionAnswering => "bert-qa",
                _ => "bert-seqcls",
            };
            let mut cfg =
                BertConfig::from_file(&fixtures().join("tiny").join(fixture).join("config.json"))
                    .unwrap();
            cfg.hidden_dropout_prob = 0.1;
            cfg.attention_probs_dropout_prob = 0.15;
            // The classifier's own rate in one case, the hidden one's in the others.
            cfg.classifier_dropout = problem.is_some().then_some(0.3);
            cfg.norm_position = norm;
            cfg.final_layer_norm = norm == NormPosition::Pre;
            cfg.problem_type = problem;
            let c = cfg.num_labels();
            let varmap = VarMap::new();
            let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let model = BertForTask::load(vb, cfg.clone(), kind).unwrap();
            let rows = random_rows(cfg.vocab_size as u32, false);
            let l = head_labels(&rows, c);
            let n = rows.ids.len();
            let dev = Device::Cpu;
            // Answers at a token, at a padding row and past the padded end
            // (clamped, then ignored), as (start, end).
            let spans: Vec<(i64, i64)> = (0..n as i64)
                .map(|s| match s {
                    1 => (20, 3),
                    3 => (0, 100),
                    _ => (s, s + 2),
                })
                .collect();
            let (starts, ends): (Vec<i64>, Vec<i64>) = spans.iter().copied().unzip();
            let (starts, ends) = (
                Tensor::from_vec(starts, n, &dev).unwrap(),
                Tensor::from_vec(ends, n, &dev).unwrap(),
            );
            let (targets, labels) = match (kind, problem) {
                (HeadKind::QuestionAnswering, _) => (
                    HeadTargets::Spans(&spans),
                    Tensor::zeros(1, DType::F32, &dev).unwrap(),
                ),
                (HeadKind::TokenClassification, _) => {
                    let (_, padded, _) = Rows {
                        labels: l.tokens.clone(),
                        ..rows.clone()
                    }
                    .padded();
                    (
                        HeadTargets::Tokens(l.tokens.iter().map(|t| &t[..]).collect()),
                        padded,
                    )
                }
                (_, None) => (
                    HeadTargets::Classes(&l.classes),
                    Tensor::from_vec(l.classes.clone(), n, &dev).unwrap(),
                ),
                _ => (
                    HeadTargets::Values(&l.values),
                    Tensor::from_vec(l.values.clone(), (n, c), &dev).unwrap(),
                ),
            };
            let qa = kind == HeadKind::QuestionAnswering;
            let head_labels = if qa {
                HeadLabels::spans(&starts, &ends)
            } else {
                HeadLabels::labels(Some(&labels))
            };
            let (want_loss, want) = candle_head_step(&model, &rows, &head_labels, 7);
            let longest = rows.ids.iter().map(Vec::len).max().unwrap();
            let batch = HeadBatch {
                sequences: sequences(&rows.ids, &rows.types),
                targets,
                pad_to: if qa || norm == NormPosition::Pre {
                    longest
                } else {
                    0
                },
            };
            seed_dropout(7, 0);
            let out = FinetuneHead::of(&model)
                .unwrap()
                .expect("covered")
                .step(&batch, 1.0, true)
                .unwrap();
            assert!(
                (out.loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "{what}: loss {} vs candle {want_loss}",
                out.loss
            );
            // Without the same masks the losses would differ by far more.
            seed_dropout(8, 0);
            let other = FinetuneHead::of(&model)
                .unwrap()
                .unwrap()
                .step(&batch, 1.0, true)
                .unwrap();
            assert_other_masks_differ(
                &what,
                &varmap,
                (other.loss, &other.gradients),
                (want_loss, &want),
            );
            let checked = assert_same_gradients(&what, &varmap, &out.gradients, &want);
            assert!(checked >= 30, "{what}: only {checked} gradients compared");
            // The weight scales the gradients, not the loss.
            seed_dropout(7, 0);
            let half = FinetuneHead::of(&model)
                .unwrap()
                .unwrap()
                .step(&batch, 0.5, true)
                .unwrap();
            assert_eq!(half.loss, out.loss);
            let vars = vars(&varmap);
            let w = &vars[if qa {
                "qa_outputs.weight"
            } else {
                "classifier.weight"
            }];
            let (full, halved) = (
                out.gradients.get(w.as_tensor()).unwrap(),
                half.gradients.get(w.as_tensor()).unwrap(),
            );
            let (rel, _) = rel_diff(&(halved * 2.0).unwrap(), full);
            assert!(
                rel <= 1e-6,
                "{what}: weight 0.5 gives {rel:e} off half the gradient"
            );
        }
    }
}
