//! Broken folders and hostile inputs give clear errors naming the file,
//! field or tensor, never a panic.

mod common;

use std::path::Path;

use bertha::{BertModel, Device, Error};
use common::fixtures;

/// A copy of a tiny checkpoint in a temp dir, to break at will.
fn copy_tiny(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("tiny").join(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

/// Loading `dir` fails with an error that names every one of `parts`.
#[track_caller]
fn assert_load_err(dir: &Path, parts: &[&str]) {
    let err = match BertModel::from_dir(dir, &Device::Cpu) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    };
    assert!(parts.iter().all(|p| err.contains(p)), "{err}");
}

/// Rewrites the `config.json` in `dir` with `edit`.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).unwrap();
}

#[test]
fn corrupt_safetensors_names_the_file() {
    let tmp = copy_tiny("bert-mlm");
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    assert_load_err(
        tmp.path(),
        &["model.safetensors", "not a valid safetensors"],
    );

    std::fs::write(&path, b"this is not a safetensors file at all").unwrap();
    assert_load_err(tmp.path(), &["model.safetensors"]);
}

#[test]
fn unsupported_config_option_names_the_field() {
    let tmp = copy_tiny("bert-mlm");
    edit_config(tmp.path(), |cfg| {
        cfg["position_embedding_type"] = "relative_key_query".into()
    });
    assert_load_err(tmp.path(), &["config.json", "position_embedding_type"]);
}

#[test]
fn invalid_config_json_names_the_file() {
    let tmp = copy_tiny("bert-mlm");
    std::fs::write(tmp.path().join("config.json"), "{ not json").unwrap();
    assert_load_err(tmp.path(), &["config.json", "invalid JSON"]);
}

#[test]
fn missing_tensor_is_named() {
    let tmp = copy_tiny("bert-mlm");
    let path = tmp.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    tensors.remove("bert.encoder.layer.1.attention.self.key.weight");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    assert_load_err(
        tmp.path(),
        &[
            "missing tensor `bert.encoder.layer.1.attention.self.key.weight`",
            "[32, 32]",
        ],
    );
}

#[test]
fn shape_mismatch_names_the_tensor_and_both_shapes() {
    let tmp = copy_tiny("bert-mlm");
    edit_config(tmp.path(), |cfg| cfg["intermediate_size"] = 40.into());
    assert_load_err(
        tmp.path(),
        &[
            "bert.encoder.layer.0.intermediate.dense.weight",
            "[37, 32]",
            "[40, 32]",
        ],
    );
}

#[test]
fn missing_folder_and_missing_weights_are_explained() {
    assert_load_err(
        Path::new("/nonexistent/model"),
        &["/nonexistent/model", "no such directory"],
    );

    let tmp = copy_tiny("bert-mlm");
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    assert_load_err(tmp.path(), &["no weights found"]);

    let tmp = copy_tiny("bert-mlm");
    std::fs::remove_file(tmp.path().join("config.json")).unwrap();
    assert_load_err(tmp.path(), &["config.json is missing"]);
}

#[test]
fn unprefixed_and_sharded_checkpoints_load_the_same() {
    let src = fixtures().join("tiny/bert-mlm");
    let reference = BertModel::from_dir(&src, &Device::Cpu).unwrap();
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let base: std::collections::HashMap<String, _> = tensors
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("bert.").map(|k| (k.to_string(), v.clone())))
        .collect();

    // A bare BertModel checkpoint (no `bert.` prefix), split into two shards.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let (a, b): (Vec<_>, Vec<_>) = base.iter().partition(|(k, _)| k.starts_with("embeddings"));
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        let part: std::collections::HashMap<String, _> = part
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for k in part.keys() {
            weight_map.insert(k.clone(), file.into());
        }
        candle_core::safetensors::save(&part, tmp.path().join(file)).unwrap();
    }
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::json!({ "metadata": {}, "weight_map": weight_map }).to_string(),
    )
    .unwrap();
    let sharded = BertModel::from_dir(tmp.path(), &Device::Cpu).unwrap();

    let input =
        bertha::BertInput::from_ids(&[vec![2, 10, 20, 3]], &[vec![0, 0, 0, 0]], 0, &Device::Cpu)
            .unwrap();
    let opts = bertha::ForwardOptions::default();
    let want = reference.forward(&input, opts).unwrap().last_hidden_state;
    let got = sharded.forward(&input, opts).unwrap().last_hidden_state;
    assert_eq!(common::max_abs_diff(&got, &want), 0.0);
}

#[test]
fn over_long_input_to_the_model_is_an_error_not_a_panic() {
    let model = BertModel::from_dir(&fixtures().join("tiny/bert-mlm"), &Device::Cpu).unwrap();
    let n = model.config().max_position_embeddings + 1;
    let input = bertha::BertInput::from_ids(&[vec![5; n]], &[vec![0; n]], 0, &Device::Cpu).unwrap();
    match model.forward(&input, bertha::ForwardOptions::default()) {
        Err(Error::Input(msg)) => assert!(msg.contains("max_position_embeddings"), "{msg}"),
        other => panic!("expected an input error, got {other:?}"),
    }
}

/// A tokenizer that gives ids past `vocab_size` is refused when a model
/// loads, naming both sizes and the folder (else every text holding such
/// an id would fail, or a whole server batch with it).
#[test]
fn tokenizer_larger_than_vocab_size_is_refused_at_load() {
    let tmp = copy_tiny("bert-mlm");
    std::fs::copy(
        fixtures().join("minilm-tokenizer/tokenizer.json"),
        tmp.path().join("tokenizer.json"),
    )
    .unwrap();
    let dir = tmp.path().display().to_string();
    let parts = ["30522", "vocab_size is 1024", dir.as_str()];
    let check = |err: Error| {
        let err = err.to_string();
        assert!(parts.iter().all(|p| err.contains(p)), "{err}");
    };
    let opts = bertha::EmbedOptions::default();
    check(
        bertha::Embedder::from_dir(tmp.path(), &Device::Cpu, &opts)
            .err()
            .unwrap(),
    );
    check(
        bertha::tasks::FillMask::from_dir(tmp.path(), &Device::Cpu)
            .err()
            .unwrap(),
    );
    check(
        bertha::tasks::AttentionModel::from_dir(tmp.path(), &Device::Cpu)
            .err()
            .unwrap(),
    );
}

/// A checkpoint with one NaN or infinite value is refused at load, naming
/// the file and the tensor, by the encoder and by a task head alike (a
/// model loaded with it would answer `null` embeddings and scores).
#[test]
fn non_finite_weights_are_refused_at_load() {
    let poison = |name: &str, value: f32, at: usize| {
        let tmp = copy_tiny("bert-mlm");
        let path = tmp.path().join("model.safetensors");
        let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        let t = &tensors[name];
        let mut values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        values[at] = value;
        let bad = bertha::Tensor::from_vec(values, t.dims(), &Device::Cpu).unwrap();
        tensors.insert(name.to_string(), bad);
        candle_core::safetensors::save(&tensors, &path).unwrap();
        tmp
    };
    let encoder = "bert.encoder.layer.1.output.dense.weight";
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let tmp = poison(encoder, value, 7);
        let want = format!("{value} at index 7");
        assert_load_err(
            tmp.path(),
            &["model.safetensors", encoder, "non-finite", &want],
        );
    }
    // A head tensor, through the task loader.
    let head = "cls.predictions.bias";
    let tmp = poison(head, f32::NAN, 0);
    let err = bertha::tasks::FillMask::from_dir(tmp.path(), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(head) && err.contains("model.safetensors") && err.contains("non-finite"),
        "{err}"
    );
}

/// In a sharded checkpoint the message names the shard holding the bad
/// tensor, not the index.
#[test]
fn non_finite_weights_name_their_shard() {
    let src = fixtures().join("tiny/bert-mlm");
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let name = "bert.encoder.layer.0.attention.self.query.bias";
    let dims = tensors[name].dims().to_vec();
    tensors.insert(
        name.into(),
        bertha::Tensor::full(f32::NAN, dims, &Device::Cpu).unwrap(),
    );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    std::fs::copy(src.join("vocab.txt"), tmp.path().join("vocab.txt")).unwrap();
    let (a, b): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .partition(|(k, _)| k.contains("encoder"));
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-1-of-2.safetensors", a),
        ("model-2-of-2.safetensors", b),
    ] {
        let part: std::collections::HashMap<String, _> = part.into_iter().collect();
        for k in part.keys() {
            weight_map.insert(k.clone(), file.into());
        }
        candle_core::safetensors::save(&part, tmp.path().join(file)).unwrap();
    }
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        serde_json::json!({ "weight_map": weight_map }).to_string(),
    )
    .unwrap();
    assert_load_err(
        tmp.path(),
        &["model-1-of-2.safetensors", name, "non-finite"],
    );
}

/// Issue 46, case 5: a token classifier loaded from a sequence
/// classifier's checkpoint read its `classifier.` tensors (the same names)
/// as a token head and tagged every token positive / negative. The head
/// follows `architectures`: refused, naming both heads. A head a
/// pre-training checkpoint really holds (its MLM) still loads.
#[test]
fn a_head_is_not_read_from_another_heads_tensors() {
    use bertha::tasks::{FillMask, TokenClassifier};
    let seqcls = fixtures().join("tiny").join("bert-seqcls");
    let err = TokenClassifier::from_dir(&seqcls, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("no BertForTokenClassification head")
            && err.contains("saved as BertForSequenceClassification"),
        "{err}"
    );
    let pretraining = fixtures().join("tiny").join("bert-pretraining");
    FillMask::from_dir(&pretraining, &Device::Cpu).unwrap();
    TokenClassifier::from_dir(&fixtures().join("tiny").join("bert-tokcls"), &Device::Cpu).unwrap();
}

/// RoBERTa's positions start past its padding index: a tiny RoBERTa with
/// 66 positions and padding index 1 takes 64 tokens, so an embedder asked
/// for 65 is refused when it loads, naming both numbers, not when the
/// first long text reaches the model.
#[test]
fn roberta_embedder_longer_than_its_positions_is_refused_at_load() {
    let dir = fixtures().join("tiny/roberta-mlm");
    let opts = |n| bertha::EmbedOptions {
        max_length: Some(n),
        ..Default::default()
    };
    assert!(bertha::Embedder::from_dir(&dir, &Device::Cpu, &opts(64)).is_ok());
    match bertha::Embedder::from_dir(&dir, &Device::Cpu, &opts(65)) {
        Err(Error::Input(msg)) => {
            assert!(msg.contains("65") && msg.contains("limit of 64"), "{msg}")
        }
        Err(e) => panic!("expected an input error, got {e}"),
        Ok(_) => panic!("a 65-token embedder loaded on 64 positions"),
    }
}
