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

fn load_err(dir: &Path) -> String {
    match BertModel::from_dir(dir, &Device::Cpu) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn corrupt_safetensors_names_the_file() {
    let tmp = copy_tiny("bert-mlm");
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    let err = load_err(tmp.path());
    assert!(
        err.contains("model.safetensors") && err.contains("not a valid safetensors"),
        "{err}"
    );

    std::fs::write(&path, b"this is not a safetensors file at all").unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn unsupported_config_option_names_the_field() {
    let tmp = copy_tiny("bert-mlm");
    let path = tmp.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["position_embedding_type"] = "relative_key_query".into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert!(
        err.contains("config.json") && err.contains("position_embedding_type"),
        "{err}"
    );
}

#[test]
fn invalid_config_json_names_the_file() {
    let tmp = copy_tiny("bert-mlm");
    std::fs::write(tmp.path().join("config.json"), "{ not json").unwrap();
    let err = load_err(tmp.path());
    assert!(
        err.contains("config.json") && err.contains("invalid JSON"),
        "{err}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let tmp = copy_tiny("bert-mlm");
    let path = tmp.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    tensors.remove("bert.encoder.layer.1.attention.self.key.weight");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let err = load_err(tmp.path());
    assert!(
        err.contains("missing tensor `bert.encoder.layer.1.attention.self.key.weight`")
            && err.contains("[32, 32]"),
        "{err}"
    );
}

#[test]
fn shape_mismatch_names_the_tensor_and_both_shapes() {
    let tmp = copy_tiny("bert-mlm");
    let path = tmp.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["intermediate_size"] = 40.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert!(
        err.contains("bert.encoder.layer.0.intermediate.dense.weight")
            && err.contains("[37, 32]")
            && err.contains("[40, 32]"),
        "{err}"
    );
}

#[test]
fn missing_folder_and_missing_weights_are_explained() {
    let err = load_err(Path::new("/nonexistent/model"));
    assert!(
        err.contains("/nonexistent/model") && err.contains("no such directory"),
        "{err}"
    );

    let tmp = copy_tiny("bert-mlm");
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("no weights found"), "{err}");

    let tmp = copy_tiny("bert-mlm");
    std::fs::remove_file(tmp.path().join("config.json")).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("config.json is missing"), "{err}");
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
