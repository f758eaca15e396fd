//! Pre-training data: plain-text corpora read as a stream of documents
//! (blank-line-separated blocks; a file without blank lines is one
//! document), tokenized in parallel and packed into sequences.
//!
//! Without NSP, documents are joined by `[SEP]` and cut into full windows
//! of `seq_len` tokens (`[CLS] … [SEP]`). With NSP, each document is cut
//! into sentences and packed into `[CLS] A [SEP] B [SEP]` pairs as BERT's
//! `create_pretraining_data.py` does: half the B segments are the real
//! continuation, half come from another document.

use std::borrow::Cow;
use std::path::PathBuf;

use super::corpus_read::read_documents;
use super::packing::{
    materialize, plan_pairs, plan_windows, Documents, ExamplePlan, Specials, Stream,
};
use super::prepared::PreparedSequences;
use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct CorpusOptions {
    /// Tokens per sequence, special tokens included.
    pub seq_len: usize,
    /// Build sentence pairs with next-sentence labels.
    pub nsp: bool,
    pub seed: u64,
}

/// One training sequence, before masking.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    /// 0: B follows A; 1: B is random (transformers' convention).
    pub next_sentence_label: Option<u32>,
}

/// A tokenized, packed corpus.
#[derive(Debug, Clone, Default)]
pub struct Corpus {
    pub examples: Vec<Example>,
    pub documents: usize,
    /// Word-piece tokens read (without special tokens).
    pub tokens: usize,
}

impl Corpus {
    /// Reads, tokenizes and packs the files (folders are read file by file,
    /// in name order).
    pub fn read(paths: &[PathBuf], tokenizer: &Tokenizer, opts: &CorpusOptions) -> Result<Self> {
        check_seq_len(opts.seq_len)?;
        let specials = specials(tokenizer)?;
        let mut docs: Vec<Vec<Vec<u32>>> = Vec::new();
        // Whether the last document still gets parts.
        let mut open = false;
        let read = read_documents(paths, tokenizer, opts.nsp, |parts| {
            for part in parts {
                match docs.last_mut() {
                    Some(doc) if open => doc.extend(part.pieces),
                    _ => docs.push(part.pieces),
                }
                open = !part.ends;
            }
            Ok(())
        })?;
        let docs = docs.as_slice();
        let stream = Stream::new(docs);
        let plans = plan(docs, &stream, opts)?;
        let examples = plans
            .iter()
            .map(|p| materialize(docs, &stream, specials, p))
            .collect();
        Ok(Self {
            examples,
            documents: read.documents,
            tokens: read.tokens,
        })
    }

    pub fn len(&self) -> usize {
        self.examples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Moves the last `n` examples into a corpus of their own (a held-out
    /// set when no evaluation corpus is given).
    pub fn split_off_last(&mut self, n: usize) -> Corpus {
        let at = self.examples.len().saturating_sub(n);
        Corpus {
            examples: self.examples.split_off(at),
            documents: 0,
            tokens: 0,
        }
    }
}

pub(crate) fn check_seq_len(seq_len: usize) -> Result<()> {
    if seq_len < 8 {
        return Err(Error::option(
            "seq_len",
            format!("{seq_len}: must be at least 8"),
        ));
    }
    Ok(())
}

/// The sequences of a run's options: windows, or NSP pairs (which need
/// two documents).
pub(crate) fn plan(
    docs: &(impl Documents + ?Sized),
    stream: &Stream,
    opts: &CorpusOptions,
) -> Result<Vec<ExamplePlan>> {
    if !opts.nsp {
        return Ok(plan_windows(stream, opts.seq_len));
    }
    if docs.count() < 2 {
        return Err(Error::option(
            "nsp",
            "needs at least two documents (blank-line-separated blocks) for random B segments",
        ));
    }
    Ok(plan_pairs(docs, opts))
}

/// The tokenizer's `[CLS]` and `[SEP]` (`<s>`, `</s>`).
pub(crate) fn specials(tokenizer: &Tokenizer) -> Result<Specials> {
    Ok(Specials {
        cls: special_id(tokenizer, &["[CLS]", "<s>"])?,
        sep: special_id(tokenizer, &["[SEP]", "</s>"])?,
    })
}

fn special_id(tokenizer: &Tokenizer, names: &[&str]) -> Result<u32> {
    names
        .iter()
        .find_map(|n| tokenizer.token_to_id(n))
        .ok_or_else(|| Error::Tokenizer(format!("the vocabulary has none of {names:?}")))
}

/// Sentence boundaries: `.`, `!` or `?` (and closing quotes) followed by
/// whitespace and a capital letter, digit or opening quote.
pub fn split_sentences(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        let (_, c) = chars[i];
        if matches!(c, '.' | '!' | '?') {
            let mut j = i + 1;
            while j < chars.len() && matches!(chars[j].1, '"' | '\'' | ')' | '”' | '’') {
                j += 1;
            }
            if j + 1 < chars.len() && chars[j].1.is_whitespace() {
                let next = chars[j + 1].1;
                if next.is_uppercase() || next.is_ascii_digit() || matches!(next, '"' | '“' | '(')
                {
                    let end = chars[j].0;
                    let s = text[start..end].trim();
                    if !s.is_empty() {
                        out.push(s);
                    }
                    start = chars[j + 1].0;
                    i = j + 1;
                    continue;
                }
            }
        }
        i += 1;
    }
    let s = text[start..].trim();
    if !s.is_empty() {
        out.push(s);
    }
    out
}

/// Pre-training sequences: held in memory, or read on demand from a
/// prepared corpus's shards.
pub enum Sequences {
    Memory(Corpus),
    Prepared(PreparedSequences),
}

impl From<Corpus> for Sequences {
    fn from(c: Corpus) -> Self {
        Self::Memory(c)
    }
}

impl Default for Sequences {
    fn default() -> Self {
        Self::Memory(Corpus::default())
    }
}

impl Sequences {
    pub fn len(&self) -> usize {
        match self {
            Self::Memory(c) => c.len(),
            Self::Prepared(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sequence `i` (read from the shards of a prepared corpus).
    pub fn example(&self, i: usize) -> Cow<'_, Example> {
        match self {
            Self::Memory(c) => Cow::Borrowed(&c.examples[i]),
            Self::Prepared(p) => p.example(i),
        }
    }

    /// Sequence `i`'s length, special tokens included.
    pub fn length(&self, i: usize) -> usize {
        match self {
            Self::Memory(c) => c.examples[i].input_ids.len(),
            Self::Prepared(p) => p.length(i),
        }
    }

    /// Feeds `add`, value by value, what identifies the sequences: every
    /// token of sequences in memory; a prepared corpus's content hash and
    /// options.
    pub fn identify(&self, add: &mut dyn FnMut(i64)) {
        match self {
            Self::Memory(c) => {
                for e in &c.examples {
                    e.input_ids.iter().for_each(|&t| add(i64::from(t)));
                    e.token_type_ids.iter().for_each(|&t| add(i64::from(t)));
                    add(e.next_sentence_label.map_or(-1, i64::from));
                }
            }
            Self::Prepared(p) => p.identity().bytes().for_each(|b| add(i64::from(b))),
        }
    }

    /// Moves the last `n` sequences into a set of their own (held out).
    pub fn split_off_last(&mut self, n: usize) -> Sequences {
        match self {
            Self::Memory(c) => Self::Memory(c.split_off_last(n)),
            Self::Prepared(p) => Self::Prepared(p.split_off_last(n)),
        }
    }
}
