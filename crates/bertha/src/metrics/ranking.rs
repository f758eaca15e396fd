//! Reranking scores of ranked candidate lists: MRR@10, NDCG@10 and MAP,
//! each ×100 and averaged over every query given. A query whose list holds
//! no relevant document (label > 0) scores 0 in each, as in a
//! retrieve-then-rerank evaluation where the retriever missed it.
//!
//! NDCG uses linear gains (the label itself) over log₂ discounts, as
//! scikit-learn's `ndcg_score` that sentence-transformers' reranking
//! evaluator calls; MAP is the mean over queries of the average precision
//! of the whole list.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// The cut-off of MRR and NDCG.
pub const RANKING_AT: usize = 10;

/// The metric that picks the best reranker.
pub const RANKING_MAIN_METRIC: &str = "mrr@10";

/// The constant of reciprocal-rank fusion, Cormack, Clarke and Büttcher's
/// (SIGIR 2009) 60: it damps the top ranks' weight so that one ranker's
/// first place does not outvote the other's agreement.
pub const RRF_K: f64 = 60.0;

/// Reciprocal-rank fusion of a candidate list's own order (the retriever's,
/// for mined lists) with a reranker's `scores`: each candidate scores
/// 1 / (k + its list rank) + 1 / (k + its rank by score), ranks from 1,
/// score ties ranked in list order. It needs no score scale, so a
/// retriever's cosines and a cross-encoder's logits fuse without tuning a
/// weight on the evaluated queries.
pub fn fuse_list_with_order(scores: &[f32], k: f64) -> Vec<f32> {
    let mut by_score: Vec<usize> = (0..scores.len()).collect();
    by_score.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut fused: Vec<f64> = (0..scores.len())
        .map(|i| 1.0 / (k + 1.0 + i as f64))
        .collect();
    for (rank, &i) in by_score.iter().enumerate() {
        fused[i] += 1.0 / (k + 1.0 + rank as f64);
    }
    fused.into_iter().map(|f| f as f32).collect()
}

/// [`fuse_list_with_order`] for each query's list.
pub fn fuse_with_list_order(scores: &[Vec<f32>], k: f64) -> Vec<Vec<f32>> {
    scores.iter().map(|s| fuse_list_with_order(s, k)).collect()
}

/// `labels[q]` are query q's candidates' relevance labels and `scores[q]`
/// the scores that rank them (higher first; ties keep the list's order).
pub fn ranking_scores(labels: &[Vec<f32>], scores: &[Vec<f32>]) -> Result<BTreeMap<String, f64>> {
    if labels.len() != scores.len() {
        return Err(Error::Input(format!(
            "ranking scores: {} label lists for {} score lists",
            labels.len(),
            scores.len()
        )));
    }
    if labels.is_empty() {
        return Err(Error::Input("ranking scores: no queries".into()));
    }
    let (mut mrr, mut ndcg, mut map) = (0.0, 0.0, 0.0);
    for (q, (y, s)) in labels.iter().zip(scores).enumerate() {
        if y.len() != s.len() {
            return Err(Error::Input(format!(
                "ranking scores: query {q} has {} labels but {} scores",
                y.len(),
                s.len()
            )));
        }
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        let ranked: Vec<f64> = order.iter().map(|&i| f64::from(y[i])).collect();
        if let Some(first) = ranked.iter().take(RANKING_AT).position(|&l| l > 0.0) {
            mrr += 1.0 / (first + 1) as f64;
        }
        let dcg = |labels: &[f64]| -> f64 {
            labels
                .iter()
                .take(RANKING_AT)
                .enumerate()
                .map(|(i, &l)| l.max(0.0) / (i as f64 + 2.0).log2())
                .sum()
        };
        let mut ideal = ranked.clone();
        ideal.sort_by(|a, b| b.total_cmp(a));
        let best = dcg(&ideal);
        if best > 0.0 {
            ndcg += dcg(&ranked) / best;
        }
        let relevant = ranked.iter().filter(|&&l| l > 0.0).count();
        if relevant > 0 {
            let mut hits = 0;
            let mut precision_sum = 0.0;
            for (i, &l) in ranked.iter().enumerate() {
                if l > 0.0 {
                    hits += 1;
                    precision_sum += hits as f64 / (i + 1) as f64;
                }
            }
            map += precision_sum / relevant as f64;
        }
    }
    let n = labels.len() as f64;
    Ok(BTreeMap::from([
        ("mrr@10".to_string(), 100.0 * mrr / n),
        ("ndcg@10".to_string(), 100.0 * ndcg / n),
        ("map".to_string(), 100.0 * map / n),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_of_known_rankings() {
        // Relevant at rank 2 of 3: MRR 1/2, NDCG 1/log2(3), AP 1/2.
        let s = ranking_scores(&[vec![0.0, 1.0, 0.0]], &[vec![0.9, 0.5, 0.1]]).unwrap();
        assert!((s["mrr@10"] - 50.0).abs() < 1e-9);
        assert!((s["ndcg@10"] - 100.0 / 3f64.log2()).abs() < 1e-9);
        assert!((s["map"] - 50.0).abs() < 1e-9);
        // A query without a relevant candidate scores 0; a perfect one 100.
        let s = ranking_scores(
            &[vec![0.0, 0.0], vec![1.0, 0.0]],
            &[vec![0.2, 0.1], vec![0.3, 0.1]],
        )
        .unwrap();
        assert!((s["mrr@10"] - 50.0).abs() < 1e-9);
        assert!((s["map"] - 50.0).abs() < 1e-9);
        // Graded labels: the ideal order gives NDCG 100.
        let s = ranking_scores(&[vec![1.0, 2.0, 0.0]], &[vec![0.5, 0.9, 0.1]]).unwrap();
        assert!((s["ndcg@10"] - 100.0).abs() < 1e-9);
        assert!(ranking_scores(&[vec![1.0]], &[vec![]]).is_err());
    }

    #[test]
    fn fusion_of_list_order_and_scores() {
        // List order a, b, c; scores rank c, a, b. Fused (k = 60):
        // a 1/61 + 1/62, b 1/62 + 1/63, c 1/63 + 1/61: a > c > b.
        let f = fuse_with_list_order(&[vec![0.5, 0.1, 0.9]], RRF_K);
        let want = [
            1.0 / 61.0 + 1.0 / 62.0,
            1.0 / 62.0 + 1.0 / 63.0,
            1.0 / 63.0 + 1.0 / 61.0,
        ];
        for (got, want) in f[0].iter().zip(want) {
            assert!((f64::from(*got) - want).abs() < 1e-7, "{got} vs {want}");
        }
        // Agreeing rankings keep their order; ties in score rank in list order.
        let f = fuse_with_list_order(&[vec![3.0, 2.0, 1.0], vec![1.0, 1.0]], RRF_K);
        assert!(f[0][0] > f[0][1] && f[0][1] > f[0][2]);
        assert!(f[1][0] > f[1][1]);
        let s = ranking_scores(
            &[vec![0.0, 0.0, 1.0]],
            &fuse_with_list_order(&[vec![0.5, 0.1, 0.9]], RRF_K),
        )
        .unwrap();
        assert!((s["mrr@10"] - 50.0).abs() < 1e-9);
    }
}
