//! Token classification (NER), like transformers' `token-classification`
//! pipeline, with its aggregation strategies: `none` (one entry per
//! token), `simple` (B-/I- tags grouped), and `first` / `average` / `max`
//! (sub-word tokens merged into words first). Tokens tagged `O` are left
//! out; `start`/`end` are character offsets into the text.

use std::path::Path;
use std::str::FromStr;

use candle_core::Device;

use super::pipeline::{self, argmax, softmax, tokens_to_string, PipelineHead};
use super::PipelineOptions;
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::model::{BertForTokenClassification, BertHead};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    #[default]
    None,
    Simple,
    First,
    Average,
    Max,
}

impl FromStr for Aggregation {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Self::None),
            "simple" => Ok(Self::Simple),
            "first" => Ok(Self::First),
            "average" => Ok(Self::Average),
            "max" => Ok(Self::Max),
            other => Err(Error::Input(format!(
                "unknown aggregation `{other}` (expected none, simple, first, average or max)"
            ))),
        }
    }
}

/// One entity: a token (`entity` and `index` set, aggregation `none`) or
/// a group (`entity_group` set), with transformers' field names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Entity {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity_group: Option<String>,
    pub score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub word: String,
    pub start: usize,
    pub end: usize,
}

/// A token before aggregation.
struct PreEntity {
    word: String,
    scores: Vec<f32>,
    start: usize,
    end: usize,
    index: usize,
    is_subword: bool,
}

/// A tagged token or word before grouping.
struct Tagged {
    entity: String,
    score: f32,
    word: String,
    start: usize,
    end: usize,
    index: Option<usize>,
}

/// Texts a forward pass of [`TokenClassifier::entities_many`] takes.
const NER_BATCH_SIZE: usize = 32;

pub struct TokenClassifier {
    model: PipelineHead<BertForTokenClassification>,
    tokenizer: Tokenizer,
    ignore_labels: Vec<String>,
}

impl TokenClassifier {
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_dir_with(dir, device, &PipelineOptions::default())
    }

    /// [`TokenClassifier::from_dir`] at the precision `opts` asks.
    pub fn from_dir_with(dir: &Path, device: &Device, opts: &PipelineOptions) -> Result<Self> {
        let (model, tokenizer) = pipeline::load(dir, device, None, opts)?;
        Ok(Self::build(model, tokenizer))
    }

    /// A pipeline over `model` in fp32.
    pub fn new(model: BertForTokenClassification, tokenizer: Tokenizer) -> Self {
        Self::build(PipelineHead::f32(model), tokenizer)
    }

    fn build(model: PipelineHead<BertForTokenClassification>, tokenizer: Tokenizer) -> Self {
        Self {
            model,
            tokenizer,
            ignore_labels: vec!["O".into()],
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The precision the encoder runs at.
    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    /// The entities of `text`.
    pub fn entities(&self, text: &str, aggregation: Aggregation) -> Result<Vec<Entity>> {
        let mut one = self.entities_many(&[text], aggregation)?;
        Ok(one.pop().unwrap_or_default())
    }

    /// [`TokenClassifier::entities`] of many texts at once, in their
    /// order: texts of similar length share a forward pass of up to 32
    /// texts, and on the packed CPU path these batches
    /// run side by side, one per core. Each text's entities are its
    /// entities alone, to fp32 rounding of the scores.
    pub fn entities_many<S: AsRef<str>>(
        &self,
        texts: &[S],
        aggregation: Aggregation,
    ) -> Result<Vec<Vec<Entity>>> {
        let encs = texts
            .iter()
            .map(|text| {
                let enc = self
                    .tokenizer
                    .inner()
                    .encode_char_offsets(text.as_ref(), true)
                    .map_err(|e| Error::Tokenizer(format!("encoding text: {e}")))?;
                if !enc.get_overflowing().is_empty() {
                    tracing::warn!(
                        "a text was truncated to {} tokens",
                        self.tokenizer.max_length()
                    );
                }
                Ok(enc)
            })
            .collect::<Result<Vec<_>>>()?;
        let seqs: Vec<(&[u32], &[u32])> = encs
            .iter()
            .map(|e| (e.get_ids(), e.get_type_ids()))
            .collect();
        let pad = self.tokenizer.pad_id();
        let logits = self.model.many_logits(&seqs, NER_BATCH_SIZE, pad)?;
        let labels = self.model.head().num_labels().max(1);
        texts
            .iter()
            .zip(&encs)
            .zip(logits)
            .map(|((text, enc), logits)| {
                let rows: Vec<&[f32]> = logits.chunks_exact(labels).collect();
                self.entities_of(text.as_ref(), enc, &rows, aggregation)
            })
            .collect()
    }

    /// The entities of `text`, encoded as `enc`, from its tokens' logits.
    fn entities_of(
        &self,
        text: &str,
        enc: &tokenizers::Encoding,
        logits: &[&[f32]],
        aggregation: Aggregation,
    ) -> Result<Vec<Entity>> {
        let ids = enc.get_ids();
        let unk = self.tokenizer.token_to_id("[UNK]");
        let special = enc.get_special_tokens_mask();
        let tokens = enc.get_tokens();
        let offsets = enc.get_offsets();
        let mut pre = Vec::new();
        for (idx, row) in logits.iter().enumerate() {
            if special.get(idx).copied().unwrap_or(0) == 1 {
                continue;
            }
            let (start, end) = offsets[idx];
            let word_ref = pipeline::char_slice(text, start, end);
            let mut word = tokens[idx].clone();
            // WordPiece marks continuations, so a token whose text differs
            // in length from its span ("##s" for "s") is a sub-word.
            let mut is_subword = word.chars().count() != word_ref.chars().count();
            if Some(ids[idx]) == unk {
                word = word_ref;
                is_subword = false;
            }
            pre.push(PreEntity {
                word,
                scores: softmax(row),
                start,
                end,
                index: idx,
                is_subword,
            });
        }
        let tagged = match aggregation {
            Aggregation::None | Aggregation::Simple => pre
                .into_iter()
                .map(|p| {
                    let i = argmax(&p.scores);
                    Ok(Tagged {
                        entity: self.label(i)?,
                        score: p.scores[i],
                        word: p.word,
                        start: p.start,
                        end: p.end,
                        index: Some(p.index),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            _ => self.aggregate_words(pre, aggregation)?,
        };
        let out = if aggregation == Aggregation::None {
            tagged
                .into_iter()
                .map(|t| Entity {
                    entity: Some(t.entity),
                    entity_group: None,
                    score: t.score,
                    index: t.index,
                    word: t.word,
                    start: t.start,
                    end: t.end,
                })
                .filter(|e| !self.ignored(e.entity.as_deref()))
                .collect()
        } else {
            self.group_entities(tagged)
                .into_iter()
                .filter(|e| !self.ignored(e.entity_group.as_deref()))
                .collect()
        };
        Ok(out)
    }

    fn ignored(&self, label: Option<&str>) -> bool {
        label.is_some_and(|l| self.ignore_labels.iter().any(|i| i == l))
    }

    fn label(&self, id: usize) -> Result<String> {
        let model = self.model.head();
        let config = model.config();
        if id >= model.num_labels() {
            return Err(Error::Input(format!(
                "the model predicted label id {id}, but id2label has {} labels",
                model.num_labels()
            )));
        }
        Ok(config.label_name(id))
    }

    /// Merges sub-word tokens into words (`first`, `average`, `max`).
    fn aggregate_words(&self, pre: Vec<PreEntity>, agg: Aggregation) -> Result<Vec<Tagged>> {
        let mut words: Vec<Vec<PreEntity>> = Vec::new();
        for p in pre {
            match words.last_mut() {
                Some(group) if p.is_subword => group.push(p),
                _ => words.push(vec![p]),
            }
        }
        words
            .into_iter()
            .map(|group| {
                let tokens: Vec<String> = group.iter().map(|p| p.word.clone()).collect();
                let word = tokens_to_string(&self.tokenizer, &tokens);
                let (idx, score) = match agg {
                    Aggregation::First => {
                        let i = argmax(&group[0].scores);
                        (i, group[0].scores[i])
                    }
                    Aggregation::Max => {
                        let max_of = |p: &PreEntity| p.scores[argmax(&p.scores)];
                        let mut best = &group[0];
                        for p in &group[1..] {
                            if max_of(p) > max_of(best) {
                                best = p;
                            }
                        }
                        let i = argmax(&best.scores);
                        (i, best.scores[i])
                    }
                    _ => {
                        let n = group[0].scores.len();
                        let avg: Vec<f32> = (0..n)
                            .map(|c| {
                                group.iter().map(|p| p.scores[c]).sum::<f32>() / group.len() as f32
                            })
                            .collect();
                        let i = argmax(&avg);
                        (i, avg[i])
                    }
                };
                Ok(Tagged {
                    entity: self.label(idx)?,
                    score,
                    word,
                    start: group[0].start,
                    end: group[group.len() - 1].end,
                    index: None,
                })
            })
            .collect()
    }

    /// Groups adjacent entities of the same tag; a `B-` starts a new group.
    fn group_entities(&self, tagged: Vec<Tagged>) -> Vec<Entity> {
        fn tag(label: &str) -> (bool, &str) {
            if let Some(t) = label.strip_prefix("B-") {
                (true, t)
            } else if let Some(t) = label.strip_prefix("I-") {
                (false, t)
            } else {
                (false, label)
            }
        }
        let mut groups: Vec<Vec<Tagged>> = Vec::new();
        for t in tagged {
            let joins = match groups.last().and_then(|g| g.last()) {
                Some(last) => {
                    let (is_b, tg) = tag(&t.entity);
                    let (_, last_tag) = tag(&last.entity);
                    tg == last_tag && !is_b
                }
                None => false,
            };
            if joins {
                if let Some(g) = groups.last_mut() {
                    g.push(t);
                }
            } else {
                groups.push(vec![t]);
            }
        }
        groups
            .into_iter()
            .map(|g| {
                let words: Vec<String> = g.iter().map(|t| t.word.clone()).collect();
                let first = &g[0];
                Entity {
                    entity: None,
                    entity_group: Some(tag(&first.entity).1.to_string()),
                    score: g.iter().map(|t| t.score).sum::<f32>() / g.len() as f32,
                    index: None,
                    word: tokens_to_string(&self.tokenizer, &words),
                    start: first.start,
                    end: g[g.len() - 1].end,
                }
            })
            .collect()
    }
}
