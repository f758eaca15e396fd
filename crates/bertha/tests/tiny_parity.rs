//! Tiny random BERT checkpoints saved by transformers (every head class),
//! and the seed's pre-LN mini BERT, against their reference outputs.

mod common;

use bertha::{BertConfig, BertInput, BertModel, Device, ForwardOptions, Tensor, Weights};
use common::{fixtures, load_safetensors, read_json};

fn ids(v: &serde_json::Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Compares `got` [B, ...] with `want` at non-padded positions only:
/// `seq_axes` are the axes (after batch) that index tokens.
fn assert_close_masked(
    what: &str,
    got: &Tensor,
    want: &Tensor,
    lens: &[usize],
    seq_axes: &[usize],
) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    for (b, &n) in lens.iter().enumerate() {
        let mut g = got.get(b).unwrap();
        let mut w = want.get(b).unwrap();
        for &ax in seq_axes {
            g = g.narrow(ax, 0, n).unwrap();
            w = w.narrow(ax, 0, n).unwrap();
        }
        let d = common::max_abs_diff(&g.contiguous().unwrap(), &w.contiguous().unwrap());
        assert!(d <= 1e-4, "{what}, sequence {b}: max abs diff {d:e}");
    }
}

fn check_tiny(name: &str) {
    let dir = fixtures().join("tiny").join(name);
    let model = BertModel::from_dir(&dir, &Device::Cpu).unwrap();
    let inputs = read_json(&dir.join("inputs.json"));
    let input_ids = ids(&inputs["inputs"]["input_ids"]);
    let types = ids(&inputs["inputs"]["token_type_ids"]);
    let mask = ids(&inputs["inputs"]["attention_mask"]);
    let lens: Vec<usize> = mask
        .iter()
        .map(|m| m.iter().filter(|&&x| x == 1).count())
        .collect();
    let (b, t) = (input_ids.len(), input_ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    let input = BertInput {
        input_ids: flat(&input_ids),
        token_type_ids: Some(flat(&types)),
        attention_mask: Some(flat(&mask)),
    };
    let out = model
        .forward(
            &input,
            ForwardOptions {
                output_hidden_states: true,
                output_attentions: true,
                train: false,
            },
        )
        .unwrap();
    let expected = load_safetensors(&dir.join("expected.safetensors"));

    // [L+1, B, T, D] → per batch row [L+1, T, D]
    let hidden = Tensor::stack(&out.hidden_states.unwrap(), 1).unwrap();
    assert_close_masked(
        &format!("{name} hidden_states"),
        &hidden,
        &expected["hidden_states"].transpose(0, 1).unwrap(),
        &lens,
        &[1],
    );
    let last_want = expected["hidden_states"]
        .get(expected["hidden_states"].dim(0).unwrap() - 1)
        .unwrap();
    // The last hidden state is the last of them, and the fixture's own
    // `last_hidden_state` where it has one.
    for want in [Some(&last_want), expected.get("last_hidden_state")]
        .into_iter()
        .flatten()
    {
        assert_close_masked(
            &format!("{name} last_hidden_state"),
            &out.last_hidden_state,
            want,
            &lens,
            &[0],
        );
    }
    // [L, B, H, T, T] → per batch row [L, H, T, T]; queries and keys both.
    let att = Tensor::stack(&out.attentions.unwrap(), 1).unwrap();
    assert_close_masked(
        &format!("{name} attentions"),
        &att,
        &expected["attentions"].transpose(0, 1).unwrap(),
        &lens,
        &[2, 3],
    );
    if let Some(want) = expected.get("pooler_output") {
        let got = out.pooler_output.expect("checkpoint has a pooler");
        let d = common::max_abs_diff(&got, want);
        assert!(d <= 1e-4, "{name} pooler_output: {d:e}");
    }
}

#[test]
fn bert_pretraining_checkpoint() {
    check_tiny("bert-pretraining");
}

#[test]
fn bert_mlm_checkpoint() {
    check_tiny("bert-mlm");
}

#[test]
fn bert_sequence_classification_checkpoint() {
    check_tiny("bert-seqcls");
}

#[test]
fn bert_token_classification_checkpoint() {
    check_tiny("bert-tokcls");
}

#[test]
fn bert_question_answering_checkpoint() {
    check_tiny("bert-qa");
}

/// Builds the mini BERT from the fixture's own description of it.
fn mini_bert_config(exp: &serde_json::Value) -> BertConfig {
    let n = |k: &str| exp[k].as_u64().unwrap() as usize;
    assert_eq!(exp["norm"], "pre");
    assert_eq!(exp["activation"], "relu");
    assert_eq!(exp["token_type_embeddings"], false);
    assert_eq!(exp["embedding_layer_norm"], false);
    assert_eq!(exp["final_layer_norm"], false);
    let cfg = BertConfig {
        vocab_size: n("vocab_size"),
        hidden_size: n("d_model"),
        num_attention_heads: n("num_heads"),
        intermediate_size: n("d_ff"),
        num_hidden_layers: n("num_layers"),
        max_position_embeddings: n("max_len"),
        layer_norm_eps: exp["layer_norm_eps"].as_f64().unwrap(),
        ..BertConfig::mini_bert_seed()
    };
    assert_eq!(
        cfg,
        BertConfig::mini_bert_seed(),
        "the preset is the seed's mini BERT"
    );
    cfg
}

#[test]
fn mini_bert_seed_matches_the_reference_implementation() {
    let dir = fixtures().join("mini_bert_seed000");
    let exp = read_json(&dir.join("expected.json"));
    let cfg = mini_bert_config(&exp);
    let weights = Weights::from_safetensors(&[dir.join("weights.safetensors")]).unwrap();
    let model = BertModel::from_weights(weights, cfg, &Device::Cpu).unwrap();
    assert!(!model.has_pooler());
    let tokens: Vec<u32> = serde_json::from_value(exp["token_ids"].clone()).unwrap();
    let t = tokens.len();
    let input = BertInput {
        input_ids: Tensor::from_vec(tokens, (1, t), &Device::Cpu).unwrap(),
        token_type_ids: None,
        attention_mask: None,
    };
    let out = model.forward(&input, ForwardOptions::default()).unwrap();
    let got = out
        .last_hidden_state
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let want: Vec<f64> = serde_json::from_value(exp["expected_flat"].clone()).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((f64::from(*g) - w).abs() <= 1e-5, "element {i}: {g} vs {w}");
    }
}

#[test]
fn mini_bert_config_file_spelling_loads() {
    let json = r#"{
        "model_type": "bert", "vocab_size": 16, "hidden_size": 8, "num_attention_heads": 2,
        "intermediate_size": 16, "num_hidden_layers": 2, "max_position_embeddings": 4,
        "layer_norm_eps": 1e-6, "hidden_act": "relu", "type_vocab_size": 0,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "norm_position": "pre", "embedding_layer_norm": false,
        "final_layer_norm": false, "add_pooling_layer": false,
        "architectures": ["BertModel"]
    }"#;
    let cfg = BertConfig::from_json_str(json, std::path::Path::new("mini.json")).unwrap();
    assert_eq!(cfg, BertConfig::mini_bert_seed());
}

#[test]
fn random_init_is_seeded_and_bert_like() {
    let cfg = BertConfig::mini_bert_seed();
    let a = BertModel::random(cfg.clone(), 7, &Device::Cpu).unwrap();
    let b = BertModel::random(cfg.clone(), 7, &Device::Cpu).unwrap();
    let c = BertModel::random(cfg, 8, &Device::Cpu).unwrap();
    let input = BertInput {
        input_ids: Tensor::new(&[[1u32, 5, 9, 2]], &Device::Cpu).unwrap(),
        token_type_ids: None,
        attention_mask: None,
    };
    let run = |m: &BertModel| {
        m.forward(&input, ForwardOptions::default())
            .unwrap()
            .last_hidden_state
    };
    assert_eq!(
        common::max_abs_diff(&run(&a), &run(&b)),
        0.0,
        "same seed, same model"
    );
    assert!(
        common::max_abs_diff(&run(&a), &run(&c)) > 1e-3,
        "another seed, another model"
    );

    // normal(0, 0.02): check the empirical std of a big random matrix.
    let big = BertConfig {
        vocab_size: 4096,
        hidden_size: 64,
        num_attention_heads: 4,
        ..BertConfig::mini_bert_seed()
    };
    let m = BertModel::random(big, 0, &Device::Cpu).unwrap();
    let w = m
        .embeddings()
        .word_embeddings()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let n = w.len() as f64;
    let mean = w.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let std = (w
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    assert!(mean.abs() < 1e-3, "mean {mean}");
    assert!((std - 0.02).abs() < 1e-3, "std {std}");
}

#[test]
fn pytorch_bin_checkpoint_loads_like_safetensors() {
    // tests/fixtures/tiny-pth holds bert-mlm's tensors as pytorch_model.bin
    // (made by scripts/make_pth_fixture.py in torch.save's zip layout).
    let pth_dir = fixtures().join("tiny-pth");
    assert!(!pth_dir.join("model.safetensors").exists());
    let from_pth = BertModel::from_dir(&pth_dir, &Device::Cpu).unwrap();
    let from_st = BertModel::from_dir(&fixtures().join("tiny/bert-mlm"), &Device::Cpu).unwrap();
    let input = BertInput::from_ids(
        &[vec![2, 528, 775, 973, 3]],
        &[vec![0, 0, 0, 1, 1]],
        0,
        &Device::Cpu,
    )
    .unwrap();
    let opts = ForwardOptions::default();
    let a = from_pth.forward(&input, opts).unwrap().last_hidden_state;
    let b = from_st.forward(&input, opts).unwrap().last_hidden_state;
    assert_eq!(common::max_abs_diff(&a, &b), 0.0);
}

#[test]
fn packed_fast_path_matches_on_pre_ln_and_tiny_checkpoints() {
    // The seed's pre-LN mini BERT.
    let dir = fixtures().join("mini_bert_seed000");
    let exp = read_json(&dir.join("expected.json"));
    let weights = Weights::from_safetensors(&[dir.join("weights.safetensors")]).unwrap();
    let model = BertModel::from_weights(weights, mini_bert_config(&exp), &Device::Cpu).unwrap();
    let packed = bertha::fast::PackedBert::from_model(&model)
        .unwrap()
        .unwrap();
    let tokens: Vec<u32> = serde_json::from_value(exp["token_ids"].clone()).unwrap();
    let types = vec![0; tokens.len()];
    let states = packed.forward(&[(&tokens, &types)]).unwrap();
    let want: Vec<f64> = serde_json::from_value(exp["expected_flat"].clone()).unwrap();
    for (g, w) in states.sequence(0).iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() <= 1e-5, "{g} vs {w}");
    }
    rows_at_equal_the_whole_pass("mini_bert_seed", &model, &[(&tokens, &types)]);

    // Every tiny BERT checkpoint, both sequences packed together.
    for name in [
        "bert-pretraining",
        "bert-mlm",
        "bert-seqcls",
        "bert-tokcls",
        "bert-qa",
    ] {
        let dir = fixtures().join("tiny").join(name);
        let model = BertModel::from_dir(&dir, &Device::Cpu).unwrap();
        let packed = bertha::fast::PackedBert::from_model(&model)
            .unwrap()
            .unwrap();
        let inputs = read_json(&dir.join("inputs.json"));
        let input_ids = ids(&inputs["inputs"]["input_ids"]);
        let types = ids(&inputs["inputs"]["token_type_ids"]);
        let mask = ids(&inputs["inputs"]["attention_mask"]);
        let seqs: Vec<(Vec<u32>, Vec<u32>)> = input_ids
            .iter()
            .zip(&types)
            .zip(&mask)
            .map(|((i, t), m)| {
                let n = m.iter().filter(|&&x| x == 1).count();
                (i[..n].to_vec(), t[..n].to_vec())
            })
            .collect();
        let refs: Vec<(&[u32], &[u32])> = seqs.iter().map(|(i, t)| (&i[..], &t[..])).collect();
        let states = packed.forward(&refs).unwrap();
        rows_at_equal_the_whole_pass(name, &model, &refs);
        let expected = load_safetensors(&dir.join("expected.safetensors"));
        let hs = &expected["hidden_states"];
        let last = hs.get(hs.dim(0).unwrap() - 1).unwrap();
        for (b, (seq, _)) in seqs.iter().enumerate() {
            let want = last.get(b).unwrap().narrow(0, 0, seq.len()).unwrap();
            let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let d = states
                .sequence(b)
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(d <= 1e-4, "{name} sequence {b}: {d:e}");
        }
    }
}

/// `forward_at` (the last layer at one row per sequence: first, middle and
/// last rows) gives the whole pass's states at those rows, in fp32 (1e-5)
/// and in bf16 (cosine to the fp32 rows ≥ 0.9999); a row outside a
/// sequence is an error naming it.
fn rows_at_equal_the_whole_pass(name: &str, model: &BertModel, seqs: &[(&[u32], &[u32])]) {
    let packed = bertha::fast::PackedBert::from_model(model)
        .unwrap()
        .unwrap();
    let full = packed.forward(seqs).unwrap();
    let d = full.hidden;
    let mut bf16 = bertha::fast::PackedBert::from_model(model)
        .unwrap()
        .unwrap();
    bf16.to_bf16();
    let picks: [fn(usize) -> usize; 3] = [|_| 0, |len| len / 2, |len| len - 1];
    for pick in picks {
        let rows: Vec<usize> = seqs.iter().map(|(ids, _)| pick(ids.len())).collect();
        let at = packed.forward_at(seqs, &rows).unwrap();
        let at16 = bf16.forward_at(seqs, &rows).unwrap();
        assert_eq!(at.len(), seqs.len());
        for (s, &r) in rows.iter().enumerate() {
            let want = &full.sequence(s)[r * d..(r + 1) * d];
            let diff = at
                .sequence(s)
                .iter()
                .zip(want)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(diff <= 1e-5, "{name} sequence {s}, row {r}: {diff:e}");
            let got = at16.sequence(s);
            let dot: f32 = got.iter().zip(want).map(|(x, y)| x * y).sum();
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let cos = dot / (norm(got) * norm(want));
            assert!(
                cos >= 0.9999,
                "{name} sequence {s}, row {r}, bf16: cosine {cos}"
            );
        }
    }
    let past: Vec<usize> = seqs.iter().map(|(ids, _)| ids.len()).collect();
    let err = packed
        .forward_at(seqs, &past)
        .err()
        .expect("a row past the end");
    assert!(err.to_string().contains("which has"), "{err}");
}
