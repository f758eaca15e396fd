//! CoNLL-style NER files and the word → word-piece label alignment of
//! transformers' `run_ner.py`.
//!
//! A file has one word per line in whitespace-separated columns, the word
//! first and the NER tag last (CoNLL-2003: `word POS chunk NER`); blank
//! lines end sentences and `-DOCSTART-` lines are skipped. Tags must be
//! `O`, `B-TYPE` or `I-TYPE`. IOB1 input (where an entity starts with
//! `I-` unless it touches one of the same type) is converted to IOB2
//! (every entity starts with `B-`), the scheme seqeval and transformers
//! evaluate: an `I-X` not following `B-X`/`I-X` becomes `B-X`. On IOB2
//! input this changes nothing, so it is always applied; the number of
//! tags it changed is reported.
//!
//! Alignment puts each word's label on its first word piece and -100 (the
//! loss's ignore index) on the other pieces and on special tokens; words cut
//! off by `max_length` are counted so evaluation can report them, and get
//! `O` when predictions are mapped back to words.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use tokenizers::{Encoding, TruncationDirection};

use super::classification::BadRow;
use super::labels::LabelSet;
use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::model::IGNORE_INDEX;

#[derive(Debug, Clone, Default)]
pub struct ConllOptions {
    /// Fixed tag ids (the training set's, or a checkpoint's `id2label`):
    /// a tag outside them makes its sentence bad. `None`: inferred with
    /// [`ner_label_set`].
    pub labels: Option<LabelSet>,
    /// Skip and count sentences with a malformed line instead of failing.
    pub skip_bad_rows: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NerSentence {
    pub words: Vec<String>,
    /// IOB2 tags, one per word.
    pub tags: Vec<String>,
    /// The tags' ids in [`NerData::labels`].
    pub tag_ids: Vec<usize>,
    /// 1-based line of the sentence's first word.
    pub line: usize,
}

#[derive(Debug, Clone)]
pub struct NerData {
    pub path: PathBuf,
    pub sentences: Vec<NerSentence>,
    pub labels: LabelSet,
    /// `-DOCSTART-` lines seen.
    pub documents: usize,
    /// `I-` tags turned into `B-` by the IOB1 → IOB2 conversion (0 for IOB2 input).
    pub retagged: usize,
    /// Sentences skipped as malformed (only with `skip_bad_rows`).
    pub skipped: usize,
    /// The first bad line of each skipped sentence, and why.
    pub bad_rows: Vec<BadRow>,
}

impl NerData {
    pub fn read(path: &Path, opts: &ConllOptions) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path, opts)
    }

    /// Parses file contents; `path` names them in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path, opts: &ConllOptions) -> Result<Self> {
        let origin = path.display().to_string();
        let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        let mut raw: Vec<(usize, Vec<String>, Vec<String>)> = Vec::new();
        let mut bad_rows = Vec::new();
        let mut documents = 0;
        // The sentence being read: first line, words, tags, first problem.
        let mut cur: (usize, Vec<String>, Vec<String>, Option<BadRow>) =
            (0, Vec::new(), Vec::new(), None);
        let mut finish = |cur: &mut (usize, Vec<String>, Vec<String>, Option<BadRow>),
                          raw: &mut Vec<(usize, Vec<String>, Vec<String>)>|
         -> Result<()> {
            let (line, words, tags, problem) = std::mem::take(cur);
            match problem {
                Some(b) if opts.skip_bad_rows => bad_rows.push(b),
                Some(b) => {
                    return Err(Error::Input(format!(
                        "{origin}: line {}: {}",
                        b.line, b.reason
                    )))
                }
                None if words.is_empty() => {}
                None => raw.push((line, words, tags)),
            }
            Ok(())
        };
        let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        for (i, line_bytes) in body.split(|b| *b == b'\n').enumerate() {
            let line = i + 1;
            let line_bytes = line_bytes.strip_suffix(b"\r").unwrap_or(line_bytes);
            let text = match std::str::from_utf8(line_bytes) {
                Ok(t) => t,
                Err(e) => {
                    if cur.0 == 0 {
                        cur.0 = line;
                    }
                    cur.3.get_or_insert(BadRow {
                        line,
                        reason: format!("invalid UTF-8 at byte {} of the line", e.valid_up_to()),
                    });
                    continue;
                }
            };
            let fields: Vec<&str> = text.split_whitespace().collect();
            if fields.is_empty() {
                finish(&mut cur, &mut raw)?;
                continue;
            }
            if fields[0] == "-DOCSTART-" {
                documents += 1;
                finish(&mut cur, &mut raw)?;
                continue;
            }
            if cur.0 == 0 {
                cur.0 = line;
            }
            if fields.len() < 2 {
                cur.3.get_or_insert(BadRow {
                    line,
                    reason: format!(
                        "expected a word and a tag separated by whitespace, got `{text}`"
                    ),
                });
                continue;
            }
            let tag = fields[fields.len() - 1];
            if let Err(reason) = check_tag(tag) {
                cur.3.get_or_insert(BadRow { line, reason });
                continue;
            }
            cur.1.push(fields[0].to_string());
            cur.2.push(tag.to_string());
        }
        finish(&mut cur, &mut raw)?;

        let mut retagged = 0;
        for (_, _, tags) in raw.iter_mut() {
            retagged += iob1_to_iob2(tags);
        }
        let labels = match &opts.labels {
            Some(set) => set.clone(),
            None => ner_label_set(raw.iter().flat_map(|(_, _, t)| t.iter())),
        };
        let mut sentences = Vec::with_capacity(raw.len());
        'sentences: for (line, words, tags) in raw {
            let mut tag_ids = Vec::with_capacity(tags.len());
            for (k, t) in tags.iter().enumerate() {
                match labels.id(t) {
                    Some(id) => tag_ids.push(id),
                    None => {
                        let reason =
                            format!("unknown tag `{t}` (the tags are {})", labels.listed());
                        // The sentence's k-th word line: words are one per
                        // line, so its line is `line + k`.
                        let bad = BadRow {
                            line: line + k,
                            reason,
                        };
                        if opts.skip_bad_rows {
                            bad_rows.push(bad);
                            continue 'sentences;
                        }
                        return Err(Error::Input(format!(
                            "{origin}: line {}: {}",
                            bad.line, bad.reason
                        )));
                    }
                }
            }
            sentences.push(NerSentence {
                words,
                tags,
                tag_ids,
                line,
            });
        }
        if sentences.is_empty() {
            let why = if bad_rows.is_empty() {
                "the file has no word lines".to_string()
            } else {
                format!("all {} sentences were malformed", bad_rows.len())
            };
            return Err(Error::Input(format!("{origin}: no sentences: {why}")));
        }
        Ok(Self {
            path: path.to_path_buf(),
            sentences,
            labels,
            documents,
            retagged,
            skipped: bad_rows.len(),
            bad_rows,
        })
    }

    pub fn len(&self) -> usize {
        self.sentences.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sentences.is_empty()
    }

    /// Every sentence's tags, for the entity metrics.
    pub fn tags(&self) -> Vec<Vec<String>> {
        self.sentences.iter().map(|s| s.tags.clone()).collect()
    }
}

/// `O`, `B-TYPE` or `I-TYPE` with a non-empty type.
fn check_tag(tag: &str) -> std::result::Result<(), String> {
    if tag == "O" {
        return Ok(());
    }
    match tag.split_once('-') {
        Some(("B" | "I", ty)) if !ty.is_empty() => Ok(()),
        _ => Err(format!(
            "tag `{tag}` is not `O`, `B-TYPE` or `I-TYPE` (IOB1 / IOB2; other schemes such as \
             IOBES are not supported)"
        )),
    }
}

/// Converts one sentence's tags from IOB1 to IOB2 in place: an `I-X` that
/// does not continue a `B-X` / `I-X` becomes `B-X`. Returns how many tags
/// changed (0 for IOB2 input).
pub fn iob1_to_iob2(tags: &mut [String]) -> usize {
    let mut changed = 0;
    for i in 0..tags.len() {
        let Some(ty) = tags[i].strip_prefix("I-") else {
            continue;
        };
        let continues = i > 0
            && matches!(
                tags[i - 1].split_once('-'),
                Some(("B" | "I", prev)) if prev == ty
            );
        if !continues {
            tags[i] = format!("B-{ty}");
            changed += 1;
        }
    }
    changed
}

/// The tag ids for a training set: `O` first, then for each entity type in
/// sorted order `B-TYPE`, `I-TYPE` (both, even when the data lacks
/// `I-TYPE`, so a single-word-only type in training does not make `I-`
/// tags of the evaluation set unknown). CoNLL-2003: O, B-LOC, I-LOC, B-MISC,
/// I-MISC, B-ORG, I-ORG, B-PER, I-PER.
pub fn ner_label_set<I, S>(tags: I) -> LabelSet
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let types: BTreeSet<String> = tags
        .into_iter()
        .filter_map(|t| {
            t.as_ref()
                .split_once('-')
                .filter(|(p, _)| matches!(*p, "B" | "I"))
                .map(|(_, ty)| ty.to_string())
        })
        .collect();
    let mut names = vec!["O".to_string()];
    for ty in types {
        names.push(format!("B-{ty}"));
        names.push(format!("I-{ty}"));
    }
    LabelSet::from_names(names).unwrap_or_default()
}

/// One sentence as model input, with token labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlignedSentence {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    /// The word's tag id on its first piece, [`IGNORE_INDEX`] elsewhere
    /// (all [`IGNORE_INDEX`] when aligned without tags).
    pub labels: Vec<i64>,
    /// The word each token came from; `None` for special tokens.
    pub word_ids: Vec<Option<usize>>,
    /// Words in the sentence.
    pub words: usize,
    /// Words cut off by `max_length` (they have no token).
    pub words_truncated: usize,
    /// Words the tokenizer turned into no token at all (e.g. only control
    /// characters); like truncated words they are predicted `O`.
    pub words_empty: usize,
}

impl AlignedSentence {
    /// Tokens, special tokens included (the attention length).
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Each word's predicted tag id: the prediction at its first piece;
    /// `None` for words without a token (truncated or empty).
    /// `token_predictions` may be longer than the sentence (padding).
    pub fn word_predictions(&self, token_predictions: &[usize]) -> Result<Vec<Option<usize>>> {
        if token_predictions.len() < self.len() {
            return Err(Error::Input(format!(
                "{} token predictions for a sentence of {} tokens",
                token_predictions.len(),
                self.len()
            )));
        }
        let mut out = vec![None; self.words];
        let mut prev = None;
        for (t, w) in self.word_ids.iter().enumerate() {
            if let Some(slot) = w.filter(|w| prev != Some(*w)).and_then(|w| out.get_mut(w)) {
                slot.get_or_insert(token_predictions[t]);
            }
            prev = *w;
        }
        Ok(out)
    }

    /// Each word's predicted tag: the first piece's prediction, `O` for
    /// words without a token. A predicted id outside `labels` is an error.
    pub fn word_tags(&self, token_predictions: &[usize], labels: &LabelSet) -> Result<Vec<String>> {
        self.word_predictions(token_predictions)?
            .into_iter()
            .map(|p| match p {
                None => Ok("O".to_string()),
                Some(id) => labels.name(id).map(str::to_string).ok_or_else(|| {
                    Error::Input(format!(
                        "predicted tag id {id}, but there are only {} tags",
                        labels.len()
                    ))
                }),
            })
            .collect()
    }
}

/// Tokenizes pre-split words, truncating at `max_length` tokens (special
/// tokens included) with the tokenizer's own special-token template.
pub struct NerAligner {
    /// The tokenizer without truncation (we cut, to count lost words).
    inner: tokenizers::Tokenizer,
    max_length: usize,
    /// Tokens the template adds to one sequence (`[CLS]`, `[SEP]`).
    added: usize,
}

impl NerAligner {
    pub fn new(tokenizer: &Tokenizer, max_length: usize) -> Result<Self> {
        let mut inner = tokenizer.inner().clone();
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let added = inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        if max_length <= added {
            return Err(Error::Input(format!(
                "max length {max_length} leaves no room for words next to the {added} special tokens"
            )));
        }
        Ok(Self {
            inner,
            max_length,
            added,
        })
    }

    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// Aligns one sentence; `tag_ids` (one per word) may be `None` for
    /// prediction.
    pub fn align<S: AsRef<str>>(
        &self,
        words: &[S],
        tag_ids: Option<&[usize]>,
    ) -> Result<AlignedSentence> {
        if let Some(t) = tag_ids {
            if t.len() != words.len() {
                return Err(Error::Input(format!(
                    "{} tags for {} words",
                    t.len(),
                    words.len()
                )));
            }
        }
        let words_ref: Vec<&str> = words.iter().map(AsRef::as_ref).collect();
        let mut enc = self
            .inner
            .encode(words_ref.as_slice(), false)
            .map_err(|e| Error::Tokenizer(format!("encoding words: {e}")))?;
        let mut seen = vec![false; words.len()];
        for w in enc.get_word_ids().iter().flatten() {
            if let Some(s) = seen.get_mut(*w as usize) {
                *s = true;
            }
        }
        let words_empty = seen.iter().filter(|s| !**s).count();
        enc.truncate(self.max_length - self.added, 0, TruncationDirection::Right);
        enc.take_overflowing();
        let enc: Encoding = self
            .inner
            .post_process(enc, None, true)
            .map_err(|e| Error::Tokenizer(format!("adding special tokens: {e}")))?;
        let word_ids: Vec<Option<usize>> = enc
            .get_word_ids()
            .iter()
            .zip(enc.get_special_tokens_mask())
            .map(|(w, special)| {
                if *special == 1 {
                    None
                } else {
                    w.map(|w| w as usize)
                }
            })
            .collect();
        let mut kept = vec![false; words.len()];
        let mut labels = Vec::with_capacity(word_ids.len());
        let mut prev = None;
        for w in &word_ids {
            let first_piece = w.filter(|w| prev != Some(*w) && kept.get(*w) == Some(&false));
            let label = match (first_piece, tag_ids) {
                (Some(w), Some(tags)) => tags[w] as i64,
                _ => IGNORE_INDEX,
            };
            if let Some(k) = first_piece.and_then(|w| kept.get_mut(w)) {
                *k = true;
            }
            labels.push(label);
            prev = *w;
        }
        let words_lost = kept.iter().filter(|k| !**k).count();
        Ok(AlignedSentence {
            input_ids: enc.get_ids().to_vec(),
            token_type_ids: enc.get_type_ids().to_vec(),
            labels,
            word_ids,
            words: words.len(),
            words_truncated: words_lost - words_empty,
            words_empty,
        })
    }

    /// Aligns every sentence, in parallel.
    pub fn align_all(&self, sentences: &[NerSentence]) -> Result<Vec<AlignedSentence>> {
        sentences
            .par_iter()
            .map(|s| {
                self.align(&s.words, Some(&s.tag_ids))
                    .map_err(|e| Error::Input(format!("sentence at line {}: {e}", s.line)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<NerData> {
        NerData::from_bytes(
            body.as_bytes(),
            Path::new("t.conll"),
            &ConllOptions::default(),
        )
    }

    #[test]
    fn iob1_becomes_iob2_and_iob2_is_unchanged() {
        let mut t = vec!["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG", "I-LOC"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        assert_eq!(iob1_to_iob2(&mut t), 4);
        assert_eq!(
            t,
            ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG", "B-LOC"]
        );
        assert_eq!(iob1_to_iob2(&mut t), 0);
    }

    #[test]
    fn reads_sentences_documents_and_converts() {
        let d = read(
            "-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\n\n\n\
             Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n-DOCSTART- -X- O\nx y O\n",
        )
        .unwrap();
        assert_eq!(d.documents, 2);
        assert_eq!(d.len(), 3);
        assert_eq!(d.sentences[0].tags, ["B-ORG", "O"]);
        assert_eq!(d.sentences[0].line, 3);
        assert_eq!(d.sentences[1].line, 7);
        assert_eq!(d.retagged, 1);
        assert_eq!(d.labels.names(), ["O", "B-ORG", "I-ORG", "B-PER", "I-PER"]);
        assert_eq!(d.sentences[1].tag_ids, [3, 4]);
    }

    #[test]
    fn malformed_lines() {
        let err = read("a O\nlonely\n").unwrap_err().to_string();
        assert_eq!(
            err,
            "t.conll: line 2: expected a word and a tag separated by whitespace, got `lonely`"
        );
        let err = read("a O\nb S-PER\n").unwrap_err().to_string();
        assert!(err.starts_with("t.conll: line 2: tag `S-PER`"), "{err}");
        let opts = ConllOptions {
            skip_bad_rows: true,
            ..Default::default()
        };
        let d = NerData::from_bytes(b"a O\nb X\n\nc B-LOC\n", Path::new("t"), &opts).unwrap();
        assert_eq!((d.len(), d.skipped), (1, 1));
        assert_eq!(d.bad_rows[0].line, 2);
        assert!(read("\n\n")
            .unwrap_err()
            .to_string()
            .contains("no sentences"));
    }

    #[test]
    fn fixed_labels_report_unknown_tags_with_their_line() {
        let opts = ConllOptions {
            labels: Some(ner_label_set(["B-PER"])),
            ..Default::default()
        };
        let err = NerData::from_bytes(b"a O\nb B-PER\n\nc O\nd B-LOC\n", Path::new("t"), &opts)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t: line 5: unknown tag `B-LOC`"), "{err}");
    }

    #[test]
    fn word_predictions_use_first_pieces() {
        let a = AlignedSentence {
            input_ids: vec![101, 1, 2, 3, 102],
            token_type_ids: vec![0; 5],
            labels: vec![-100, 1, -100, 0, -100],
            word_ids: vec![None, Some(0), Some(0), Some(1), None],
            words: 3,
            words_truncated: 1,
            words_empty: 0,
        };
        let labels = ner_label_set(["B-PER"]);
        let tags = a.word_tags(&[0, 1, 2, 0, 0, 0, 0], &labels).unwrap();
        assert_eq!(tags, ["B-PER", "O", "O"]);
        assert!(a.word_tags(&[0, 1], &labels).is_err());
        assert!(a.word_tags(&[0, 9, 0, 0, 0], &labels).is_err());
    }
}
