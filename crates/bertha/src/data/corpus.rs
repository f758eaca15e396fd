//! Pre-training data: plain-text corpora read as a stream of documents
//! (blank-line-separated blocks; a file without blank lines is one
//! document), tokenized in parallel and packed into sequences.
//!
//! Without NSP, documents are joined by `[SEP]` and cut into full windows
//! of `seq_len` tokens (`[CLS] … [SEP]`). With NSP, each document is cut
//! into sentences and packed into `[CLS] A [SEP] B [SEP]` pairs as BERT's
//! `create_pretraining_data.py` does: half the B segments are the real
//! continuation, half come from another document.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use rand::Rng;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::rng::rng_for;

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

/// Documents tokenized per parallel batch: enough work for every core,
/// little text held at once.
const DOCS_PER_BATCH: usize = 512;

struct Ids {
    cls: u32,
    sep: u32,
}

impl Corpus {
    /// Reads, tokenizes and packs the files (folders are read file by file,
    /// in name order).
    pub fn read(paths: &[PathBuf], tokenizer: &Tokenizer, opts: &CorpusOptions) -> Result<Self> {
        if opts.seq_len < 8 {
            return Err(Error::option(
                "seq_len",
                format!("{}: must be at least 8", opts.seq_len),
            ));
        }
        let ids = Ids {
            cls: special_id(tokenizer, &["[CLS]", "<s>"])?,
            sep: special_id(tokenizer, &["[SEP]", "</s>"])?,
        };
        let mut tk = tokenizer.inner().clone();
        tk.with_truncation(None)
            .map_err(|e| Error::Tokenizer(format!("disabling truncation: {e}")))?;
        tk.with_padding(None);

        let files = expand(paths)?;
        // Each document: its sentences' ids (one entry per line without NSP).
        let mut docs: Vec<Vec<Vec<u32>>> = Vec::new();
        let mut pending: Vec<Vec<String>> = Vec::new();
        let mut tokens = 0usize;
        let mut flush =
            |pending: &mut Vec<Vec<String>>, docs: &mut Vec<Vec<Vec<u32>>>| -> Result<()> {
                let batch: Vec<Vec<Vec<u32>>> = std::mem::take(pending)
                    .into_par_iter()
                    .map(|lines| {
                        let pieces: Vec<String> = if opts.nsp {
                            lines
                                .iter()
                                .flat_map(|l| split_sentences(l))
                                .map(str::to_string)
                                .collect()
                        } else {
                            lines
                        };
                        let enc = tk
                            .encode_batch(pieces, false)
                            .map_err(|e| Error::Tokenizer(format!("encoding corpus: {e}")))?;
                        Ok(enc
                            .into_iter()
                            .map(|e| e.get_ids().to_vec())
                            .filter(|ids| !ids.is_empty())
                            .collect::<Vec<_>>())
                    })
                    .collect::<Result<_>>()?;
                for doc in batch.into_iter().filter(|d| !d.is_empty()) {
                    tokens += doc.iter().map(Vec::len).sum::<usize>();
                    docs.push(doc);
                }
                Ok(())
            };
        for file in &files {
            let f = std::fs::File::open(file).map_err(|e| Error::io(file, e))?;
            let mut reader = BufReader::new(f);
            let mut doc: Vec<String> = Vec::new();
            let mut buf = Vec::new();
            let mut line_no = 0usize;
            loop {
                buf.clear();
                let n = reader
                    .read_until(b'\n', &mut buf)
                    .map_err(|e| Error::io(file, e))?;
                line_no += 1;
                let line = if n == 0 {
                    ""
                } else {
                    std::str::from_utf8(&buf).map_err(|e| {
                        Error::Input(format!("{}:{line_no}: invalid UTF-8 ({e})", file.display()))
                    })?
                };
                let line = line.trim();
                if line.is_empty() {
                    if !doc.is_empty() {
                        pending.push(std::mem::take(&mut doc));
                        if pending.len() >= DOCS_PER_BATCH {
                            flush(&mut pending, &mut docs)?;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                } else {
                    doc.push(line.to_string());
                }
            }
        }
        flush(&mut pending, &mut docs)?;
        if tokens == 0 {
            return Err(Error::Input(format!(
                "the corpus ({}) holds no text",
                files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let examples = if opts.nsp {
            if docs.len() < 2 {
                return Err(Error::option(
                    "nsp",
                    "needs at least two documents (blank-line-separated blocks) for random B segments",
                ));
            }
            nsp_examples(&docs, &ids, opts)
        } else {
            packed_examples(&docs, &ids, opts.seq_len)
        };
        Ok(Self {
            examples,
            documents: docs.len(),
            tokens,
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

fn special_id(tokenizer: &Tokenizer, names: &[&str]) -> Result<u32> {
    names
        .iter()
        .find_map(|n| tokenizer.token_to_id(n))
        .ok_or_else(|| Error::Tokenizer(format!("the vocabulary has none of {names:?}")))
}

pub(crate) fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| Error::io(p, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && !is_hidden_or_doc(p))
                .collect();
            entries.sort();
            files.extend(entries);
        } else if p.is_file() {
            files.push(p.clone());
        } else {
            return Err(Error::io(
                p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
            ));
        }
    }
    if files.is_empty() {
        return Err(Error::Input("no corpus files given".into()));
    }
    Ok(files)
}

/// Folders of data sets carry a SOURCE.md / README.md that is not corpus.
fn is_hidden_or_doc(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with('.') || matches!(name, "SOURCE.md" | "README.md")
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

fn packed_examples(docs: &[Vec<Vec<u32>>], ids: &Ids, seq_len: usize) -> Vec<Example> {
    let body = seq_len - 2;
    let mut examples = Vec::new();
    let mut window: Vec<u32> = Vec::with_capacity(body);
    let mut emit = |window: &mut Vec<u32>| {
        let mut input_ids = Vec::with_capacity(seq_len);
        input_ids.push(ids.cls);
        input_ids.append(window);
        input_ids.push(ids.sep);
        let n = input_ids.len();
        examples.push(Example {
            input_ids,
            token_type_ids: vec![0; n],
            next_sentence_label: None,
        });
    };
    for (d, doc) in docs.iter().enumerate() {
        let sep = (d > 0 && !window.is_empty()).then_some(ids.sep);
        for id in sep.into_iter().chain(doc.iter().flatten().copied()) {
            if window.len() >= body {
                emit(&mut window);
            }
            window.push(id);
        }
    }
    // A tail shorter than a quarter window is dropped, as group_texts does
    // with any remainder.
    if window.len() >= body / 4 && window.iter().any(|&t| t != ids.sep) {
        emit(&mut window);
    }
    examples
}

fn nsp_examples(docs: &[Vec<Vec<u32>>], ids: &Ids, opts: &CorpusOptions) -> Vec<Example> {
    let target = opts.seq_len - 3;
    let mut rng = rng_for(opts.seed, 0x4e5350, 0);
    let mut examples = Vec::new();
    for (d, doc) in docs.iter().enumerate() {
        let mut chunk: Vec<&[u32]> = Vec::new();
        let mut len = 0;
        let mut i = 0;
        while i < doc.len() {
            chunk.push(&doc[i]);
            len += doc[i].len();
            if i == doc.len() - 1 || len >= target {
                let a_end = if chunk.len() >= 2 {
                    rng.random_range(1..chunk.len())
                } else {
                    1
                };
                let mut a: Vec<u32> = chunk[..a_end]
                    .iter()
                    .flat_map(|s| s.iter().copied())
                    .collect();
                let real_next = rng.random::<f64>() >= 0.5;
                let (mut b, label) = if real_next && chunk.len() == 1 && a.len() >= 2 {
                    // One long sentence: its second part is the real
                    // continuation (BERT would always draw a random B here,
                    // skewing the labels on corpora of short paragraphs).
                    let cut = rng.random_range(1..a.len());
                    (a.split_off(cut), 0)
                } else if chunk.len() == 1 || !real_next {
                    // A random B from another document; the unused
                    // sentences of this chunk are read again.
                    let mut other = rng.random_range(0..docs.len() - 1);
                    if other >= d {
                        other += 1;
                    }
                    let od = &docs[other];
                    let start = rng.random_range(0..od.len());
                    let want = target.saturating_sub(a.len()).max(1);
                    let mut b = Vec::new();
                    for s in &od[start..] {
                        b.extend_from_slice(s);
                        if b.len() >= want {
                            break;
                        }
                    }
                    i -= chunk.len() - a_end;
                    (b, 1)
                } else {
                    let b: Vec<u32> = chunk[a_end..]
                        .iter()
                        .flat_map(|s| s.iter().copied())
                        .collect();
                    (b, 0)
                };
                // Trim the longer segment until the pair fits.
                while a.len() + b.len() > target {
                    let longer = if a.len() > b.len() { &mut a } else { &mut b };
                    if rng.random::<bool>() {
                        longer.remove(0);
                    } else {
                        longer.pop();
                    }
                }
                if !a.is_empty() && !b.is_empty() {
                    let mut input_ids = Vec::with_capacity(a.len() + b.len() + 3);
                    input_ids.push(ids.cls);
                    input_ids.extend_from_slice(&a);
                    input_ids.push(ids.sep);
                    let na = input_ids.len();
                    input_ids.extend_from_slice(&b);
                    input_ids.push(ids.sep);
                    let mut token_type_ids = vec![0; na];
                    token_type_ids.resize(input_ids.len(), 1);
                    examples.push(Example {
                        input_ids,
                        token_type_ids,
                        next_sentence_label: Some(label),
                    });
                }
                chunk.clear();
                len = 0;
            }
            i += 1;
        }
    }
    examples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_lengths() {
        let docs = vec![
            vec![vec![5u32; 252]],
            vec![vec![6u32; 50], vec![7u32; 10]],
            vec![vec![8u32; 200]],
        ];
        let ex = packed_examples(&docs, &Ids { cls: 1, sep: 2 }, 128);
        let lens: Vec<usize> = ex.iter().map(|e| e.input_ids.len()).collect();
        // 252 fill two windows exactly; the separator starts the third.
        assert_eq!(lens, vec![128, 128, 128, 128]); // a tail of 10 tokens is dropped
        assert_eq!(ex[2].input_ids[..3], [1, 2, 6]);
        assert!(ex
            .iter()
            .all(|e| e.input_ids[0] == 1 && *e.input_ids.last().unwrap() == 2));
    }
}
