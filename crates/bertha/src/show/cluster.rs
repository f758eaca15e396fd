//! How well labels cluster: the silhouette score of the 2-D map and the
//! k-nearest-neighbour label accuracy in the full embedding space.

use serde::Serialize;

/// Neighbours in the k-NN accuracy.
pub const KNN_K: usize = 10;

/// The two figures printed with a map.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quality {
    /// Mean silhouette of the 2-D points grouped by label (Euclidean), in
    /// [-1, 1]; `None` with fewer than 2 labels or no label shared by 2 points.
    pub silhouette: Option<f64>,
    /// Leave-one-out k-NN label accuracy in the full space (cosine).
    pub knn_accuracy: Option<f64>,
    pub knn_k: usize,
    pub knn_metric: &'static str,
    /// The accuracy of always guessing the most common label.
    pub majority_baseline: Option<f64>,
}

impl Quality {
    /// Both figures for `vectors` (full space), `points` (the map) and each
    /// point's label index.
    pub fn measure(vectors: &[Vec<f32>], points: &[[f64; 2]], labels: &[usize]) -> Self {
        Self {
            silhouette: silhouette(points, labels),
            knn_accuracy: knn_accuracy(vectors, labels, KNN_K),
            knn_k: KNN_K,
            knn_metric: "cosine",
            majority_baseline: majority_baseline(labels),
        }
    }
}

fn distinct(labels: &[usize]) -> usize {
    labels.iter().max().map_or(0, |m| {
        let mut seen = vec![false; m + 1];
        labels.iter().for_each(|&l| seen[l] = true);
        seen.iter().filter(|s| **s).count()
    })
}

/// The mean silhouette coefficient (Rousseeuw 1987, as scikit-learn's
/// `silhouette_score`): for each point, a = mean distance to the other
/// points of its label, b = the smallest mean distance to the points of
/// another label, s = (b − a) / max(a, b), and s = 0 for a point alone in
/// its label. `None` unless there are 2 to n − 1 distinct labels.
pub fn silhouette(points: &[[f64; 2]], labels: &[usize]) -> Option<f64> {
    let n = points.len();
    if n != labels.len() || n < 3 {
        return None;
    }
    let groups = distinct(labels);
    if groups < 2 || groups > n - 1 {
        return None;
    }
    let n_labels = labels.iter().max().map_or(0, |m| m + 1);
    let mut counts = vec![0usize; n_labels];
    labels.iter().for_each(|&l| counts[l] += 1);
    let mut total = 0.0;
    let mut sums = vec![0.0f64; n_labels];
    for i in 0..n {
        sums.iter_mut().for_each(|s| *s = 0.0);
        for j in 0..n {
            if i != j {
                let dx = points[i][0] - points[j][0];
                let dy = points[i][1] - points[j][1];
                sums[labels[j]] += (dx * dx + dy * dy).sqrt();
            }
        }
        let own = labels[i];
        if counts[own] < 2 {
            continue;
        }
        let a = sums[own] / (counts[own] - 1) as f64;
        let b = (0..n_labels)
            .filter(|&l| l != own && counts[l] > 0)
            .map(|l| sums[l] / counts[l] as f64)
            .fold(f64::INFINITY, f64::min);
        let m = a.max(b);
        if m > 0.0 {
            total += (b - a) / m;
        }
    }
    Some(total / n as f64)
}

/// Leave-one-out k-NN label accuracy with cosine similarity: each vector's
/// label is predicted by a vote of its `k` most similar other vectors
/// (ties between labels go to the label whose voter is most similar), and
/// the fraction predicted right is returned. `None` with fewer than 2
/// vectors or fewer than 2 distinct labels.
pub fn knn_accuracy(vectors: &[Vec<f32>], labels: &[usize], k: usize) -> Option<f64> {
    use rayon::prelude::*;
    let n = vectors.len();
    if n != labels.len() || n < 2 || k == 0 || distinct(labels) < 2 {
        return None;
    }
    let unit: Vec<Vec<f64>> = vectors
        .iter()
        .map(|v| {
            let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            v.iter()
                .map(|x| {
                    if norm > 0.0 {
                        f64::from(*x) / norm
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    let n_labels = labels.iter().max().map_or(0, |m| m + 1);
    let correct: usize = (0..n)
        .into_par_iter()
        .filter(|&i| {
            let mut sims: Vec<(usize, f64)> = (0..n)
                .filter(|&j| j != i)
                .map(|j| (j, unit[i].iter().zip(&unit[j]).map(|(a, b)| a * b).sum()))
                .collect();
            sims.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            sims.truncate(k);
            let mut votes = vec![0usize; n_labels];
            sims.iter().for_each(|(j, _)| votes[labels[*j]] += 1);
            let best = votes.iter().copied().max().unwrap_or(0);
            // The nearest voter whose label has the most votes.
            let predicted = sims
                .iter()
                .map(|(j, _)| labels[*j])
                .find(|&l| votes[l] == best);
            predicted == Some(labels[i])
        })
        .count();
    Some(correct as f64 / n as f64)
}

/// The share of the most common label.
pub fn majority_baseline(labels: &[usize]) -> Option<f64> {
    if labels.is_empty() || distinct(labels) < 2 {
        return None;
    }
    let n_labels = labels.iter().max().map_or(0, |m| m + 1);
    let mut counts = vec![0usize; n_labels];
    labels.iter().for_each(|&l| counts[l] += 1);
    counts.iter().max().map(|&m| m as f64 / labels.len() as f64)
}
