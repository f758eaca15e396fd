//! Sentence vectors from token states, and the sentence-transformers
//! folder layout that says which pooling (and normalisation) a model was
//! trained with.

use std::path::Path;
use std::str::FromStr;

use candle_core::{DType, Result as CResult, Tensor, D};
use serde_json::Value;

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
            other => {
                return Err(Error::option(
                    "pooling",
                    format!(
                    "`{other}` is unknown (expected cls, mean, max, mean_sqrt_len, pooler or none)"
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

/// What a sentence-transformers folder (`modules.json`) prescribes.
#[derive(Debug, Clone, PartialEq)]
pub struct SentenceTransformerSpec {
    pub pooling: Pooling,
    pub normalize: bool,
}

impl SentenceTransformerSpec {
    /// Reads `modules.json` and the Pooling module's `config.json`.
    /// `Ok(None)` when the folder is a plain transformers checkpoint.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(None);
        }
        let modules = read_json(&modules_path)?;
        let list = modules
            .as_array()
            .ok_or_else(|| Error::config(&modules_path, "<root>", "expected a list of modules"))?;
        let mut spec = Self {
            pooling: Pooling::Cls,
            normalize: false,
        };
        let mut saw_pooling = false;
        for (i, m) in list.iter().enumerate() {
            let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
            let kind = ty.rsplit('.').next().unwrap_or_default();
            match kind {
                "Transformer" => {}
                "Normalize" => spec.normalize = true,
                "Pooling" => {
                    let sub = m.get("path").and_then(Value::as_str).unwrap_or_default();
                    spec.pooling = read_pooling_config(&dir.join(sub).join("config.json"))?;
                    saw_pooling = true;
                }
                _ => {
                    return Err(Error::config(
                        &modules_path,
                        format!("[{i}].type"),
                        format!("module `{ty}` is not supported (supported: Transformer, Pooling, Normalize)"),
                    ))
                }
            }
        }
        if !saw_pooling {
            // sentence-transformers falls back to mean pooling.
            spec.pooling = Pooling::Mean;
        }
        Ok(Some(spec))
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn read_pooling_config(path: &Path) -> Result<Pooling> {
    let v = read_json(path)?;
    if let Some(mode) = v.get("pooling_mode").and_then(Value::as_str) {
        return match mode {
            "cls" => Ok(Pooling::Cls),
            "mean" => Ok(Pooling::Mean),
            "max" => Ok(Pooling::Max),
            "mean_sqrt_len_tokens" => Ok(Pooling::MeanSqrtLen),
            other => Err(Error::config(
                path,
                "pooling_mode",
                format!("`{other}` is not supported"),
            )),
        };
    }
    let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_max_tokens", Pooling::Max),
        ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
    ];
    for unsupported in ["pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"] {
        if flag(unsupported) {
            return Err(Error::config(
                path,
                unsupported,
                "this pooling mode is not supported",
            ));
        }
    }
    let on: Vec<_> = modes.iter().filter(|(k, _)| flag(k)).collect();
    match on.as_slice() {
        [] => Err(Error::config(
            path,
            "pooling_mode_*",
            "no pooling mode is enabled",
        )),
        [(_, p)] => Ok(*p),
        _ => Err(Error::config(
            path,
            "pooling_mode_*",
            "several pooling modes at once (concatenated) are not supported",
        )),
    }
}

/// Pools one text's token states (`rows`, [tokens, d], no padding) to one
/// vector; the slice form of [`pool`] for the packed fast path.
/// [`Pooling::Pooler`] and [`Pooling::None`] are not token poolings and
/// are handled by the caller.
pub fn pool_rows(rows: &[f32], d: usize, pooling: Pooling) -> Vec<f32> {
    let n = rows.len() / d.max(1);
    match pooling {
        Pooling::Cls | Pooling::Pooler | Pooling::None => rows[..d].to_vec(),
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
