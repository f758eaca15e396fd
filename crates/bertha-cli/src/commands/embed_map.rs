//! `bertha embed-map`: a picture of the sentence vectors, reduced to 2-D
//! with t-SNE or PCA and coloured by label, with the silhouette of the map
//! and the k-NN label accuracy of the full vectors.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use bertha::show::{
    coords, reduce, ImageFormat, LabeledTexts, MapPlot, Method, Quality, ReadSpec, TsneOptions,
};
use bertha::Pooling;
use serde_json::json;

use super::EmbedArgs;
use crate::texts::{progress_bar, report_truncation};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    embed: EmbedArgs,

    /// Texts to map: one per line, or a TSV / CSV (with a header) / JSONL file
    /// with a text and a label column (e.g. SST-2's dev.tsv).
    #[arg(long, short = 'i')]
    input: PathBuf,

    /// The text column (default: `sentence`, else `text`).
    #[arg(long)]
    text_column: Option<String>,

    /// The label column that colours the points (default: `label` when present).
    #[arg(long, conflicts_with = "labels")]
    label_column: Option<String>,

    /// Labels one per line, aligned with the texts of --input.
    #[arg(long)]
    labels: Option<PathBuf>,

    /// tsne or pca.
    #[arg(long, default_value = "tsne")]
    method: String,

    /// Names for the labels in the legend and CSV, e.g. `0=negative,1=positive`.
    #[arg(long)]
    label_names: Option<String>,

    /// t-SNE perplexity (neighbours per point are 3 × perplexity).
    #[arg(long, default_value_t = 30.0)]
    perplexity: f64,

    /// Seed of t-SNE's initial embedding: the same seed gives the same picture.
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// t-SNE iterations.
    #[arg(long, default_value_t = 1000)]
    iterations: usize,

    /// Map only the first N texts (after --per-label).
    #[arg(long)]
    limit: Option<usize>,

    /// Take the first N texts of each label.
    #[arg(long)]
    per_label: Option<usize>,

    /// The picture: FILE.png or FILE.svg.
    #[arg(long)]
    out: PathBuf,

    /// Also write the 2-D points with their label and text as CSV.
    #[arg(long)]
    coords: Option<PathBuf>,

    /// Title of the picture (default: model, pooling and method).
    #[arg(long)]
    title: Option<String>,

    /// Picture size in pixels, WIDTHxHEIGHT.
    #[arg(long, default_value = "1000x800")]
    size: String,
}

fn parse_size(s: &str) -> Result<(u32, u32)> {
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    match parsed {
        Some((w, h)) if (200..=10_000).contains(&w) && (200..=10_000).contains(&h) => Ok((w, h)),
        _ => bail!("--size must be WIDTHxHEIGHT with both between 200 and 10000, e.g. 1000x800"),
    }
}

fn model_name(dir: &Path) -> String {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.3}"))
}

pub fn run(a: Args) -> Result<()> {
    // Everything that can be checked before the model runs is checked first.
    let method: Method = a.method.parse()?;
    ImageFormat::from_path(&a.out)?;
    let size = parse_size(&a.size)?;
    if a.per_label == Some(0) || a.limit == Some(0) {
        bail!("--per-label and --limit must be at least 1");
    }
    let spec = ReadSpec {
        text_column: a.text_column.clone(),
        label_column: a.label_column.clone(),
        labels_file: a.labels.clone(),
    };
    let mut data = LabeledTexts::read(&a.input, &spec)?.select(a.per_label, a.limit)?;
    if let Some(names) = &a.label_names {
        data.rename_labels(names)?;
    }
    let tsne = TsneOptions {
        perplexity: a.perplexity,
        seed: a.seed,
        iterations: a.iterations,
        ..TsneOptions::default()
    };
    match method {
        Method::Tsne => tsne.check(data.len())?,
        Method::Pca if data.len() < 3 => bail!("PCA needs at least 3 texts (got {})", data.len()),
        Method::Pca => {}
    }

    let dir = a.embed.model.resolve()?;
    let embedder = a.embed.load()?;
    if embedder.pooling() == Pooling::None {
        bail!("pooling `none` gives token vectors; a map needs one vector per text (cls, mean, pooler, ...)");
    }
    let encodings = embedder.tokenizer().encode_batch(&data.texts)?;
    let bar = progress_bar(data.len());
    let vectors = embedder.embed_encoded(&encodings, a.embed.batch_size, &mut |done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    report_truncation(&encodings, embedder.tokenizer().max_length());

    let reduced = reduce::reduce(&vectors, method, &tsne)?;
    let (names, groups) = data.groups();
    let quality = if data.labels.is_some() {
        Quality::measure(&vectors, &reduced.points, &groups)
    } else {
        Quality::measure(&[], &[], &[])
    };

    let model = model_name(&dir);
    let pooling = embedder.pooling().name();
    let method_text = match method {
        Method::Tsne => format!("t-SNE (perplexity {}, seed {})", a.perplexity, a.seed),
        Method::Pca => "PCA".to_string(),
    };
    let title = a
        .title
        .clone()
        .unwrap_or_else(|| format!("{model} · {pooling} pooling · {method_text}"));
    let subtitle = if data.labels.is_some() {
        format!(
            "{} texts · silhouette by label (2-D) {} · {}-NN label accuracy ({}, {}-d) {} (majority {})",
            data.len(),
            fmt_opt(quality.silhouette),
            quality.knn_k,
            quality.knn_metric,
            vectors.first().map_or(0, Vec::len),
            fmt_opt(quality.knn_accuracy),
            fmt_opt(quality.majority_baseline),
        )
    } else {
        format!("{} texts · no labels", data.len())
    };
    let plot = MapPlot {
        title: &title,
        subtitle: Some(&subtitle),
        axes: [&reduced.axes[0], &reduced.axes[1]],
        points: &reduced.points,
        labels: &groups,
        label_names: &names,
        legend: data.labels.is_some(),
        size,
    };
    plot.save(&a.out)?;
    if let Some(path) = &a.coords {
        coords::write_csv(
            path,
            &reduced.points,
            &data.texts,
            data.labels.as_deref(),
            &data.lines,
        )?;
    }

    eprintln!("{title}");
    eprintln!("{subtitle}");
    eprintln!("wrote {}", a.out.display());
    let counts: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .filter(|_| data.labels.is_some())
        .map(|(g, n)| (n.clone(), json!(groups.iter().filter(|&&x| x == g).count())))
        .collect();
    let summary = json!({
        "model": model,
        "pooling": pooling,
        "method": method.name(),
        "perplexity": (method == Method::Tsne).then_some(a.perplexity),
        "seed": (method == Method::Tsne).then_some(a.seed),
        "explained_variance_ratio": reduced.explained_variance_ratio,
        "n": data.len(),
        "labels": counts,
        "silhouette": quality.silhouette,
        "knn_accuracy": quality.knn_accuracy,
        "knn_k": quality.knn_k,
        "knn_metric": quality.knn_metric,
        "majority_baseline": quality.majority_baseline,
        "out": a.out,
        "coords": a.coords,
    });
    println!("{summary}");
    Ok(())
}
