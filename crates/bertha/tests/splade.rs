//! SPLADE sparse vectors against sentence-transformers' SparseEncoder
//! (`tests/fixtures/splade`, made by its `make.py`): the saved SparseEncoder
//! folder, `--pooling splade` on the plain MLM checkpoint, every
//! SpladePooling mode (max / sum, relu / log1p_relu), both encoder paths
//! and any chunking of the logits; every family's MLM head against
//! transformers' logits; and the errors of a checkpoint without an MLM
//! head and of a bad SpladePooling config.

mod common;

use std::path::{Path, PathBuf};

use bertha::model::BertForMaskedLM;
use bertha::tasks::EncodeOptions;
use bertha::{
    BertHead, Device, EmbedOptions, Embedder, Encoded, HeadInit, Pooling, SentenceTransformerSpec,
    SparseVector, SpladeActivation, SpladeOptions, SpladeStrategy, Tensor,
};
use common::{err_text, fixtures, load_safetensors, read_json};
use serde_json::Value;

fn splade_dir() -> PathBuf {
    fixtures().join("splade")
}

fn st_folder() -> PathBuf {
    splade_dir().join("st-folder")
}

fn reference() -> Value {
    read_json(&splade_dir().join("expected.json"))
}

fn texts() -> Vec<String> {
    serde_json::from_value(reference()["texts"].clone()).unwrap()
}

/// sentence-transformers' vectors for one mode (`max/relu`, ...).
fn expected(mode: &str) -> Vec<SparseVector> {
    let r = reference();
    r["expected"][mode]
        .as_array()
        .unwrap_or_else(|| panic!("no mode {mode} in expected.json"))
        .iter()
        .map(|v| {
            let indices: Vec<u32> = serde_json::from_value(v["indices"].clone()).unwrap();
            let values: Vec<f32> = serde_json::from_value(v["values"].clone()).unwrap();
            SparseVector(
                indices
                    .into_iter()
                    .zip(values)
                    .map(|(index, value)| bertha::SparseValue { index, value })
                    .collect(),
            )
        })
        .collect()
}

/// Same indices, values within 1e-4 (absolute, or relative above 1).
#[track_caller]
fn assert_same(what: &str, got: &[SparseVector], want: &[SparseVector]) {
    assert_eq!(got.len(), want.len(), "{what}: number of vectors");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.indices(), w.indices(), "{what}: text {i}: indices");
        for (a, b) in g.0.iter().zip(&w.0) {
            let tol = 1e-4 * b.value.abs().max(1.0);
            assert!(
                (a.value - b.value).abs() <= tol,
                "{what}: text {i}, index {}: {} vs sentence-transformers' {}",
                a.index,
                a.value,
                b.value
            );
        }
    }
}

fn load(dir: &Path, pooling: Option<Pooling>) -> Embedder {
    let opts = EmbedOptions {
        pooling,
        ..EmbedOptions::default()
    };
    Embedder::from_dir(dir, &Device::Cpu, &opts).unwrap()
}

/// `e`'s vectors on both encoder paths, in batches of 1, 4 and all, with
/// the logits in chunks of 1, 7 and 100 tokens and the default.
#[track_caller]
fn assert_matches(what: &str, e: &mut Embedder, want: &[SparseVector]) {
    let texts = texts();
    for fast in [true, false] {
        e.set_fast_path(fast).unwrap();
        for (batch, chunk) in [(texts.len(), 0), (1, 1), (4, 7), (texts.len(), 100)] {
            e.set_splade_chunk_tokens(chunk).unwrap();
            let got = e.embed_sparse(&texts, batch, &mut |_| {}).unwrap();
            let what = format!("{what} (fast path {fast}, batch {batch}, chunk {chunk})");
            assert_same(&what, &got, want);
        }
    }
    e.set_splade_chunk_tokens(0).unwrap();
}

#[test]
fn the_sparse_encoder_folder_matches_sentence_transformers() {
    let spec = SentenceTransformerSpec::from_dir(&st_folder())
        .unwrap()
        .unwrap();
    assert_eq!(spec.pooling, Pooling::Splade);
    assert_eq!(spec.splade, Some(SpladeOptions::default()));
    assert!(!spec.normalize);

    let mut e = load(&st_folder(), None);
    assert_eq!(e.pooling(), Pooling::Splade);
    assert!(e.is_sparse() && !e.normalizes());
    assert_eq!(e.dimension(), 1024);
    assert_eq!(e.tokenizer().max_length(), 64);
    // The tokens are sentence-transformers' (the long text truncated).
    let ids: Vec<Vec<u32>> = serde_json::from_value(reference()["input_ids"].clone()).unwrap();
    let encodings = e.encode_texts(&texts(), &EncodeOptions::default()).unwrap();
    let got: Vec<Vec<u32>> = encodings.iter().map(|e| e.input_ids.clone()).collect();
    assert_eq!(got, ids);
    assert_matches("st-folder", &mut e, &expected("max/relu"));
}

#[test]
fn pooling_splade_on_the_plain_mlm_checkpoint_matches() {
    let dir = fixtures().join("tiny/bert-mlm");
    let mut e = load(&dir, Some("splade".parse().unwrap()));
    assert_eq!(e.splade_options(), Some(SpladeOptions::default()));
    assert_matches("bert-mlm --pooling splade", &mut e, &expected("max/relu"));
    // From parts: the head and a tokenizer.
    let head = BertForMaskedLM::from_dir(&dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let options = SpladeOptions {
        strategy: SpladeStrategy::Sum,
        ..SpladeOptions::default()
    };
    let e = Embedder::new_splade(head, e.tokenizer().clone(), options, false).unwrap();
    let got = e.embed_sparse(&texts(), 8, &mut |_| {}).unwrap();
    assert_same("Embedder::new_splade", &got, &expected("sum/relu"));
}

/// A copy of the folder with `1_SpladePooling/config.json` set to `mode`,
/// in sentence-transformers 5's spelling (`sparse_encoder.models` module
/// paths, `word_embedding_dimension`), as SPLADE models on the Hub have it.
fn folder_with_mode(strategy: &str, activation: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&st_folder(), tmp.path());
    let modules = serde_json::json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}
    ]);
    std::fs::write(tmp.path().join("modules.json"), modules.to_string()).unwrap();
    let config = serde_json::json!({
        "pooling_strategy": strategy,
        "activation_function": activation,
        "word_embedding_dimension": 1024
    });
    std::fs::write(
        tmp.path().join("1_SpladePooling/config.json"),
        config.to_string(),
    )
    .unwrap();
    tmp
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn every_splade_pooling_mode_matches() {
    for (strategy, activation) in [
        ("max", "relu"),
        ("sum", "relu"),
        ("max", "log1p_relu"),
        ("sum", "log1p_relu"),
    ] {
        let mode = format!("{strategy}/{activation}");
        let tmp = folder_with_mode(strategy, activation);
        let mut e = load(tmp.path(), None);
        let options = SpladeOptions {
            strategy: strategy.parse().unwrap(),
            activation: activation.parse().unwrap(),
        };
        assert_eq!(e.splade_options(), Some(options), "{mode}");
        assert_matches(&mode, &mut e, &expected(&mode));
    }
    // The same, set on an embedder.
    let mut e = load(&st_folder(), None);
    e.set_splade_options(SpladeOptions {
        strategy: SpladeStrategy::Sum,
        activation: SpladeActivation::Log1pRelu,
    })
    .unwrap();
    let got = e.embed_sparse(&texts(), 8, &mut |_| {}).unwrap();
    assert_same("set_splade_options", &got, &expected("sum/log1p_relu"));
}

#[test]
fn dense_splade_vectors_are_the_sparse_ones_in_full() {
    let mut e = load(&st_folder(), None);
    let texts = texts();
    let sparse = e.embed_sparse(&texts, 8, &mut |_| {}).unwrap();
    let dense = e.embed(&texts, 8, &mut |_| {}).unwrap();
    for (s, d) in sparse.iter().zip(&dense) {
        assert_eq!(d.len(), 1024);
        assert_eq!(&s.to_dense(1024).unwrap(), d);
        assert_eq!(&SparseVector::from_dense(d), s);
    }
    // Matryoshka dimensions cut dense vectors (as TEI's /embed does) but
    // not sparse ones.
    let opts = EncodeOptions {
        dimensions: Some(10),
        ..EncodeOptions::default()
    };
    let cut = e.embed_with(&texts, &opts, 8, &mut |_| {}).unwrap();
    assert_eq!(cut[0], dense[0][..10]);
    let err = err_text(e.embed_sparse_with(&texts, &opts, 8, &mut |_| {}));
    assert!(err.contains("dimensions") && err.contains("dense"), "{err}");
    let too_many = EncodeOptions {
        dimensions: Some(1025),
        ..EncodeOptions::default()
    };
    let err = err_text(e.embed_with(&texts, &too_many, 8, &mut |_| {}));
    assert!(err.contains("1024"), "{err}");
    // Normalised when asked: the same entries, unit length.
    e = Embedder::from_dir(
        &st_folder(),
        &Device::Cpu,
        &EmbedOptions {
            normalize: Some(true),
            ..EmbedOptions::default()
        },
    )
    .unwrap();
    let unit = e.embed_sparse(&texts[..2], 8, &mut |_| {}).unwrap();
    for (u, s) in unit.iter().zip(&sparse) {
        assert_eq!(u.indices(), s.indices());
        assert!((u.dot(u) - 1.0).abs() < 1e-5);
    }
    // A text's vector does not depend on its batch (beyond the last bit
    // of the MLM head's matrix product): alone, it is the same.
    let one = e
        .embed_sparse_encoded_from(
            &e.encode_texts(&texts[..1], &EncodeOptions::default())
                .unwrap(),
            &[0],
            1,
            &mut |_| {},
        )
        .unwrap();
    assert_same("alone", &one, &unit[..1]);
}

/// SPLADE from each family's MLM head: the same vectors as the reference
/// computed here from transformers' logits (`tiny/<family>-mlm`).
#[test]
fn every_family_mlm_head_gives_splade_vectors() {
    for name in [
        "bert-mlm",
        "roberta-mlm",
        "distilbert-mlm",
        "albert-mlm",
        "deberta-v2-mlm",
    ] {
        let dir = fixtures().join("tiny").join(name);
        let inputs = read_json(&dir.join("inputs.json"));
        let rows = |k: &str| common::input_rows(&inputs, k);
        let (ids, mask) = (rows("input_ids").unwrap(), rows("attention_mask").unwrap());
        let types = rows("token_type_ids");
        let encodings: Vec<Encoded> = ids
            .iter()
            .zip(&mask)
            .enumerate()
            .map(|(b, (ids, mask))| {
                let n = mask.iter().filter(|&&m| m == 1).count();
                Encoded {
                    input_ids: ids[..n].to_vec(),
                    token_type_ids: types.as_ref().map_or(vec![0; n], |t| t[b][..n].to_vec()),
                    attention_mask: vec![1; n],
                    tokens: vec![String::new(); n],
                    offsets: vec![(0, 0); n],
                    truncated: false,
                }
            })
            .collect();
        let logits: &Tensor = &load_safetensors(&dir.join("expected.safetensors"))["logits"];
        let logits: Vec<Vec<Vec<f32>>> = logits.to_vec3().unwrap();
        let want: Vec<SparseVector> = encodings
            .iter()
            .enumerate()
            .map(|(b, e)| {
                let v = logits[b][0].len();
                let row: Vec<f32> = (0..v)
                    .map(|j| {
                        (0..e.len())
                            .map(|t| logits[b][t][j].max(0.0).ln_1p())
                            .fold(0.0, f32::max)
                    })
                    .collect();
                SparseVector::from_dense(&row)
            })
            .collect();
        let mut e = load(&dir, Some(Pooling::Splade));
        for chunk in [0, 3] {
            e.set_splade_chunk_tokens(chunk).unwrap();
            let n = encodings.len();
            let got = e
                .embed_sparse_encoded_from(&encodings, &vec![0; n], 2, &mut |_| {})
                .unwrap();
            assert_same(&format!("{name} (chunk {chunk})"), &got, &want);
        }
    }
}

#[test]
fn a_checkpoint_without_an_mlm_head_is_a_clear_error() {
    let splade = EmbedOptions {
        pooling: Some(Pooling::Splade),
        ..EmbedOptions::default()
    };
    let dir = fixtures().join("tiny/bert-seqcls");
    let err = err_text(Embedder::from_dir(&dir, &Device::Cpu, &splade));
    assert!(
        err.contains("splade")
            && err.contains("tiny/bert-seqcls")
            && err.contains("missing tensor `cls.predictions.transform.dense.weight`")
            && err.contains("BertForSequenceClassification"),
        "{err}"
    );
    // A sentence-transformers folder of a bare encoder.
    let dir = fixtures().join("st-embedding");
    let err = err_text(Embedder::from_dir(&dir, &Device::Cpu, &splade));
    assert!(
        err.contains("st-embedding") && err.contains("cls.predictions"),
        "{err}"
    );
    // An embedder of another pooling has no sparse vectors.
    let e = load(&fixtures().join("tiny/bert-mlm"), None);
    assert!(!e.is_sparse());
    let err = err_text(e.embed_sparse(&["a"], 1, &mut |_| {}));
    assert!(
        err.contains("pooling `splade`") && err.contains("mean"),
        "{err}"
    );
    let model = e.model().clone();
    let err = err_text(Embedder::new(
        model,
        e.tokenizer().clone(),
        Pooling::Splade,
        false,
    ));
    assert!(err.contains("MLM head"), "{err}");
}

#[test]
fn bad_splade_pooling_configs_name_the_file_and_field() {
    let tmp = folder_with_mode("mean", "relu");
    let err = err_text(Embedder::from_dir(
        tmp.path(),
        &Device::Cpu,
        &EmbedOptions::default(),
    ));
    assert!(
        err.contains("1_SpladePooling/config.json")
            && err.contains("pooling_strategy")
            && err.contains("`mean`"),
        "{err}"
    );
    let tmp = folder_with_mode("max", "gelu");
    let err = err_text(SentenceTransformerSpec::from_dir(tmp.path()));
    assert!(
        err.contains("activation_function") && err.contains("`gelu`"),
        "{err}"
    );
    // A SparseEncoder's other modules are named as unsupported.
    let modules = serde_json::json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SparseAutoEncoder", "type": "sentence_transformers.sparse_encoder.models.SparseAutoEncoder"}
    ]);
    std::fs::write(tmp.path().join("modules.json"), modules.to_string()).unwrap();
    let err = err_text(SentenceTransformerSpec::from_dir(tmp.path()));
    assert!(
        err.contains("SparseAutoEncoder") && err.contains("not supported"),
        "{err}"
    );
    // Pooling `splade` is not a sentence-transformers Pooling to write.
    let err = err_text(
        SentenceTransformerSpec::new(Pooling::Splade, false)
            .write(tempfile::tempdir().unwrap().path(), 8),
    );
    assert!(err.contains("splade"), "{err}");
}
