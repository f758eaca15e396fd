//! Token ids, types, mask and character offsets equal transformers'
//! exactly, from `tokenizer.json` and from a folder with only `vocab.txt`.

mod common;

use bertha::Tokenizer;
use common::{fixtures, read_json};
use serde_json::Value;

fn check(tok: &Tokenizer, case: &Value, encoded: bertha::Encoded, what: &str) {
    let text = case["text"].as_str().unwrap();
    let want_ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
    let want_types: Vec<u32> = serde_json::from_value(case["token_type_ids"].clone()).unwrap();
    let want_mask: Vec<u32> = serde_json::from_value(case["attention_mask"].clone()).unwrap();
    let want_offsets: Vec<(usize, usize)> =
        serde_json::from_value(case["offsets"].clone()).unwrap();
    let want_tokens: Vec<String> = serde_json::from_value(case["tokens"].clone()).unwrap();
    assert_eq!(encoded.input_ids, want_ids, "{what}: ids of {text:?}");
    assert_eq!(
        encoded.token_type_ids, want_types,
        "{what}: token types of {text:?}"
    );
    assert_eq!(
        encoded.attention_mask, want_mask,
        "{what}: mask of {text:?}"
    );
    assert_eq!(encoded.offsets, want_offsets, "{what}: offsets of {text:?}");
    assert_eq!(encoded.tokens, want_tokens, "{what}: tokens of {text:?}");
    assert!(encoded.len() <= tok.max_length());
}

fn check_all(make: impl Fn(usize) -> Tokenizer, what: &str) {
    let fx = read_json(&fixtures().join("tokenizer.json"));
    let tok = make(512);
    let singles = fx["single"].as_array().unwrap();
    assert_eq!(singles.len(), 17);
    for case in singles {
        let e = tok.encode(case["text"].as_str().unwrap()).unwrap();
        assert!(!e.truncated);
        check(&tok, case, e, what);
    }
    // The batch path gives the same encodings as one-by-one calls.
    let texts: Vec<&str> = singles
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    for (case, e) in singles.iter().zip(tok.encode_batch(&texts).unwrap()) {
        check(&tok, case, e, what);
    }
    for case in fx["pair"].as_array().unwrap() {
        let e = tok
            .encode_pair(
                case["text"].as_str().unwrap(),
                case["text_pair"].as_str().unwrap(),
            )
            .unwrap();
        check(&tok, case, e, &format!("{what} (pair)"));
    }
    for key in ["long", "long_128"] {
        let case = &fx[key];
        let max = case["max_length"].as_u64().unwrap() as usize;
        let tok = make(max);
        let e = tok.encode(case["text"].as_str().unwrap()).unwrap();
        assert!(e.truncated, "{key} must report truncation");
        assert_eq!(e.len(), max);
        check(&tok, case, e, &format!("{what} ({key})"));
    }
}

#[test]
fn tokenizer_json_matches_transformers() {
    let dir = fixtures().join("minilm-tokenizer");
    check_all(|n| Tokenizer::from_dir(&dir, n).unwrap(), "tokenizer.json");
}

#[test]
fn vocab_txt_only_matches_transformers() {
    let dir = fixtures().join("minilm-vocab-only");
    assert!(!dir.join("tokenizer.json").exists());
    check_all(|n| Tokenizer::from_dir(&dir, n).unwrap(), "vocab.txt");
}

#[test]
fn tokenizer_json_padding_and_truncation_are_overridden() {
    // all-MiniLM-L6-v2's tokenizer.json pads to a fixed 128 and truncates at
    // 128; transformers' call arguments override both, and so do we.
    let dir = fixtures().join("minilm-tokenizer");
    let tok = Tokenizer::from_dir(&dir, 512).unwrap();
    let short = tok.encode("x").unwrap();
    assert_eq!(short.input_ids, vec![101, 1060, 102]);
    let long_text = "word ".repeat(300);
    let long = tok.encode(&long_text).unwrap();
    assert_eq!(long.len(), 302);
    assert!(!long.truncated);
}

#[test]
fn empty_text_is_cls_sep() {
    for sub in ["minilm-tokenizer", "minilm-vocab-only"] {
        let tok = Tokenizer::from_dir(&fixtures().join(sub), 512).unwrap();
        let e = tok.encode("").unwrap();
        assert_eq!(e.input_ids, vec![101, 102], "{sub}");
        assert_eq!(e.tokens, vec!["[CLS]", "[SEP]"], "{sub}");
    }
}

#[test]
fn special_tokens_in_text_stay_whole() {
    for sub in ["minilm-tokenizer", "minilm-vocab-only"] {
        let tok = Tokenizer::from_dir(&fixtures().join(sub), 512).unwrap();
        let e = tok.encode("Paris is the [MASK] of France.").unwrap();
        assert!(e.input_ids.contains(&103), "{sub}: {:?}", e.tokens);
    }
}

#[test]
fn ten_thousand_words_are_truncated_not_a_crash() {
    let tok = Tokenizer::from_dir(&fixtures().join("minilm-vocab-only"), 128).unwrap();
    let text = "lorem ipsum ".repeat(5000);
    let e = tok.encode(&text).unwrap();
    assert_eq!(e.len(), 128);
    assert!(e.truncated);
    assert_eq!(e.input_ids.last(), Some(&102));
}

#[test]
fn too_small_max_length_is_an_error() {
    let err = common::err_text(Tokenizer::from_dir(
        &fixtures().join("minilm-vocab-only"),
        2,
    ));
    assert!(err.contains("max length 2"), "{err}");
}
