//! Hard-negative mining for reranker (and embedding) training, as
//! sentence-transformers' `mine_hard_negatives`: a bi-encoder ranks a
//! corpus for every query; the candidates most similar to the query that
//! are not its positives become its negatives.
//!
//! The rules are sentence-transformers': queries and corpus texts are
//! deduplicated (the corpus is the given one plus every positive, or the
//! positives alone); a query's positives are never its negatives (unless
//! kept with `include_positives`), nor (bertha's addition, for pair sets
//! read both ways) is a query's own text where it is in the corpus;
//! candidates above `max_score` (or below `min_score`) are dropped; of the `range_max` best that remain, the first
//! `range_min` are skipped and `num_negatives` are taken, the best ones
//! (`top`) or drawn at random (`random`, seeded). The similarity is the
//! cosine of normalised vectors.
//!
//! Memory stays linear in the corpus: the scores are computed for a few
//! queries at a time and only each query's best `range_max + positives`
//! candidates are kept.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use rand::seq::IndexedRandom;

use super::embed::{Embedder, EncodeOptions};
use crate::error::{Error, Result};
use crate::rng::rng_for;

/// How negatives are picked from the remaining candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sampling {
    Top,
    Random,
}

impl std::str::FromStr for Sampling {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "top" => Ok(Self::Top),
            "random" => Ok(Self::Random),
            other => Err(Error::option(
                "sampling",
                format!("`{other}` is not top or random"),
            )),
        }
    }
}

/// The options of [`mine_hard_negatives`], named as sentence-transformers
/// names them.
#[derive(Debug, Clone)]
pub struct MiningOptions {
    pub num_negatives: usize,
    pub range_min: usize,
    /// `None`: `range_min + num_negatives + positives`, ×10 negatives when
    /// a score limit is set (sentence-transformers' default).
    pub range_max: Option<usize>,
    pub max_score: Option<f32>,
    pub min_score: Option<f32>,
    pub sampling: Sampling,
    /// Keep the positives among the candidates, in their place: each
    /// query's `range_max` best documents as retrieved (the candidate
    /// lists of a retrieve-then-rerank evaluation).
    pub include_positives: bool,
    pub seed: u64,
    /// Texts per encoder pass.
    pub batch_size: usize,
}

impl Default for MiningOptions {
    fn default() -> Self {
        Self {
            num_negatives: 3,
            range_min: 0,
            range_max: None,
            max_score: None,
            min_score: None,
            sampling: Sampling::Top,
            include_positives: false,
            seed: 0,
            batch_size: 32,
        }
    }
}

/// One query's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Mined {
    pub query: String,
    /// The query's positives, in file order.
    pub positives: Vec<String>,
    /// Its negatives (with their scores), best first; fewer than asked
    /// when too few candidates remain. With `include_positives`: the
    /// retrieved candidates in order, positives among them.
    pub negatives: Vec<(String, f32)>,
}

/// Mines negatives for the (query, positive) `pairs` from `corpus`
/// (`None`: the positives), ranked by `embedder`. Queries come back once
/// each, in their first appearance's order.
pub fn mine_hard_negatives(
    embedder: &Embedder,
    pairs: &[(String, String)],
    corpus: Option<&[String]>,
    opts: &MiningOptions,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<Mined>> {
    if pairs.is_empty() {
        return Err(Error::Input("mining: no (query, positive) pairs".into()));
    }
    if opts.num_negatives == 0 {
        return Err(Error::option("num_negatives", "must be at least 1"));
    }
    // Deduplicated corpus (given texts, then the positives) and queries.
    let mut corpus_at: HashMap<&str, usize> = HashMap::new();
    let mut docs: Vec<&str> = Vec::new();
    let given = corpus.map(|c| c.iter().map(String::as_str).collect::<Vec<_>>());
    for d in given
        .into_iter()
        .flatten()
        .chain(pairs.iter().map(|(_, p)| p.as_str()))
    {
        corpus_at.entry(d).or_insert_with(|| {
            docs.push(d);
            docs.len() - 1
        });
    }
    let mut query_at: HashMap<&str, usize> = HashMap::new();
    let mut queries: Vec<&str> = Vec::new();
    let mut positives: Vec<Vec<usize>> = Vec::new();
    for (q, p) in pairs {
        let i = *query_at.entry(q).or_insert_with(|| {
            queries.push(q);
            positives.push(Vec::new());
            queries.len() - 1
        });
        let d = corpus_at[p.as_str()];
        if !positives[i].contains(&d) {
            positives[i].push(d);
        }
    }
    let max_positives = positives.iter().map(Vec::len).max().unwrap_or(1);
    let range_max = opts.range_max.unwrap_or_else(|| {
        let per = if opts.max_score.is_some() || opts.min_score.is_some() {
            10
        } else {
            1
        };
        opts.range_min + opts.num_negatives * per + max_positives
    });
    if opts.range_min >= range_max {
        return Err(Error::option(
            "range_min",
            format!(
                "{} must be smaller than range_max {range_max}",
                opts.range_min
            ),
        ));
    }
    if opts.num_negatives > range_max - opts.range_min {
        return Err(Error::option(
            "num_negatives",
            format!(
                "cannot mine {} per query: only {} candidates remain after skipping the first {} of {range_max}",
                opts.num_negatives,
                range_max - opts.range_min,
                opts.range_min
            ),
        ));
    }

    let batch = opts.batch_size.max(1);
    let (nd, nq) = (docs.len(), queries.len());
    let doc_vecs = embedder.embed_with(&docs, &EncodeOptions::default(), batch, &mut |n| {
        progress("corpus", n, nd)
    })?;
    let query_vecs = embedder.embed_with(&queries, &EncodeOptions::default(), batch, &mut |n| {
        progress("queries", n, nq)
    })?;
    let corpus_t = unit_rows(&doc_vecs)?.t()?.contiguous()?;
    // A query whose own text is in the corpus (a pair set read both ways:
    // every question is some row's positive) would retrieve itself first;
    // it is no negative of itself. Candidate lists (`include_positives`)
    // stay as retrieved.
    let own: Vec<Option<usize>> = queries.iter().map(|q| corpus_at.get(q).copied()).collect();
    let k = (range_max + max_positives + 1).min(nd);
    // A few queries at a time: at most ~64 MiB of scores.
    let chunk = (16 << 20) / nd.max(1);
    let mut out = Vec::with_capacity(nq);
    for (c, qs) in query_vecs.chunks(chunk.max(1)).enumerate() {
        let scores = unit_rows(qs)?.matmul(&corpus_t)?.to_vec2::<f32>()?;
        for (r, row) in scores.iter().enumerate() {
            let q = c * chunk.max(1) + r;
            out.push(pick(
                row,
                k,
                range_max,
                &positives[q],
                own[q],
                opts,
                q as u64,
            ));
        }
        progress("ranking", (out.len()).min(nq), nq);
    }
    Ok(out
        .into_iter()
        .enumerate()
        .map(|(q, picked)| Mined {
            query: queries[q].to_string(),
            positives: positives[q].iter().map(|&d| docs[d].to_string()).collect(),
            negatives: picked
                .into_iter()
                .map(|(d, s)| (docs[d].to_string(), s))
                .collect(),
        })
        .collect())
}

/// `rows` L2-normalised as one `[n, d]` tensor.
fn unit_rows(rows: &[Vec<f32>]) -> Result<Tensor> {
    let d = rows.first().map_or(0, Vec::len);
    let mut flat = Vec::with_capacity(rows.len() * d);
    for r in rows {
        let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        flat.extend(r.iter().map(|x| x / norm));
    }
    Ok(Tensor::from_vec(flat, (rows.len(), d), &Device::Cpu)?)
}

/// One query's negatives from its scores against the corpus: the `k` best
/// candidates, positives, the query's `own` text and out-of-range scores
/// dropped, then the rule.
fn pick(
    row: &[f32],
    k: usize,
    range_max: usize,
    positives: &[usize],
    own: Option<usize>,
    opts: &MiningOptions,
    query: u64,
) -> Vec<(usize, f32)> {
    let mut best: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
    let by_score = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k < best.len() {
        best.select_nth_unstable_by(k, by_score);
        best.truncate(k);
    }
    best.sort_by(by_score);
    let kept = |&(d, s): &(usize, f32)| {
        (opts.include_positives || !(positives.contains(&d) || own == Some(d)))
            && opts.max_score.is_none_or(|m| s <= m)
            && opts.min_score.is_none_or(|m| s >= m)
    };
    let candidates: Vec<(usize, f32)> = best
        .into_iter()
        .filter(kept)
        .take(range_max)
        .skip(opts.range_min)
        .collect();
    match opts.sampling {
        Sampling::Top => candidates.into_iter().take(opts.num_negatives).collect(),
        Sampling::Random => {
            let mut drawn: Vec<(usize, f32)> = candidates
                .choose_multiple(
                    &mut rng_for(opts.seed, MINING_STREAM, query),
                    opts.num_negatives,
                )
                .copied()
                .collect();
            drawn.sort_by(by_score);
            drawn
        }
    }
}

/// The purpose of random sampling's draws.
const MINING_STREAM: u64 = 41;

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(n: usize) -> MiningOptions {
        MiningOptions {
            num_negatives: n,
            range_max: Some(10),
            ..MiningOptions::default()
        }
    }

    #[test]
    fn picks_follow_the_rules() {
        let row = [0.9, 0.8, 0.7, 0.6, 0.5, 0.95];
        // Document 5 is the positive: never a negative.
        let got = pick(&row, 6, 10, &[5], None, &opts(2), 0);
        assert_eq!(got, vec![(0, 0.9), (1, 0.8)]);
        // Document 0 is the query's own text: no negative of itself.
        let got = pick(&row, 6, 10, &[5], Some(0), &opts(2), 0);
        assert_eq!(got, vec![(1, 0.8), (2, 0.7)]);
        // range_min skips the best; max_score drops scores above it.
        let o = MiningOptions {
            range_min: 1,
            max_score: Some(0.85),
            ..opts(2)
        };
        assert_eq!(
            pick(&row, 6, 10, &[5], None, &o, 0),
            vec![(2, 0.7), (3, 0.6)]
        );
        // Kept positives stay in their place.
        let o = MiningOptions {
            include_positives: true,
            ..opts(3)
        };
        let ids: Vec<usize> = pick(&row, 6, 10, &[5], None, &o, 0)
            .iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(ids, [5, 0, 1]);
        // Random: seeded, best first, from the allowed candidates.
        let o = MiningOptions {
            sampling: Sampling::Random,
            ..opts(2)
        };
        let a = pick(&row, 6, 10, &[5], None, &o, 3);
        assert_eq!(a, pick(&row, 6, 10, &[5], None, &o, 3));
        assert!(a.len() == 2 && a[0].1 >= a[1].1 && a.iter().all(|p| p.0 != 5));
    }
}
