//! The flags that say how a sentence-embedding data file is laid out
//! (`bertha evaluate --task sts|retrieval`, and training on pairs).

use bertha::data::{PairColumns, PairOptions};

#[derive(clap::Args, Debug, Clone)]
pub struct PairArgs {
    /// Pairs: the anchor (query) column.
    #[arg(long, default_value = "anchor")]
    pub anchor_column: String,

    /// Pairs: the positive column.
    #[arg(long, default_value = "positive")]
    pub positive_column: String,

    /// Pairs: every column whose name starts with this holds a hard negative.
    #[arg(long, default_value = "negative")]
    pub negative_prefix: String,

    /// Scored pairs: the first sentence.
    #[arg(long, default_value = "sentence1")]
    pub sentence1_column: String,

    /// Scored pairs: the second sentence.
    #[arg(long, default_value = "sentence2")]
    pub sentence2_column: String,

    /// Scored pairs: the similarity score, in 0..1.
    #[arg(long, default_value = "score")]
    pub score_column: String,

    /// The file is an original STS Benchmark file (sts-train.csv, sts-dev.csv,
    /// sts-test.csv: no header, tab-split, score 0..5 in field 5, sentences in
    /// fields 6 and 7): scores are divided by 5. scripts/stsb-to-pairs.py
    /// converts such a file to scored pairs instead.
    #[arg(long)]
    pub stsb: bool,
}

impl PairArgs {
    pub fn options(&self) -> PairOptions {
        PairOptions {
            columns: PairColumns {
                anchor: self.anchor_column.clone(),
                positive: self.positive_column.clone(),
                negative_prefix: self.negative_prefix.clone(),
                sentence1: self.sentence1_column.clone(),
                sentence2: self.sentence2_column.clone(),
                score: self.score_column.clone(),
            },
            stsb: self.stsb,
            max_rows: None,
        }
    }
}
