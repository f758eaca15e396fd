//! `bertha mine-negatives`: hard negatives for reranker or embedding
//! training, mined from a corpus with a bi-encoder, as sentence-
//! transformers' `mine_hard_negatives` (see `bertha::tasks::negatives`
//! for the rules), written as JSON Lines in one of its output formats.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bertha::data::{RerankData, RerankLayout};
use bertha::tasks::{mine_hard_negatives, MiningOptions, Sampling};
use bertha::{EmbedOptions, Embedder};
use serde::ser::SerializeMap;
use serde_json::Value;

use super::{device, PrecisionArgs};
use crate::model_dir::ModelArgs;
use crate::output::JsonLines;

/// How mined rows are written (sentence-transformers' `output_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// (query, positive, negative): one row per negative.
    Triplet,
    /// (query, positive, negative_1…negative_N): queries with N negatives.
    NTuple,
    /// (query, document, label): the positives with label 1, each negative with 0.
    LabeledPair,
    /// {query, documents, labels}: the positives and negatives of a query in one list.
    LabeledList,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The bi-encoder (a sentence-transformers folder) that ranks the corpus.
    #[command(flatten)]
    model: ModelArgs,

    /// (query, positive) pairs: TSV, CSV or JSON Lines, the query in a
    /// `query` or `anchor` column (else the first), the positive in
    /// `positive` or `document` (else the second); with a `label` column,
    /// rows labelled above 0.
    #[arg(long)]
    train: PathBuf,

    /// The documents to mine from, one per line (default: the positives);
    /// the positives are always added.
    #[arg(long)]
    corpus: Option<PathBuf>,

    /// Where the rows go (JSON Lines, written whole or not at all).
    #[arg(long, short = 'o')]
    out: PathBuf,

    #[arg(long, default_value_t = 3)]
    num_negatives: usize,

    /// Skip this many of the best candidates (likely unlabelled positives).
    #[arg(long, default_value_t = 0)]
    range_min: usize,

    /// Consider only this many of the best candidates (default:
    /// range-min + num-negatives + positives; ×10 negatives with a score limit).
    #[arg(long)]
    range_max: Option<usize>,

    /// Drop candidates scoring above this (cosine).
    #[arg(long, allow_negative_numbers = true)]
    max_score: Option<f32>,

    /// Drop candidates scoring below this (cosine).
    #[arg(long, allow_negative_numbers = true)]
    min_score: Option<f32>,

    /// top (the best remaining) or random (drawn with --seed).
    #[arg(long, default_value = "top")]
    sampling: Sampling,

    #[arg(long, value_enum, default_value = "triplet")]
    output_format: Format,

    /// Keep the positives among the candidates, in their place: with
    /// labeled-list, each query's --range-max best documents as retrieved,
    /// the lists a retrieve-then-rerank evaluation reranks.
    #[arg(long)]
    include_positives: bool,

    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// Texts per forward pass.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,

    /// Tokens per text (default: the folder's max_seq_length).
    #[arg(long)]
    max_length: Option<usize>,

    #[command(flatten)]
    precision: PrecisionArgs,
}

/// A JSON object whose keys keep the order given.
struct Ordered(Vec<(String, Value)>);

impl serde::Serialize for Ordered {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.include_positives && a.output_format != Format::LabeledList {
        bail!(
            "--include-positives writes retrieval lists: use it with --output-format labeled-list"
        );
    }
    let data = RerankData::read(&a.train)?;
    let pairs: Vec<(String, String)> = match data.layout {
        RerankLayout::Lists => bail!(
            "{}: lists are not (query, positive) pairs",
            a.train.display()
        ),
        _ => data
            .groups
            .iter()
            .filter(|g| g.labels[0] > 0.0)
            .map(|g| (g.query.clone(), g.documents[0].clone()))
            .collect(),
    };
    let corpus = a
        .corpus
        .as_deref()
        .map(bertha::io::texts::read_lines_from_file)
        .transpose()?;
    let embed = EmbedOptions {
        max_length: a.max_length,
        precision: a.precision.precision,
        ..EmbedOptions::default()
    };
    let model = a.model.resolve()?;
    let embedder = Embedder::from_dir(&model, &device()?, &embed)?;
    let opts = MiningOptions {
        num_negatives: a.num_negatives,
        range_min: a.range_min,
        range_max: a.range_max,
        max_score: a.max_score,
        min_score: a.min_score,
        sampling: a.sampling,
        include_positives: a.include_positives,
        seed: a.seed,
        batch_size: a.batch_size.max(1),
    };
    let t0 = std::time::Instant::now();
    let mut last = String::new();
    let mined = mine_hard_negatives(
        &embedder,
        &pairs,
        corpus.as_deref(),
        &opts,
        &mut |stage, n, total| {
            if stage != last && n == total {
                eprintln!("{stage}: {total} ({:.1} s)", t0.elapsed().as_secs_f64());
                last = stage.to_string();
            }
        },
    )
    .with_context(|| format!("mining negatives with {}", model.display()))?;

    let (qname, pname) = ("query", "positive");
    let text = |s: &str| Value::String(s.to_string());
    let mut out = JsonLines::open(Some(&a.out))?;
    let (mut rows, mut negatives) = (0usize, 0usize);
    for m in &mined {
        negatives += m.negatives.len();
        let mut write = |fields: Vec<(&str, Value)>| -> Result<()> {
            rows += 1;
            out.write(&Ordered(
                fields
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ))
        };
        match a.output_format {
            Format::Triplet => {
                for p in &m.positives {
                    for (n, _) in &m.negatives {
                        write(vec![
                            (qname, text(&m.query)),
                            (pname, text(p)),
                            ("negative", text(n)),
                        ])?;
                    }
                }
            }
            Format::NTuple => {
                if m.negatives.len() < a.num_negatives {
                    continue;
                }
                for p in &m.positives {
                    let mut row = vec![
                        (qname.to_string(), text(&m.query)),
                        (pname.to_string(), text(p)),
                    ];
                    for (i, (n, _)) in m.negatives.iter().enumerate() {
                        row.push((format!("negative_{}", i + 1), text(n)));
                    }
                    rows += 1;
                    out.write(&Ordered(row))?;
                }
            }
            Format::LabeledPair => {
                for p in &m.positives {
                    write(vec![
                        ("query", text(&m.query)),
                        ("document", text(p)),
                        ("label", 1.into()),
                    ])?;
                }
                for (n, _) in &m.negatives {
                    write(vec![
                        ("query", text(&m.query)),
                        ("document", text(n)),
                        ("label", 0.into()),
                    ])?;
                }
            }
            Format::LabeledList => {
                let (docs, labels): (Vec<Value>, Vec<Value>) = if a.include_positives {
                    m.negatives
                        .iter()
                        .map(|(d, _)| (text(d), u8::from(m.positives.contains(d)).into()))
                        .unzip()
                } else {
                    m.positives
                        .iter()
                        .map(|p| (text(p), 1.into()))
                        .chain(m.negatives.iter().map(|(n, _)| (text(n), 0.into())))
                        .unzip()
                };
                write(vec![
                    ("query", text(&m.query)),
                    ("documents", Value::Array(docs)),
                    ("labels", Value::Array(labels)),
                ])?;
            }
        }
    }
    out.finish()?;
    eprintln!(
        "{} queries, {negatives} {} → {rows} rows in {} ({:.1} s)",
        mined.len(),
        if a.include_positives {
            "candidates"
        } else {
            "negatives"
        },
        a.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
