//! Reranking data: queries with the documents judged for them. Three
//! shapes read, by their columns (TSV, CSV or JSON Lines with a header):
//!
//! - **labelled pairs**: a `label` column (0/1 or graded relevance), a
//!   query and a document;
//! - **tuples**: no `label` column: a query, its positive, and hard
//!   negatives (as sentence-transformers' `mine_hard_negatives` writes
//!   n-tuples);
//! - **lists** (JSON Lines): `query`, `documents` (strings) and `labels`
//!   (numbers, one per document).
//!
//! Columns are found by name: the query is `query` or `anchor`; the
//! document or positive `document`, `positive`, `answer` or `passage`;
//! negatives every `negative…` column. A delimited file without those
//! names is read by position: the query first, then the documents.
//!
//! A row with an empty text, a label that is not a finite number, or lists
//! of different lengths is an error naming the file and line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::texts::{Cell, Record, Table, TableFormat};

/// What the rows of a file hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RerankLayout {
    LabelledPairs,
    Tuples,
    Lists,
}

/// A query and the documents judged for it.
#[derive(Debug, Clone, PartialEq)]
pub struct RerankGroup {
    pub query: String,
    pub documents: Vec<String>,
    /// One per document; tuples: 1 for the positive (first), 0 for the
    /// negatives.
    pub labels: Vec<f32>,
    /// The 1-based line of the file the group starts at.
    pub line: usize,
}

#[derive(Debug, Clone)]
pub struct RerankData {
    pub path: PathBuf,
    pub layout: RerankLayout,
    /// One per row (labelled pairs: one document each).
    pub groups: Vec<RerankGroup>,
}

impl RerankData {
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses file contents; `path` names them in errors and picks the
    /// format by extension (else by the first line).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let origin = path.display().to_string();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Input(format!("{origin}: the file is empty")));
        }
        let table = Table::parse(bytes, &origin, TableFormat::detect(path, bytes))?;
        let has = |name: &str| table.columns.iter().any(|c| c == name);
        let layout = if has("documents") && has("labels") && table.format == TableFormat::Jsonl {
            RerankLayout::Lists
        } else if has("label") {
            RerankLayout::LabelledPairs
        } else {
            RerankLayout::Tuples
        };
        let texts = text_columns(&table.columns, layout);
        let needed = match layout {
            RerankLayout::Lists => 0,
            _ => 2,
        };
        if texts.len() < needed {
            return Err(Error::Input(format!(
                "{origin}: {} text column(s) in the {} ({}): a query and at least one document are needed",
                texts.len(),
                table.format.header_name(),
                table.columns.join(", ")
            )));
        }
        let label_at = table.columns.iter().position(|c| c == "label");
        let mut groups = Vec::with_capacity(table.rows.len());
        for (line, record) in &table.rows {
            let row = || -> std::result::Result<RerankGroup, String> {
                let record = record.as_ref().map_err(Clone::clone)?;
                if !matches!(record, Record::Object(_)) {
                    table.check_width(record)?;
                }
                match layout {
                    RerankLayout::Lists => list_row(record, *line),
                    RerankLayout::LabelledPairs => {
                        let query = record.text(texts[0].0, texts[0].1)?.to_string();
                        let doc = record.text(texts[1].0, texts[1].1)?.to_string();
                        let i = label_at.unwrap_or_default();
                        let label = number(record.cell(i, "label")?, "label")?;
                        Ok(RerankGroup {
                            query,
                            documents: vec![doc],
                            labels: vec![label],
                            line: *line,
                        })
                    }
                    RerankLayout::Tuples => {
                        let query = record.text(texts[0].0, texts[0].1)?.to_string();
                        let documents = texts[1..]
                            .iter()
                            .map(|&(i, name)| record.text(i, name).map(str::to_string))
                            .collect::<std::result::Result<Vec<_>, _>>()?;
                        let mut labels = vec![0.0; documents.len()];
                        labels[0] = 1.0;
                        Ok(RerankGroup {
                            query,
                            documents,
                            labels,
                            line: *line,
                        })
                    }
                }
            };
            groups.push(row().map_err(|r| Error::Input(format!("{origin}: line {line}: {r}")))?);
        }
        if groups.is_empty() {
            return Err(Error::Input(format!(
                "{origin}: no examples: the file has a {} only",
                table.format.header_name()
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            layout,
            groups,
        })
    }

    /// Every judged (query, document, label), one group each (the unit
    /// `bce` trains on).
    pub fn to_pairs(&self) -> Vec<RerankGroup> {
        self.groups
            .iter()
            .flat_map(|g| {
                g.documents
                    .iter()
                    .zip(&g.labels)
                    .map(|(d, &l)| RerankGroup {
                        query: g.query.clone(),
                        documents: vec![d.clone()],
                        labels: vec![l],
                        line: g.line,
                    })
            })
            .collect()
    }

    /// One list per query (the unit `lambda`, `listnet` and evaluation
    /// take): labelled pairs of the same query text are gathered, in file
    /// order, into the group of its first row.
    pub fn to_lists(&self) -> Vec<RerankGroup> {
        if self.layout != RerankLayout::LabelledPairs {
            return self.groups.clone();
        }
        let mut at: HashMap<&str, usize> = HashMap::new();
        let mut lists: Vec<RerankGroup> = Vec::new();
        for g in &self.groups {
            match at.get(g.query.as_str()) {
                Some(&i) => {
                    lists[i].documents.extend(g.documents.iter().cloned());
                    lists[i].labels.extend(&g.labels);
                }
                None => {
                    at.insert(&g.query, lists.len());
                    lists.push(g.clone());
                }
            }
        }
        lists
    }
}

/// The query's column, then the documents' (positive first), as
/// `(index, name)`: by name where the columns have them (`query` or
/// `anchor`; `document`, `positive`, `answer` or `passage`; then every
/// `negative…` column, by its number), else in the header's order (JSON
/// objects' keys come sorted, so JSON Lines need the names).
fn text_columns(columns: &[String], layout: RerankLayout) -> Vec<(usize, &str)> {
    let find = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| columns.iter().position(|c| c == n))
    };
    let (Some(q), Some(d)) = (
        find(&["query", "anchor"]),
        find(&["document", "positive", "answer", "passage"]),
    ) else {
        return columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_str() != "label")
            .map(|(i, c)| (i, c.as_str()))
            .collect();
    };
    let mut out = vec![(q, columns[q].as_str()), (d, columns[d].as_str())];
    if layout == RerankLayout::Tuples {
        let mut negatives: Vec<(usize, &str)> = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.starts_with("negative"))
            .map(|(i, c)| (i, c.as_str()))
            .collect();
        let number = |c: &str| -> u64 {
            c.trim_start_matches(|ch: char| !ch.is_ascii_digit())
                .parse()
                .unwrap_or(0)
        };
        negatives.sort_by_key(|&(i, c)| (number(c), i));
        out.extend(negatives);
    }
    out
}

fn number(cell: Cell, name: &str) -> std::result::Result<f32, String> {
    let v = match cell {
        Cell::Missing => return Err(format!("no field `{name}`")),
        Cell::Text(t) => t
            .trim()
            .parse::<f32>()
            .map_err(|_| format!("`{name}` `{t}` is not a number"))?,
        Cell::Json(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN) as f32,
        Cell::Json(Value::Bool(b)) => f32::from(u8::from(*b)),
        Cell::Json(v) => return Err(format!("`{name}` {v} is not a number")),
    };
    if !v.is_finite() {
        return Err(format!("`{name}` {v} is not a finite number"));
    }
    Ok(v)
}

fn list_row(record: &Record, line: usize) -> std::result::Result<RerankGroup, String> {
    let query = record.text(0, "query")?.to_string();
    let array = |name: &str| -> std::result::Result<Vec<Value>, String> {
        match record.cell(0, name)? {
            Cell::Json(Value::Array(a)) if !a.is_empty() => Ok(a.clone()),
            Cell::Json(Value::Array(_)) => Err(format!("`{name}` is empty")),
            Cell::Missing => Err(format!("no field `{name}`")),
            _ => Err(format!("`{name}` is not a list")),
        }
    };
    let documents = array("documents")?
        .into_iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(s) if !s.trim().is_empty() => Ok(s),
            Value::String(_) => Err(format!("documents[{i}] is empty")),
            other => Err(format!("documents[{i}] {other} is not a string")),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let labels = array("labels")?
        .iter()
        .enumerate()
        .map(|(i, v)| number(Cell::Json(v), &format!("labels[{i}]")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if labels.len() != documents.len() {
        return Err(format!(
            "{} documents but {} labels",
            documents.len(),
            labels.len()
        ));
    }
    Ok(RerankGroup {
        query,
        documents,
        labels,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: &str, text: &str) -> Result<RerankData> {
        RerankData::from_bytes(text.as_bytes(), Path::new(name))
    }

    #[test]
    fn the_three_shapes_read() {
        let d = read(
            "p.tsv",
            "query\tdocument\tlabel\nq1\td1\t1\nq2\td2\t0\nq1\td3\t0\n",
        )
        .unwrap();
        assert_eq!(d.layout, RerankLayout::LabelledPairs);
        let lists = d.to_lists();
        assert_eq!(lists.len(), 2);
        assert_eq!(lists[0].documents, ["d1", "d3"]);
        assert_eq!(lists[0].labels, [1.0, 0.0]);

        let d = read(
            "t.tsv",
            "query\tpositive\tnegative_1\tnegative_2\nq\tp\tn1\tn2\n",
        )
        .unwrap();
        assert_eq!(d.layout, RerankLayout::Tuples);
        assert_eq!(d.groups[0].documents, ["p", "n1", "n2"]);
        assert_eq!(d.groups[0].labels, [1.0, 0.0, 0.0]);
        assert_eq!(d.to_pairs().len(), 3);

        let d = read(
            "l.jsonl",
            "{\"query\": \"q\", \"documents\": [\"a\", \"b\"], \"labels\": [2, 0]}\n",
        )
        .unwrap();
        assert_eq!(d.layout, RerankLayout::Lists);
        assert_eq!(d.groups[0].labels, [2.0, 0.0]);
    }

    #[test]
    fn bad_rows_name_their_line() {
        let e = read("p.tsv", "query\tdocument\tlabel\nq\td\tyes\n").unwrap_err();
        assert!(
            e.to_string().contains("line 2") && e.to_string().contains("label"),
            "{e}"
        );
        let e = read(
            "l.jsonl",
            "{\"query\": \"q\", \"documents\": [\"a\"], \"labels\": [1, 0]}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("1 documents but 2 labels"), "{e}");
        let e = read("t.tsv", "query\tpositive\nq\t \n").unwrap_err();
        assert!(e.to_string().contains("empty text"), "{e}");
        assert!(read("e.tsv", "query\tpositive\n").is_err());
        assert!(read("one.tsv", "query\nq\n").is_err());
    }
}
