//! `bertha curves`: one chart of a figure from several runs' `metrics.jsonl`
//! (e.g. the held-out MLM loss of an ablation), with a JSON line per run.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::output::JsonLines;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run folders (each with a `metrics.jsonl`), as `LABEL=DIR` or `DIR`
    /// (labelled by the folder's name).
    #[arg(required = true, num_args = 1..)]
    runs: Vec<String>,

    /// The figure to draw: any key of the metrics lines, e.g. `eval_mlm_loss`,
    /// `eval_loss`, `loss`, `accuracy`, `f1`.
    #[arg(long, default_value = "eval_loss")]
    metric: String,

    /// The chart: FILE.png or FILE.svg.
    #[arg(long)]
    out: PathBuf,

    /// The chart's title (default: the metric's name).
    #[arg(long)]
    title: Option<String>,

    /// The horizontal axis's label (the metrics lines' `step`).
    #[arg(long, default_value = "step")]
    x_label: String,
}

/// One run's points of the metric, in step order.
struct Curve {
    label: String,
    dir: PathBuf,
    points: Vec<(f64, f64)>,
}

pub fn run(a: Args) -> Result<()> {
    let curves = a
        .runs
        .iter()
        .map(|spec| read_curve(spec, &a.metric))
        .collect::<Result<Vec<_>>>()?;
    let series: Vec<(&str, Vec<(f64, f64)>)> = curves
        .iter()
        .map(|c| (c.label.as_str(), c.points.clone()))
        .collect();
    let title = a.title.clone().unwrap_or_else(|| a.metric.clone());
    bertha::show::curve::plot_curves(&a.out, &title, &a.x_label, &series)?;
    let mut out = JsonLines::open(None)?;
    for c in &curves {
        let best = c.points.iter().copied().min_by(|x, y| x.1.total_cmp(&y.1));
        let (last_step, last) = c.points.last().copied().unzip();
        out.write(&json!({
            "run": c.label,
            "dir": c.dir.display().to_string(),
            "metric": a.metric,
            "points": c.points.len(),
            "last_step": last_step,
            "last": last,
            "min_step": best.map(|b| b.0),
            "min": best.map(|b| b.1),
        }))?;
    }
    out.finish()?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// Parses `LABEL=DIR` or `DIR` and reads the metric's points from
/// `DIR/metrics.jsonl` (lines without the metric are other kinds of line:
/// steps or evaluations).
fn read_curve(spec: &str, metric: &str) -> Result<Curve> {
    let (label, dir) = match spec.split_once('=') {
        Some((label, dir)) if !label.is_empty() => (label.to_string(), PathBuf::from(dir)),
        _ => {
            let dir = PathBuf::from(spec);
            let label = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.to_string());
            (label, dir)
        }
    };
    let path = dir.join("metrics.jsonl");
    let points = read_points(&path, metric)?;
    if points.is_empty() {
        bail!(
            "{}: no line has the metric `{metric}` with a step",
            path.display()
        );
    }
    Ok(Curve { label, dir, points })
}

fn read_points(path: &Path, metric: &str) -> Result<Vec<(f64, f64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        if let (Some(step), Some(y)) = (
            v.get("step").and_then(Value::as_f64),
            v.get(metric).and_then(Value::as_f64),
        ) {
            points.push((step, y));
        }
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(points)
}
