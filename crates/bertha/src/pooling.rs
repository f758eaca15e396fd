//! Sentence vectors from token states. Which pooling a model was trained
//! with is read from its sentence-transformers folder
//! ([`crate::io::st_folder`]).

use std::str::FromStr;

use candle_core::{DType, Result as CResult, Tensor, D};

use crate::error::{Error, Result};

/// How token states become one vector per text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The `[CLS]` (first) token's state.
    Cls,
    /// Mean over real tokens (padding excluded).
    Mean,
    /// Element-wise max over real tokens.
    Max,
    /// Sum over real tokens divided by √(token count).
    MeanSqrtLen,
    /// The BERT pooler's output (dense + tanh on `[CLS]`).
    Pooler,
    /// No pooling: one vector per token.
    None,
    /// SPLADE: the MLM head's logits at every real token, through
    /// log(1 + relu(·)) and pooled over the tokens (max by default) to
    /// one sparse vocabulary-sized vector ([`crate::splade`]). Needs a
    /// checkpoint with its MLM head.
    Splade,
}

impl FromStr for Pooling {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "cls" => Self::Cls,
            "mean" => Self::Mean,
            "max" => Self::Max,
            "mean_sqrt_len" | "mean_sqrt_len_tokens" => Self::MeanSqrtLen,
            "pooler" => Self::Pooler,
            "none" => Self::None,
            "splade" => Self::Splade,
            other => {
                return Err(Error::option(
                    "pooling",
                    format!(
                    "`{other}` is unknown (expected cls, mean, max, mean_sqrt_len, pooler, none or splade)"
                ),
                ))
            }
        })
    }
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Mean => "mean",
            Self::Max => "max",
            Self::MeanSqrtLen => "mean_sqrt_len",
            Self::Pooler => "pooler",
            Self::None => "none",
            Self::Splade => "splade",
        }
    }
}

/// Pools `hidden` [B, T, D] under `mask` [B, T] (1 = real token) to [B, D].
/// `pooler_output` is needed for [`Pooling::Pooler`] only.
pub fn pool(
    hidden: &Tensor,
    mask: &Tensor,
    pooling: Pooling,
    pooler_output: Option<&Tensor>,
) -> CResult<Tensor> {
    let mask = mask.to_dtype(hidden.dtype())?.unsqueeze(2)?; // [B, T, 1]
    match pooling {
        Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1),
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let sum = hidden.broadcast_mul(&mask)?.sum(1)?;
            let count = mask.sum(1)?.clamp(1e-9, f64::MAX)?; // [B, 1]
            let denom = if pooling == Pooling::Mean {
                count
            } else {
                count.sqrt()?
            };
            sum.broadcast_div(&denom)
        }
        Pooling::Max => {
            // Padding gets -1e9 so it never wins, as sentence-transformers does.
            let fill = ((mask.ones_like()? - &mask)? * -1e9)?;
            hidden.broadcast_mul(&mask)?.broadcast_add(&fill)?.max(1)
        }
        Pooling::Pooler => match pooler_output {
            Some(p) => Ok(p.clone()),
            None => candle_core::bail!("this model has no pooler: choose another pooling"),
        },
        Pooling::None => {
            candle_core::bail!("pooling `none` keeps token vectors; there is nothing to pool")
        }
        Pooling::Splade => {
            candle_core::bail!(
                "pooling `splade` pools the MLM head's logits, not token states: use an \
                 Embedder loaded with it (or crate::splade::SpladeHead)"
            )
        }
    }
}

/// L2-normalises rows: x / max(‖x‖, 1e-12), as torch's `F.normalize`.
pub fn normalize(x: &Tensor) -> CResult<Tensor> {
    let norm = x
        .to_dtype(DType::F32)?
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12, f64::MAX)?;
    x.broadcast_div(&norm)
}

/// Pools one text's token states (`rows`, [tokens, d], no padding) to one
/// vector; the slice form of [`pool`] for the packed fast path.
/// [`Pooling::Pooler`], [`Pooling::None`] and [`Pooling::Splade`] are not
/// poolings of token states and are handled by the caller (they get the
/// first row here).
pub fn pool_rows(rows: &[f32], d: usize, pooling: Pooling) -> Vec<f32> {
    let n = rows.len() / d.max(1);
    match pooling {
        Pooling::Cls | Pooling::Pooler | Pooling::None | Pooling::Splade => {
            rows[..d.min(rows.len())].to_vec()
        }
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let mut sum = vec![0f32; d];
            for r in rows.chunks(d) {
                sum.iter_mut().zip(r).for_each(|(s, v)| *s += v);
            }
            let count = (n as f32).max(1e-9);
            let denom = if pooling == Pooling::Mean {
                count
            } else {
                count.sqrt()
            };
            sum.iter_mut().for_each(|s| *s /= denom);
            sum
        }
        Pooling::Max => {
            let mut max = vec![f32::NEG_INFINITY; d];
            for r in rows.chunks(d) {
                max.iter_mut().zip(r).for_each(|(m, v)| *m = m.max(*v));
            }
            max
        }
    }
}

/// L2-normalises a vector in place: x / max(‖x‖, 1e-12).
pub fn normalize_in_place(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt()
        .max(1e-12) as f32;
    v.iter_mut().for_each(|x| *x /= norm);
}
