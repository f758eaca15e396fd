//! A prepared corpus (tokenized once into memory-mapped shards) gives the
//! very sequences the text reader gives, windows and NSP pairs alike, with
//! documents spread over several shards; it refuses another tokenizer, a
//! damaged shard and an existing folder it was not told to replace.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bertha::data::prepared::tokenizer_hash;
use bertha::data::{prepare_corpus, Corpus, CorpusOptions, PrepareOptions, PreparedCorpus};
use bertha::Tokenizer;
use common::fixtures;

fn tokenizer() -> (Tokenizer, PathBuf) {
    let dir = fixtures().join("minilm-tokenizer");
    (Tokenizer::from_dir(&dir, 512).unwrap(), dir)
}

fn corpus() -> PathBuf {
    fixtures().join("corpus-wiki-slice.txt")
}

fn prepare(out: &Path, sentences: bool, shard_tokens: usize) -> PreparedCorpus {
    let (tok, dir) = tokenizer();
    let opts = PrepareOptions {
        sentences,
        shard_tokens,
        overwrite: false,
    };
    prepare_corpus(&[corpus()], &tok, &dir, &opts, out).unwrap();
    PreparedCorpus::open(out, Some(tokenizer_hash(&dir).unwrap())).unwrap()
}

fn same_sequences(nsp: bool, seq_len: usize) {
    let (tok, _) = tokenizer();
    let tmp = tempfile::tempdir().unwrap();
    // Small shards: documents end up in many of them.
    let prepared = Arc::new(prepare(&tmp.path().join("c"), nsp, 700));
    assert!(
        prepared.header.shards.len() > 5,
        "{:?}",
        prepared.header.shards.len()
    );
    let opts = CorpusOptions {
        seq_len,
        nsp,
        seed: 7,
    };
    let text = Corpus::read(&[corpus()], &tok, &opts).unwrap();
    assert_eq!(prepared.header.documents, text.documents);
    assert_eq!(prepared.header.tokens, text.tokens);
    let seqs = prepared.sequences(&tok, &opts).unwrap();
    assert_eq!(seqs.len(), text.len());
    assert!(text.len() > 50, "{}", text.len());
    for (i, want) in text.examples.iter().enumerate() {
        assert_eq!(seqs.length(i), want.input_ids.len(), "sequence {i}");
        assert_eq!(seqs.example(i).as_ref(), want, "sequence {i}");
    }
}

#[test]
fn prepared_windows_equal_the_text_readers() {
    same_sequences(false, 32);
}

#[test]
fn prepared_nsp_pairs_equal_the_text_readers() {
    same_sequences(true, 64);
}

#[test]
fn ids_of_a_small_vocabulary_take_two_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prepare(&tmp.path().join("c"), false, 1 << 20);
    assert_eq!(p.header.token_bytes, 2);
    assert_eq!(p.header.shards.len(), 1);
    let shard = tmp.path().join("c").join(&p.header.shards[0].file);
    let len = std::fs::metadata(&shard).unwrap().len() as usize;
    // Header, 2 bytes a token (padded to 8), then the piece and document ends.
    assert!(len >= 48 + 2 * p.header.tokens && len < 48 + 4 * p.header.tokens + 8 * 4000);
}

#[test]
fn refusals_name_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let p = prepare(&out, false, 1 << 20);
    let (tok, dir) = tokenizer();
    // An existing folder is not replaced unless asked.
    let opts = PrepareOptions {
        sentences: false,
        shard_tokens: 1 << 20,
        overwrite: false,
    };
    let err = prepare_corpus(&[corpus()], &tok, &dir, &opts, &out)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--overwrite"), "{err}");
    // Another tokenizer.
    let err = PreparedCorpus::open(&out, Some(12345))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("another tokenizer"), "{err}");
    // NSP needs sentences.
    let prepared = Arc::new(PreparedCorpus::open(&out, None).unwrap());
    let nsp = CorpusOptions {
        seq_len: 64,
        nsp: true,
        seed: 0,
    };
    let err = prepared.sequences(&tok, &nsp).err().unwrap().to_string();
    assert!(err.contains("prepare-corpus --nsp"), "{err}");
    // A truncated shard.
    let shard = out.join(&p.header.shards[0].file);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 8]).unwrap();
    let err = PreparedCorpus::open(&out, None).err().unwrap().to_string();
    assert!(err.contains("its header describes"), "{err}");
    // Nothing half-written is left beside the output.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["c"]);
}
