//! ELECTRA on transformers' fixtures (`tests/fixtures/families/electra-*`):
//! the discriminator (`ElectraForPreTraining`, with `embeddings_project`),
//! the generator (`ElectraForMaskedLM`) and sequence classification give
//! transformers' logits, hidden states and attentions at non-padded
//! positions within 1e-4, its losses within 1e-5 relative and its
//! gradients within 1e-4 of each tensor's max; the joint replaced-token
//! objective (`electra-rtd`, shared embeddings) gives both loss parts, the
//! total and the gradients of shared and unshared tensors.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use bertha::fast::train::{MlmBatch, MlmHead, ReplacedTokenHead};
use bertha::model::electra_pretraining::{ElectraPretraining, ReplacedTokenBatch as PairBatch};
use bertha::{
    BertConfig, BertForTask, BertInput, DType, Device, ForwardOptions, HeadInit, HeadKind,
    HeadLabels, HeadOptions, PackedBert, Tensor,
};
use candle_core::backprop::GradStore;
use candle_nn::{VarBuilder, VarMap};
use common::{fixtures, load_safetensors, read_json};

fn dir(name: &str) -> PathBuf {
    fixtures().join("families").join(name)
}

/// [B, T] from rows of ids, or [B] from one row (class labels).
fn ids_tensor(v: &serde_json::Value) -> Tensor {
    if let Ok(row) = serde_json::from_value::<Vec<i64>>(v.clone()) {
        let n = row.len();
        return Tensor::from_vec(row, n, &Device::Cpu).unwrap();
    }
    let rows: Vec<Vec<i64>> = serde_json::from_value(v.clone()).unwrap();
    let (b, t) = (rows.len(), rows[0].len());
    Tensor::from_vec(rows.concat(), (b, t), &Device::Cpu).unwrap()
}

fn input_of(inputs: &serde_json::Value, ids: &serde_json::Value) -> BertInput {
    let u32s = |v: &serde_json::Value| ids_tensor(v).to_dtype(DType::U32).unwrap();
    BertInput {
        input_ids: u32s(ids),
        token_type_ids: Some(u32s(&inputs["token_type_ids"])),
        attention_mask: Some(u32s(&inputs["attention_mask"])),
    }
}

fn lens(inputs: &serde_json::Value) -> Vec<usize> {
    let mask: Vec<Vec<u32>> = serde_json::from_value(inputs["attention_mask"].clone()).unwrap();
    mask.iter()
        .map(|m| m.iter().filter(|&&x| x == 1).count())
        .collect()
}

fn scalar(t: &Tensor) -> f32 {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0]
}

fn rel(got: f32, want: f32) -> f32 {
    ((got - want) / want).abs()
}

/// Worst (logits, hidden, attentions) differences at non-padded positions.
fn output_diffs(
    name: &str,
    logits: &Tensor,
    hidden: Vec<Tensor>,
    att: Vec<Tensor>,
    expected: &HashMap<String, Tensor>,
    lens: &[usize],
    logit_axes: &[usize],
) -> (f32, f32, f32) {
    let want_h = expected["hidden_states"].transpose(0, 1).unwrap();
    let want_a = expected["attentions"].transpose(0, 1).unwrap();
    let hidden = Tensor::stack(&hidden, 0).unwrap().transpose(0, 1).unwrap();
    let att = Tensor::stack(&att, 0).unwrap().transpose(0, 1).unwrap();
    assert_eq!(logits.dims(), expected["logits"].dims(), "{name}: logits");
    assert_eq!(hidden.dims(), want_h.dims(), "{name}: hidden states");
    assert_eq!(att.dims(), want_a.dims(), "{name}: attentions");
    let (mut dl, mut dh, mut da) = (0f32, 0f32, 0f32);
    for (b, &n) in lens.iter().enumerate() {
        dl = dl.max(common::diff_unpadded(
            logits,
            &expected["logits"],
            b,
            n,
            logit_axes,
        ));
        dh = dh.max(common::diff_unpadded(&hidden, &want_h, b, n, &[1]));
        da = da.max(common::diff_unpadded(&att, &want_a, b, n, &[2, 3]));
    }
    (dl, dh, da)
}

/// Each head checkpoint: the head its `architectures` names, its outputs
/// and loss, then the listed gradients from a training-mode load.
#[test]
fn electra_heads_match_transformers() {
    let cases = [
        (
            "electra-discriminator",
            HeadKind::ReplacedTokenDetection,
            &[0usize][..],
        ),
        ("electra-generator", HeadKind::MaskedLM, &[0][..]),
        ("electra-seqcls", HeadKind::SequenceClassification, &[][..]),
    ];
    let mut failures = Vec::new();
    for (name, kind, logit_axes) in cases {
        let d = dir(name);
        let json = read_json(&d.join("inputs.json"));
        let inputs = &json["inputs"];
        let input = input_of(inputs, &inputs["input_ids"]);
        let labels = ids_tensor(&json["labels"]["labels"]);
        let expected = load_safetensors(&d.join("expected.safetensors"));
        let m = BertForTask::from_dir(&d, None, HeadInit::FromCheckpoint, &Device::Cpu)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.kind(), kind, "{name}: the head config.json names");
        // Inference at bf16 / int8 and embeddings run it packed.
        assert!(
            PackedBert::from_model(m.bert()).unwrap().is_some(),
            "{name}"
        );
        let opts = HeadOptions::from(ForwardOptions {
            output_hidden_states: true,
            output_attentions: true,
            train: false,
        });
        let out = m
            .forward(&input, &HeadLabels::labels(Some(&labels)), opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let bertha::TaskOutput::Logits(out) = out else {
            panic!("{name}: one-logits output expected")
        };
        let (dl, dh, da) = output_diffs(
            name,
            &out.logits,
            out.hidden_states.unwrap(),
            out.attentions.unwrap(),
            &expected,
            &lens(inputs),
            logit_axes,
        );
        let r = rel(scalar(&out.loss.unwrap()), scalar(&expected["loss"]));
        println!("{name}: logits {dl:.2e}, hidden {dh:.2e}, attentions {da:.2e}, loss rel {r:.2e}");
        if dl > 1e-4 || dh > 1e-4 || da > 1e-4 || r > 1e-5 {
            failures.push(format!(
                "{name}: logits {dl:e}, hidden {dh:e}, att {da:e}, loss {r:e}"
            ));
        }

        // Gradients, from a VarMap as training holds the weights.
        let config = BertConfig::from_file(&d.join("config.json")).unwrap();
        let mut varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let m = BertForTask::load(vb, config, kind).unwrap();
        varmap.load(d.join("model.safetensors")).unwrap();
        let out = m
            .forward(
                &input,
                &HeadLabels::labels(Some(&labels)),
                ForwardOptions::default().into(),
            )
            .unwrap();
        let grads = out.loss().unwrap().backward().unwrap();
        let vars = varmap.data().lock().unwrap();
        let params: Vec<String> = serde_json::from_value(json["grad_params"].clone()).unwrap();
        for p in &params {
            let got = common::grad_of(&grads, &vars, p, name);
            let want = &expected[&format!("grad.{p}")];
            let scale = common::max_abs(want);
            let diff = common::max_abs_diff(got, want);
            println!("{name} grad.{p}: {:.2e} of max {scale:.2e}", diff / scale);
            if diff > 1e-4 * scale.max(1e-12) {
                failures.push(format!("{name} grad.{p}: {diff:e} of max {scale:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The `electra-rtd` fixture: its pair loaded with transformers' weights
/// (the generator's own tensors under `generator.`, its embeddings the
/// discriminator's), its inputs and expected values.
struct RtdFixture {
    varmap: VarMap,
    pair: ElectraPretraining,
    json: serde_json::Value,
    expected: HashMap<String, Tensor>,
}

fn rtd_fixture() -> RtdFixture {
    let d = dir("electra-rtd");
    let json = read_json(&d.join("inputs.json"));
    let expected = load_safetensors(&d.join("expected.safetensors"));
    let disc_cfg = BertConfig::from_file(&d.join("discriminator/config.json")).unwrap();
    let gen_cfg = BertConfig::from_file(&d.join("generator/config.json")).unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let pair = ElectraPretraining::load(vb, disc_cfg, gen_cfg).unwrap();
    let disc_w = load_safetensors(&d.join("discriminator/model.safetensors"));
    let gen_w = load_safetensors(&d.join("generator/model.safetensors"));
    {
        let mut data = varmap.data().lock().unwrap();
        let mut set = |name: String, t: &Tensor| {
            let var = data
                .get_mut(&name)
                .unwrap_or_else(|| panic!("no variable {name}"));
            var.set(t).unwrap();
        };
        for (n, t) in &disc_w {
            set(n.clone(), t);
        }
        for (n, t) in &gen_w {
            if n.starts_with("electra.embeddings.") {
                let shared = &disc_w[n];
                assert_eq!(common::max_abs_diff(t, shared), 0.0, "{n} is shared");
            } else if n != "generator_lm_head.weight" {
                set(format!("generator.{n}"), t);
            }
        }
        assert!(
            !data
                .keys()
                .any(|k| k.starts_with("generator.electra.embeddings.")),
            "the generator keeps no embeddings of its own"
        );
    }
    RtdFixture {
        varmap,
        pair,
        json,
        expected,
    }
}

/// Failures among the gradients of every tensor the fixture names, both
/// models' parts of the shared ones summed in `grads`.
fn rtd_gradient_failures(f: &RtdFixture, grads: &GradStore) -> Vec<String> {
    let vars = f.varmap.data().lock().unwrap();
    let params: HashMap<String, Vec<String>> =
        serde_json::from_value(f.json["grad_params"].clone()).unwrap();
    let mut failures = Vec::new();
    for (model, names) in &params {
        for p in names {
            let var = match model.as_str() {
                "discriminator" => p.clone(),
                _ => format!("generator.{p}"),
            };
            let got = common::grad_of(grads, &vars, &var, "electra-rtd");
            let want = &f.expected[&format!("grad.{model}.{p}")];
            let scale = common::max_abs(want);
            let diff = common::max_abs_diff(got, want);
            println!("grad.{model}.{p}: {:.2e} of max {scale:.2e}", diff / scale);
            if diff > 1e-4 * scale.max(1e-12) {
                failures.push(format!("grad.{model}.{p}: {diff:e} of max {scale:e}"));
            }
        }
    }
    failures
}

/// Failures among the loss parts and the total, against the fixture's.
fn rtd_loss_failures(f: &RtdFixture, parts: [(&str, f32); 3]) -> Vec<String> {
    let mut failures = Vec::new();
    for (what, got) in parts {
        let r = rel(got, scalar(&f.expected[what]));
        println!("{what}: rel {r:.2e}");
        if r > 1e-5 {
            failures.push(format!("{what}: rel {r:e}"));
        }
    }
    failures
}

/// The joint objective on the fixture's own corruption: generator loss,
/// discriminator loss, `gen + 50 × disc`, both logits, and gradients of
/// shared tensors (both models' parts summed) and unshared ones.
#[test]
fn replaced_token_objective_matches_transformers() {
    let f = rtd_fixture();
    let (json, expected, pair) = (&f.json, &f.expected, &f.pair);
    let inputs = &json["inputs"];
    let masked = input_of(inputs, &json["masked_input_ids"]);
    let corrupted = input_of(inputs, &json["corrupted_input_ids"]);
    let gen_labels = ids_tensor(&json["generator_labels"]);
    let disc_labels = ids_tensor(&json["discriminator_labels"]);
    let weight = json["discriminator_weight"].as_f64().unwrap();
    let batch = PairBatch {
        masked: &masked,
        generator_labels: &gen_labels,
        corrupted: &corrupted,
        discriminator_labels: &disc_labels,
    };
    let out = pair
        .forward(&batch, weight, ForwardOptions::default().into())
        .unwrap();
    let mut failures = rtd_loss_failures(
        &f,
        [
            ("loss", scalar(&out.loss)),
            ("generator_loss", scalar(&out.generator_loss)),
            ("discriminator_loss", scalar(&out.discriminator_loss)),
        ],
    );
    let lens = lens(inputs);
    for (what, got, axes) in [
        ("generator_logits", &out.generator_logits, &[0usize][..]),
        ("discriminator_logits", &out.discriminator_logits, &[0][..]),
    ] {
        let worst = lens
            .iter()
            .enumerate()
            .map(|(b, &n)| common::diff_unpadded(got, &expected[what], b, n, axes))
            .fold(0f32, f32::max);
        println!("{what}: {worst:.2e}");
        if worst > 1e-4 {
            failures.push(format!("{what}: {worst:e}"));
        }
    }
    let grads = out.loss.backward().unwrap();
    failures.extend(rtd_gradient_failures(&f, &grads));
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The same objective on the fast engine: the generator's MLM step on the
/// masked rows and the discriminator's on the corrupted ones, packed
/// without padding, give the fixture's loss parts and, their gradient
/// stores added, its gradients.
#[test]
fn replaced_token_objective_matches_transformers_on_the_fast_path() {
    let f = rtd_fixture();
    let json = &f.json;
    let rows = |key: &str| -> Vec<Vec<i64>> { serde_json::from_value(json[key].clone()).unwrap() };
    let lens = lens(&json["inputs"]);
    let cut = |rows: Vec<Vec<i64>>| -> Vec<Vec<i64>> {
        rows.into_iter()
            .zip(&lens)
            .map(|(r, &n)| r[..n].to_vec())
            .collect()
    };
    let ids = |key: &str| -> Vec<Vec<u32>> {
        cut(rows(key))
            .into_iter()
            .map(|r| r.into_iter().map(|v| v as u32).collect())
            .collect()
    };
    let (masked, corrupted, types) = (
        ids("masked_input_ids"),
        ids("corrupted_input_ids"),
        cut(serde_json::from_value(json["inputs"]["token_type_ids"].clone()).unwrap())
            .into_iter()
            .map(|r| r.into_iter().map(|v| v as u32).collect::<Vec<u32>>())
            .collect::<Vec<_>>(),
    );
    let gen_labels = cut(rows("generator_labels"));
    let replaced: Vec<Vec<bool>> = cut(rows("discriminator_labels"))
        .into_iter()
        .map(|r| r.into_iter().map(|v| v == 1).collect())
        .collect();
    let weight = json["discriminator_weight"].as_f64().unwrap();
    let pack = |ids: &[Vec<u32>]| -> Vec<(Vec<u32>, Vec<u32>)> {
        ids.iter().cloned().zip(types.iter().cloned()).collect()
    };
    let (masked, corrupted) = (pack(&masked), pack(&corrupted));
    fn seqs(p: &[(Vec<u32>, Vec<u32>)]) -> Vec<(&[u32], &[u32])> {
        p.iter().map(|(i, t)| (&i[..], &t[..])).collect()
    }
    let generator = MlmHead::of_masked_lm(&f.pair.generator)
        .unwrap()
        .expect("the fast path runs the generator");
    let gen = generator
        .step(
            &MlmBatch {
                sequences: seqs(&masked),
                labels: gen_labels.iter().map(|l| &l[..]).collect(),
                next_sentence: None,
            },
            [1.0, 0.0],
            false,
        )
        .unwrap();
    let disc = ReplacedTokenHead::of(&f.pair.discriminator)
        .unwrap()
        .expect("the fast path runs the discriminator")
        .step(
            &bertha::fast::train::ReplacedTokenBatch {
                sequences: seqs(&corrupted),
                replaced: replaced.iter().map(|r| &r[..]).collect(),
            },
            weight,
            false,
        )
        .unwrap();
    let total = gen.mlm_loss + weight * disc.loss;
    let mut failures = rtd_loss_failures(
        &f,
        [
            ("loss", total as f32),
            ("generator_loss", gen.mlm_loss as f32),
            ("discriminator_loss", disc.loss as f32),
        ],
    );
    let mut grads = gen.gradients;
    grads.extend(disc.gradients).unwrap();
    failures.extend(rtd_gradient_failures(&f, &grads));
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A generator that cannot share the discriminator's embeddings is refused
/// by name.
#[test]
fn a_generator_of_another_embedding_width_is_refused() {
    let d = dir("electra-rtd");
    let disc = BertConfig::from_file(&d.join("discriminator/config.json")).unwrap();
    let mut gen = BertConfig::from_file(&d.join("generator/config.json")).unwrap();
    gen.family = bertha::Family::Electra(bertha::config::ElectraOptions {
        embedding_size: 8,
        summary: Default::default(),
    });
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let err = common::err_text(ElectraPretraining::load(vb, disc, gen));
    assert!(err.contains("embedding_size"), "{err}");
}

/// fill-mask on the generator: candidates best first, each score the
/// softmax of the generator's logits at `[MASK]`.
#[test]
fn pipelines_run_on_electra() {
    use bertha::tasks::FillMask;
    let d = dir("electra-generator");
    let fm = FillMask::from_dir(&d, &Device::Cpu).unwrap();
    let text = "tok5 [MASK] tok7";
    let got = fm.fill(text, 5).unwrap();
    let enc = fm.tokenizer().encode(text).unwrap();
    let pos = enc.tokens.iter().position(|t| t == "[MASK]").unwrap();
    let m = BertForTask::from_dir(&d, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let n = enc.input_ids.len();
    let input = BertInput {
        input_ids: Tensor::from_vec(enc.input_ids.clone(), (1, n), &Device::Cpu).unwrap(),
        token_type_ids: None,
        attention_mask: None,
    };
    let bertha::TaskOutput::Logits(out) = m
        .forward(
            &input,
            &HeadLabels::default(),
            ForwardOptions::default().into(),
        )
        .unwrap()
    else {
        panic!("one-logits output expected")
    };
    let row = out
        .logits
        .get(0)
        .unwrap()
        .get(pos)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    assert_eq!(got[0].len(), 5);
    let mut last = f32::INFINITY;
    for p in &got[0] {
        let want = ((row[p.token as usize] as f64 - max).exp() / sum) as f32;
        assert!((p.score - want).abs() < 1e-6, "{p:?} vs {want}");
        assert!(p.score <= last);
        last = p.score;
    }
}
