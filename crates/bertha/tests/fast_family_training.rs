//! The training fast path on the other families' encoders (ELECTRA,
//! RoBERTa, DistilBERT) under their fine-tuning heads: with dropout on, a
//! step's loss and gradients equal the candle path's.

mod common;

use bertha::fast::train::{FinetuneHead, HeadBatch, HeadTargets};
use bertha::model::{seed_dropout, BertForTask, HeadKind, HeadLabels};
use bertha::BertConfig;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::fast_steps::{
    assert_other_masks_differ, assert_same_gradients, candle_head_step, head_labels, random_rows,
    sequences, span_positions, vars, Rows,
};
use common::fixtures;

/// The fine-tuning heads every family's encoder runs under.
const FINETUNE_HEADS: [HeadKind; 3] = [
    HeadKind::SequenceClassification,
    HeadKind::TokenClassification,
    HeadKind::QuestionAnswering,
];

/// ELECTRA's encoder on the fast path (narrower embeddings, so
/// `embeddings_project`), under its sequence classifier (dense → GELU →
/// `out_proj` on the first token, dropout before each) and the
/// token-classification and QA heads: with dropout on, a step equals the
/// candle head's.
#[test]
fn electra_finetuning_steps_equal_the_candle_path() {
    let dir = fixtures().join("families").join("electra-discriminator");
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    assert!(
        cfg.embedding_size() < cfg.hidden_size,
        "a projecting config"
    );
    family_steps_equal_the_candle_path(cfg, "electra.embeddings_project.weight");
}

/// RoBERTa's encoder on the fast path (positions from the padding id, its
/// row frozen; no token types) under its own sequence classifier (dropout
/// → dense → tanh → dropout → out_proj) and the token-classification and
/// QA heads, QA with padding rows as a padded batch has them.
#[test]
fn roberta_finetuning_steps_equal_the_candle_path() {
    let dir = fixtures().join("tiny").join("roberta-mlm");
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    family_steps_equal_the_candle_path(cfg, "roberta.embeddings.position_embeddings.weight");
}

/// DistilBERT's encoder on the fast path (no token types, no dropout on
/// the attention's output) under its sequence classifier (`pre_classifier`
/// → ReLU → dropout → `classifier`), the token classifier and its QA head,
/// which drops the hidden states before `qa_outputs` (`qa_dropout`).
#[test]
fn distilbert_finetuning_steps_equal_the_candle_path() {
    let dir = fixtures().join("tiny").join("distilbert-mlm");
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    match &cfg.family {
        bertha::config::Family::DistilBert(o) => assert!(o.qa_dropout > 0.0),
        other => panic!("{other:?}"),
    }
    family_steps_equal_the_candle_path(
        cfg,
        "distilbert.transformer.layer.0.attention.out_lin.weight",
    );
}

/// ALBERT's encoder on the fast path (embeddings projected by
/// `embedding_hidden_mapping_in`; one layer group shared by the 3 steps,
/// so its parameters add the gradients of every step) under the pooler's
/// sequence classifier, the token classifier and QA.
#[test]
fn albert_finetuning_steps_equal_the_candle_path() {
    let dir = fixtures().join("tiny").join("albert-mlm");
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    match &cfg.family {
        bertha::config::Family::Albert(o) => assert!(o.num_hidden_groups < cfg.num_hidden_layers),
        other => panic!("{other:?}"),
    }
    family_steps_equal_the_candle_path(
        cfg,
        "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight",
    );
}

/// A step of each of [`FINETUNE_HEADS`] on a model of `cfg` (dropout on) on both
/// engines; `named` must be among the gradients.
fn family_steps_equal_the_candle_path(mut cfg: BertConfig, named: &str) {
    cfg.hidden_dropout_prob = 0.1;
    cfg.attention_probs_dropout_prob = 0.15;
    cfg.id2label = (0..3).map(|i| (i, format!("L{i}"))).collect();
    let dev = Device::Cpu;
    for kind in FINETUNE_HEADS {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let model = BertForTask::load(vb, cfg.clone(), kind).unwrap();
        let rows = random_rows(cfg.vocab_size as u32, false);
        let n = rows.ids.len();
        let l = head_labels(&rows, 3);
        let spans: Vec<(i64, i64)> = (0..n as i64).map(|s| (s, s + 2)).collect();
        let (starts, ends) = span_positions(&spans);
        let (_, padded, _) = Rows {
            labels: l.tokens.clone(),
            ..rows.clone()
        }
        .padded();
        let qa = kind == HeadKind::QuestionAnswering;
        let classes = Tensor::from_vec(l.classes.clone(), n, &dev).unwrap();
        let (targets, head_labels) = match kind {
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
        let (want_loss, want) = candle_head_step(&model, &rows, &head_labels, 7);
        let longest = rows.ids.iter().map(Vec::len).max().unwrap();
        let batch = HeadBatch {
            sequences: sequences(&rows.ids, &rows.types),
            targets,
            pad_to: if qa { longest } else { 0 },
        };
        seed_dropout(7, 0);
        let out = FinetuneHead::of(&model)
            .unwrap()
            .expect("the fast path runs the family's encoder")
            .step(&batch, 1.0, true)
            .unwrap();
        let what = format!("{} {kind:?}", cfg.model_type);
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
        let named = vars(&varmap)[named].clone();
        assert!(out.gradients.get(named.as_tensor()).is_some());
        // All but a few (zero in exact arithmetic, such as QA's last
        // LayerNorm bias) of the model's tensors.
        let all = vars(&varmap).len();
        assert!(
            checked + 4 >= all,
            "{what}: only {checked} of {all} gradients compared"
        );
    }
}
