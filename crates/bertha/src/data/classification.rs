//! Sentence and sentence-pair classification files (GLUE style): TSV, CSV
//! or JSON Lines with a header (JSONL: the first object's keys).
//!
//! Columns are found by name: `sentence` (SST-2), or pairs such as
//! `sentence1`/`sentence2` (MRPC, RTE), `question`/`sentence` (QNLI),
//! `premise`/`hypothesis`, `text_a`/`text_b`; the label is `label`
//! (`labels`, `gold_label`, `score` also work). Labels are class names or
//! integer ids, or numbers for regression ([`LabelKind::Scores`]).
//!
//! A malformed row (wrong number of fields, invalid UTF-8, invalid JSON, an
//! empty text or label, a label outside a given label set, a score that is
//! not a number) is an error naming the file and line, or, with
//! [`ReadOptions::skip_bad_rows`], is skipped and counted. Problems with the
//! file as a whole (empty, no header, missing columns) are always errors.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::labels::LabelSet;
use crate::error::{Error, Result};
use crate::io::texts::{columns_list, Cell, Record, Table};

/// Text columns tried when none is named: pairs first, then single texts.
pub const PAIR_COLUMNS: [(&str, &str); 6] = [
    ("sentence1", "sentence2"),
    ("text_a", "text_b"),
    ("question", "sentence"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("text", "text_pair"),
];
pub const TEXT_COLUMNS: [&str; 5] = ["sentence", "text", "text_a", "sentence1", "question"];
pub const LABEL_COLUMNS: [&str; 4] = ["label", "labels", "gold_label", "score"];

/// How a file is laid out: the shared table formats.
pub use crate::io::texts::TableFormat as FileFormat;

/// What the label column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelKind {
    /// Class names or integer class ids.
    #[default]
    Classes,
    /// Numbers to regress on (STS-B similarity scores).
    Scores,
}

#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Default: by extension, else sniffed ([`FileFormat::detect`]).
    pub format: Option<FileFormat>,
    /// The (first) text column; default from [`PAIR_COLUMNS`] / [`TEXT_COLUMNS`].
    pub text_column: Option<String>,
    /// The second text of a pair; default: the partner of an auto-detected
    /// pair, none when `text_column` is named.
    pub pair_column: Option<String>,
    /// Default: the first of [`LABEL_COLUMNS`] in the header.
    pub label_column: Option<String>,
    pub label_kind: LabelKind,
    /// Fixed label ids (the training set's, or a checkpoint's `id2label`):
    /// labels outside them are bad rows. `None`: inferred from this file
    /// ([`LabelSet::infer`]).
    pub labels: Option<LabelSet>,
    /// Skip and count malformed rows instead of failing on the first.
    pub skip_bad_rows: bool,
    /// Accept a file without a label column (for prediction): its examples
    /// have [`LabelValue::Unlabelled`].
    pub allow_unlabelled: bool,
}

/// An example's gold label.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LabelValue {
    /// An id into [`ClassificationData::labels`].
    Class(usize),
    /// A regression target.
    Score(f32),
    /// The file has no label column (prediction inputs).
    Unlabelled,
}

impl LabelValue {
    pub fn class(self) -> Option<usize> {
        match self {
            Self::Class(c) => Some(c),
            _ => None,
        }
    }

    pub fn score(self) -> Option<f32> {
        match self {
            Self::Score(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClassificationExample {
    pub text_a: String,
    pub text_b: Option<String>,
    pub label: LabelValue,
    /// 1-based line of the file the example starts on.
    pub line: usize,
}

/// A row that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    pub line: usize,
    pub reason: String,
}

/// The columns a file was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub text: String,
    pub pair: Option<String>,
    pub label: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ClassificationData {
    pub path: PathBuf,
    pub format: FileFormat,
    pub columns: Columns,
    pub examples: Vec<ClassificationExample>,
    /// Class names ↔ ids (empty for [`LabelKind::Scores`] and unlabelled files).
    pub labels: LabelSet,
    /// Rows skipped as malformed (only with `skip_bad_rows`).
    pub skipped: usize,
    /// Line and reason of each skipped row.
    pub bad_rows: Vec<BadRow>,
}

/// A row's fields before the label is interpreted.
struct RawRow {
    text_a: String,
    text_b: Option<String>,
    label: Option<String>,
}

type Rows = Vec<(usize, std::result::Result<RawRow, String>)>;

impl ClassificationData {
    pub fn read(path: &Path, opts: &ReadOptions) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path, opts)
    }

    /// Parses file contents; `path` names them in errors and picks the
    /// format by extension.
    pub fn from_bytes(bytes: &[u8], path: &Path, opts: &ReadOptions) -> Result<Self> {
        let origin = path.display().to_string();
        let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Input(format!(
                "{origin}: the file is empty: expected a header row and examples"
            )));
        }
        let format = opts
            .format
            .unwrap_or_else(|| FileFormat::detect(path, bytes));
        let (columns, rows) = read_rows(bytes, &origin, format, opts)?;

        let mut bad_rows = Vec::new();
        let mut bad = |line: usize, reason: String| -> Result<()> {
            if opts.skip_bad_rows {
                bad_rows.push(BadRow { line, reason });
                Ok(())
            } else {
                Err(Error::Input(format!("{origin}: line {line}: {reason}")))
            }
        };
        let mut good: Vec<(usize, RawRow)> = Vec::with_capacity(rows.len());
        for (line, row) in rows {
            match row {
                Ok(r) => good.push((line, r)),
                Err(reason) => bad(line, reason)?,
            }
        }

        let labelled = columns.label.is_some();
        let labels = match (&opts.labels, opts.label_kind, labelled) {
            (Some(set), LabelKind::Classes, _) => set.clone(),
            (None, LabelKind::Classes, true) => {
                LabelSet::infer(good.iter().filter_map(|(_, r)| r.label.as_deref()))
            }
            _ => LabelSet::default(),
        };
        let mut examples = Vec::with_capacity(good.len());
        for (line, row) in good {
            let label = match (row.label, opts.label_kind) {
                (None, _) => LabelValue::Unlabelled,
                (Some(l), LabelKind::Classes) => match labels.id(&l) {
                    Some(id) => LabelValue::Class(id),
                    None => {
                        bad(
                            line,
                            format!("unknown label `{l}` (the labels are {})", labels.listed()),
                        )?;
                        continue;
                    }
                },
                (Some(l), LabelKind::Scores) => match l.parse::<f32>() {
                    Ok(s) if s.is_finite() => LabelValue::Score(s),
                    _ => {
                        bad(line, format!("label `{l}` is not a number"))?;
                        continue;
                    }
                },
            };
            examples.push(ClassificationExample {
                text_a: row.text_a,
                text_b: row.text_b,
                label,
                line,
            });
        }
        if examples.is_empty() {
            let why = if bad_rows.is_empty() {
                "the file has a header but no examples".to_string()
            } else {
                format!("all {} rows were malformed", bad_rows.len())
            };
            return Err(Error::Input(format!("{origin}: no examples: {why}")));
        }
        Ok(Self {
            path: path.to_path_buf(),
            format,
            columns,
            examples,
            labels,
            skipped: bad_rows.len(),
            bad_rows,
        })
    }

    pub fn len(&self) -> usize {
        self.examples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Whether the examples are sentence pairs.
    pub fn is_pair(&self) -> bool {
        self.columns.pair.is_some()
    }

    /// The class id of every example, for accuracy / F1; an error when
    /// any example is unlabelled or a score.
    pub fn class_ids(&self) -> Result<Vec<usize>> {
        self.every_label("class", |l| l.class())
    }

    /// The regression target of every example.
    pub fn scores(&self) -> Result<Vec<f32>> {
        self.every_label("score", |l| l.score())
    }

    /// `pick` of every example's label; an error naming the first example
    /// without a label of that `kind`.
    fn every_label<T>(
        &self,
        kind: &str,
        pick: impl Fn(&LabelValue) -> Option<T>,
    ) -> Result<Vec<T>> {
        self.examples
            .iter()
            .map(|e| {
                pick(&e.label).ok_or_else(|| {
                    Error::Input(format!(
                        "{}: line {}: the example has no {kind} label",
                        self.path.display(),
                        e.line
                    ))
                })
            })
            .collect()
    }
}

/// Picks the text, pair and label columns among `names` (a header, or the
/// keys of the first JSON object).
fn pick_columns(names: &[String], origin: &str, opts: &ReadOptions, what: &str) -> Result<Columns> {
    let has = |c: &str| names.iter().any(|n| n == c);
    let missing = |role: &str, c: &str| {
        Error::Input(format!(
            "{origin}: no {role} column `{c}` in the {what} (it has {})",
            columns_list(names)
        ))
    };
    let (text, pair) = match (&opts.text_column, &opts.pair_column) {
        (Some(t), _) if !has(t) => return Err(missing("text", t)),
        (_, Some(p)) if !has(p) => return Err(missing("pair", p)),
        (Some(t), p) => (t.clone(), p.clone()),
        (None, p) => {
            let auto_pair = PAIR_COLUMNS
                .iter()
                .find(|(a, b)| has(a) && has(b))
                .filter(|_| p.is_none());
            match auto_pair {
                Some((a, b)) => (a.to_string(), Some(b.to_string())),
                None => {
                    let text = TEXT_COLUMNS
                        .iter()
                        .find(|c| has(c) && p.as_deref() != Some(**c))
                        .ok_or_else(|| {
                            Error::Input(format!(
                                "{origin}: no text column: the {what} has {}, none of {}; \
                                 name the text column",
                                columns_list(names),
                                TEXT_COLUMNS.map(|c| format!("`{c}`")).join(", ")
                            ))
                        })?;
                    (text.to_string(), p.clone())
                }
            }
        }
    };
    let label = match &opts.label_column {
        Some(c) if has(c) => Some(c.clone()),
        Some(c) => return Err(missing("label", c)),
        None => match LABEL_COLUMNS.iter().find(|c| has(c)) {
            Some(c) => Some(c.to_string()),
            None if opts.allow_unlabelled => None,
            None => {
                return Err(Error::Input(format!(
                    "{origin}: no label column: the {what} has {}, none of {}; name the label \
                     column",
                    columns_list(names),
                    LABEL_COLUMNS.map(|c| format!("`{c}`")).join(", ")
                )))
            }
        },
    };
    Ok(Columns { text, pair, label })
}

fn label_field(value: &str, name: &str) -> std::result::Result<String, String> {
    let v = value.trim();
    if v.is_empty() {
        Err(format!("empty label in column `{name}`"))
    } else {
        Ok(v.to_string())
    }
}

/// The rows of a table as texts and labels; a row's problem is its `Err`.
fn read_rows(
    bytes: &[u8],
    origin: &str,
    format: FileFormat,
    opts: &ReadOptions,
) -> Result<(Columns, Rows)> {
    let table = Table::parse(bytes, origin, format)?;
    let header = &table.columns;
    let columns = pick_columns(header, origin, opts, format.header_name())?;
    let index = |c: &str| table.column(c).unwrap_or(0);
    let text_idx = index(&columns.text);
    let pair_idx = columns.pair.as_deref().map(index);
    let label_idx = columns.label.as_deref().map(index);
    let row = |record: &Record| -> std::result::Result<RawRow, String> {
        table.check_width(record)?;
        let text = |idx: usize, name: &str| record.text(idx, name).map(str::to_string);
        let text_a = text(text_idx, &columns.text)?;
        let text_b = match (pair_idx, &columns.pair) {
            (Some(i), Some(name)) => Some(text(i, name)?),
            _ => None,
        };
        let label = match (label_idx, &columns.label) {
            (Some(i), Some(name)) => Some(match record.cell(i, name)? {
                Cell::Text(s) => label_field(s, name)?,
                Cell::Json(Value::String(s)) => label_field(s, name)?,
                Cell::Json(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                Cell::Json(_) => {
                    return Err(format!(
                        "field `{name}` is not a label (a non-empty string, a number or a \
                         boolean)"
                    ))
                }
                Cell::Missing => return Err(format!("no field `{name}`")),
            }),
            _ => None,
        };
        Ok(RawRow {
            text_a,
            text_b,
            label,
        })
    };
    let rows = table
        .rows
        .iter()
        .map(|(line, record)| (*line, record.as_ref().map_err(String::clone).and_then(row)))
        .collect();
    Ok((columns, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: &str, body: &str, opts: &ReadOptions) -> Result<ClassificationData> {
        ClassificationData::from_bytes(body.as_bytes(), Path::new(name), opts)
    }

    #[test]
    fn tsv_with_integer_labels() {
        let d = read(
            "dev.tsv",
            "sentence\tlabel\nit 's good . \t1\n\nbad \t0\n",
            &ReadOptions::default(),
        )
        .unwrap();
        assert_eq!(d.labels.names(), ["0", "1"]);
        assert_eq!(d.examples.len(), 2);
        assert_eq!(d.examples[0].text_a, "it 's good . ");
        assert_eq!(d.examples[0].label, LabelValue::Class(1));
        assert_eq!(d.examples[1].line, 4);
        assert!(!d.is_pair());
    }

    #[test]
    fn csv_pairs_with_quotes_and_named_labels() {
        let d = read(
            "x.csv",
            "premise,hypothesis,label\n\"A man, tall\",\"He is \"\"tall\"\"\",entailment\n\
             a,b,neutral\n",
            &ReadOptions::default(),
        )
        .unwrap();
        assert_eq!(d.columns.text, "premise");
        assert_eq!(d.columns.pair.as_deref(), Some("hypothesis"));
        assert_eq!(d.examples[0].text_a, "A man, tall");
        assert_eq!(d.examples[0].text_b.as_deref(), Some("He is \"tall\""));
        assert_eq!(d.labels.names(), ["entailment", "neutral"]);
        assert_eq!(d.class_ids().unwrap(), [0, 1]);
    }

    #[test]
    fn jsonl_numbers_and_scores() {
        let body = "{\"sentence1\": \"a\", \"sentence2\": \"b\", \"label\": 3.8}\n\
                    {\"sentence1\": \"c\", \"sentence2\": \"d\", \"label\": \"1\"}\n";
        let opts = ReadOptions {
            label_kind: LabelKind::Scores,
            ..Default::default()
        };
        let d = read("x.jsonl", body, &opts).unwrap();
        assert_eq!(d.scores().unwrap(), [3.8, 1.0]);
        assert!(d.labels.is_empty());
        assert!(d.class_ids().is_err());
    }

    #[test]
    fn bad_rows_error_or_are_skipped() {
        let body = "sentence\tlabel\ngood\t1\ntab\tinside\t0\n\t1\nfine\t0\n";
        let err = read("d.tsv", body, &ReadOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "d.tsv: line 3: 3 fields, but the header has 2 (a tab inside a text?)"
        );
        let opts = ReadOptions {
            skip_bad_rows: true,
            ..Default::default()
        };
        let d = read("d.tsv", body, &opts).unwrap();
        assert_eq!(d.skipped, 2);
        assert_eq!(d.bad_rows[1].line, 4);
        assert!(d.bad_rows[1].reason.contains("empty text"));
        assert_eq!(d.len(), 2);
    }

    #[test]
    fn fixed_label_set_rejects_unknown_labels() {
        let labels = LabelSet::from_names(vec!["neg".into(), "pos".into()]).unwrap();
        let opts = ReadOptions {
            labels: Some(labels),
            ..Default::default()
        };
        let d = read("a.tsv", "sentence\tlabel\nx\tpos\n", &opts).unwrap();
        assert_eq!(d.examples[0].label, LabelValue::Class(1));
        let err = read("a.tsv", "sentence\tlabel\nx\tpos\ny\tmaybe\n", &opts).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a.tsv: line 3: unknown label `maybe` (the labels are `neg`, `pos`)"
        );
    }

    #[test]
    fn whole_file_problems() {
        let opts = ReadOptions::default();
        assert!(read("e.tsv", " \n", &opts)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let err = read("e.tsv", "foo\tbar\n1\t2\n", &opts)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no text column") && err.contains("`foo`"),
            "{err}"
        );
        let err = read("e.tsv", "sentence\n1\n", &opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no label column"), "{err}");
        let unlabelled = ReadOptions {
            allow_unlabelled: true,
            ..Default::default()
        };
        let d = read("e.tsv", "sentence\nhello\n", &unlabelled).unwrap();
        assert_eq!(d.examples[0].label, LabelValue::Unlabelled);
        let err = read("e.tsv", "sentence\tlabel\n", &opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no examples"), "{err}");
    }

    #[test]
    fn invalid_utf8_names_the_line() {
        let body = b"sentence\tlabel\nok\t1\nbad \xff\t0\n";
        let err = ClassificationData::from_bytes(body, Path::new("u.tsv"), &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("u.tsv: line 3: column `sentence`: invalid UTF-8"),
            "{err}"
        );
    }
}
