//! Sentence-embedding data on committed slices of the real files
//! (`tests/fixtures/pairs/`, see its README), and its STS / retrieval
//! scores with all-MiniLM-L6-v2 against sentence-transformers' on the
//! same slices (`minilm-reference.json`).

mod common;

use std::path::PathBuf;

use bertha::data::{EmbeddingData, EmbeddingEval, PairLayout, PairOptions};
use bertha::{Device, EmbedOptions, Embedder};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    common::fixtures().join("pairs").join(name)
}

fn read(name: &str, opts: &PairOptions) -> EmbeddingData {
    EmbeddingData::read(&fixture(name), opts).unwrap()
}

fn stsb() -> PairOptions {
    PairOptions {
        stsb: true,
        ..PairOptions::default()
    }
}

#[test]
fn stsb_original_reads_as_its_converted_tsv() {
    // 84 lines of sts-test.csv; 16 carry two source fields after
    // sentence2, line 46 (line 649 of sts-test.csv) an unbalanced quote.
    let original = read("sts-test-slice.csv", &stsb());
    let converted = read("sts-test-slice.tsv", &PairOptions::default());
    assert_eq!(original.len(), 84);
    assert_eq!(original.layout, PairLayout::Scored);
    assert_eq!(original.rows, converted.rows);
    assert_eq!(original.columns, converted.columns);
    assert_eq!(original.scores, converted.scores);
    assert_eq!(
        original.rows[0],
        [
            "A girl is styling her hair.",
            "A girl is brushing her hair."
        ]
    );
    // 2.500 / 5 and the converted file's 0.5.
    assert_eq!(original.scores.as_ref().unwrap()[0], 0.5);
    assert_eq!(original.lines[45], 46);
    assert!(original.rows[45][1].starts_with("I always go by the rule \"When in doubt"));
    assert_eq!((original.lines[0], converted.lines[0]), (1, 2));
}

#[test]
fn pairs_and_triplets_with_a_split_column() {
    let pairs = read("flickr8k-train-head.tsv", &PairOptions::default());
    assert_eq!((pairs.len(), pairs.negatives()), (200, 0));
    assert_eq!(pairs.columns, ["anchor", "positive"]);
    assert_eq!(
        pairs.rows[0],
        [
            "Two dogs chase each other across the snowy ground .",
            "Two dogs play together in the snow ."
        ]
    );
    let triplets = read("snli-triplets-head.tsv", &PairOptions::default());
    assert_eq!(triplets.columns, ["anchor", "positive", "negative"]);
    assert_eq!(triplets.len(), 10);
    assert_eq!(
        triplets.column(2).next(),
        Some("The men are fighting outside a deli .")
    );
    let first3 = read(
        "snli-triplets-head.tsv",
        &PairOptions {
            max_rows: Some(3),
            ..PairOptions::default()
        },
    );
    assert_eq!(first3.rows, triplets.rows[..3]);
}

/// all-MiniLM-L6-v2 as `bertha evaluate` loads it, as an `embed` callback.
fn minilm() -> Embedder {
    Embedder::from_dir(
        &common::minilm_dir(),
        &Device::Cpu,
        &EmbedOptions::default(),
    )
    .unwrap()
}

fn reference(task: &str) -> Value {
    let text = std::fs::read_to_string(fixture("minilm-reference.json")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap()[task].clone()
}

#[test]
fn minilm_scores_match_sentence_transformers() {
    let model = minilm();
    let embed = |texts: &[&str]| model.embed(texts, 32, &mut |_| {});
    let sts = read("sts-test-slice.csv", &stsb())
        .evaluate(EmbeddingEval::Sts, embed)
        .unwrap();
    let want = reference("sts");
    // ×100 scores: equal ranks give the same Spearman; Pearson moves with
    // the embeddings' last digits (3.7e-6 here).
    for key in ["spearman", "pearson"] {
        let (got, exp) = (sts[key], want[key].as_f64().unwrap());
        assert!((got - exp).abs() < 1e-4, "{key}: {got} vs {exp}");
    }
    let retrieval = read("flickr8k-train-head.tsv", &PairOptions::default())
        .evaluate(EmbeddingEval::Retrieval, embed)
        .unwrap();
    let want = reference("retrieval");
    for key in ["recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10"] {
        let (got, exp) = (retrieval[key], want[key].as_f64().unwrap());
        assert!((got - exp).abs() < 1e-9, "{key}: {got} vs {exp}");
    }
    assert_eq!(retrieval.len(), 5);
}
