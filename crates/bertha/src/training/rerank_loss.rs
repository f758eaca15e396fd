//! The ranking losses of cross-encoder training, with sentence-
//! transformers 6's definitions (`sentence_transformers.cross_encoder.
//! losses`), on the scores of one micro-batch.
//!
//! A batch is a list of groups: one query with the documents scored
//! against it (`[positive, negatives…]` for `mnrl`; a labelled list for
//! `lambda` / `listnet`; one or more labelled pairs for `bce`). Each loss
//! is a sum over terms divided by their count (pairs for `bce` and
//! `lambda`'s document pairs, queries for `mnrl` and `listnet`), so a
//! batch split over processes gives each process a part of the sum and
//! of the count. The gradient with respect to every logit is computed
//! here, in f64, and the encoder's backward pass starts from it.

use crate::error::{Error, Result};

/// A cross-encoder training loss.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "name", rename_all = "lowercase")]
pub enum RerankLoss {
    /// `BinaryCrossEntropyLoss`: BCE with logits on every labelled pair,
    /// the positive term weighted by `pos_weight`.
    Bce { pos_weight: Option<f64> },
    /// The cross-encoder `MultipleNegativesRankingLoss`: for each query,
    /// cross-entropy of `scale · sigmoid(logit)` picking its positive among
    /// its hard negatives and every other document of the batch.
    Mnrl { scale: f64 },
    /// `LambdaLoss` with the NDCGLoss2++ weights (μ 10, σ 1, k none,
    /// binary log).
    Lambda,
    /// `ListNetLoss`: cross-entropy between the softmax of the labels and
    /// of the logits of each list.
    ListNet,
}

impl std::str::FromStr for RerankLoss {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bce" => Ok(Self::Bce { pos_weight: None }),
            "mnrl" => Ok(Self::Mnrl { scale: 10.0 }),
            "lambda" => Ok(Self::Lambda),
            "listnet" => Ok(Self::ListNet),
            other => Err(Error::option(
                "loss",
                format!("`{other}` is not a reranking loss (bce, mnrl, lambda, listnet)"),
            )),
        }
    }
}

impl RerankLoss {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Bce { .. } => "bce",
            Self::Mnrl { .. } => "mnrl",
            Self::Lambda => "lambda",
            Self::ListNet => "listnet",
        }
    }

    /// Whether a group's documents are scored against the other groups'
    /// documents too (in-batch negatives).
    pub fn in_batch_negatives(&self) -> bool {
        matches!(self, Self::Mnrl { .. })
    }
}

/// One group's logits and labels (`mnrl`: the positive first, labels
/// unused).
pub struct GroupScores<'a> {
    pub logits: &'a [f32],
    pub labels: &'a [f32],
}

/// A batch part's loss terms: their sum, their count, and the gradient of
/// the sum with respect to each logit, group by group.
#[derive(Debug, Clone, PartialEq)]
pub struct LossSum {
    pub sum: f64,
    pub count: usize,
    pub grads: Vec<Vec<f64>>,
}

impl LossSum {
    /// The mean (0 without terms).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

impl RerankLoss {
    /// The loss terms of `groups`.
    pub fn sum(&self, groups: &[GroupScores]) -> Result<LossSum> {
        let mut out = LossSum {
            sum: 0.0,
            count: 0,
            grads: Vec::with_capacity(groups.len()),
        };
        for (g, group) in groups.iter().enumerate() {
            let n = group.logits.len();
            if n == 0 {
                return Err(Error::Input(format!("group {g}: no documents")));
            }
            if !matches!(self, Self::Mnrl { .. }) && group.labels.len() != n {
                return Err(Error::Input(format!(
                    "group {g}: {n} documents but {} labels",
                    group.labels.len()
                )));
            }
            let x: Vec<f64> = group.logits.iter().map(|&v| f64::from(v)).collect();
            let y: Vec<f64> = group.labels.iter().map(|&v| f64::from(v)).collect();
            let (sum, count, grad) = match *self {
                Self::Bce { pos_weight } => bce(&x, &y, pos_weight.unwrap_or(1.0)),
                Self::Mnrl { scale } => mnrl(&x, scale),
                Self::Lambda => lambda(&x, &y),
                Self::ListNet => listnet(&x, &y),
            };
            out.sum += sum;
            out.count += count;
            out.grads.push(grad);
        }
        Ok(out)
    }
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// log σ(x), stable for large |x|.
fn log_sigmoid(x: f64) -> f64 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

/// BCEWithLogits with `pos_weight` p: −[p·y·log σ(x) + (1−y)·log(1−σ(x))]
/// per pair.
fn bce(x: &[f64], y: &[f64], p: f64) -> (f64, usize, Vec<f64>) {
    let mut sum = 0.0;
    let grad = x
        .iter()
        .zip(y)
        .map(|(&x, &y)| {
            sum -= p * y * log_sigmoid(x) + (1.0 - y) * log_sigmoid(-x);
            let s = sigmoid(x);
            s * (p * y + 1.0 - y) - p * y
        })
        .collect();
    (sum, x.len(), grad)
}

/// −log softmax(scale·σ(x))₀: the positive (first) against the rest.
fn mnrl(x: &[f64], scale: f64) -> (f64, usize, Vec<f64>) {
    let z: Vec<f64> = x.iter().map(|&v| scale * sigmoid(v)).collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = z.iter().map(|&v| (v - max).exp()).sum();
    let loss = max + total.ln() - z[0];
    let grad = x
        .iter()
        .zip(&z)
        .enumerate()
        .map(|(j, (&v, &zj))| {
            let p = (zj - max).exp() / total - if j == 0 { 1.0 } else { 0.0 };
            let s = sigmoid(v);
            p * scale * s * (1.0 - s)
        })
        .collect();
    (loss, 1, grad)
}

/// ListNet: −Σⱼ softmax(y)ⱼ · log softmax(x)ⱼ.
fn listnet(x: &[f64], y: &[f64]) -> (f64, usize, Vec<f64>) {
    let p = softmax(y);
    let q = softmax(x);
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + x.iter().map(|&v| (v - max).exp()).sum::<f64>().ln();
    let loss = -p.iter().zip(x).map(|(&p, &x)| p * (x - lse)).sum::<f64>();
    // Σp = 1, so the gradient is softmax(x) − p.
    let grad = q.iter().zip(&p).map(|(q, p)| q - p).collect();
    (loss, 1, grad)
}

fn softmax(v: &[f64]) -> Vec<f64> {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = v.iter().map(|&x| (x - max).exp()).collect();
    let total: f64 = e.iter().sum();
    e.into_iter().map(|x| x / total).collect()
}

/// LambdaLoss with NDCGLoss2++ weights, as sentence-transformers computes
/// it for one list (k ≥ the list's length, σ 1, log base 2): the documents
/// sorted by logit; every ordered pair (i, j) of sorted positions whose
/// labels differ (yᵢ > yⱼ) adds −wᵢⱼ·log₂ σ(sᵢ − sⱼ). The terms are
/// counted over the batch.
fn lambda(x: &[f64], y: &[f64]) -> (f64, usize, Vec<f64>) {
    const MU: f64 = 10.0;
    const EPS: f64 = 1e-10;
    let n = x.len();
    let mut order: Vec<usize> = (0..n).collect();
    // torch.sort(descending): ties keep no particular order; scores are
    // almost never tied.
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let s: Vec<f64> = order.iter().map(|&i| x[i]).collect();
    let t: Vec<f64> = order.iter().map(|&i| y[i]).collect();
    let mut ideal = y.to_vec();
    ideal.sort_by(|a, b| b.total_cmp(a));
    // discount[i] = log2(2 + i), positions counted from 0.
    let discount: Vec<f64> = (0..n).map(|i| (2.0 + i as f64).log2()).collect();
    let max_dcg = ideal
        .iter()
        .zip(&discount)
        .map(|(&r, d)| (2f64.powf(r.max(0.0)) - 1.0) / d)
        .sum::<f64>()
        .max(EPS);
    let gain: Vec<f64> = t
        .iter()
        .map(|&r| (2f64.powf(r.max(0.0)) - 1.0) / max_dcg)
        .collect();
    let mut sum = 0.0;
    let mut count = 0;
    let mut grad_sorted = vec![0.0; n];
    for i in 0..n {
        for j in 0..n {
            if t[i] - t[j] <= 0.0 {
                continue;
            }
            let dg = (gain[i] - gain[j]).abs();
            // NDCGLoss2: the discount step at the positions' distance.
            let d = i.abs_diff(j);
            let delta = (1.0 / (1.0 + d as f64).log2() - 1.0 / discount[d]).abs();
            let lambda_rank = (1.0 / discount[i] - 1.0 / discount[j]).abs();
            let w = MU * delta * dg + lambda_rank * dg;
            let diff = (s[i] - s[j]).clamp(-1e8, 1e8);
            sum -= w * log_sigmoid(diff) / std::f64::consts::LN_2;
            count += 1;
            let g = -w * (1.0 - sigmoid(diff)) / std::f64::consts::LN_2;
            grad_sorted[i] += g;
            grad_sorted[j] -= g;
        }
    }
    let mut grad = vec![0.0; n];
    for (k, &i) in order.iter().enumerate() {
        grad[i] = grad_sorted[k];
    }
    (sum, count, grad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each loss's gradient against central differences of its sum.
    #[test]
    fn gradients_match_finite_differences() {
        let x = [0.3f32, -1.2, 2.0, 0.7];
        let y = [2.0f32, 0.0, 1.0, 1.0];
        for loss in [
            RerankLoss::Bce {
                pos_weight: Some(5.0),
            },
            RerankLoss::Mnrl { scale: 10.0 },
            RerankLoss::Lambda,
            RerankLoss::ListNet,
        ] {
            let y: Vec<f32> = match loss {
                RerankLoss::Bce { .. } => vec![1.0, 0.0, 1.0, 0.0],
                _ => y.to_vec(),
            };
            let at = |x: &[f32]| {
                let g = GroupScores {
                    logits: x,
                    labels: &y,
                };
                loss.sum(&[g]).unwrap()
            };
            let base = at(&x);
            assert!(base.sum.is_finite() && base.count > 0, "{loss:?}");
            for k in 0..x.len() {
                let h = 1e-3f32;
                let (mut up, mut down) = (x, x);
                up[k] += h;
                down[k] -= h;
                let numeric = (at(&up).sum - at(&down).sum) / (2.0 * f64::from(h));
                let analytic = base.grads[0][k];
                assert!(
                    (numeric - analytic).abs() < 1e-4 * (1.0 + analytic.abs()),
                    "{loss:?} logit {k}: {numeric} vs {analytic}"
                );
            }
        }
    }

    #[test]
    fn definitions_on_small_cases() {
        // BCE of logit 0 is ln 2 whatever the label (pos_weight 1).
        let l = RerankLoss::Bce { pos_weight: None }
            .sum(&[GroupScores {
                logits: &[0.0, 0.0],
                labels: &[1.0, 0.0],
            }])
            .unwrap();
        assert!((l.mean() - std::f64::consts::LN_2).abs() < 1e-12);
        // ListNet of equal labels and equal logits: ln n.
        let l = RerankLoss::ListNet
            .sum(&[GroupScores {
                logits: &[1.0, 1.0, 1.0],
                labels: &[0.0, 0.0, 0.0],
            }])
            .unwrap();
        assert!((l.mean() - 3f64.ln()).abs() < 1e-12);
        // Lambda without differing labels has no terms.
        let l = RerankLoss::Lambda
            .sum(&[GroupScores {
                logits: &[1.0, 2.0],
                labels: &[1.0, 1.0],
            }])
            .unwrap();
        assert_eq!((l.count, l.mean()), (0, 0.0));
        // Mismatched labels are an error naming the group.
        let e = RerankLoss::ListNet
            .sum(&[GroupScores {
                logits: &[1.0],
                labels: &[],
            }])
            .unwrap_err();
        assert!(e.to_string().contains("group 0"), "{e}");
        assert!("ranknet".parse::<RerankLoss>().is_err());
    }
}
