//! Labelled texts for a map: a TSV / CSV with a header, JSON Lines, or one
//! text per line (labels then come from a second file, one per line).
//!
//! Errors name the file, the column and the line: a missing column lists
//! the columns the header has.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::texts::{self, columns_list, Cell, Record, Table, TableFormat};

/// Text columns tried, in order, when none is named (SST-2 says `sentence`).
pub const DEFAULT_TEXT_COLUMNS: [&str; 2] = ["sentence", "text"];
/// The label column used when none is named and the header has it.
pub const DEFAULT_LABEL_COLUMN: &str = "label";

/// Which columns (or which labels file) to read.
#[derive(Debug, Clone, Default)]
pub struct ReadSpec {
    /// The text column; default the first of [`DEFAULT_TEXT_COLUMNS`] present.
    pub text_column: Option<String>,
    /// The label column; default [`DEFAULT_LABEL_COLUMN`] when present. A
    /// named column must exist.
    pub label_column: Option<String>,
    /// Labels one per line, aligned with the texts (instead of a column).
    pub labels_file: Option<PathBuf>,
}

/// How an input file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One text per line, no header.
    Lines,
    /// Tab-separated with a header row; fields are not quoted (GLUE's files).
    Tsv,
    /// Comma-separated with a header row; fields may be quoted (RFC 4180).
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl Format {
    /// By extension (`.tsv`, `.csv`, `.jsonl` / `.ndjson`); other files are
    /// lines of text unless a column is named, when the first line decides
    /// (`{` JSONL, a tab TSV, else CSV).
    pub fn detect(path: &Path, first_line: &str, columns_named: bool) -> Self {
        let table = match TableFormat::by_extension(path) {
            Some(f) => f,
            None if !columns_named => return Self::Lines,
            None => TableFormat::sniff(first_line),
        };
        match table {
            TableFormat::Tsv => Self::Tsv,
            TableFormat::Csv => Self::Csv,
            TableFormat::Jsonl => Self::Jsonl,
        }
    }
}

/// Texts with their labels (absent when the input has none) and the input
/// line each came from (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct LabeledTexts {
    pub texts: Vec<String>,
    pub labels: Option<Vec<String>>,
    pub lines: Vec<usize>,
}

impl LabeledTexts {
    /// Reads `path` as `spec` says; an input without texts is an error.
    pub fn read(path: &Path, spec: &ReadSpec) -> Result<Self> {
        if spec.label_column.is_some() && spec.labels_file.is_some() {
            return Err(Error::Input(
                "give either a label column or a labels file, not both".into(),
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let origin = path.display().to_string();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Input(format!(
                "{origin}: the input is empty: there are no texts to map"
            )));
        }
        let first_line = bytes
            .split(|b| *b == b'\n')
            .next()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        let named = spec.text_column.is_some() || spec.label_column.is_some();
        let mut out = match Format::detect(path, &first_line, named) {
            Format::Lines => {
                let texts = texts::lines_from_bytes(&bytes, &origin)?;
                let lines = (1..=texts.len()).collect();
                Self {
                    texts,
                    labels: None,
                    lines,
                }
            }
            Format::Tsv => read_table(&bytes, &origin, TableFormat::Tsv, spec)?,
            Format::Csv => read_table(&bytes, &origin, TableFormat::Csv, spec)?,
            Format::Jsonl => read_table(&bytes, &origin, TableFormat::Jsonl, spec)?,
        };
        if out.texts.is_empty() {
            return Err(Error::Input(format!(
                "{origin}: no texts: the file has a header but no rows"
            )));
        }
        if let Some(labels_path) = &spec.labels_file {
            out.labels = Some(read_labels_file(labels_path, out.texts.len(), &origin)?);
        }
        Ok(out)
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// Renames labels by `KEY=NAME` pairs separated by commas (e.g.
    /// `0=negative,1=positive`); labels not named keep their value.
    pub fn rename_labels(&mut self, spec: &str) -> Result<()> {
        let mut names = HashMap::new();
        for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, name) = pair
                .split_once('=')
                .map(|(k, n)| (k.trim(), n.trim()))
                .filter(|(k, n)| !k.is_empty() && !n.is_empty())
                .ok_or_else(|| {
                    Error::Input(format!(
                        "label names: `{pair}` is not KEY=NAME (e.g. 0=negative,1=positive)"
                    ))
                })?;
            names.insert(key.to_string(), name.to_string());
        }
        let labels = self.labels.as_mut().ok_or_else(|| {
            Error::Input("label names were given but the input has no labels".into())
        })?;
        for l in labels.iter_mut() {
            if let Some(n) = names.get(l.as_str()) {
                l.clone_from(n);
            }
        }
        Ok(())
    }

    /// The first `per_label` texts of each label (in input order), then the
    /// first `limit` of those.
    pub fn select(&self, per_label: Option<usize>, limit: Option<usize>) -> Result<Self> {
        let mut keep: Vec<usize> = (0..self.len()).collect();
        if let Some(n) = per_label {
            let labels = self.labels.as_ref().ok_or_else(|| {
                Error::Input("taking N texts per label needs labels: the input has none".into())
            })?;
            let mut seen: HashMap<&str, usize> = HashMap::new();
            keep.retain(|&i| {
                let c = seen.entry(labels[i].as_str()).or_insert(0);
                *c += 1;
                *c <= n
            });
        }
        if let Some(n) = limit {
            keep.truncate(n);
        }
        if keep.is_empty() {
            return Err(Error::Input(
                "no texts left after taking per_label / limit".into(),
            ));
        }
        Ok(Self {
            texts: keep.iter().map(|&i| self.texts[i].clone()).collect(),
            labels: self
                .labels
                .as_ref()
                .map(|l| keep.iter().map(|&i| l[i].clone()).collect()),
            lines: keep.iter().map(|&i| self.lines[i]).collect(),
        })
    }

    /// The distinct labels in display order (numeric order when every label
    /// is a number, else string order) and each text's index into them.
    /// Without labels: one group, `(unlabelled)`.
    pub fn groups(&self) -> (Vec<String>, Vec<usize>) {
        let Some(labels) = &self.labels else {
            return (vec!["(unlabelled)".into()], vec![0; self.len()]);
        };
        let mut names: Vec<String> = labels.clone();
        names.sort();
        names.dedup();
        let numeric: Option<Vec<f64>> = names.iter().map(|n| n.parse::<f64>().ok()).collect();
        if let Some(values) = numeric {
            let mut pairs: Vec<(f64, String)> = values.into_iter().zip(names).collect();
            pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            names = pairs.into_iter().map(|(_, n)| n).collect();
        }
        let index: HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect();
        let idx = labels.iter().map(|l| index[l.as_str()]).collect();
        (names, idx)
    }
}

/// Finds the text and label columns among `names` (a header, or the keys
/// of the first JSON object).
fn pick_columns(
    names: &[String],
    origin: &str,
    spec: &ReadSpec,
    what: &str,
) -> Result<(String, Option<String>)> {
    let has = |c: &str| names.iter().any(|n| n == c);
    let text = match &spec.text_column {
        Some(c) if has(c) => c.clone(),
        Some(c) => {
            return Err(Error::Input(format!(
                "{origin}: no text column `{c}` in the {what} (it has {})",
                columns_list(names)
            )))
        }
        None => DEFAULT_TEXT_COLUMNS
            .iter()
            .find(|c| has(c))
            .map(|c| c.to_string())
            .ok_or_else(|| {
                Error::Input(format!(
                    "{origin}: no text column: the {what} has {} but neither `sentence` nor \
                     `text`; name the text column",
                    columns_list(names)
                ))
            })?,
    };
    let label = match &spec.label_column {
        Some(c) if has(c) => Some(c.clone()),
        Some(c) => {
            return Err(Error::Input(format!(
                "{origin}: no label column `{c}` in the {what} (it has {})",
                columns_list(names)
            )))
        }
        None if spec.labels_file.is_none() && has(DEFAULT_LABEL_COLUMN) => {
            Some(DEFAULT_LABEL_COLUMN.to_string())
        }
        None => None,
    };
    Ok((text, label))
}

/// Texts (and labels) of a table's rows; errors name the line.
fn read_table(
    bytes: &[u8],
    origin: &str,
    format: TableFormat,
    spec: &ReadSpec,
) -> Result<LabeledTexts> {
    let table = Table::parse(bytes, origin, format)?;
    let (text_col, label_col) =
        pick_columns(&table.columns, origin, spec, table.format.header_name())?;
    let position = |c: &str| table.column(c).unwrap_or(0);
    let text_idx = position(&text_col);
    let label_idx = label_col.as_deref().map(position);
    let mut out = LabeledTexts {
        texts: Vec::new(),
        labels: label_idx.map(|_| Vec::new()),
        lines: Vec::new(),
    };
    for (line, record) in &table.rows {
        let at = |reason: String| Error::Input(format!("{origin}: line {line}: {reason}"));
        let record = record.as_ref().map_err(|r| at(r.clone()))?;
        if record.is_blank() {
            continue;
        }
        let cell = |idx: usize, name: &str| -> Result<Cell> {
            match record.cell(idx, name).map_err(at)? {
                Cell::Missing => Err(at(match record {
                    Record::Fields(r) => format!(
                        "no field `{name}` (column {}): the row has {} fields",
                        idx + 1,
                        r.len()
                    ),
                    Record::Object(_) => format!("no field `{name}`"),
                })),
                c => Ok(c),
            }
        };
        match cell(text_idx, &text_col)? {
            Cell::Text(t) => out.texts.push(t.to_string()),
            Cell::Json(Value::String(t)) => out.texts.push(t.clone()),
            _ => return Err(at(format!("field `{text_col}` is not a string"))),
        }
        if let (Some(idx), Some(labels), Some(name)) =
            (label_idx, out.labels.as_mut(), label_col.as_deref())
        {
            let label = match cell(idx, name)? {
                Cell::Text(t) if !t.trim().is_empty() => t.trim().to_string(),
                Cell::Text(_) => return Err(at(format!("empty label in column `{name}`"))),
                Cell::Json(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
                Cell::Json(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                _ => {
                    return Err(at(format!(
                        "field `{name}` is not a label (a non-empty string, a number or a \
                         boolean)"
                    )))
                }
            };
            labels.push(label);
        }
        out.lines.push(*line);
    }
    Ok(out)
}

fn read_labels_file(path: &Path, n_texts: usize, texts_origin: &str) -> Result<Vec<String>> {
    let mut labels = texts::read_lines_from_file(path)?;
    while labels.len() > n_texts && labels.last().is_some_and(|l| l.trim().is_empty()) {
        labels.pop();
    }
    if labels.len() != n_texts {
        return Err(Error::Input(format!(
            "{}: {} labels for the {n_texts} texts of {texts_origin} (expected one label per text)",
            path.display(),
            labels.len()
        )));
    }
    labels
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let l = l.trim();
            if l.is_empty() {
                Err(Error::Input(format!(
                    "{}: line {}: empty label",
                    path.display(),
                    i + 1
                )))
            } else {
                Ok(l.to_string())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn reads_tsv_csv_jsonl_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let tsv = write(
            dir.path(),
            "a.tsv",
            "sentence\tlabel\nit 's \"good\" \t1\n\nbad\t0\n",
        );
        let t = LabeledTexts::read(&tsv, &ReadSpec::default()).unwrap();
        assert_eq!(t.texts, vec!["it 's \"good\" ", "bad"]);
        assert_eq!(t.labels, Some(vec!["1".to_string(), "0".to_string()]));
        assert_eq!(t.lines, vec![2, 4]);
        assert_eq!(t.groups(), (vec!["0".into(), "1".into()], vec![1, 0]));

        let csv = write(
            dir.path(),
            "b.csv",
            "id,text,topic\n1,\"hello, world\",greet\n2,\"say \"\"bye\"\"\",leave\n",
        );
        let spec = ReadSpec {
            label_column: Some("topic".into()),
            ..Default::default()
        };
        let t = LabeledTexts::read(&csv, &spec).unwrap();
        assert_eq!(t.texts, vec!["hello, world", "say \"bye\""]);
        assert_eq!(t.labels.unwrap(), vec!["greet", "leave"]);

        let jsonl = write(
            dir.path(),
            "c.jsonl",
            "{\"text\": \"a\", \"label\": 2}\n{\"text\": \"b\", \"label\": 10}\n",
        );
        let t = LabeledTexts::read(&jsonl, &ReadSpec::default()).unwrap();
        assert_eq!(
            t.groups().0,
            vec!["2", "10"],
            "numeric labels sort as numbers"
        );

        let lines = write(dir.path(), "d.txt", "x\ny\n");
        let labels = write(dir.path(), "d.labels", "pos\nneg\n");
        let spec = ReadSpec {
            labels_file: Some(labels),
            ..Default::default()
        };
        let t = LabeledTexts::read(&lines, &spec).unwrap();
        assert_eq!(t.texts, vec!["x", "y"]);
        assert_eq!(t.labels.unwrap(), vec!["pos", "neg"]);
    }

    #[test]
    fn per_label_and_limit_keep_input_order() {
        let t = LabeledTexts {
            texts: ["a", "b", "c", "d", "e"].map(String::from).to_vec(),
            labels: Some(["1", "1", "0", "1", "0"].map(String::from).to_vec()),
            lines: vec![2, 3, 4, 5, 6],
        };
        let s = t.select(Some(1), None).unwrap();
        assert_eq!(s.texts, vec!["a", "c"]);
        assert_eq!(s.lines, vec![2, 4]);
        let s = t.select(Some(2), Some(3)).unwrap();
        assert_eq!(s.texts, vec!["a", "b", "c"]);
        let unlabelled = LabeledTexts { labels: None, ..t };
        assert!(unlabelled.select(Some(1), None).is_err());
    }
}
