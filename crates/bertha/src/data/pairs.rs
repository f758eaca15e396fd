//! Sentence-embedding data: TSV, CSV or JSON Lines with a header holding
//! either texts to pull together, (anchor, positive) pairs with optional
//! hard negatives, or scored pairs (sentence1, sentence2, score in 0..1);
//! and the original STS Benchmark files (no header, scores 0..5).
//!
//! The layout is found by column names (overridable): `anchor` and
//! `positive` (plus every column starting with `negative`, in file order)
//! make [`PairLayout::Texts`]; `sentence1`, `sentence2` and `score` make
//! [`PairLayout::Scored`]. Other columns (a `split`, ids) are ignored. A
//! row with an empty text, a missing field or a score outside 0..1 is an
//! error naming the file and line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value;

use super::classification::BadRow;
use crate::error::{Error, Result};
use crate::io::texts::{columns_list, Cell, Record, Table, TableFormat};
use crate::metrics::{retrieval_scores, sts_scores, RETRIEVAL_MAIN_METRIC, STS_MAIN_METRIC};
use crate::pooling::normalize_in_place;

/// The column names that pick a file's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairColumns {
    pub anchor: String,
    pub positive: String,
    /// Every column whose name starts with this holds a hard negative.
    pub negative_prefix: String,
    pub sentence1: String,
    pub sentence2: String,
    pub score: String,
}

impl Default for PairColumns {
    fn default() -> Self {
        Self {
            anchor: "anchor".into(),
            positive: "positive".into(),
            negative_prefix: "negative".into(),
            sentence1: "sentence1".into(),
            sentence2: "sentence2".into(),
            score: "score".into(),
        }
    }
}

/// What the rows of a file hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairLayout {
    /// Anchor, positive and zero or more hard negatives.
    Texts,
    /// Two sentences and their similarity score in 0..1.
    Scored,
}

#[derive(Debug, Clone, Default)]
pub struct PairOptions {
    pub columns: PairColumns,
    /// The file is an original STS Benchmark file (sts-train.csv, ...): no
    /// header, tab-split without quoting, the score (0..5, divided by 5
    /// here) in field 5, the sentences in fields 6 and 7 (1-based; lines
    /// may carry more fields, which are ignored).
    pub stsb: bool,
    /// Read only the first this many rows.
    pub max_rows: Option<usize>,
    /// Skip a malformed row (counted in [`EmbeddingData::bad_rows`] and
    /// logged) instead of stopping at it, as the classification reader
    /// does. Problems with the file as a whole (no header, no such
    /// column) still stop the read.
    pub skip_bad_rows: bool,
}

/// Fields of an original STS Benchmark line (0-based): score, sentences.
const STSB_SCORE: usize = 4;
const STSB_SENTENCES: [usize; 2] = [5, 6];

#[derive(Debug, Clone)]
pub struct EmbeddingData {
    pub path: PathBuf,
    pub layout: PairLayout,
    /// Column names in order: `["anchor", "positive", "negative_1", ...]`
    /// or `["sentence1", "sentence2"]` (as named in the file).
    pub columns: Vec<String>,
    /// `rows[i][j]`: the text of column j in example i (never empty).
    pub rows: Vec<Vec<String>>,
    /// Scored layout: one score per row, in 0..1.
    pub scores: Option<Vec<f32>>,
    /// The 1-based line of the file each row comes from.
    pub lines: Vec<usize>,
    /// Rows skipped as malformed (only with `skip_bad_rows`).
    pub bad_rows: Vec<BadRow>,
}

/// Where a layout's fields are in the table.
struct Plan {
    layout: PairLayout,
    /// Output name and table index of each text column.
    texts: Vec<(String, usize)>,
    /// Name and index of the score column, and what divides its values.
    score: Option<(String, usize, f64)>,
}

impl EmbeddingData {
    pub fn read(path: &Path, opts: &PairOptions) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path, opts)
    }

    /// Parses file contents; `path` names them in errors and picks the
    /// format by extension (else by the first line).
    pub fn from_bytes(bytes: &[u8], path: &Path, opts: &PairOptions) -> Result<Self> {
        let origin = path.display().to_string();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Input(format!("{origin}: the file is empty")));
        }
        if opts.columns.negative_prefix.is_empty() {
            return Err(Error::option("negative_prefix", "must not be empty"));
        }
        let (table, plan) = if opts.stsb {
            let table = Table::parse_without_header(bytes, &origin, TableFormat::Tsv)?;
            let c = &opts.columns;
            let plan = Plan {
                layout: PairLayout::Scored,
                texts: vec![
                    (c.sentence1.clone(), STSB_SENTENCES[0]),
                    (c.sentence2.clone(), STSB_SENTENCES[1]),
                ],
                score: Some((c.score.clone(), STSB_SCORE, 5.0)),
            };
            (table, plan)
        } else {
            let table = Table::parse(bytes, &origin, TableFormat::detect(path, bytes))?;
            let plan = plan(&table, &origin, &opts.columns)?;
            (table, plan)
        };
        let limit = opts.max_rows.unwrap_or(usize::MAX);
        let mut data = Self {
            path: path.to_path_buf(),
            layout: plan.layout,
            columns: plan.texts.iter().map(|(name, _)| name.clone()).collect(),
            rows: Vec::new(),
            scores: plan.score.as_ref().map(|_| Vec::new()),
            lines: Vec::new(),
            bad_rows: Vec::new(),
        };
        for (line, record) in table.rows.iter().take(limit) {
            // One row: its texts and score, or why it is malformed.
            let row = || -> std::result::Result<(Vec<String>, Option<f32>), String> {
                let record = record.as_ref().map_err(Clone::clone)?;
                if opts.stsb {
                    check_stsb_width(record)?;
                } else {
                    table.check_width(record)?;
                }
                let texts = plan
                    .texts
                    .iter()
                    .map(|(name, i)| record.text(*i, name).map(str::to_string))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let score = match &plan.score {
                    Some((name, i, scale)) => Some(score(record, *i, name, *scale, opts.stsb)?),
                    None => None,
                };
                Ok((texts, score))
            };
            match row() {
                Ok((texts, s)) => {
                    if let (Some(s), Some(scores)) = (s, &mut data.scores) {
                        scores.push(s);
                    }
                    data.rows.push(texts);
                    data.lines.push(*line);
                }
                Err(reason) if opts.skip_bad_rows => data.bad_rows.push(BadRow {
                    line: *line,
                    reason,
                }),
                Err(reason) => {
                    return Err(Error::Input(format!("{origin}: line {line}: {reason}")))
                }
            }
        }
        if !data.bad_rows.is_empty() {
            tracing::warn!(
                "{origin}: skipped {} malformed rows (the first: line {}: {})",
                data.bad_rows.len(),
                data.bad_rows[0].line,
                data.bad_rows[0].reason
            );
        }
        if data.rows.is_empty() {
            return Err(Error::Input(format!(
                "{origin}: no examples: the file has {}",
                if opts.stsb {
                    "no lines"
                } else {
                    "a header only"
                }
            )));
        }
        Ok(data)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Hard negatives per row (0 for scored pairs).
    pub fn negatives(&self) -> usize {
        match self.layout {
            PairLayout::Texts => self.columns.len() - 2,
            PairLayout::Scored => 0,
        }
    }

    /// The texts of column `j` (0: anchor or sentence1, 1: positive or
    /// sentence2, 2..: negatives), in row order. Panics when `j` is not
    /// below `columns.len()`.
    pub fn column(&self, j: usize) -> impl Iterator<Item = &str> + '_ {
        assert!(
            j < self.columns.len(),
            "column {j} of {}",
            self.columns.len()
        );
        self.rows.iter().map(move |r| r[j].as_str())
    }

    /// Keeps the first `n` rows.
    pub fn truncate(&mut self, n: usize) {
        self.rows.truncate(n);
        self.lines.truncate(n);
        if let Some(s) = &mut self.scores {
            s.truncate(n);
        }
    }

    /// Splits off the rows from `at` on (e.g. a held-out tail), as
    /// `Vec::split_off`; `at` past the end leaves the second part empty.
    pub fn split_off(&mut self, at: usize) -> Self {
        let at = at.min(self.len());
        Self {
            path: self.path.clone(),
            layout: self.layout,
            columns: self.columns.clone(),
            rows: self.rows.split_off(at),
            scores: self.scores.as_mut().map(|s| s.split_off(at)),
            lines: self.lines.split_off(at),
            bad_rows: Vec::new(),
        }
    }

    /// Scores sentence embeddings of this data as `task` asks, `embed`
    /// giving one vector per text (normalised here, so cosine is a dot
    /// product): STS scores of column 0 against column 1
    /// ([`sts_scores`]), or retrieval of each anchor's positive among the
    /// distinct positives ([`retrieval_scores`]; negatives are not in
    /// the corpus).
    pub fn evaluate(
        &self,
        task: EmbeddingEval,
        mut embed: impl FnMut(&[&str]) -> Result<Vec<Vec<f32>>>,
    ) -> Result<BTreeMap<String, f64>> {
        let wanted = task.layout();
        if self.layout != wanted {
            return Err(Error::Input(format!(
                "{}: {task} needs {}, the file holds {}",
                self.path.display(),
                wanted.describe(),
                self.layout.describe()
            )));
        }
        let mut unit_vectors = |j: usize| -> Result<Vec<Vec<f32>>> {
            let texts: Vec<&str> = self.column(j).collect();
            let mut vectors = embed(&texts)?;
            if vectors.len() != texts.len() {
                return Err(Error::Input(format!(
                    "{} embeddings for {} texts",
                    vectors.len(),
                    texts.len()
                )));
            }
            vectors.iter_mut().for_each(|v| normalize_in_place(v));
            Ok(vectors)
        };
        let (first, second) = (unit_vectors(0)?, unit_vectors(1)?);
        match task {
            EmbeddingEval::Sts => {
                let cosine: Vec<f64> = first
                    .iter()
                    .zip(&second)
                    .map(|(a, b)| f64::from(a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()))
                    .collect();
                let gold: Vec<f64> = self
                    .scores
                    .iter()
                    .flatten()
                    .map(|&s| f64::from(s))
                    .collect();
                sts_scores(&cosine, &gold)
            }
            EmbeddingEval::Retrieval => {
                let texts: Vec<&str> = self.column(1).collect();
                retrieval_scores(&first, &second, &texts)
            }
        }
    }
}

impl PairLayout {
    /// What the layout's rows hold, for errors.
    fn describe(self) -> &'static str {
        match self {
            Self::Texts => "(anchor, positive) texts",
            Self::Scored => "scored pairs (sentence1, sentence2, score)",
        }
    }
}

/// How sentence embeddings are scored on held-out data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingEval {
    /// Scored pairs: Spearman and Pearson ×100 of cosine similarity
    /// against the gold scores.
    Sts,
    /// (anchor, positive) pairs: recall@1/5/10, MRR@10, NDCG@10 of each
    /// anchor's positive among all positives.
    Retrieval,
}

impl EmbeddingEval {
    /// The evaluation a file of this layout gets.
    pub fn for_layout(layout: PairLayout) -> Self {
        match layout {
            PairLayout::Scored => Self::Sts,
            PairLayout::Texts => Self::Retrieval,
        }
    }

    /// The layout it needs.
    pub fn layout(self) -> PairLayout {
        match self {
            Self::Sts => PairLayout::Scored,
            Self::Retrieval => PairLayout::Texts,
        }
    }

    /// The score that picks the best checkpoint (higher is better):
    /// `spearman` or `ndcg@10`.
    pub fn main_metric(self) -> &'static str {
        match self {
            Self::Sts => STS_MAIN_METRIC,
            Self::Retrieval => RETRIEVAL_MAIN_METRIC,
        }
    }
}

impl FromStr for EmbeddingEval {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sts" => Ok(Self::Sts),
            "retrieval" => Ok(Self::Retrieval),
            other => Err(Error::Input(format!(
                "unknown embedding evaluation `{other}` (expected sts or retrieval)"
            ))),
        }
    }
}

impl std::fmt::Display for EmbeddingEval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sts => "sts",
            Self::Retrieval => "retrieval",
        })
    }
}

/// Picks the layout from the header.
fn plan(table: &Table, origin: &str, c: &PairColumns) -> Result<Plan> {
    let find = |name: &str| table.column(name);
    if let (Some(a), Some(p)) = (find(&c.anchor), find(&c.positive)) {
        let mut texts = vec![(c.anchor.clone(), a), (c.positive.clone(), p)];
        texts.extend(
            table
                .columns
                .iter()
                .enumerate()
                .filter(|(i, name)| name.starts_with(&c.negative_prefix) && *i != a && *i != p)
                .map(|(i, name)| (name.clone(), i)),
        );
        return Ok(Plan {
            layout: PairLayout::Texts,
            texts,
            score: None,
        });
    }
    if let (Some(s1), Some(s2), Some(s)) = (find(&c.sentence1), find(&c.sentence2), find(&c.score))
    {
        return Ok(Plan {
            layout: PairLayout::Scored,
            texts: vec![(c.sentence1.clone(), s1), (c.sentence2.clone(), s2)],
            score: Some((c.score.clone(), s, 1.0)),
        });
    }
    Err(Error::Input(format!(
        "{origin}: no `{}` and `{}` columns (pairs, with `{}...` negatives) nor `{}`, `{}` and \
         `{}` (scored pairs): the {} has {}; name them with --anchor-column and \
         --positive-column, or --sentence1-column, --sentence2-column and --score-column \
         (--stsb for an original STS Benchmark file)",
        c.anchor,
        c.positive,
        c.negative_prefix,
        c.sentence1,
        c.sentence2,
        c.score,
        table.format.header_name(),
        columns_list(&table.columns)
    )))
}

/// An STS Benchmark line has at least the 7 fields up to sentence2.
fn check_stsb_width(record: &Record) -> std::result::Result<(), String> {
    let want = STSB_SENTENCES[1] + 1;
    if record.len() < want {
        return Err(format!(
            "{} fields, an STS Benchmark line has at least {want} (genre, file, year, id, \
             score, sentence1, sentence2)",
            record.len()
        ));
    }
    Ok(())
}

/// The score in column `index` divided by `scale`, which must land in 0..1.
fn score(
    record: &Record,
    index: usize,
    name: &str,
    scale: f64,
    stsb: bool,
) -> std::result::Result<f32, String> {
    let raw = match record.cell(index, name)? {
        Cell::Missing => return Err(format!("no field `{name}`")),
        Cell::Text(t) => t.trim().parse::<f64>().ok(),
        Cell::Json(Value::Number(n)) => n.as_f64(),
        Cell::Json(Value::String(t)) => t.trim().parse::<f64>().ok(),
        Cell::Json(_) => None,
    };
    let value = raw
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("the score in column `{name}` is not a number"))?;
    if !(0.0..=scale).contains(&value) {
        let hint = if stsb {
            ""
        } else {
            " (an original STS Benchmark file with 0..5 scores: --stsb; else rescale the \
             scores to 0..1)"
        };
        return Err(format!(
            "score {value} in column `{name}` is outside 0..{scale}{hint}"
        ));
    }
    // Divided in f64, as Python divides STS-B's scores.
    Ok((value / scale) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, body: &str, opts: &PairOptions) -> Result<EmbeddingData> {
        EmbeddingData::from_bytes(body.as_bytes(), Path::new(name), opts)
    }

    fn err(name: &str, body: &str, opts: &PairOptions) -> String {
        parse(name, body, opts).unwrap_err().to_string()
    }

    #[test]
    fn triplets_keep_negatives_in_file_order_and_skip_other_columns() {
        let tsv = "id\tnegative_b\tanchor\tsplit\tpositive\tnegative_a\n\
                   1\tn1\ta\tdev\tp\tn2\n";
        let d = parse("t.tsv", tsv, &PairOptions::default()).unwrap();
        assert_eq!(d.layout, PairLayout::Texts);
        assert_eq!(
            d.columns,
            ["anchor", "positive", "negative_b", "negative_a"]
        );
        assert_eq!(d.rows, [["a", "p", "n1", "n2"]]);
        assert_eq!(d.negatives(), 2);
        assert_eq!(d.scores, None);
        assert_eq!(d.lines, [2]);
    }

    #[test]
    fn scored_pairs_from_jsonl_and_renamed_csv_columns() {
        let jsonl = "{\"sentence1\": \"a\", \"sentence2\": \"b\", \"score\": 0.25}\n\
                     \n{\"sentence1\": \"c\", \"sentence2\": \"d\", \"score\": \"1\"}\n";
        let d = parse("s.jsonl", jsonl, &PairOptions::default()).unwrap();
        assert_eq!(d.layout, PairLayout::Scored);
        assert_eq!(d.rows, [["a", "b"], ["c", "d"]]);
        assert_eq!(d.scores, Some(vec![0.25, 1.0]));
        assert_eq!(d.lines, [1, 3]);
        let csv = "q,doc,sim\n\"x, y\",z,0.5\n";
        let opts = PairOptions {
            columns: PairColumns {
                sentence1: "q".into(),
                sentence2: "doc".into(),
                score: "sim".into(),
                ..PairColumns::default()
            },
            ..PairOptions::default()
        };
        let d = parse("s.csv", csv, &opts).unwrap();
        assert_eq!(d.columns, ["q", "doc"]);
        assert_eq!(d.rows, [["x, y", "z"]]);
    }

    #[test]
    fn stsb_originals_are_read_by_position_and_rescaled() {
        let stsb = "g\tf\t2012\t1\t2.5\tA \"quoted\tB\n\
                    g\tf\t2012\t2\t5.000\tC\tD\tsource1\tsource2\n";
        let opts = PairOptions {
            stsb: true,
            ..PairOptions::default()
        };
        let d = parse("sts-test.csv", stsb, &opts).unwrap();
        assert_eq!(d.layout, PairLayout::Scored);
        assert_eq!(d.columns, ["sentence1", "sentence2"]);
        assert_eq!(d.rows, [["A \"quoted", "B"], ["C", "D"]]);
        assert_eq!(d.scores, Some(vec![0.5, 1.0]));
        let e = err("sts.csv", "g\tf\t2012\t1\t2.5\tA\n", &opts);
        assert!(
            e.starts_with("sts.csv: line 1: 6 fields, an STS Benchmark line"),
            "{e}"
        );
        let e = err("sts.csv", "g\tf\t2012\t1\t5.5\tA\tB\n", &opts);
        assert_eq!(
            e,
            "sts.csv: line 1: score 5.5 in column `score` is outside 0..5"
        );
        let opts = PairOptions {
            stsb: true,
            max_rows: Some(1),
            ..PairOptions::default()
        };
        assert_eq!(parse("sts.csv", stsb, &opts).unwrap().len(), 1);
    }

    #[test]
    fn bad_rows_name_file_line_and_column() {
        let o = PairOptions::default();
        let e = err("p.tsv", "anchor\tpositive\na\tb\nc\t \n", &o);
        assert_eq!(e, "p.tsv: line 3: empty text in column `positive`");
        let e = err("p.tsv", "anchor\tpositive\na\tb\tc\n", &o);
        assert_eq!(
            e,
            "p.tsv: line 2: 3 fields, but the header has 2 (a tab inside a text?)"
        );
        let e = err("s.tsv", "sentence1\tsentence2\tscore\na\tb\t3.8\n", &o);
        assert!(
            e.starts_with("s.tsv: line 2: score 3.8 in column `score` is outside 0..1 (")
                && e.contains("--stsb"),
            "{e}"
        );
        let e = err("s.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n", &o);
        assert_eq!(
            e,
            "s.tsv: line 2: the score in column `score` is not a number"
        );
        let e = err("p.jsonl", "{\"anchor\": \"a\", \"positive\": 3}\n", &o);
        assert_eq!(e, "p.jsonl: line 1: field `positive` is not a string");
        let e = err("p.tsv", "anchor\tpositive\n", &o);
        assert_eq!(e, "p.tsv: no examples: the file has a header only");
        assert!(err("p.tsv", " \n", &o).contains("empty"));
    }

    #[test]
    fn unknown_layout_lists_columns_and_flags() {
        let e = err("x.csv", "question,answer\na,b\n", &PairOptions::default());
        assert!(
            e.starts_with("x.csv: no `anchor` and `positive` columns"),
            "{e}"
        );
        for part in [
            "`question`, `answer`",
            "--anchor-column",
            "--score-column",
            "--stsb",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        let opts = PairOptions {
            columns: PairColumns {
                negative_prefix: String::new(),
                ..PairColumns::default()
            },
            ..PairOptions::default()
        };
        assert_eq!(
            err("x.csv", "a\nb\n", &opts),
            "negative_prefix must not be empty"
        );
    }

    #[test]
    fn split_off_and_truncate_keep_rows_scores_and_lines_together() {
        let tsv = "sentence1\tsentence2\tscore\na\tb\t0\nc\td\t0.5\ne\tf\t1\n";
        let mut d = parse("s.tsv", tsv, &PairOptions::default()).unwrap();
        let tail = d.split_off(2);
        assert_eq!((d.len(), tail.len()), (2, 1));
        assert_eq!(tail.rows, [["e", "f"]]);
        assert_eq!(tail.scores, Some(vec![1.0]));
        assert_eq!(tail.lines, [4]);
        d.truncate(1);
        assert_eq!(d.column(1).collect::<Vec<_>>(), ["b"]);
        assert_eq!(d.scores, Some(vec![0.0]));
    }

    #[test]
    fn evaluate_checks_the_layout_and_normalises() {
        let tsv = "sentence1\tsentence2\tscore\na\tb\t0\na\tc\t0.5\na\td\t1\n";
        let d = parse("s.tsv", tsv, &PairOptions::default()).unwrap();
        // Unnormalised vectors whose cosine with `a` rises b < c < d.
        let embed = |texts: &[&str]| -> Result<Vec<Vec<f32>>> {
            Ok(texts
                .iter()
                .map(|t| match *t {
                    "a" => vec![10.0, 0.0],
                    "b" => vec![0.0, 3.0],
                    "c" => vec![1.0, 1.0],
                    _ => vec![5.0, 0.1],
                })
                .collect())
        };
        let s = d.evaluate(EmbeddingEval::Sts, embed).unwrap();
        assert!((s["spearman"] - 100.0).abs() < 1e-9, "{s:?}");
        let e = d.evaluate(EmbeddingEval::Retrieval, embed).unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.tsv: retrieval needs (anchor, positive) texts, the file holds scored pairs \
             (sentence1, sentence2, score)"
        );
        let short = |_: &[&str]| -> Result<Vec<Vec<f32>>> { Ok(vec![vec![1.0]]) };
        assert!(d.evaluate(EmbeddingEval::Sts, short).is_err());
    }
}
