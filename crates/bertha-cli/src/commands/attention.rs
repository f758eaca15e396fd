//! `bertha attention`: a picture (or the JSON) of the attention maps of
//! one text — one head of one layer, or the first token's row averaged
//! over the heads for every layer.

use std::path::PathBuf;

use anyhow::{bail, Result};
use bertha::show::heatmap::Heatmap;
use bertha::tasks::AttentionModel;

use super::device;
use crate::model_dir::ModelArgs;
use crate::output::JsonLines;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A PNG or SVG picture (by the --out extension).
    Image,
    /// The raw matrices as one JSON object.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// The text whose attention to show.
    text: String,

    /// The picture (.png or .svg), or with --format json the JSON file
    /// (default: stdout).
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,

    /// The layer (0-based) of the head to draw.
    #[arg(long, default_value_t = 0, conflicts_with = "cls_across_layers")]
    layer: usize,

    /// The head (0-based) within the layer.
    #[arg(long, default_value_t = 0, conflicts_with = "cls_across_layers")]
    head: usize,

    /// Draw the first token's ([CLS]) attention averaged over heads, one
    /// row per layer.
    #[arg(long)]
    cls_across_layers: bool,

    #[arg(long, value_enum, default_value_t = Format::Image)]
    format: Format,
}

#[derive(serde::Serialize)]
struct JsonOut<'a> {
    model_type: &'a str,
    tokens: &'a [String],
    /// "head" or "cls_across_layers".
    view: &'static str,
    layer: Option<usize>,
    head: Option<usize>,
    rows: Vec<String>,
    /// The drawn matrix: [query][key] of the head, or [layer][key].
    matrix: Vec<Vec<f32>>,
    /// Every map: [layer][head][query][key].
    attentions: &'a [Vec<Vec<Vec<f32>>>],
}

pub fn run(a: Args) -> Result<()> {
    let dir = a.model.resolve()?;
    let model = AttentionModel::from_dir(&dir, &device()?)?;
    let maps = model.attend(&a.text)?;
    let model_type = model.model().config().model_type.clone();
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    let (rows, matrix, title, subtitle) = if a.cls_across_layers {
        let rows = (0..maps.num_layers())
            .map(|l| format!("layer {l}"))
            .collect();
        let title = format!("{name}: attention of {} across layers", maps.tokens[0]);
        let sub = format!(
            "rows: layers; columns: the tokens {} attends to (mean over {} heads)",
            maps.tokens[0],
            maps.num_heads()
        );
        (rows, maps.cls_across_layers(), title, sub)
    } else {
        let m = maps.head(a.layer, a.head)?.clone();
        let title = format!("{name}: layer {}, head {}", a.layer, a.head);
        let sub = "rows: queries; columns: the keys they attend to".to_string();
        (maps.tokens.clone(), m, title, sub)
    };
    match a.format {
        Format::Json => {
            let mut out = JsonLines::open(a.out.as_deref())?;
            out.write(&JsonOut {
                model_type: &model_type,
                tokens: &maps.tokens,
                view: if a.cls_across_layers {
                    "cls_across_layers"
                } else {
                    "head"
                },
                layer: (!a.cls_across_layers).then_some(a.layer),
                head: (!a.cls_across_layers).then_some(a.head),
                rows,
                matrix,
                attentions: &maps.attentions,
            })?;
            out.finish()
        }
        Format::Image => {
            let Some(path) = a.out.as_deref() else {
                bail!("--out FILE.png or FILE.svg is needed for a picture (or use --format json)");
            };
            Heatmap {
                title,
                subtitle,
                row_labels: &rows,
                col_labels: &maps.tokens,
                values: &matrix,
            }
            .save(path)?;
            eprintln!("wrote {}", path.display());
            Ok(())
        }
    }
}
