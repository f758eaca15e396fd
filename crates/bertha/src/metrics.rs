//! Evaluation metrics, each with the definition of the reference
//! implementation the field reports against: scikit-learn (accuracy,
//! macro-F1), scipy (Pearson, Spearman with average ranks for ties),
//! seqeval's default conlleval-compatible mode (entity precision / recall /
//! F1) and the official SQuAD v1.1 evaluation script (exact match, F1).
//!
//! Inputs of different lengths are errors, not panics; so are empty ones,
//! which have no score. Sentence-embedding scores (STS, retrieval) are in
//! [`embedding`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::{Error, Result};

pub mod embedding;
pub mod ranking;
pub use embedding::{retrieval_scores, sts_scores, RETRIEVAL_MAIN_METRIC, STS_MAIN_METRIC};
pub use ranking::{
    fuse_list_with_order, fuse_with_list_order, ranking_scores, RANKING_MAIN_METRIC, RRF_K,
};

fn check_lengths(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::Input(format!(
            "{what}: {a} predictions for {b} gold labels"
        )));
    }
    if a == 0 {
        return Err(Error::Input(format!("{what}: no examples to score")));
    }
    Ok(())
}

/// Fraction of predictions equal to the gold label.
pub fn accuracy(predictions: &[usize], gold: &[usize]) -> Result<f64> {
    check_lengths("accuracy", predictions.len(), gold.len())?;
    let right = predictions.iter().zip(gold).filter(|(p, g)| p == g).count();
    Ok(right as f64 / gold.len() as f64)
}

/// F1 of one class: 2·TP / (2·TP + FP + FN), 0 when it is never gold nor
/// predicted (scikit-learn's `zero_division=0`).
fn class_f1(predictions: &[usize], gold: &[usize], class: usize) -> f64 {
    let (mut tp, mut fp, mut fn_) = (0usize, 0usize, 0usize);
    for (&p, &g) in predictions.iter().zip(gold) {
        match (p == class, g == class) {
            (true, true) => tp += 1,
            (true, false) => fp += 1,
            (false, true) => fn_ += 1,
            _ => {}
        }
    }
    if tp == 0 {
        0.0
    } else {
        2.0 * tp as f64 / (2 * tp + fp + fn_) as f64
    }
}

/// The mean of the per-class F1 over the classes that occur as gold or
/// prediction (scikit-learn's `f1_score(average="macro")`).
pub fn macro_f1(predictions: &[usize], gold: &[usize]) -> Result<f64> {
    check_lengths("macro F1", predictions.len(), gold.len())?;
    let classes: BTreeSet<usize> = predictions.iter().chain(gold).copied().collect();
    let sum: f64 = classes
        .iter()
        .map(|&c| class_f1(predictions, gold, c))
        .sum();
    Ok(sum / classes.len() as f64)
}

/// F1 of the `positive` class (what GLUE reports for MRPC and QQP).
pub fn binary_f1(predictions: &[usize], gold: &[usize], positive: usize) -> Result<f64> {
    check_lengths("F1", predictions.len(), gold.len())?;
    Ok(class_f1(predictions, gold, positive))
}

/// Pearson's correlation coefficient; NaN when either side is constant
/// (as scipy).
pub fn pearson(x: &[f64], y: &[f64]) -> Result<f64> {
    check_lengths("Pearson correlation", x.len(), y.len())?;
    if x.len() < 2 {
        return Err(Error::Input(
            "Pearson correlation: needs at least 2 examples".into(),
        ));
    }
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        let (dx, dy) = (a - mx, b - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx == 0.0 || syy == 0.0 {
        return Ok(f64::NAN);
    }
    Ok((sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0))
}

/// 1-based ranks, ties sharing their average rank (scipy's `rankdata`).
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut out = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            out[k] = rank;
        }
        i = j + 1;
    }
    out
}

/// Spearman's rank correlation: Pearson of the average ranks.
pub fn spearman(x: &[f64], y: &[f64]) -> Result<f64> {
    check_lengths("Spearman correlation", x.len(), y.len())?;
    pearson(&ranks(x), &ranks(y))
}

/// A labelled span of a tag sequence, `start..end` (end exclusive).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entity {
    pub kind: String,
    pub start: usize,
    pub end: usize,
}

/// seqeval's reading of one tag: its first character (`B`, `I`, `O`, ...)
/// and its type (after the first `-`; `_` when there is none).
fn split_tag(tag: &str) -> (char, &str) {
    let mut chars = tag.chars();
    let Some(prefix) = chars.next() else {
        return ('O', "_");
    };
    let rest = chars.as_str();
    let ty = rest.split_once('-').map_or(rest, |(_, t)| t);
    (prefix, if ty.is_empty() { "_" } else { ty })
}

/// The entities of one sentence as seqeval's default mode finds them
/// (conlleval's chunking): a chunk starts at `B`, at an `I` after `O` (or
/// after an entity of another type) and ends before `O`, `B`, or a type
/// change. So `I-PER` without a `B-PER` still starts a `PER` entity, and
/// `B-PER I-LOC` is two entities.
pub fn entities<S: AsRef<str>>(tags: &[S]) -> Vec<Entity> {
    let mut out = Vec::new();
    let (mut prev_tag, mut prev_type) = ('O', String::new());
    let mut begin = 0;
    // A final `O` closes an entity that runs to the end.
    let padded = tags.iter().map(|t| t.as_ref()).chain(std::iter::once("O"));
    for (i, t) in padded.enumerate() {
        let (tag, ty) = split_tag(t);
        if chunk_ends(prev_tag, tag, &prev_type, ty) {
            out.push(Entity {
                kind: prev_type.clone(),
                start: begin,
                end: i,
            });
        }
        if chunk_starts(prev_tag, tag, &prev_type, ty) {
            begin = i;
        }
        prev_tag = tag;
        prev_type = ty.to_string();
    }
    out
}

/// seqeval's `end_of_chunk`.
fn chunk_ends(prev: char, tag: char, prev_type: &str, ty: &str) -> bool {
    matches!(prev, 'E' | 'S')
        || (matches!(prev, 'B' | 'I') && matches!(tag, 'B' | 'S' | 'O'))
        || (prev != 'O' && prev != '.' && prev_type != ty)
}

/// seqeval's `start_of_chunk`.
fn chunk_starts(prev: char, tag: char, prev_type: &str, ty: &str) -> bool {
    matches!(tag, 'B' | 'S')
        || (matches!(prev, 'E' | 'S' | 'O') && matches!(tag, 'E' | 'I'))
        || (tag != 'O' && tag != '.' && prev_type != ty)
}

/// Precision, recall and F1 of one entity type or of all (micro).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Prf {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Gold entities.
    pub support: usize,
    pub predicted: usize,
    pub correct: usize,
}

impl Prf {
    /// From counts; 0 where a denominator is 0 (seqeval's `zero_division`).
    pub fn from_counts(correct: usize, predicted: usize, support: usize) -> Self {
        let div = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let (precision, recall) = (div(correct, predicted), div(correct, support));
        let f1 = if precision + recall == 0.0 {
            0.0
        } else {
            2.0 * precision * recall / (precision + recall)
        };
        Self {
            precision,
            recall,
            f1,
            support,
            predicted,
            correct,
        }
    }
}

/// seqeval's `classification_report` numbers.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct EntityScores {
    /// Micro average over all entities (seqeval's `f1_score` default).
    pub overall: Prf,
    /// Per type, for every type in the gold or predicted tags.
    pub per_type: BTreeMap<String, Prf>,
    /// Token-level accuracy (seqeval's `accuracy_score`).
    pub token_accuracy: f64,
}

/// Entity-level scores over sentences of tags: an entity is right when its
/// type, start and end all match a gold entity.
pub fn entity_scores<S: AsRef<str>, T: AsRef<str>>(
    gold: &[Vec<S>],
    predicted: &[Vec<T>],
) -> Result<EntityScores> {
    check_lengths("entity scores (sentences)", predicted.len(), gold.len())?;
    let mut gold_set: HashMap<String, BTreeSet<(usize, usize, usize)>> = HashMap::new();
    let mut pred_set: HashMap<String, BTreeSet<(usize, usize, usize)>> = HashMap::new();
    let (mut tokens, mut right) = (0usize, 0usize);
    for (s, (g, p)) in gold.iter().zip(predicted).enumerate() {
        if g.len() != p.len() {
            return Err(Error::Input(format!(
                "entity scores: sentence {s} has {} gold tags but {} predicted",
                g.len(),
                p.len()
            )));
        }
        tokens += g.len();
        right += g
            .iter()
            .zip(p)
            .filter(|(a, b)| a.as_ref() == b.as_ref())
            .count();
        for e in entities(g) {
            gold_set
                .entry(e.kind)
                .or_default()
                .insert((s, e.start, e.end));
        }
        for e in entities(p) {
            pred_set
                .entry(e.kind)
                .or_default()
                .insert((s, e.start, e.end));
        }
    }
    let kinds: BTreeSet<&String> = gold_set.keys().chain(pred_set.keys()).collect();
    let empty = BTreeSet::new();
    let (mut c_all, mut p_all, mut g_all) = (0, 0, 0);
    let mut per_type = BTreeMap::new();
    for k in kinds {
        let g = gold_set.get(k).unwrap_or(&empty);
        let p = pred_set.get(k).unwrap_or(&empty);
        let c = g.intersection(p).count();
        per_type.insert(k.clone(), Prf::from_counts(c, p.len(), g.len()));
        c_all += c;
        p_all += p.len();
        g_all += g.len();
    }
    Ok(EntityScores {
        overall: Prf::from_counts(c_all, p_all, g_all),
        per_type,
        token_accuracy: if tokens == 0 {
            0.0
        } else {
            right as f64 / tokens as f64
        },
    })
}

/// Python's `str.split()` whitespace: Unicode White_Space plus the ASCII
/// separators U+001C..U+001F.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The official SQuAD v1.1 `normalize_answer`: lowercase, drop ASCII
/// punctuation (`string.punctuation`), drop the articles a / an / the as
/// whole words (regex `\b(a|an|the)\b`), collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let lower: String = s
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    // `\b` in Python 3's `re` on str: word characters are Unicode
    // alphanumerics and `_` (gone with the punctuation already).
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut no_articles = String::with_capacity(lower.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in lower.chars() {
        if is_word(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut no_articles);
            no_articles.push(c);
        }
    }
    flush(&mut word, &mut no_articles);
    no_articles
        .split(is_py_space)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn answer_tokens(s: &str) -> Vec<String> {
    normalize_answer(s)
        .split(' ')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// 1.0 when the normalised answers are equal, else 0.0.
pub fn squad_exact_match(prediction: &str, gold: &str) -> f64 {
    if normalize_answer(prediction) == normalize_answer(gold) {
        1.0
    } else {
        0.0
    }
}

/// Token F1 between normalised answers, tokens counted as a multiset.
/// As in the official v2.0 script, when either side has no tokens the
/// score is 1.0 if both have none, else 0.0 (v1.1 gives 0.0 when both are
/// empty, which only a no-answer question can hit).
pub fn squad_f1(prediction: &str, gold: &str) -> f64 {
    let (p, g) = (answer_tokens(prediction), answer_tokens(gold));
    if p.is_empty() || g.is_empty() {
        return if p.is_empty() && g.is_empty() {
            1.0
        } else {
            0.0
        };
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for t in &g {
        *counts.entry(t).or_default() += 1;
    }
    let mut same = 0;
    for t in &p {
        if let Some(c) = counts.get_mut(t.as_str()).filter(|c| **c > 0) {
            *c -= 1;
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / p.len() as f64;
    let recall = same as f64 / g.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct SquadScores {
    /// Percent, as the official script reports.
    pub exact_match: f64,
    pub f1: f64,
    /// Questions scored.
    pub total: usize,
    /// Questions with a prediction.
    pub answered: usize,
}

/// The official script's aggregate: per question the best exact match and
/// F1 over its gold answers (an unanswered question scores 0; a question
/// without gold answers is compared with ""), averaged over all questions
/// and multiplied by 100.
pub fn squad_scores<'a, I, G>(items: I) -> SquadScores
where
    I: IntoIterator<Item = (Option<&'a str>, G)>,
    G: AsRef<[&'a str]>,
{
    let (mut em, mut f1, mut total, mut answered) = (0.0, 0.0, 0, 0);
    for (prediction, golds) in items {
        total += 1;
        let Some(p) = prediction else { continue };
        answered += 1;
        let golds = golds.as_ref();
        let golds: &[&str] = if golds.is_empty() { &[""] } else { golds };
        em += golds
            .iter()
            .map(|g| squad_exact_match(p, g))
            .fold(0.0, f64::max);
        f1 += golds.iter().map(|g| squad_f1(p, g)).fold(0.0, f64::max);
    }
    let pct = |x: f64| {
        if total == 0 {
            0.0
        } else {
            100.0 * x / total as f64
        }
    };
    SquadScores {
        exact_match: pct(em),
        f1: pct(f1),
        total,
        answered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn accuracy_and_macro_f1() {
        let gold = [0, 0, 1, 1, 2];
        let pred = [0, 1, 1, 1, 0];
        assert!(close(accuracy(&pred, &gold).unwrap(), 0.6));
        // class 0: tp 1 fp 1 fn 1 → 2/4; class 1: tp 2 fp 1 fn 0 → 4/5;
        // class 2: tp 0 → 0. Mean (0.5 + 0.8 + 0) / 3.
        assert!(close(macro_f1(&pred, &gold).unwrap(), 1.3 / 3.0));
        assert!(close(binary_f1(&pred, &gold, 1).unwrap(), 0.8));
        assert!(accuracy(&pred, &gold[..4]).is_err());
        assert!(accuracy(&[], &[]).is_err());
    }

    #[test]
    fn correlations() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert!(close(pearson(&x, &[2.0, 4.0, 6.0, 8.0]).unwrap(), 1.0));
        assert!(close(
            spearman(&x, &[1.0, 10.0, 100.0, 1000.0]).unwrap(),
            1.0
        ));
        assert!(pearson(&x, &[1.0; 4]).unwrap().is_nan());
        assert_eq!(ranks(&[10.0, 20.0, 10.0, 5.0]), [2.5, 4.0, 2.5, 1.0]);
    }

    #[test]
    fn seqeval_chunking_rules() {
        let e = |tags: &[&str]| -> Vec<(String, usize, usize)> {
            entities(tags)
                .into_iter()
                .map(|e| (e.kind, e.start, e.end))
                .collect()
        };
        let t = |k: &str, s, n| (k.to_string(), s, n);
        assert_eq!(e(&["B-PER", "I-PER", "O"]), [t("PER", 0, 2)]);
        // I- after O starts an entity; a type change splits.
        assert_eq!(
            e(&["O", "I-PER", "I-LOC"]),
            [t("PER", 1, 2), t("LOC", 2, 3)]
        );
        // B- after B- of the same type: two entities.
        assert_eq!(e(&["B-ORG", "B-ORG"]), [t("ORG", 0, 1), t("ORG", 1, 2)]);
        assert!(e(&[] as &[&str]).is_empty());
    }

    #[test]
    fn squad_normalisation() {
        assert_eq!(normalize_answer("The  Cat!"), "cat");
        assert_eq!(normalize_answer("an apple, a day"), "apple day");
        assert_eq!(normalize_answer("theatre"), "theatre");
        assert_eq!(normalize_answer("Über-the_top"), "überthetop");
        assert_eq!(normalize_answer("l'a"), "la");
    }
}
