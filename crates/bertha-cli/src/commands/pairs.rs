//! How sentence-embedding data files are read: the column names that pick
//! their layout and the STS Benchmark's original format (shared by
//! `finetune --task embedding` and `evaluate --task sts|retrieval`).

use bertha::data::{PairColumns, PairOptions};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct PairArgs {
    /// The files are original STS Benchmark files (sts-train.csv,
    /// sts-dev.csv, sts-test.csv: no header, tab-split, score 0..5 in field 5,
    /// divided by 5; sentences in fields 6 and 7). It applies to every data
    /// file of the command: scripts/stsb-to-pairs.py converts one file to
    /// scored pairs instead (e.g. an STS-B dev file beside training pairs).
    #[arg(long)]
    pub stsb: bool,

    /// The anchor column of pairs and triplets (default: anchor).
    #[arg(long)]
    pub anchor_column: Option<String>,

    /// The positive column (default: positive).
    #[arg(long)]
    pub positive_column: Option<String>,

    /// Columns whose names start with this hold hard negatives (default:
    /// negative).
    #[arg(long)]
    pub negative_prefix: Option<String>,

    /// The first sentence of scored pairs (default: sentence1).
    #[arg(long)]
    pub sentence1_column: Option<String>,

    /// The second sentence of scored pairs (default: sentence2).
    #[arg(long)]
    pub sentence2_column: Option<String>,

    /// The score of scored pairs, in 0..1 (default: score).
    #[arg(long)]
    pub score_column: Option<String>,
}

impl PairArgs {
    pub fn options(&self) -> PairOptions {
        let mut columns = PairColumns::default();
        for (flag, field) in [
            (&self.anchor_column, &mut columns.anchor),
            (&self.positive_column, &mut columns.positive),
            (&self.negative_prefix, &mut columns.negative_prefix),
            (&self.sentence1_column, &mut columns.sentence1),
            (&self.sentence2_column, &mut columns.sentence2),
            (&self.score_column, &mut columns.score),
        ] {
            if let Some(name) = flag {
                field.clone_from(name);
            }
        }
        PairOptions {
            columns,
            stsb: self.stsb,
            max_rows: None,
            skip_bad_rows: false,
        }
    }

    /// The flags given (refused where they do not apply).
    pub fn given(&self) -> Vec<&'static str> {
        [
            (self.stsb, "--stsb"),
            (self.anchor_column.is_some(), "--anchor-column"),
            (self.positive_column.is_some(), "--positive-column"),
            (self.negative_prefix.is_some(), "--negative-prefix"),
            (self.sentence1_column.is_some(), "--sentence1-column"),
            (self.sentence2_column.is_some(), "--sentence2-column"),
            (self.score_column.is_some(), "--score-column"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}
