//! What a run reports: one line of `metrics.jsonl` per optimiser step and
//! per evaluation, the same for every objective, and the events the loop
//! hands to its caller (a progress bar, a test).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::checkpoint::write_atomic;
use crate::error::{Error, Result};

/// One optimiser step's figures (a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    /// Epochs done after this step (fractional).
    #[serde(default)]
    pub epoch: f64,
    /// The objective's loss, averaged over the step's micro-batches.
    pub loss: f64,
    /// The objective's own figures (pre-training: `mlm_loss`,
    /// `mlm_accuracy`, `nsp_loss`).
    #[serde(flatten)]
    pub figures: BTreeMap<String, f64>,
    pub lr: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

/// A held-out evaluation (also a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalMetrics {
    pub step: u64,
    #[serde(default)]
    pub epoch: f64,
    /// Mean loss over the held-out targets (NaN without labels; JSON
    /// writes NaN as `null`, read back as NaN).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub eval_loss: f64,
    /// The key of `scores` that picks the best model.
    #[serde(default)]
    pub metric: String,
    /// Whether a larger `metric` is better (a loss is not).
    #[serde(default = "yes")]
    pub greater_is_better: bool,
    /// The objective's scores: accuracy, macro_f1 / precision, recall, f1,
    /// token_accuracy / exact_match, f1 (SQuAD's, in percent) /
    /// eval_mlm_loss, eval_perplexity, eval_mlm_accuracy / spearman,
    /// pearson / recall@k, mrr@10, ndcg@10.
    #[serde(flatten, deserialize_with = "scores_nan_if_null")]
    pub scores: BTreeMap<String, f64>,
}

fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn scores_nan_if_null<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, f64>, D::Error> {
    let m = <BTreeMap<String, Option<f64>> as serde::Deserialize>::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

fn nan() -> f64 {
    f64::NAN
}

fn yes() -> bool {
    true
}

impl EvalMetrics {
    /// The main metric's value.
    pub fn main(&self) -> f64 {
        self.scores.get(&self.metric).copied().unwrap_or(f64::NAN)
    }

    /// Whether this evaluation beats `than` (a main metric value).
    pub fn beats(&self, than: f64) -> bool {
        let v = self.main();
        if self.greater_is_better {
            v > than
        } else {
            v < than
        }
    }
}

/// What the loop reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    Step(StepMetrics),
    Eval(EvalMetrics),
    /// A new best model was written to `out/best` (early stopping only).
    Best(EvalMetrics),
    Saved(PathBuf),
    /// Patience ran out at `step`; the best model is from `best_step`.
    EarlyStop {
        step: u64,
        best_step: u64,
    },
}

/// `metrics.jsonl`, open for appending.
pub(crate) struct MetricsFile {
    file: std::fs::File,
    path: PathBuf,
}

impl MetricsFile {
    /// Opens `path` to continue it (`keep`, a resumed run) or anew.
    pub(crate) fn open(path: &Path, keep: bool) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(keep)
            .write(true)
            .truncate(!keep)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn append(&mut self, value: &impl serde::Serialize) -> Result<()> {
        let line =
            serde_json::to_string(value).map_err(|e| Error::serialise(self.path.display(), e))?;
        writeln!(self.file, "{line}").map_err(|e| Error::io(&self.path, e))
    }
}

/// On resume: cuts `metrics.jsonl` back to the lines of steps up to `step`
/// (later ones belong to the abandoned run) and returns them parsed. A
/// missing file is no history. Only with `rewrite` is the file cut (a
/// data-parallel run's other processes only read it).
pub fn rewind_metrics(
    path: &Path,
    step: u64,
    rewrite: bool,
) -> Result<(Vec<StepMetrics>, Vec<EvalMetrics>)> {
    let (mut steps, mut evals) = (Vec::new(), Vec::new());
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok((steps, evals));
    };
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v.get("step")?.as_u64())
                .is_some_and(|s| s <= step)
        })
        .collect();
    for line in &kept {
        if let Ok(m) = serde_json::from_str::<StepMetrics>(line) {
            steps.push(m);
        } else if let Ok(e) = serde_json::from_str::<EvalMetrics>(line) {
            evals.push(e);
        }
    }
    if rewrite {
        let mut body = kept.join("\n");
        if !body.is_empty() {
            body.push('\n');
        }
        write_atomic(path, body.as_bytes())?;
    }
    Ok((steps, evals))
}

/// Writes `value` as pretty JSON, atomically.
pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| Error::serialise(path.display(), e))?;
    write_atomic(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NaN dev loss or score is written as `null` and read back as NaN,
    /// so a resumed run keeps that evaluation.
    #[test]
    fn nan_evaluations_survive_a_round_trip() {
        let e = EvalMetrics {
            step: 4,
            epoch: 1.0,
            eval_loss: f64::NAN,
            metric: "spearman".into(),
            greater_is_better: true,
            scores: BTreeMap::from([("spearman".into(), 81.5), ("pearson".into(), f64::NAN)]),
        };
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.contains("\"eval_loss\":null"), "{line}");
        let back: EvalMetrics = serde_json::from_str(&line).unwrap();
        assert!(back.eval_loss.is_nan() && back.scores["pearson"].is_nan());
        assert_eq!(back.scores["spearman"], 81.5);
        assert_eq!((back.step, back.metric.as_str()), (4, "spearman"));
        // A step line is not taken for an evaluation.
        assert!(serde_json::from_str::<StepMetrics>(&line).is_err());
    }
}
