//! SQuAD: the JSON reader, the windowed features of transformers'
//! `run_qa.py` (`prepare_train_features` / `prepare_validation_features`)
//! and its post-processing (`postprocess_qa_predictions`).
//!
//! A feature is `[CLS] question [SEP] context-window [SEP]` (the
//! tokenizer's own pair template; token types 0 / 1). Only the context is
//! cut: into windows of at most `max_length` tokens that share `doc_stride`
//! tokens, exactly as the tokenizer's `only_second` truncation with
//! overflow does. Offsets are character offsets into the context, as
//! SQuAD's `answer_start` is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use serde_json::Value;
use tokenizers::{Encoding, TruncationDirection};

use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::metrics::{squad_scores, SquadScores};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadAnswer {
    pub text: String,
    /// Character (not byte) offset of the answer in the context.
    pub start: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadExample {
    pub id: String,
    pub title: String,
    pub question: String,
    /// Shared by the questions of a paragraph.
    pub context: Arc<str>,
    /// Gold answers (several annotators in dev sets); empty when the
    /// question has no answer (SQuAD v2 `is_impossible`).
    pub answers: Vec<SquadAnswer>,
    pub is_impossible: bool,
}

#[derive(Debug, Clone)]
pub struct SquadData {
    pub path: PathBuf,
    pub version: String,
    pub examples: Vec<SquadExample>,
    pub articles: usize,
    pub paragraphs: usize,
}

fn field<'a>(obj: &'a Value, key: &str, at: &str) -> std::result::Result<&'a Value, String> {
    obj.get(key)
        .ok_or_else(|| format!("{at}: no field `{key}`"))
}

fn str_field(obj: &Value, key: &str, at: &str) -> std::result::Result<String, String> {
    field(obj, key, at)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{at}: field `{key}` is not a string"))
}

fn array_field<'a>(
    obj: &'a Value,
    key: &str,
    at: &str,
) -> std::result::Result<&'a [Value], String> {
    field(obj, key, at)?
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{at}: field `{key}` is not a list"))
}

impl SquadData {
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses a SQuAD v1.1 / v2.0 file's contents; `path` names them in
    /// errors, which give the JSON path (and question id) at fault.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let origin = path.display().to_string();
        let root: Value = serde_json::from_slice(bytes).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let err = |msg: String| Error::Input(format!("{origin}: {msg}"));
        let version = match root.get("version") {
            Some(Value::String(v)) => v.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        };
        let data = array_field(&root, "data", "the top level").map_err(err)?;
        let mut examples = Vec::new();
        let mut paragraphs = 0;
        for (a, article) in data.iter().enumerate() {
            let at = format!("data[{a}]");
            let title = match article.get("title") {
                Some(Value::String(t)) => t.clone(),
                _ => String::new(),
            };
            for (p, para) in array_field(article, "paragraphs", &at)
                .map_err(err)?
                .iter()
                .enumerate()
            {
                paragraphs += 1;
                let at = format!("data[{a}].paragraphs[{p}]");
                let context: Arc<str> = str_field(para, "context", &at).map_err(err)?.into();
                let context_chars: Vec<char> = context.chars().collect();
                for (q, qa) in array_field(para, "qas", &at)
                    .map_err(err)?
                    .iter()
                    .enumerate()
                {
                    let at = format!("data[{a}].paragraphs[{p}].qas[{q}]");
                    let id = match field(qa, "id", &at).map_err(err)? {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        _ => return Err(err(format!("{at}: field `id` is not a string"))),
                    };
                    let at = format!("{at} (id {id})");
                    let question = str_field(qa, "question", &at).map_err(err)?;
                    let is_impossible = match qa.get("is_impossible") {
                        None | Some(Value::Null) => false,
                        Some(Value::Bool(b)) => *b,
                        Some(_) => {
                            return Err(err(format!(
                                "{at}: field `is_impossible` is not a boolean"
                            )))
                        }
                    };
                    let mut answers = Vec::new();
                    let listed = match qa.get("answers") {
                        None if is_impossible => &[][..],
                        _ => array_field(qa, "answers", &at).map_err(err)?,
                    };
                    for (n, ans) in listed.iter().enumerate() {
                        let at = format!("{at}.answers[{n}]");
                        let text = str_field(ans, "text", &at).map_err(err)?;
                        let start = field(ans, "answer_start", &at)
                            .map_err(err)?
                            .as_u64()
                            .ok_or_else(|| {
                                err(format!(
                                    "{at}: field `answer_start` is not a non-negative integer"
                                ))
                            })? as usize;
                        let len = text.chars().count();
                        if len == 0 {
                            return Err(err(format!("{at}: the answer text is empty")));
                        }
                        let found: Option<String> = context_chars
                            .get(start..start + len)
                            .map(|s| s.iter().collect());
                        if found.as_deref() != Some(text.as_str()) {
                            return Err(err(format!(
                                "{at}: the context at character {start} is {}, not the answer \
                                 text `{text}`",
                                match found {
                                    Some(f) => format!("`{f}`"),
                                    None => format!(
                                        "too short (it has {} characters)",
                                        context_chars.len()
                                    ),
                                }
                            )));
                        }
                        answers.push(SquadAnswer { text, start });
                    }
                    if is_impossible {
                        answers.clear();
                    }
                    examples.push(SquadExample {
                        id,
                        title: title.clone(),
                        question,
                        context: context.clone(),
                        answers,
                        is_impossible,
                    });
                }
            }
        }
        if examples.is_empty() {
            return Err(err("no questions in the file".into()));
        }
        Ok(Self {
            path: path.to_path_buf(),
            version,
            examples,
            articles: data.len(),
            paragraphs,
        })
    }

    pub fn len(&self) -> usize {
        self.examples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Exact match and F1 as the official evaluation script computes them:
    /// every question counts, a question without a prediction scores 0.
    pub fn evaluate(&self, predictions: &[SquadPrediction]) -> SquadScores {
        let by_id: std::collections::HashMap<&str, &str> = predictions
            .iter()
            .map(|p| (p.id.as_str(), p.text.as_str()))
            .collect();
        let golds: Vec<Vec<&str>> = self
            .examples
            .iter()
            .map(|e| e.answers.iter().map(|a| a.text.as_str()).collect())
            .collect();
        squad_scores(
            self.examples
                .iter()
                .zip(&golds)
                .map(|(e, g)| (by_id.get(e.id.as_str()).copied(), g.as_slice())),
        )
    }
}

/// Window sizes (transformers' `run_qa.py` defaults: 384 / 128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureOptions {
    /// Tokens per feature, question and special tokens included.
    pub max_length: usize,
    /// Context tokens shared by consecutive windows.
    pub doc_stride: usize,
}

impl Default for FeatureOptions {
    fn default() -> Self {
        Self {
            max_length: 384,
            doc_stride: 128,
        }
    }
}

/// One window of one example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadFeature {
    /// Index of the example in the list given to the featurizer.
    pub example_index: usize,
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    /// Character offsets into the context of context tokens; `None` for
    /// question and special tokens (what `prepare_validation_features` keeps).
    pub offsets: Vec<Option<(usize, usize)>>,
    /// Training targets: the first and last token of the (first) gold
    /// answer; 0, 0 (`[CLS]`) when the answer is not wholly inside this
    /// window or the question has none.
    pub start_position: usize,
    pub end_position: usize,
}

impl SquadFeature {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Token positions of the context window.
    pub fn context_tokens(&self) -> impl Iterator<Item = usize> + '_ {
        self.offsets
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.map(|_| i))
    }
}

/// Builds features with a tokenizer's pair template.
pub struct SquadFeaturizer {
    /// The tokenizer without truncation (windows are cut here).
    inner: tokenizers::Tokenizer,
    opts: FeatureOptions,
    /// Special tokens the template adds to a pair.
    added: usize,
}

impl SquadFeaturizer {
    pub fn new(tokenizer: &Tokenizer, opts: FeatureOptions) -> Result<Self> {
        let mut inner = tokenizer.inner().clone();
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let added = inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, true));
        if opts.max_length <= added + opts.doc_stride {
            return Err(Error::Input(format!(
                "max length {} must exceed doc stride {} plus the {added} special tokens",
                opts.max_length, opts.doc_stride
            )));
        }
        Ok(Self { inner, opts, added })
    }

    pub fn options(&self) -> FeatureOptions {
        self.opts
    }

    fn encode(&self, text: &str) -> Result<Encoding> {
        self.inner
            .encode_char_offsets(text, false)
            .map_err(|e| Error::Tokenizer(format!("encoding text: {e}")))
    }

    /// The features of one example (`example_index` is stored in them).
    pub fn features(&self, example_index: usize, ex: &SquadExample) -> Result<Vec<SquadFeature>> {
        // run_qa.py strips the question's leading whitespace: some SQuAD
        // questions have a lot of it, and it only wastes window room.
        let q = self.encode(ex.question.trim_start())?;
        let c = self.encode(&ex.context)?;
        let FeatureOptions {
            max_length,
            doc_stride,
        } = self.opts;
        let room = max_length.saturating_sub(self.added + q.len());
        if room <= doc_stride {
            return Err(Error::Input(format!(
                "question {}: its {} tokens leave {room} context tokens per window of {max_length}, \
                 not more than the doc stride {doc_stride}; raise the max length or lower the stride",
                ex.id,
                q.len()
            )));
        }
        let c_empty = c.is_empty();
        let mut first = c;
        first.truncate(room, doc_stride, TruncationDirection::Right);
        let rest = first.take_overflowing();
        let answer = ex
            .answers
            .first()
            .map(|a| (a.start, a.start + a.text.chars().count()));
        std::iter::once(first)
            .chain(rest)
            .map(|window| {
                let enc = self
                    .inner
                    .post_process(q.clone(), Some(window), true)
                    .map_err(|e| Error::Tokenizer(format!("question {}: {e}", ex.id)))?;
                let offsets: Vec<Option<(usize, usize)>> = enc
                    .get_sequence_ids()
                    .iter()
                    .zip(enc.get_offsets())
                    .zip(enc.get_special_tokens_mask())
                    .map(|((s, o), special)| (*s == Some(1) && *special == 0).then_some(*o))
                    .collect();
                if offsets.iter().all(Option::is_none) && !c_empty {
                    return Err(Error::Tokenizer(
                        "the tokenizer's post-processor does not mark which tokens are the \
                         context (no sequence ids); SQuAD features need a pair template"
                            .into(),
                    ));
                }
                let (start_position, end_position) = answer
                    .map(|(s, e)| answer_positions(&offsets, s, e))
                    .unwrap_or((0, 0));
                Ok(SquadFeature {
                    example_index,
                    input_ids: enc.get_ids().to_vec(),
                    token_type_ids: enc.get_type_ids().to_vec(),
                    offsets,
                    start_position,
                    end_position,
                })
            })
            .collect()
    }

    /// The features of every example, in example order (built in parallel).
    pub fn features_all(&self, examples: &[SquadExample]) -> Result<Vec<SquadFeature>> {
        let per: Vec<Vec<SquadFeature>> = examples
            .par_iter()
            .enumerate()
            .map(|(i, e)| self.features(i, e))
            .collect::<Result<_>>()?;
        Ok(per.into_iter().flatten().collect())
    }
}

/// The tokens holding characters `start..end` of the context: the last
/// context token starting at or before `start`, the first ending at or
/// after `end`; (0, 0) when the window does not hold the whole answer.
/// (run_qa.py's scan, kept inside the context: its scan runs past the last
/// context token when the answer starts there.)
fn answer_positions(
    offsets: &[Option<(usize, usize)>],
    start: usize,
    end: usize,
) -> (usize, usize) {
    let ctx: Vec<(usize, (usize, usize))> = offsets
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.map(|o| (i, o)))
        .collect();
    let (Some(&(_, first)), Some(&(_, last))) = (ctx.first(), ctx.last()) else {
        return (0, 0);
    };
    if !(first.0 <= start && last.1 >= end) {
        return (0, 0);
    }
    let s = ctx
        .iter()
        .rev()
        .find(|(_, o)| o.0 <= start)
        .map_or(0, |(i, _)| *i);
    let e = ctx.iter().find(|(_, o)| o.1 >= end).map_or(s, |(i, _)| *i);
    (s, e.max(s))
}

/// How answers are chosen (transformers' `postprocess_qa_predictions`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PostprocessOptions {
    /// Start and end candidates per window: the `n_best` highest logits.
    pub n_best: usize,
    /// The longest answer, in tokens.
    pub max_answer_length: usize,
    /// SQuAD v2: answer "" when the best `[CLS]` score (start + end logit at
    /// position 0) beats the best span by more than `null_threshold`.
    pub allow_no_answer: bool,
    pub null_threshold: f32,
}

impl Default for PostprocessOptions {
    fn default() -> Self {
        Self {
            n_best: 20,
            max_answer_length: 30,
            allow_no_answer: false,
            null_threshold: 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SquadPrediction {
    pub id: String,
    /// The answer, cut from the original context; "" when no span was
    /// valid (or, with `allow_no_answer`, for no answer).
    pub text: String,
    /// Character offsets of `text` in the context.
    pub start: usize,
    pub end: usize,
    /// Start logit + end logit of the span.
    pub score: f32,
}

/// The characters `start..end` of `text` (offsets count chars, not bytes).
fn char_slice(text: &str, start: usize, end: usize) -> String {
    text.chars()
        .skip(start)
        .take(end.saturating_sub(start))
        .collect()
}

/// Indices of the `k` largest values, largest first.
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    idx.truncate(k);
    idx
}

/// The best answer of each example over all its windows: among the
/// `n_best` start and end tokens of each window, pairs inside the context
/// with start ≤ end and at most `max_answer_length` tokens, scored by
/// start logit + end logit. One prediction per example, in example order.
/// `start_logits[f]` / `end_logits[f]` belong to `features[f]` and may be
/// longer than it (padding).
pub fn postprocess<L: AsRef<[f32]>>(
    examples: &[SquadExample],
    features: &[SquadFeature],
    start_logits: &[L],
    end_logits: &[L],
    opts: &PostprocessOptions,
) -> Result<Vec<SquadPrediction>> {
    if start_logits.len() != features.len() || end_logits.len() != features.len() {
        return Err(Error::Input(format!(
            "{} start and {} end logit rows for {} features",
            start_logits.len(),
            end_logits.len(),
            features.len()
        )));
    }
    // (score, char start, char end) of the best span, and the best null score.
    let mut best: Vec<Option<(f32, usize, usize)>> = vec![None; examples.len()];
    let mut null: Vec<Option<f32>> = vec![None; examples.len()];
    for (f, feat) in features.iter().enumerate() {
        let (starts, ends) = (start_logits[f].as_ref(), end_logits[f].as_ref());
        if starts.len() < feat.len() || ends.len() < feat.len() {
            return Err(Error::Input(format!(
                "feature {f} has {} tokens but {} start and {} end logits",
                feat.len(),
                starts.len(),
                ends.len()
            )));
        }
        let ex = feat.example_index;
        if ex >= examples.len() {
            return Err(Error::Input(format!(
                "feature {f} belongs to example {ex}, but there are {} examples",
                examples.len()
            )));
        }
        if let (Some(s0), Some(e0)) = (starts.first(), ends.first()) {
            let n = s0 + e0;
            // run_qa.py keeps the smallest null score over the windows.
            null[ex] = Some(null[ex].map_or(n, |m: f32| m.min(n)));
        }
        for &s in &top_k(starts, opts.n_best) {
            for &e in &top_k(ends, opts.n_best) {
                let (Some(Some(so)), Some(Some(eo))) = (feat.offsets.get(s), feat.offsets.get(e))
                else {
                    continue;
                };
                if e < s || e - s + 1 > opts.max_answer_length {
                    continue;
                }
                let score = starts[s] + ends[e];
                if best[ex].is_none_or(|(b, _, _)| score > b) {
                    best[ex] = Some((score, so.0, eo.1));
                }
            }
        }
    }
    Ok(examples
        .iter()
        .enumerate()
        .map(|(i, ex)| {
            let span = best[i].filter(|(score, _, _)| {
                !(opts.allow_no_answer && null[i].is_some_and(|n| n - score > opts.null_threshold))
            });
            match span {
                Some((score, start, end)) => SquadPrediction {
                    id: ex.id.clone(),
                    text: char_slice(&ex.context, start, end),
                    start,
                    end,
                    score,
                },
                None => SquadPrediction {
                    id: ex.id.clone(),
                    text: String::new(),
                    start: 0,
                    end: 0,
                    score: null[i].unwrap_or(0.0),
                },
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "Ünïcode café in Paris.", "qas": [
            {"id": "q1", "question": "  Where?", "answers": [{"text": "Paris", "answer_start": 16}]},
            {"id": "q2", "question": "What?", "is_impossible": true, "answers": [],
             "plausible_answers": [{"text": "café", "answer_start": 8}]}]}]}]}"#;

    #[test]
    fn reads_char_offsets_and_impossible_questions() {
        let d = SquadData::from_bytes(FILE.as_bytes(), Path::new("s.json")).unwrap();
        assert_eq!(
            (d.version.as_str(), d.articles, d.paragraphs, d.len()),
            ("1.1", 1, 1, 2)
        );
        assert_eq!(
            d.examples[0].answers[0],
            SquadAnswer {
                text: "Paris".into(),
                start: 16
            }
        );
        assert!(d.examples[1].is_impossible && d.examples[1].answers.is_empty());
        assert_eq!(d.examples[0].title, "T");
    }

    #[test]
    fn bad_answers_name_the_question() {
        let bad = FILE.replace("\"answer_start\": 16", "\"answer_start\": 15");
        let err = SquadData::from_bytes(bad.as_bytes(), Path::new("s.json"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "s.json: data[0].paragraphs[0].qas[0] (id q1).answers[0]: the context at character 15 \
             is ` Pari`, not the answer text `Paris`"
        );
        let bad = FILE.replace("\"question\": \"What?\",", "");
        let err = SquadData::from_bytes(bad.as_bytes(), Path::new("s.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("qas[1] (id q2): no field `question`"),
            "{err}"
        );
        let err = SquadData::from_bytes(b"{\"data\": [", Path::new("s.json")).unwrap_err();
        assert!(err.to_string().starts_with("s.json: invalid JSON"), "{err}");
    }

    #[test]
    fn answer_positions_follow_character_offsets() {
        // [CLS] q [SEP] "ab" "cd" "ef" [SEP]; context "ab cd ef".
        let o = [
            None,
            None,
            None,
            Some((0, 2)),
            Some((3, 5)),
            Some((6, 8)),
            None,
        ];
        assert_eq!(answer_positions(&o, 3, 5), (4, 4));
        assert_eq!(answer_positions(&o, 4, 8), (4, 5)); // starts inside a token
        assert_eq!(answer_positions(&o, 6, 8), (5, 5)); // last context token
        assert_eq!(answer_positions(&o, 6, 9), (0, 0)); // past the window
        let window = [None, Some((3, 5)), Some((6, 8)), None];
        assert_eq!(answer_positions(&window, 0, 2), (0, 0)); // before the window
    }

    #[test]
    fn postprocess_picks_the_best_valid_span_over_windows() {
        let d = SquadData::from_bytes(FILE.as_bytes(), Path::new("s.json")).unwrap();
        let ex = &d.examples[..1];
        // Context "Ünïcode café in Paris.": tokens Ünïcode(0,7) café(8,12) in(13,15) Paris(16,21) .(21,22)
        let mk = |offsets: Vec<Option<(usize, usize)>>| SquadFeature {
            example_index: 0,
            input_ids: vec![0; offsets.len()],
            token_type_ids: vec![0; offsets.len()],
            offsets,
            start_position: 0,
            end_position: 0,
        };
        let f0 = mk(vec![None, None, Some((0, 7)), Some((8, 12)), None]);
        let f1 = mk(vec![
            None,
            None,
            Some((13, 15)),
            Some((16, 21)),
            Some((21, 22)),
            None,
        ]);
        // Position 1 (the question) has the highest logits but is not
        // context. Window 0: the best start (3) comes after the best end
        // (2), so "Ünïcode" (0 + 3) wins there; window 1 has "Paris" at
        // 2 + 1.5 = 3.5 over "Paris." (2 + 1.4); its best end (6) is [SEP].
        let starts = vec![
            vec![0.0, 9.0, 0.0, 1.0, 0.0],
            vec![0.0, 9.0, 0.0, 2.0, 0.0, 0.0, -1.0],
        ];
        let ends = vec![
            vec![0.0, 9.0, 3.0, 1.0, 0.0],
            vec![0.0, 9.0, 0.0, 1.5, 1.4, 0.0, 5.0],
        ];
        let p = postprocess(
            ex,
            &[f0, f1],
            &starts,
            &ends,
            &PostprocessOptions::default(),
        )
        .unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            (p[0].text.as_str(), p[0].start, p[0].end),
            ("Paris", 16, 21)
        );
        assert_eq!(p[0].score, 3.5);
    }
}
