//! Multiple-choice data: a context, its candidate endings, and which one
//! is right. Read as transformers' `run_swag.py` reads SWAG (TSV, CSV or
//! JSON Lines with a header):
//!
//! - the context: `sent1`, else `context` or `question`;
//! - the start every ending shares (optional): `sent2`;
//! - the endings: `ending0`, `ending1`, ... (numbered from 0, as many as
//!   the file has), or in JSON Lines one list, `endings` or `choices`;
//! - `label`: the index of the right ending (optional when predicting).
//!
//! Each choice becomes the text pair (context, `sent2` + " " + ending), as
//! `run_swag.py` pairs them. Every example must have the same number of
//! endings (the model scores them as one `[batch, choices]` row); a row
//! with another count, an empty text or a label that is not an ending's
//! index is an error naming the file and line.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::texts::{Cell, Record, Table, TableFormat};

/// The context's column names, in the order they are looked for.
pub const CONTEXT_COLUMNS: [&str; 3] = ["sent1", "context", "question"];
/// JSON Lines: the names of the endings' list.
pub const ENDINGS_LISTS: [&str; 2] = ["endings", "choices"];

/// One example: the context and its choices' second texts.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceExample {
    pub context: String,
    /// The second text of each choice (`sent2` and the ending).
    pub choices: Vec<String>,
    /// The index of the right choice (`None`: unlabelled).
    pub label: Option<usize>,
    /// The 1-based line of the file.
    pub line: usize,
}

/// A multiple-choice data set.
#[derive(Debug, Clone)]
pub struct ChoiceData {
    pub path: PathBuf,
    pub examples: Vec<ChoiceExample>,
    /// Choices per example (the same for all).
    pub choices: usize,
}

/// Where a row's endings are.
enum Endings {
    /// Delimited columns (or object keys) `ending0`, `ending1`, ...
    Columns(Vec<(usize, String)>),
    /// A JSON list under this key.
    List(&'static str),
}

impl ChoiceData {
    /// Reads `path`; `unlabelled` accepts rows (or a file) without a label.
    pub fn read(path: &Path, unlabelled: bool) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path, unlabelled)
    }

    /// Parses file contents; `path` names them in errors and picks the
    /// format by extension (else by the first line).
    pub fn from_bytes(bytes: &[u8], path: &Path, unlabelled: bool) -> Result<Self> {
        let origin = path.display().to_string();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Input(format!("{origin}: the file is empty")));
        }
        let table = Table::parse(bytes, &origin, TableFormat::detect(path, bytes))?;
        let columns = &table.columns;
        let find = |name: &str| columns.iter().position(|c| c == name);
        let Some((context_at, context_name)) = CONTEXT_COLUMNS
            .iter()
            .find_map(|&n| find(n).map(|i| (i, n)))
        else {
            return Err(Error::Input(format!(
                "{origin}: no context column in the {} ({}): expected one of {}",
                table.format.header_name(),
                columns.join(", "),
                CONTEXT_COLUMNS.join(", ")
            )));
        };
        let lead = find("sent2");
        let numbered: Vec<(usize, String)> = (0..)
            .map(|k| format!("ending{k}"))
            .map_while(|name| find(&name).map(|i| (i, name)))
            .collect();
        let endings = match ENDINGS_LISTS.iter().find(|&&n| find(n).is_some()) {
            Some(&list) if table.format == TableFormat::Jsonl && numbered.is_empty() => {
                Endings::List(list)
            }
            _ if numbered.len() >= 2 => Endings::Columns(numbered),
            _ => {
                return Err(Error::Input(format!(
                    "{origin}: {} ending column(s) in the {} ({}): multiple choice needs `ending0`, `ending1`, ... (or, in JSON Lines, an `endings` list) with at least two",
                    numbered.len(),
                    table.format.header_name(),
                    columns.join(", ")
                )))
            }
        };
        let label_at = find("label");
        if label_at.is_none() && !unlabelled {
            return Err(Error::Input(format!(
                "{origin}: no `label` column in the {} ({})",
                table.format.header_name(),
                columns.join(", ")
            )));
        }
        let mut examples: Vec<ChoiceExample> = Vec::with_capacity(table.rows.len());
        for (line, record) in &table.rows {
            let row = || -> std::result::Result<ChoiceExample, String> {
                let record = record.as_ref().map_err(Clone::clone)?;
                if !matches!(record, Record::Object(_)) {
                    table.check_width(record)?;
                }
                let context = record.text(context_at, context_name)?.to_string();
                let lead = match lead {
                    Some(i) => match record.cell(i, "sent2")? {
                        Cell::Missing => "",
                        c => c.as_str().ok_or("field `sent2` is not a string")?.trim(),
                    },
                    None => "",
                };
                let endings = match &endings {
                    Endings::Columns(cols) => cols
                        .iter()
                        .map(|(i, name)| record.text(*i, name).map(str::to_string))
                        .collect::<std::result::Result<Vec<_>, _>>()?,
                    Endings::List(name) => list(record, name)?,
                };
                // run_swag.py: f"{sent2} {ending}".
                let choices = endings
                    .into_iter()
                    .map(|e| match lead {
                        "" => e,
                        l => format!("{l} {e}"),
                    })
                    .collect::<Vec<_>>();
                let label = match label_at.map(|i| record.cell(i, "label")).transpose()? {
                    None | Some(Cell::Missing) if unlabelled => None,
                    Some(Cell::Text(t)) if unlabelled && t.trim().is_empty() => None,
                    None | Some(Cell::Missing) => return Err("no field `label`".into()),
                    Some(cell) => Some(index(cell, choices.len())?),
                };
                Ok(ChoiceExample {
                    context,
                    choices,
                    label,
                    line: *line,
                })
            };
            let example = row().map_err(|r| Error::Input(format!("{origin}: line {line}: {r}")))?;
            if let Some(first) = examples.first() {
                if example.choices.len() != first.choices.len() {
                    return Err(Error::Input(format!(
                        "{origin}: line {line}: {} choices, but line {} has {}: every example needs the same number",
                        example.choices.len(),
                        first.line,
                        first.choices.len()
                    )));
                }
            }
            examples.push(example);
        }
        let Some(first) = examples.first() else {
            return Err(Error::Input(format!(
                "{origin}: no examples: the file has a {} only",
                table.format.header_name()
            )));
        };
        let choices = first.choices.len();
        Ok(Self {
            path: path.to_path_buf(),
            examples,
            choices,
        })
    }

    pub fn len(&self) -> usize {
        self.examples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Whether every example has its label.
    pub fn is_labelled(&self) -> bool {
        self.examples.iter().all(|e| e.label.is_some())
    }
}

/// A JSON list of at least two non-blank strings.
fn list(record: &Record, name: &str) -> std::result::Result<Vec<String>, String> {
    let items = match record.cell(0, name)? {
        Cell::Json(Value::Array(a)) => a,
        Cell::Missing => return Err(format!("no field `{name}`")),
        _ => return Err(format!("`{name}` is not a list")),
    };
    if items.len() < 2 {
        return Err(format!(
            "`{name}` has {} item(s): at least two are needed",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
            Value::String(_) => Err(format!("{name}[{i}] is empty")),
            other => Err(format!("{name}[{i}] {other} is not a string")),
        })
        .collect()
}

/// A label cell as the index of one of `n` choices.
fn index(cell: Cell, n: usize) -> std::result::Result<usize, String> {
    let value = match cell {
        Cell::Text(t) => t.trim().parse::<i64>().ok(),
        Cell::Json(Value::Number(x)) => x.as_i64(),
        Cell::Json(Value::String(t)) => t.trim().parse::<i64>().ok(),
        _ => None,
    };
    let shown = match cell {
        Cell::Text(t) => t.to_string(),
        Cell::Json(v) => v.to_string(),
        Cell::Missing => String::new(),
    };
    match value {
        Some(v) if (0..n as i64).contains(&v) => Ok(v as usize),
        _ => Err(format!(
            "`label` {shown} is not a choice's index (0 to {})",
            n - 1
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: &str, text: &str, unlabelled: bool) -> Result<ChoiceData> {
        ChoiceData::from_bytes(text.as_bytes(), Path::new(name), unlabelled)
    }

    #[test]
    fn swag_columns_pair_the_context_with_sent2_and_each_ending() {
        let d = read(
            "swag.csv",
            "video-id,sent1,sent2,ending0,ending1,ending2,label\n\
             v1,He rides a bike.,He,falls off.,\"waves, smiling.\",sings.,1\n\
             v2,She opens the door.,,walks in.,leaves.,sits.,0\n",
            false,
        )
        .unwrap();
        assert_eq!(d.choices, 3);
        assert_eq!(d.examples[0].context, "He rides a bike.");
        assert_eq!(
            d.examples[0].choices,
            ["He falls off.", "He waves, smiling.", "He sings."]
        );
        assert_eq!(d.examples[0].label, Some(1));
        assert_eq!(d.examples[1].choices, ["walks in.", "leaves.", "sits."]);
        assert_eq!(d.examples[1].line, 3);
        assert!(d.is_labelled());
    }

    #[test]
    fn json_lists_and_tsv_read() {
        let d = read(
            "mc.jsonl",
            "{\"context\": \"2 + 2\", \"endings\": [\"3\", \"4\"], \"label\": 1}\n\
             {\"context\": \"sky\", \"endings\": [\"blue\", \"green\"], \"label\": 0}\n",
            false,
        )
        .unwrap();
        assert_eq!(d.examples[0].choices, ["3", "4"]);
        assert_eq!(d.examples[1].label, Some(0));
        let d = read("mc.tsv", "question\tending0\tending1\nq\ta\tb\n", true).unwrap();
        assert_eq!(d.examples[0].label, None);
        assert!(!d.is_labelled());
    }

    #[test]
    fn bad_files_and_rows_are_named() {
        let e = read("a.csv", "text,ending0,ending1,label\nx,a,b,0\n", false).unwrap_err();
        assert!(e.to_string().contains("no context column"), "{e}");
        let e = read("b.csv", "sent1,ending0,label\nx,a,0\n", false).unwrap_err();
        assert!(e.to_string().contains("1 ending column(s)"), "{e}");
        let e = read("c.csv", "sent1,ending0,ending1\nx,a,b\n", false).unwrap_err();
        assert!(e.to_string().contains("no `label` column"), "{e}");
        let e = read("d.csv", "sent1,ending0,ending1,label\nx,a,b,2\n", false).unwrap_err();
        assert!(e.to_string().contains("d.csv: line 2"), "{e}");
        assert!(
            e.to_string().contains("not a choice's index (0 to 1)"),
            "{e}"
        );
        let e = read("e.csv", "sent1,ending0,ending1,label\nx,a, ,0\n", false).unwrap_err();
        assert!(
            e.to_string().contains("empty text in column `ending1`"),
            "{e}"
        );
        let e = read(
            "f.jsonl",
            "{\"context\": \"c\", \"endings\": [\"a\", \"b\"], \"label\": 0}\n\
             {\"context\": \"c\", \"endings\": [\"a\", \"b\", \"d\"], \"label\": 0}\n",
            false,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("line 2: 3 choices, but line 1 has 2"),
            "{e}"
        );
        let e = read("g.csv", "sent1,ending0,ending1,label\n", false).unwrap_err();
        assert!(e.to_string().contains("no examples"), "{e}");
        let e = read("h.csv", "", false).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = ChoiceData::from_bytes(
            b"sent1,ending0,ending1,label\nx\xff,a,b,0\n",
            Path::new("i.csv"),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(e.to_string().contains("UTF-8"), "{e}");
    }
}
