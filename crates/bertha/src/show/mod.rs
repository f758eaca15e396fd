//! Pictures of what the encoder learned: sentence vectors reduced to 2-D
//! (t-SNE or PCA), drawn as a scatter plot coloured by label, with two
//! figures of how well the labels cluster.
//!
//! The path of a map: [`data`] reads labelled texts (TSV, CSV, JSONL or
//! one text per line with a labels file) → an [`crate::Embedder`] embeds
//! them → [`reduce`] maps the vectors to 2-D → [`cluster`] measures the
//! silhouette in the map and the k-NN label accuracy in the full space →
//! [`plot`] draws a PNG or SVG and [`coords`] writes the points as CSV.
//!
//! Text is rendered with DejaVu Sans, compiled into the crate
//! (`assets/fonts/`), so drawing needs no system font library.

pub mod cluster;
pub mod coords;
pub mod curve;
pub mod data;
pub mod heatmap;
pub mod plot;
pub mod reduce;

pub use cluster::{knn_accuracy, silhouette, Quality, KNN_K};
pub use data::{LabeledTexts, ReadSpec};
pub use heatmap::Heatmap;
pub use plot::{ImageFormat, MapPlot};
pub use reduce::{Method, Reduced, TsneOptions};
