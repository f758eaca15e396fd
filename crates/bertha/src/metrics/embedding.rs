//! Scores of sentence embeddings, as sentence-transformers' evaluators
//! report them: semantic textual similarity (`EmbeddingSimilarityEvaluator`:
//! correlation of cosine similarity with gold scores) and retrieval
//! (`InformationRetrievalEvaluator`: each anchor's positive ranked among a
//! corpus by cosine similarity).

use std::collections::{BTreeMap, HashMap};

use rayon::prelude::*;

use super::{check_lengths, pearson, spearman};
use crate::error::{Error, Result};

/// The score that picks the best checkpoint on scored pairs (higher is better).
pub const STS_MAIN_METRIC: &str = "spearman";

/// The score that picks the best checkpoint on (anchor, positive) pairs
/// (higher is better), sentence-transformers' primary retrieval metric.
pub const RETRIEVAL_MAIN_METRIC: &str = "ndcg@10";

/// The cut-offs of [`retrieval_scores`]' recall.
pub const RECALL_AT: [usize; 3] = [1, 5, 10];

/// The cut-off of MRR and NDCG.
const RANK_CUTOFF: usize = 10;

/// `spearman` and `pearson`: the correlations of `similarity` (the cosine
/// similarity of each pair's embeddings) with the `gold` scores, ×100
/// (Spearman with average ranks for ties, as `scipy.stats.spearmanr`).
/// NaN when either side is constant.
pub fn sts_scores(similarity: &[f64], gold: &[f64]) -> Result<BTreeMap<String, f64>> {
    check_lengths("STS scores", similarity.len(), gold.len())?;
    Ok(BTreeMap::from([
        ("spearman".to_string(), 100.0 * spearman(similarity, gold)?),
        ("pearson".to_string(), 100.0 * pearson(similarity, gold)?),
    ]))
}

/// Retrieval scores of anchors against the corpus of the distinct
/// `positive_texts`, in 0..1: `recall@1`, `recall@5`, `recall@10`,
/// `mrr@10` and `ndcg@10`.
///
/// Embeddings must be L2-normalised (cosine = dot product). Row i is a
/// query, anchor i, whose one relevant document is positive i's text; a
/// text given as several positives is one document (the corpus keeps its
/// first occurrence), so rows sharing a positive all look for that
/// document. With one relevant document per query, sentence-transformers'
/// recall@k and accuracy@k are both "found in the top k", MRR@10 is
/// 1 / rank and NDCG@10 is 1 / log2(rank + 1) when rank ≤ 10, else 0.
/// Documents scoring exactly as the relevant one rank before it when they
/// come earlier in the corpus (file order), after it otherwise.
pub fn retrieval_scores(
    anchors: &[Vec<f32>],
    positives: &[Vec<f32>],
    positive_texts: &[&str],
) -> Result<BTreeMap<String, f64>> {
    check_lengths("retrieval scores", anchors.len(), positives.len())?;
    if positive_texts.len() != positives.len() {
        return Err(Error::Input(format!(
            "retrieval scores: {} positive texts for {} positive embeddings",
            positive_texts.len(),
            positives.len()
        )));
    }
    let dim = anchors[0].len();
    if let Some((i, v)) = anchors
        .iter()
        .chain(positives)
        .enumerate()
        .find(|(_, v)| v.len() != dim || v.is_empty())
    {
        return Err(Error::Input(format!(
            "retrieval scores: embedding {i} has {} dimensions, the first anchor {dim}",
            v.len()
        )));
    }
    // The corpus: rows whose positive text comes first; `doc_of[i]`: the
    // document row i's anchor looks for.
    let mut first_row: HashMap<&str, usize> = HashMap::new();
    let mut corpus: Vec<&[f32]> = Vec::new();
    let doc_of: Vec<usize> = positive_texts
        .iter()
        .zip(positives)
        .map(|(text, v)| {
            *first_row.entry(text).or_insert_with(|| {
                corpus.push(v);
                corpus.len() - 1
            })
        })
        .collect();
    let rank_of = |i: usize| -> usize {
        let relevant = doc_of[i];
        let target = dot(&anchors[i], corpus[relevant]);
        let above = corpus
            .iter()
            .enumerate()
            .filter(|&(d, doc)| {
                let s = dot(&anchors[i], doc);
                s > target || (s == target && d < relevant)
            })
            .count();
        above + 1
    };
    let ranks: Vec<usize> = (0..anchors.len()).into_par_iter().map(rank_of).collect();
    let n = ranks.len() as f64;
    let mean = |f: &dyn Fn(usize) -> f64| ranks.iter().map(|&r| f(r)).sum::<f64>() / n;
    let mut out = BTreeMap::new();
    for k in RECALL_AT {
        out.insert(
            format!("recall@{k}"),
            mean(&|r| f64::from(u8::from(r <= k))),
        );
    }
    let within = |r: usize, score: f64| if r <= RANK_CUTOFF { score } else { 0.0 };
    out.insert(
        format!("mrr@{RANK_CUTOFF}"),
        mean(&|r| within(r, 1.0 / r as f64)),
    );
    out.insert(
        format!("ndcg@{RANK_CUTOFF}"),
        mean(&|r| within(r, 1.0 / (r as f64 + 1.0).log2())),
    );
    Ok(out)
}

/// The dot product in f32, as torch's matrix multiply scores them.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn sts_scores_with_ties_as_scipy() {
        // scipy.stats.spearmanr([0.1, 0.4, 0.4, 0.9, 0.2], [1, 2, 3, 4, 1]):
        // ranks x = [1, 3.5, 3.5, 5, 2], y = [1.5, 3, 4, 5, 1.5]; deviations
        // from the mean 3: x [-2, .5, .5, 2, -1], y [-1.5, 0, 1, 2, -1.5];
        // Σxy = 3 + 0 + .5 + 4 + 1.5 = 9, Σx² = Σy² = 9.5, so rho = 18 / 19
        // (scipy: 0.9473684210526317).
        // scipy.stats.pearsonr: x mean 0.4, dx [-.3, 0, 0, .5, -.2]; y mean
        // 2.2, dy [-1.2, -.2, .8, 1.8, -1.2]; Σdxdy = .36 + .9 + .24 = 1.5,
        // Σdx² = .38, Σdy² = 6.8: r = 1.5 / sqrt(2.584) (scipy:
        // 0.9331361283626991).
        let s = sts_scores(&[0.1, 0.4, 0.4, 0.9, 0.2], &[1.0, 2.0, 3.0, 4.0, 1.0]).unwrap();
        assert!(close(s["spearman"], 100.0 * 18.0 / 19.0), "{s:?}");
        assert!(close(s["pearson"], 100.0 * 1.5 / 2.584f64.sqrt()), "{s:?}");
        assert_eq!(s.len(), 2);
        // Perfectly reversed order: -100.
        let s = sts_scores(&[3.0, 2.0, 1.0], &[0.0, 0.5, 1.0]).unwrap();
        assert!(close(s["spearman"], -100.0));
        assert!(sts_scores(&[1.0], &[1.0, 2.0]).is_err());
        assert!(sts_scores(&[], &[]).is_err());
        assert!(sts_scores(&[0.5, 0.5], &[0.1, 0.9]).unwrap()["spearman"].is_nan());
    }

    fn unit(deg: f64) -> Vec<f32> {
        let r = deg.to_radians();
        vec![r.cos() as f32, r.sin() as f32]
    }

    #[test]
    fn retrieval_ranks_each_anchor_among_distinct_positives() {
        // Documents on the axes, a (1, 0), b (0, 1), c (-1, 0), d (0, -1);
        // rows 4 and 5 repeat texts b and d: four documents. Anchor 0 at
        // 10° finds a first (rank 1); anchor 1 at 170° wants b (80° off)
        // but c is 10° off: rank 2; anchor 2 at 300° wants c (120° off)
        // after d (30°) and a (60°): rank 3; anchor 3 at 275° finds d
        // (rank 1). Anchors 4 and 5 sit on a: b and d both score exactly
        // 0, a tie broken by corpus order: b ranks 2, d ranks 3.
        let axes = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]].map(|v: [f32; 2]| v.to_vec());
        let positives = [0, 1, 2, 3, 1, 3].map(|i| axes[i].clone()).to_vec();
        let texts = ["a", "b", "c", "d", "b", "d"];
        let mut anchors: Vec<Vec<f32>> = [10.0, 170.0, 300.0, 275.0].map(unit).to_vec();
        anchors.extend([axes[0].clone(), axes[0].clone()]);
        let s = retrieval_scores(&anchors, &positives, &texts).unwrap();
        let ranks = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0f64];
        let mean = |f: &dyn Fn(f64) -> f64| ranks.iter().map(|&r| f(r)).sum::<f64>() / 6.0;
        assert!(close(s["recall@1"], 2.0 / 6.0), "{s:?}");
        assert!(close(s["recall@5"], 1.0));
        assert!(close(s["recall@10"], 1.0));
        assert!(close(s["mrr@10"], mean(&|r| 1.0 / r)));
        assert!(close(s["ndcg@10"], mean(&|r| 1.0 / (r + 1.0).log2())));
        assert_eq!(s.len(), 5);
    }

    #[test]
    fn retrieval_counts_nothing_below_rank_10() {
        // Twelve documents on a half circle; the anchor at 0° looks for
        // the one at 165°, the farthest: rank 12, beyond every cut-off.
        let positives: Vec<Vec<f32>> = (0..12).map(|i| unit(15.0 * i as f64)).collect();
        let texts: Vec<String> = (0..12).map(|i| i.to_string()).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let mut anchors = positives.clone();
        anchors[11] = unit(0.0);
        let s = retrieval_scores(&anchors, &positives, &texts).unwrap();
        // The other eleven find themselves first.
        assert!(close(s["recall@10"], 11.0 / 12.0), "{s:?}");
        assert!(close(s["mrr@10"], 11.0 / 12.0));
        assert!(close(s["ndcg@10"], 11.0 / 12.0));
    }

    #[test]
    fn retrieval_input_errors() {
        let v = vec![vec![1.0f32, 0.0]];
        assert!(retrieval_scores(&v, &v, &["a", "b"]).is_err());
        assert!(retrieval_scores(&v, &[], &[]).is_err());
        assert!(retrieval_scores(&[], &[], &[]).is_err());
        let err = retrieval_scores(&v, &[vec![1.0f32]], &["a"]).unwrap_err();
        assert!(
            err.to_string().contains("embedding 1 has 1 dimensions"),
            "{err}"
        );
    }
}
