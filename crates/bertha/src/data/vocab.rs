//! `--train-tokenizer`: a WordPiece vocabulary learnt from the corpus with
//! the tokenizers crate's trainer, for pre-training on text whose words the
//! stock vocabularies split badly (another language, a domain's jargon).
//!
//! The pipeline around the vocabulary is BERT's uncased one (clean text,
//! split CJK characters, lowercase and strip accents, split on whitespace
//! and punctuation, `##` continuation pieces), the same that
//! [`Tokenizer::from_vocab`](crate::Tokenizer::from_vocab) builds, so the
//! result is written as `vocab.txt` + `tokenizer_config.json`, which
//! transformers' `BertTokenizer` loads too.

use std::path::{Path, PathBuf};

use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::AddedToken;

use super::corpus_read::expand;
use crate::error::{Error, Result};
use crate::training::checkpoint::write_atomic;

/// BERT's special tokens, given the first ids in this order.
pub const SPECIAL_TOKENS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// Learns a vocabulary of at most `vocab_size` tokens (specials included)
/// from the corpus files or folders `corpus` (read line by line, never
/// whole) and writes it into `out_dir`, which it returns.
pub fn train_wordpiece(corpus: &[PathBuf], vocab_size: usize, out_dir: &Path) -> Result<PathBuf> {
    if vocab_size <= SPECIAL_TOKENS.len() {
        return Err(Error::option(
            "vocab_size",
            format!(
                "{vocab_size}: a vocabulary needs more than the {} special tokens",
                SPECIAL_TOKENS.len()
            ),
        ));
    }
    let files = expand(corpus)?;
    let mut names = Vec::with_capacity(files.len());
    for f in &files {
        let name = f.to_str().ok_or_else(|| {
            Error::Input(format!("corpus path {} is not valid UTF-8", f.display()))
        })?;
        names.push(name.to_string());
    }
    let trainer = WordPieceTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .build();
    let mut trainer = TrainerWrapper::from(trainer);
    let mut tokenizer = tokenizers::Tokenizer::new(WordPiece::default());
    tokenizer
        .with_normalizer(Some(BertNormalizer::default()))
        .map_err(|e| Error::Tokenizer(format!("training a WordPiece vocabulary: {e}")))?
        .with_pre_tokenizer(Some(BertPreTokenizer));
    tokenizer
        .train_from_files(&mut trainer, names)
        .map_err(|e| Error::Tokenizer(format!("training a WordPiece vocabulary: {e}")))?;

    let mut vocab: Vec<(String, u32)> = tokenizer.get_vocab(false).into_iter().collect();
    vocab.sort_by_key(|(_, id)| *id);
    if vocab
        .iter()
        .enumerate()
        .any(|(i, (_, id))| *id as usize != i)
    {
        return Err(Error::Tokenizer(
            "the trained vocabulary's ids are not 0..n without gaps".into(),
        ));
    }
    let mut text = String::new();
    for (token, _) in &vocab {
        text.push_str(token);
        text.push('\n');
    }
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    write_atomic(&out_dir.join("vocab.txt"), text.as_bytes())?;
    let config = serde_json::json!({
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": true,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    });
    write_atomic(
        &out_dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    Ok(out_dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;

    #[test]
    fn learns_a_vocabulary_that_covers_its_corpus() {
        let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/corpus-wiki-slice.txt");
        let dir = tempfile::tempdir().unwrap();
        let out =
            train_wordpiece(std::slice::from_ref(&corpus), 800, &dir.path().join("tok")).unwrap();
        let tok = Tokenizer::from_dir(&out, 512).unwrap();
        let n = tok.vocab_size();
        assert!((600..=800).contains(&n), "vocab size {n}");
        for (i, s) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(tok.token_to_id(s), Some(i as u32), "{s}");
        }
        // Frequent words are whole tokens, rare ones split into ## pieces,
        // and nothing of the corpus itself is unknown.
        assert!(tok.token_to_id("the").is_some());
        let text = std::fs::read_to_string(&corpus).unwrap();
        let line = text.lines().find(|l| l.len() > 200).unwrap();
        let e = tok.encode(line).unwrap();
        let unk = tok.token_to_id("[UNK]").unwrap();
        assert!(!e.input_ids.contains(&unk), "{line}");
        assert!(
            e.tokens.iter().any(|t| t.starts_with("##")),
            "{:?}",
            e.tokens
        );
        assert_eq!(e.tokens.first().map(String::as_str), Some("[CLS]"));
    }

    #[test]
    fn a_vocabulary_of_only_specials_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = train_wordpiece(&[dir.path().to_path_buf()], 5, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("special tokens"), "{err}");
    }
}
