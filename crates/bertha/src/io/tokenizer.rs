//! Text → token ids, exactly as transformers' fast BERT tokenizer does.
//!
//! A folder's `tokenizer.json` is used when present; a folder with only
//! `vocab.txt` (+ `tokenizer_config.json`) gets the equivalent WordPiece
//! pipeline built here, as transformers' slow→fast converter builds it.
//! Whatever truncation or padding a `tokenizer.json` carries is replaced by
//! ours: truncation at an explicit `max_length`, no padding (batches are
//! padded to their longest member when tensors are built).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{
    AddedToken, EncodeInput, TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::st_folder;

/// One tokenized text (or text pair), unpadded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Encoded {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub attention_mask: Vec<u32>,
    pub tokens: Vec<String>,
    /// Character (not byte) offsets into the text each token came from,
    /// `[0, 0]` for special tokens, as transformers' `offset_mapping`.
    pub offsets: Vec<(usize, usize)>,
    /// Whether tokens were dropped to fit `max_length`.
    pub truncated: bool,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

/// Special tokens of a WordPiece vocabulary.
#[derive(Debug, Clone)]
pub struct SpecialTokens {
    pub unk: String,
    pub sep: String,
    pub pad: String,
    pub cls: String,
    pub mask: String,
}

impl Default for SpecialTokens {
    fn default() -> Self {
        Self {
            unk: "[UNK]".into(),
            sep: "[SEP]".into(),
            pad: "[PAD]".into(),
            cls: "[CLS]".into(),
            mask: "[MASK]".into(),
        }
    }
}

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_length: usize,
    /// Drop tokens from the end (transformers' default) or the start.
    truncate_left: bool,
    pad_id: u32,
    source: PathBuf,
}

fn tk_err(context: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("{context}: {e}"))
}

impl Tokenizer {
    /// Loads the tokenizer of a model folder: `tokenizer.json` if present,
    /// else `vocab.txt` with `tokenizer_config.json`.
    pub fn from_dir(dir: &Path, max_length: usize) -> Result<Self> {
        let json = dir.join("tokenizer.json");
        let vocab = dir.join("vocab.txt");
        if json.is_file() {
            Self::from_tokenizer_json(&json, max_length)
        } else if vocab.is_file() {
            Self::from_vocab(&vocab, &dir.join("tokenizer_config.json"), max_length)
        } else {
            Err(Error::ModelDir {
                path: dir.to_path_buf(),
                reason: "no tokenizer found (expected tokenizer.json or vocab.txt)".into(),
            })
        }
    }

    pub fn from_tokenizer_json(path: &Path, max_length: usize) -> Result<Self> {
        if let Err(e) = std::fs::metadata(path) {
            return Err(Error::io(path, e));
        }
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| tk_err(path.display(), e))?;
        Self::finish(inner, max_length, path)
    }

    /// Builds BERT's WordPiece pipeline from `vocab.txt`; `config` may be
    /// absent (BertTokenizer's defaults: lowercase, strip accents with it,
    /// split Chinese characters).
    pub fn from_vocab(vocab: &Path, config: &Path, max_length: usize) -> Result<Self> {
        let cfg: Value = if config.is_file() {
            let text = std::fs::read_to_string(config).map_err(|e| Error::io(config, e))?;
            serde_json::from_str(&text).map_err(|source| Error::Json {
                path: config.to_path_buf(),
                source,
            })?
        } else {
            Value::Object(Default::default())
        };
        let flag = |field: &str, default: Option<bool>| -> Result<Option<bool>> {
            match cfg.get(field) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(other) => Err(Error::config(
                    config,
                    field,
                    format!("expected true, false or null, got {other}"),
                )),
            }
        };
        let lowercase = flag("do_lower_case", Some(true))?.unwrap_or(true);
        let strip_accents = flag("strip_accents", None)?;
        let chinese = flag("tokenize_chinese_chars", Some(true))?.unwrap_or(true);
        let token = |field: &str, default: &str| -> Result<String> {
            match cfg.get(field) {
                None | Some(Value::Null) => Ok(default.to_string()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(Value::Object(o)) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| Error::config(config, field, "object without `content`")),
                Some(other) => Err(Error::config(
                    config,
                    field,
                    format!("expected a token string, got {other}"),
                )),
            }
        };
        // RoBERTa-style vocabularies (`<s>`, `</s>`, `<mask>`, ...) have no
        // `[CLS]`: their special tokens are the defaults then.
        let roberta_style = {
            let text = std::fs::read_to_string(vocab).map_err(|e| Error::io(vocab, e))?;
            let has = |t: &str| text.lines().any(|l| l == t);
            !has("[CLS]") && has("<s>") && has("</s>")
        };
        let d = if roberta_style {
            SpecialTokens {
                unk: "<unk>".into(),
                sep: "</s>".into(),
                pad: "<pad>".into(),
                cls: "<s>".into(),
                mask: "<mask>".into(),
            }
        } else {
            SpecialTokens::default()
        };
        let special = SpecialTokens {
            unk: token("unk_token", &d.unk)?,
            sep: token("sep_token", &d.sep)?,
            pad: token("pad_token", &d.pad)?,
            cls: token("cls_token", &d.cls)?,
            mask: token("mask_token", &d.mask)?,
        };

        let vocab_str = vocab
            .to_str()
            .ok_or_else(|| Error::Input(format!("path {} is not UTF-8", vocab.display())))?;
        std::fs::metadata(vocab).map_err(|e| Error::io(vocab, e))?;
        let model = WordPiece::from_file(vocab_str)
            .unk_token(special.unk.clone())
            .continuing_subword_prefix("##".into())
            .max_input_chars_per_word(100)
            .build()
            .map_err(|e| tk_err(vocab.display(), e))?;
        let id = |tok: &str| -> Result<u32> {
            tokenizers::Model::token_to_id(&model, tok).ok_or_else(|| {
                tk_err(
                    vocab.display(),
                    format!("special token `{tok}` is not in the vocabulary"),
                )
            })
        };
        let (sep_id, cls_id) = (id(&special.sep)?, id(&special.cls)?);
        id(&special.unk)?;

        let mut inner = tokenizers::Tokenizer::new(model);
        // tokenizers 0.23 re-normalizes the added tokens here, which can fail.
        inner
            .with_normalizer(Some(BertNormalizer::new(
                true,
                chinese,
                strip_accents,
                lowercase,
            )))
            .map_err(|e| tk_err(vocab.display(), e))?;
        inner.with_pre_tokenizer(Some(BertPreTokenizer));
        inner.with_post_processor(Some(BertProcessing::new(
            (special.sep.clone(), sep_id),
            (special.cls.clone(), cls_id),
        )));
        inner.with_decoder(Some(WordPieceDecoder::default()));
        // Special tokens match in raw text before normalisation, so that
        // "[MASK]" stays one token in a lowercasing pipeline.
        let specials: Vec<AddedToken> = [
            &special.pad,
            &special.unk,
            &special.cls,
            &special.sep,
            &special.mask,
        ]
        .into_iter()
        .filter(|t| tokenizers::Model::token_to_id(inner.get_model(), t).is_some())
        .map(|t| AddedToken::from(t.clone(), true).normalized(false))
        .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| tk_err(vocab.display(), e))?;
        Self::finish(inner, max_length, vocab)
    }

    fn finish(mut inner: tokenizers::Tokenizer, max_length: usize, source: &Path) -> Result<Self> {
        inner.with_padding(None);
        let pad_id = inner
            .token_to_id("[PAD]")
            .or_else(|| inner.token_to_id("<pad>"))
            .unwrap_or(0);
        let mut t = Self {
            inner,
            max_length: 0,
            truncate_left: false,
            pad_id,
            source: source.to_path_buf(),
        };
        t.set_max_length(max_length)?;
        Ok(t)
    }

    /// Sets the truncation length (in tokens, special tokens included).
    pub fn set_max_length(&mut self, max_length: usize) -> Result<()> {
        if max_length < 3 {
            return Err(Error::Input(format!(
                "max length {max_length} is too small: a text needs at least 3 tokens ([CLS] x [SEP])"
            )));
        }
        self.inner
            .with_truncation(Some(TruncationParams {
                direction: if self.truncate_left {
                    TruncationDirection::Left
                } else {
                    TruncationDirection::Right
                },
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| tk_err(self.source.display(), e))?;
        self.max_length = max_length;
        Ok(())
    }

    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// Truncates from the start of the text instead of its end (TEI's
    /// `truncation_direction: "Left"`).
    pub fn set_truncate_left(&mut self, left: bool) -> Result<()> {
        self.truncate_left = left;
        self.set_max_length(self.max_length)
    }

    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// One past the largest id this tokenizer can give (added tokens
    /// included): the embedding rows a model needs for it.
    pub fn id_limit(&self) -> usize {
        self.inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1)
    }

    /// The underlying `tokenizers` pipeline.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn encode(&self, text: &str) -> Result<Encoded> {
        let e = self
            .inner
            .encode_char_offsets(text, true)
            .map_err(|e| tk_err("encoding text", e))?;
        Ok(convert(e))
    }

    pub fn encode_pair(&self, text: &str, pair: &str) -> Result<Encoded> {
        let e = self
            .inner
            .encode_char_offsets((text, pair), true)
            .map_err(|e| tk_err("encoding text pair", e))?;
        Ok(convert(e))
    }

    /// Encodes many texts in parallel.
    pub fn encode_batch<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Encoded>> {
        let inputs = texts.iter().map(|t| EncodeInput::from(t.as_ref()));
        self.encode_inputs(inputs.collect(), "encoding batch")
    }

    /// Encodes many text pairs in parallel.
    pub fn encode_pair_batch<S: AsRef<str> + Sync>(
        &self,
        pairs: &[(S, S)],
    ) -> Result<Vec<Encoded>> {
        let inputs = pairs
            .iter()
            .map(|(a, b)| EncodeInput::from((a.as_ref(), b.as_ref())));
        self.encode_inputs(inputs.collect(), "encoding batch of pairs")
    }

    fn encode_inputs(&self, inputs: Vec<EncodeInput>, what: &str) -> Result<Vec<Encoded>> {
        let encs = self
            .inner
            .encode_batch_char_offsets(inputs, true)
            .map_err(|e| tk_err(what, e))?;
        Ok(encs.into_iter().map(convert).collect())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| tk_err("decoding", e))
    }
}

fn convert(e: tokenizers::Encoding) -> Encoded {
    Encoded {
        truncated: !e.get_overflowing().is_empty(),
        input_ids: e.get_ids().to_vec(),
        token_type_ids: e.get_type_ids().to_vec(),
        attention_mask: e.get_attention_mask().to_vec(),
        tokens: e.get_tokens().to_vec(),
        offsets: e.get_offsets().to_vec(),
    }
}

/// The truncation length a user of transformers / sentence-transformers
/// gets by default for this folder: sentence-transformers' own (see
/// [`st_folder::max_seq_length`]) when the folder states one, capped at
/// the model's positions, else the model's `max_position_embeddings`.
pub fn default_max_length(dir: &Path, config: &BertConfig) -> Result<usize> {
    let limit = config.max_sequence_length();
    Ok(st_folder::max_seq_length(dir)?.map_or(limit, |n| n.min(limit)))
}
