//! Sentence-embedding losses over the embeddings of a batch's columns, as
//! sentence-transformers defines them: MultipleNegativesRankingLoss (and
//! its symmetric and cached forms), CoSENT, CosineSimilarityLoss, and
//! MatryoshkaLoss wrapping any of them. Built from candle ops that record
//! a backward, so the gradients reach the encoder.

use std::str::FromStr;

use candle_core::{Result as CResult, Tensor, D};

use crate::error::{Error, Result};
use crate::pooling::normalize;

/// Which loss, by the name `--loss` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    /// MultipleNegativesRankingLoss: each anchor against every positive of
    /// the batch (and the given hard negatives), cosine × scale,
    /// cross-entropy towards its own positive.
    Mnrl,
    /// MultipleNegativesSymmetricRankingLoss: the mean of MNRL and the
    /// positives' ranking of the anchors.
    MnrlSymmetric,
    /// CachedMultipleNegativesRankingLoss (GradCache): MNRL's loss and
    /// gradients, the encoder run in mini-batches so memory stays bounded
    /// whatever the batch size.
    CachedMnrl,
    /// CoSENTLoss: pairs ranked by cosine × scale as their gold scores rank.
    Cosent,
    /// CosineSimilarityLoss: mean squared error of cosine against the score.
    CosineMse,
}

impl LossKind {
    pub const ALL: [Self; 5] = [
        Self::Mnrl,
        Self::MnrlSymmetric,
        Self::CachedMnrl,
        Self::Cosent,
        Self::CosineMse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Mnrl => "mnrl",
            Self::MnrlSymmetric => "mnrl-symmetric",
            Self::CachedMnrl => "cached-mnrl",
            Self::Cosent => "cosent",
            Self::CosineMse => "cosine-mse",
        }
    }

    /// Whether the loss learns from gold scores (scored pairs) rather than
    /// from (anchor, positive, negative…) texts.
    pub fn needs_scores(self) -> bool {
        matches!(self, Self::Cosent | Self::CosineMse)
    }
}

impl FromStr for LossKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|k| k.name()).collect();
                Error::option(
                    "loss",
                    format!("`{s}` is unknown (expected {})", names.join(", ")),
                )
            })
    }
}

impl std::fmt::Display for LossKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// sentence-transformers' default similarity scale of MNRL and CoSENT.
pub const DEFAULT_SCALE: f64 = 20.0;

/// A loss with its settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EmbeddingLoss {
    pub kind: LossKind,
    /// Cosine similarities are multiplied by this (MNRL, CoSENT).
    pub scale: f64,
    /// MatryoshkaLoss: the loss summed over these leading dimensions of
    /// every embedding (weights 1), or `None` for the full vectors.
    pub matryoshka: Option<Vec<usize>>,
}

impl EmbeddingLoss {
    pub fn new(kind: LossKind) -> Self {
        Self {
            kind,
            scale: DEFAULT_SCALE,
            matryoshka: None,
        }
    }

    /// Checks the settings against the embedding width and the number of
    /// text columns the data has.
    pub fn validate(&self, dim: usize, columns: usize) -> Result<()> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(Error::option(
                "scale",
                format!("{}: must be above 0", self.scale),
            ));
        }
        if let Some(dims) = &self.matryoshka {
            if dims.is_empty() {
                return Err(Error::option("matryoshka", "needs at least one dimension"));
            }
            if let Some(d) = dims.iter().find(|&&d| d == 0 || d > dim) {
                return Err(Error::option(
                    "matryoshka",
                    format!("dimension {d} is outside 1..={dim} (the model's embedding size)"),
                ));
            }
        }
        let wanted = if self.kind.needs_scores() {
            "2 text columns and a score"
        } else {
            "an anchor and a positive column (and optional negatives)"
        };
        let fits = if self.kind.needs_scores() {
            columns == 2
        } else {
            columns >= 2
        };
        if !fits {
            return Err(Error::option(
                "loss",
                format!(
                    "{} needs {wanted}; the data has {columns} text column(s)",
                    self.kind
                ),
            ));
        }
        Ok(())
    }

    /// The loss of one batch: `reps` holds one [B, D] embedding tensor per
    /// column (anchor, positive, negatives… or sentence1, sentence2);
    /// `scores` [B] the gold scores of scored pairs.
    pub fn compute(&self, reps: &[Tensor], scores: Option<&Tensor>) -> CResult<Tensor> {
        match &self.matryoshka {
            None => self.base(reps, scores),
            Some(dims) => {
                let mut total: Option<Tensor> = None;
                for &d in dims {
                    let cut = reps
                        .iter()
                        .map(|r| r.narrow(D::Minus1, 0, d))
                        .collect::<CResult<Vec<_>>>()?;
                    let l = self.base(&cut, scores)?;
                    total = Some(match total {
                        Some(t) => (t + l)?,
                        None => l,
                    });
                }
                total.ok_or_else(|| candle_core::Error::Msg("no matryoshka dimension".into()))
            }
        }
    }

    fn base(&self, reps: &[Tensor], scores: Option<&Tensor>) -> CResult<Tensor> {
        let need = |n: usize| {
            if reps.len() < n {
                candle_core::bail!(
                    "{} needs {n} embedding columns, got {}",
                    self.kind,
                    reps.len()
                )
            }
            Ok(())
        };
        let gold =
            || scores.ok_or_else(|| candle_core::Error::Msg(format!("{} needs scores", self.kind)));
        match self.kind {
            LossKind::Mnrl | LossKind::CachedMnrl => {
                need(2)?;
                let (sim, _) = ranking_scores(reps, self.scale)?;
                cross_entropy_diagonal(&sim)
            }
            LossKind::MnrlSymmetric => {
                need(2)?;
                let (sim, b) = ranking_scores(reps, self.scale)?;
                let forward = cross_entropy_diagonal(&sim)?;
                let backward = cross_entropy_diagonal(&sim.narrow(1, 0, b)?.t()?)?;
                (forward + backward)? / 2.0
            }
            LossKind::Cosent => {
                need(2)?;
                cosent(&reps[0], &reps[1], gold()?, self.scale)
            }
            LossKind::CosineMse => {
                need(2)?;
                let cos = pairwise_cos(&reps[0], &reps[1])?;
                (cos - gold()?)?.sqr()?.mean_all()
            }
        }
    }
}

/// Anchors [B, D] against every candidate (the other columns stacked,
/// positives first): cosine × scale, [B, kB]; and B.
fn ranking_scores(reps: &[Tensor], scale: f64) -> CResult<(Tensor, usize)> {
    let b = reps[0].dim(0)?;
    let candidates = Tensor::cat(&reps[1..], 0)?;
    let sim = normalize(&reps[0])?.matmul(&normalize(&candidates)?.t()?)?;
    Ok(((sim * scale)?, b))
}

/// Mean cross-entropy of rows [B, N] (N ≥ B) whose target is row i's
/// column i.
fn cross_entropy_diagonal(logits: &Tensor) -> CResult<Tensor> {
    let b = logits.dim(0)?;
    let eye = Tensor::eye(b, logits.dtype(), logits.device())?;
    let target = (logits.narrow(1, 0, b)? * eye)?.sum(1)?;
    (logsumexp(logits, 1)? - target)?.mean_all()
}

/// log Σ exp(x) along `dim` (removed), shifted by the detached maximum.
fn logsumexp(x: &Tensor, dim: usize) -> CResult<Tensor> {
    let max = x.max_keepdim(dim)?.detach();
    let sum = x.broadcast_sub(&max)?.exp()?.sum_keepdim(dim)?;
    (sum.log()? + max)?.squeeze(dim)
}

/// Row-wise cosine of two [B, D] tensors, [B].
fn pairwise_cos(a: &Tensor, b: &Tensor) -> CResult<Tensor> {
    (normalize(a)? * normalize(b)?)?.sum(1)
}

/// CoSENT: log(1 + Σ over pairs (i, j) with gold_i < gold_j of
/// exp(scale·cos_i − scale·cos_j)).
fn cosent(a: &Tensor, b: &Tensor, gold: &Tensor, scale: f64) -> CResult<Tensor> {
    let s = (pairwise_cos(a, b)? * scale)?;
    let n = s.dim(0)?;
    let diff = s.unsqueeze(1)?.broadcast_sub(&s.unsqueeze(0)?)?; // s_i − s_j
    let g = gold.to_vec1::<f32>()?;
    let mut off = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            if g[i] >= g[j] {
                off[i * n + j] = 1e12;
            }
        }
    }
    let off = Tensor::from_vec(off, (n, n), s.device())?;
    let masked = (diff - off)?.flatten_all()?;
    let zero = Tensor::zeros(1, masked.dtype(), masked.device())?;
    logsumexp(&Tensor::cat(&[&zero, &masked], 0)?.unsqueeze(0)?, 1)?.squeeze(0)
}
