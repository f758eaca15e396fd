//! Vectors to 2-D points: t-SNE (the `bhtsne` crate's Barnes-Hut t-SNE)
//! or PCA (`linfa-reduction`).
//!
//! Both are deterministic. `bhtsne` draws its initial embedding and its
//! vantage-point tree from an unseeded thread-local RNG, so we hand it
//! both: the initial embedding is drawn from N(0, 1e-4²) (bhtsne's own
//! initialisation) with a [`rand::rngs::StdRng`] seeded by
//! [`TsneOptions::seed`], and the nearest neighbours come from an exact,
//! brute-force search (ties broken by index) instead of the tree. The fit
//! runs on a one-thread rayon pool so that its sums always add up in the
//! same order: the same inputs and seed give bit-identical points.
//!
//! PCA comes from linfa's truncated SVD (LOBPCG with a fixed seed); each
//! axis's sign is fixed so that its largest-magnitude loading is positive
//! (scikit-learn's `svd_flip` convention).

use std::str::FromStr;

use linfa::traits::{Fit, Predict};
use linfa::DatasetBase;
use ndarray::Array2;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::error::{Error, Result};

/// How vectors become 2-D points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Tsne,
    Pca,
}

impl FromStr for Method {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tsne" | "t-sne" => Ok(Self::Tsne),
            "pca" => Ok(Self::Pca),
            other => Err(Error::Input(format!(
                "unknown method `{other}` (expected tsne or pca)"
            ))),
        }
    }
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tsne => "tsne",
            Self::Pca => "pca",
        }
    }

    /// How the method is written in titles.
    pub fn display_name(self) -> &'static str {
        match self {
            Self::Tsne => "t-SNE",
            Self::Pca => "PCA",
        }
    }
}

/// t-SNE settings; the defaults are scikit-learn's (perplexity 30, 1000
/// iterations, θ = 0.5, early exaggeration 12 for 250 iterations).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TsneOptions {
    pub perplexity: f64,
    pub seed: u64,
    pub iterations: usize,
    /// Barnes-Hut accuracy (0 < θ; smaller is more exact and slower).
    pub theta: f64,
}

impl Default for TsneOptions {
    fn default() -> Self {
        Self {
            perplexity: 30.0,
            seed: 0,
            iterations: 1000,
            theta: 0.5,
        }
    }
}

impl TsneOptions {
    /// Neighbours per point in the affinity graph: ⌊3 × perplexity⌋.
    pub fn neighbours(&self) -> usize {
        (3.0 * self.perplexity).floor() as usize
    }

    /// Checks the options against `n` points before any work is done.
    pub fn check(&self, n: usize) -> Result<()> {
        if !(self.perplexity.is_finite() && self.perplexity >= 1.0) {
            return Err(Error::Input(format!(
                "t-SNE perplexity must be a number of at least 1 (got {})",
                self.perplexity
            )));
        }
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return Err(Error::Input(format!(
                "t-SNE theta must be above 0 (got {})",
                self.theta
            )));
        }
        if self.iterations == 0 {
            return Err(Error::Input("t-SNE needs at least 1 iteration".into()));
        }
        if n < 2 || self.neighbours() > n - 1 {
            let max = (n.saturating_sub(1) as f64 / 3.0).floor();
            return Err(Error::Input(format!(
                "t-SNE perplexity {} is too large for {n} points: it needs at least 3 × perplexity \
                 + 1 = {} points (use a perplexity of at most {max}, or more texts)",
                self.perplexity,
                self.neighbours() + 1,
            )));
        }
        Ok(())
    }
}

/// 2-D points with what their axes mean.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduced {
    pub points: Vec<[f64; 2]>,
    /// Axis titles: `t-SNE 1`, or `PC1 (23.4% of variance)`.
    pub axes: [String; 2],
    /// PCA only: the fraction of the total variance on each axis.
    pub explained_variance_ratio: Option<[f64; 2]>,
}

fn check_vectors(vectors: &[Vec<f32>], min: usize, method: &str) -> Result<usize> {
    if vectors.len() < min {
        return Err(Error::Input(format!(
            "{method} needs at least {min} vectors (got {})",
            vectors.len()
        )));
    }
    let d = vectors[0].len();
    for (i, v) in vectors.iter().enumerate() {
        if v.len() != d {
            return Err(Error::Input(format!(
                "vector {} has {} dimensions, vector 1 has {d}",
                i + 1,
                v.len()
            )));
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err(Error::Input(format!(
                "vector {} has a value that is not a finite number",
                i + 1
            )));
        }
    }
    Ok(d)
}

/// Reduces with `method`; `tsne` is used by [`Method::Tsne`] only.
pub fn reduce(vectors: &[Vec<f32>], method: Method, tsne: &TsneOptions) -> Result<Reduced> {
    match method {
        Method::Tsne => Ok(Reduced {
            points: tsne_2d(vectors, tsne)?,
            axes: ["t-SNE 1".into(), "t-SNE 2".into()],
            explained_variance_ratio: None,
        }),
        Method::Pca => {
            let (points, ratio) = pca_2d(vectors)?;
            Ok(Reduced {
                points,
                axes: [
                    format!("PC1 ({:.1}% of variance)", 100.0 * ratio[0]),
                    format!("PC2 ({:.1}% of variance)", 100.0 * ratio[1]),
                ],
                explained_variance_ratio: Some(ratio),
            })
        }
    }
}

/// The projection on the first two principal components, and the fraction
/// of the total variance each carries.
pub fn pca_2d(vectors: &[Vec<f32>]) -> Result<(Vec<[f64; 2]>, [f64; 2])> {
    let d = check_vectors(vectors, 3, "PCA")?;
    if d < 2 {
        return Err(Error::Input(format!(
            "PCA to 2-D needs vectors of at least 2 dimensions (got {d})"
        )));
    }
    let n = vectors.len();
    let x = Array2::from_shape_fn((n, d), |(i, j)| f64::from(vectors[i][j]));
    let mean = x
        .mean_axis(ndarray::Axis(0))
        .unwrap_or_else(|| ndarray::Array1::zeros(d));
    let total: f64 = (&x - &mean).iter().map(|v| v * v).sum();
    if total <= 0.0 {
        return Err(Error::Input(
            "PCA: every vector is the same, there is no variance to show".into(),
        ));
    }
    let dataset = DatasetBase::from(x.clone());
    let pca = linfa_reduction::Pca::params(2)
        .fit(&dataset)
        .map_err(|e| Error::Input(format!("PCA failed: {e}")))?;
    let mut projected = pca.predict(&x);
    let components = pca.components(); // [2, d]
    for (axis, comp) in components.outer_iter().enumerate() {
        let biggest = comp
            .iter()
            .copied()
            .fold(0.0f64, |m, v| if v.abs() > m.abs() { v } else { m });
        if biggest < 0.0 {
            projected.column_mut(axis).mapv_inplace(|v| -v);
        }
    }
    let points: Vec<[f64; 2]> = projected.outer_iter().map(|row| [row[0], row[1]]).collect();
    let variance = |axis: usize| points.iter().map(|p| p[axis] * p[axis]).sum::<f64>() / total;
    let ratio = [variance(0), variance(1)];
    Ok((points, ratio))
}

/// Exact nearest neighbours by Euclidean distance: for each point its `k`
/// nearest others, nearest first (ties by index).
pub fn nearest_neighbours(vectors: &[Vec<f32>], k: usize) -> Vec<Vec<(usize, f64)>> {
    use rayon::prelude::*;
    let sq: Vec<f64> = vectors
        .iter()
        .map(|v| v.iter().map(|x| f64::from(*x).powi(2)).sum())
        .collect();
    (0..vectors.len())
        .into_par_iter()
        .map(|i| {
            let mut row: Vec<(usize, f64)> = (0..vectors.len())
                .filter(|&j| j != i)
                .map(|j| {
                    let dot: f64 = vectors[i]
                        .iter()
                        .zip(&vectors[j])
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    (j, (sq[i] + sq[j] - 2.0 * dot).max(0.0).sqrt())
                })
                .collect();
            row.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            row.truncate(k);
            row
        })
        .collect()
}

/// Barnes-Hut t-SNE to 2-D, seeded (see the module docs).
pub fn tsne_2d(vectors: &[Vec<f32>], opts: &TsneOptions) -> Result<Vec<[f64; 2]>> {
    check_vectors(vectors, 2, "t-SNE")?;
    let n = vectors.len();
    opts.check(n)?;
    let k = opts.neighbours();
    let neighbours: Vec<Vec<bhtsne::Neighbor<f64>>> = nearest_neighbours(vectors, k)
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|(index, distance)| bhtsne::Neighbor { index, distance })
                .collect()
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let normal =
        Normal::new(0.0, 1e-4).map_err(|e| Error::Input(format!("t-SNE initialisation: {e}")))?;
    let init: Vec<f64> = (0..2 * n).map(|_| normal.sample(&mut rng)).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| Error::Input(format!("t-SNE: cannot start a worker thread: {e}")))?;
    let ids: Vec<usize> = (0..n).collect();
    let y: Vec<f64> = pool.install(|| {
        let mut tsne: bhtsne::tSNE<f64, usize> = bhtsne::tSNE::new(&ids);
        tsne.perplexity(opts.perplexity)
            .epochs(opts.iterations)
            .initial_embedding(init)
            .barnes_hut_with_neighbors(opts.theta, &neighbours);
        tsne.embedding()
    });
    let points: Vec<[f64; 2]> = y.chunks(2).map(|p| [p[0], p[1]]).collect();
    if points.len() != n || points.iter().flatten().any(|v| !v.is_finite()) {
        return Err(Error::Input(
            "t-SNE diverged (non-finite coordinates); try another perplexity or seed".into(),
        ));
    }
    Ok(points)
}
