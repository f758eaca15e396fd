//! Where the repository's test inputs are, for the tests of every crate
//! (included by path from each crate's `tests/common/mod.rs`; every crate
//! sits two folders below the repository root).

use std::path::PathBuf;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

/// A tiny checkpoint of `tests/fixtures/tiny` (`bert-mlm`, `bert-qa`, ...).
pub fn tiny_dir(name: &str) -> PathBuf {
    fixtures().join("tiny").join(name)
}

/// The all-MiniLM-L6-v2 folder fetched by `scripts/fetch-model.sh`.
pub fn minilm() -> PathBuf {
    let dir = repo().join(".cache/models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "run scripts/fetch-model.sh first"
    );
    dir
}
