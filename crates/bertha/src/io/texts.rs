//! Reading user texts: one text per line, from a file or a reader, with
//! invalid UTF-8 reported by line number instead of a crash; and the one
//! table reader ([`Table`]: TSV, CSV with RFC 4180 quoting, or JSON Lines,
//! with a header) behind `--column`, embed-map and fine-tuning's
//! classification files, so all three read the same file the same way.

use std::io::{BufRead, Read};
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// Splits bytes into lines (`\n` or `\r\n`), each checked to be UTF-8.
/// `origin` names the source in errors (a path, or "stdin").
pub fn lines_from_bytes(bytes: &[u8], origin: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if bytes.is_empty() {
        return Ok(out);
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    for (i, raw) in body.split(|b| *b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = std::str::from_utf8(raw).map_err(|e| {
            Error::Input(format!(
                "{origin}: line {}: invalid UTF-8 at byte {} of the line",
                i + 1,
                e.valid_up_to()
            ))
        })?;
        out.push(line.to_string());
    }
    Ok(out)
}

/// The lines of a reader one at a time, split and checked as
/// [`lines_from_bytes`] does (same lines, same errors), so that an input of
/// any size is read in the memory of one line.
pub struct Lines<R> {
    reader: R,
    origin: String,
    read: usize,
    buf: Vec<u8>,
}

impl<R: BufRead> Lines<R> {
    /// `origin` names the source in errors (a path, or "stdin").
    pub fn new(reader: R, origin: impl Into<String>) -> Self {
        Self {
            reader,
            origin: origin.into(),
            read: 0,
            buf: Vec::new(),
        }
    }

    /// How many lines have been read so far.
    pub fn lines_read(&self) -> usize {
        self.read
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        self.buf.clear();
        match self.reader.read_until(b'\n', &mut self.buf) {
            Ok(0) => None,
            Ok(_) => {
                self.read += 1;
                let raw = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
                let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
                Some(match std::str::from_utf8(raw) {
                    Ok(line) => Ok(line.to_string()),
                    Err(e) => Err(Error::Input(format!(
                        "{}: line {}: invalid UTF-8 at byte {} of the line",
                        self.origin,
                        self.read,
                        e.valid_up_to()
                    ))),
                })
            }
            Err(e) => Some(Err(Error::io(&self.origin, e))),
        }
    }
}

/// The number of lines [`Lines`] will read from `path` (a `\n` count, plus
/// one for a last line without one), in one pass of a few MiB at a time.
pub fn count_lines(path: &Path) -> Result<usize> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut block = vec![0u8; 1 << 20];
    let (mut lines, mut last) = (0, b'\n');
    loop {
        let n = file.read(&mut block).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        lines += block[..n].iter().filter(|&&b| b == b'\n').count();
        last = block[n - 1];
    }
    Ok(lines + usize::from(last != b'\n'))
}

pub fn read_lines_from_file(path: &Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    lines_from_bytes(&bytes, &path.display().to_string())
}

pub fn read_lines_from_reader(mut reader: impl Read, origin: &str) -> Result<Vec<String>> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(origin, e))?;
    lines_from_bytes(&bytes, origin)
}

/// Reads one text column of a table (TSV, CSV or JSONL with a header,
/// [`TableFormat::detect`]), e.g. `sentence` of GLUE's SST-2. Quoted CSV
/// fields may hold commas and line breaks; blank rows are skipped.
pub fn read_column(path: &Path, column: &str) -> Result<Vec<String>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let origin = path.display().to_string();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Input(format!(
            "{origin}: empty file, expected a header row"
        )));
    }
    let table = Table::parse(&bytes, &origin, TableFormat::detect(path, &bytes))?;
    let idx = table.column(column).ok_or_else(|| {
        Error::Input(format!(
            "{origin}: no column `{column}` (the {} has {})",
            table.format.header_name(),
            columns_list(&table.columns)
        ))
    })?;
    table
        .rows
        .iter()
        .map(|(line, record)| {
            let at = |reason: String| Error::Input(format!("{origin}: line {line}: {reason}"));
            let cell = record
                .as_ref()
                .map_err(|r| at(r.clone()))?
                .cell(idx, column);
            match cell.map_err(at)? {
                Cell::Missing => Err(at(format!("no field `{column}`"))),
                c => c
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| at(format!("field `{column}` is not a string"))),
            }
        })
        .collect()
}

/// `a`, `b` as "`a`, `b`", for errors listing a header.
pub fn columns_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a table file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// Tab-separated, header row, no quoting (GLUE's files contain bare `"`).
    Tsv,
    /// Comma-separated, header row, RFC 4180 quoting.
    Csv,
    /// One JSON object per line; the first object's keys are the columns.
    Jsonl,
}

impl TableFormat {
    /// By extension (`.tsv`, `.csv`, `.jsonl` / `.ndjson`).
    pub fn by_extension(path: &Path) -> Option<Self> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("tsv") => Some(Self::Tsv),
            Some("csv") => Some(Self::Csv),
            Some("jsonl" | "ndjson") => Some(Self::Jsonl),
            _ => None,
        }
    }

    /// By the first line: `{` JSONL, a tab TSV, otherwise CSV.
    pub fn sniff(first_line: &str) -> Self {
        if first_line.trim_start().starts_with('{') {
            Self::Jsonl
        } else if first_line.contains('\t') {
            Self::Tsv
        } else {
            Self::Csv
        }
    }

    /// By extension, else by the first line of `bytes`.
    pub fn detect(path: &Path, bytes: &[u8]) -> Self {
        Self::by_extension(path).unwrap_or_else(|| Self::sniff(&first_line(bytes)))
    }

    /// What holds the column names, for errors: "header" or "first object".
    pub fn header_name(self) -> &'static str {
        match self {
            Self::Jsonl => "first object",
            _ => "header",
        }
    }
}

/// The first line of `bytes` (lossily decoded), for sniffing a format.
pub fn first_line(bytes: &[u8]) -> String {
    bytes
        .split(|b| *b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .unwrap_or_default()
}

/// One row: the fields of a delimited line, or a JSON object.
#[derive(Debug, Clone)]
pub enum Record {
    Fields(csv::ByteRecord),
    Object(serde_json::Map<String, Value>),
}

/// One cell of a [`Record`].
#[derive(Debug, Clone, Copy)]
pub enum Cell<'a> {
    /// The row has no such field (a short row, or an object without the key).
    Missing,
    /// A delimited field.
    Text(&'a str),
    /// A JSON value.
    Json(&'a Value),
}

impl<'a> Cell<'a> {
    /// The text of a delimited field or of a JSON string.
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            Self::Text(t) => Some(t),
            Self::Json(Value::String(t)) => Some(t),
            _ => None,
        }
    }
}

impl Record {
    /// Fields in the row (keys of an object).
    pub fn len(&self) -> usize {
        match self {
            Self::Fields(r) => r.len(),
            Self::Object(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cell of column `index`, named `name` (fields by position,
    /// objects by key); invalid UTF-8 in a field is an error naming the
    /// column.
    pub fn cell<'a>(&'a self, index: usize, name: &str) -> std::result::Result<Cell<'a>, String> {
        match self {
            Self::Fields(r) => match r.get(index) {
                None => Ok(Cell::Missing),
                Some(raw) => std::str::from_utf8(raw).map(Cell::Text).map_err(|e| {
                    format!(
                        "column `{name}`: invalid UTF-8 at byte {} of the field",
                        e.valid_up_to()
                    )
                }),
            },
            Self::Object(m) => Ok(m.get(name).map_or(Cell::Missing, Cell::Json)),
        }
    }

    /// The text of column `index` (`name`), which must be a non-blank
    /// string: the reason otherwise ("empty text in column `name`", ...).
    pub fn text(&self, index: usize, name: &str) -> std::result::Result<&str, String> {
        match self.cell(index, name)? {
            Cell::Missing => Err(format!("no field `{name}`")),
            c => match c.as_str() {
                Some(s) if s.trim().is_empty() => Err(format!("empty text in column `{name}`")),
                Some(s) => Ok(s),
                None => Err(format!("field `{name}` is not a string")),
            },
        }
    }

    /// Whether every field is blank (Unicode whitespace only).
    pub fn is_blank(&self) -> bool {
        match self {
            Self::Fields(r) => r
                .iter()
                .all(|f| std::str::from_utf8(f).is_ok_and(|t| t.trim().is_empty())),
            Self::Object(_) => false,
        }
    }
}

/// A table with a header: its column names and its rows, each with its
/// 1-based line and its record, or why the row is malformed (invalid UTF-8
/// or JSON; the reason names neither file nor line).
#[derive(Debug, Clone)]
pub struct Table {
    pub format: TableFormat,
    /// The header's names (trimmed), or the first object's keys.
    pub columns: Vec<String>,
    /// Rows in file order; blank lines (ASCII whitespace only) are left out.
    pub rows: Vec<(usize, std::result::Result<Record, String>)>,
}

impl Table {
    /// Parses `bytes` (a leading UTF-8 byte-order mark is dropped); `origin`
    /// names them in errors. A file whose header cannot be read (no valid
    /// object in JSONL) is an error; malformed rows are not.
    pub fn parse(bytes: &[u8], origin: &str, format: TableFormat) -> Result<Self> {
        let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        match format {
            TableFormat::Tsv => Self::delimited(bytes, origin, b'\t', false, format, true),
            TableFormat::Csv => Self::delimited(bytes, origin, b',', true, format, true),
            TableFormat::Jsonl => Self::jsonl(bytes, origin),
        }
    }

    /// Parses a delimited file without a header row (TSV or CSV; JSON
    /// Lines always names its fields): the columns are named by their
    /// 1-based position, "1" to the widest row's count.
    pub fn parse_without_header(bytes: &[u8], origin: &str, format: TableFormat) -> Result<Self> {
        let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        match format {
            TableFormat::Tsv => Self::delimited(bytes, origin, b'\t', false, format, false),
            TableFormat::Csv => Self::delimited(bytes, origin, b',', true, format, false),
            TableFormat::Jsonl => Err(Error::Input(format!(
                "{origin}: JSON Lines name their fields: read them with a header"
            ))),
        }
    }

    /// The reason a delimited row does not have as many fields as the
    /// header (JSON objects are not counted: missing keys are found by
    /// name).
    pub fn check_width(&self, record: &Record) -> std::result::Result<(), String> {
        let Record::Fields(r) = record else {
            return Ok(());
        };
        let want = self.columns.len();
        if r.len() == want {
            return Ok(());
        }
        let hint = if self.format == TableFormat::Tsv && r.len() > want {
            " (a tab inside a text?)"
        } else {
            ""
        };
        Err(format!(
            "{} fields, but the header has {want}{hint}",
            r.len()
        ))
    }

    /// The index of column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    fn delimited(
        bytes: &[u8],
        origin: &str,
        delimiter: u8,
        quoting: bool,
        format: TableFormat,
        header: bool,
    ) -> Result<Self> {
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(delimiter)
            .quoting(quoting)
            .flexible(true)
            .has_headers(header)
            .from_reader(bytes);
        let csv_error = |e: csv::Error| {
            let line = e
                .position()
                .map_or(String::new(), |p| format!(" line {}:", p.line()));
            Error::Input(format!("{origin}:{line} {e}"))
        };
        let mut columns = Vec::new();
        if header {
            let names = reader.byte_headers().map_err(csv_error)?.clone();
            for (i, h) in names.iter().enumerate() {
                let h = std::str::from_utf8(h).map_err(|_| {
                    Error::Input(format!(
                        "{origin}: line 1: header field {} is not valid UTF-8",
                        i + 1
                    ))
                })?;
                columns.push(h.trim().to_string());
            }
        }
        let mut rows = Vec::new();
        // Lines counted incrementally from byte offsets (csv's own count
        // skips blank lines before a record).
        let (mut counted_to, mut line) = (0usize, 1usize);
        for record in reader.byte_records() {
            let record = record.map_err(csv_error)?;
            let mut offset = record.position().map_or(0, |p| p.byte() as usize);
            while offset < bytes.len() && matches!(bytes[offset], b'\n' | b'\r') {
                offset += 1;
            }
            let offset = offset.max(counted_to).min(bytes.len());
            line += bytes[counted_to..offset]
                .iter()
                .filter(|b| **b == b'\n')
                .count();
            counted_to = offset;
            if record.iter().all(|f| f.iter().all(u8::is_ascii_whitespace)) {
                continue;
            }
            rows.push((line, Ok(Record::Fields(record))));
        }
        if !header {
            let widest = rows
                .iter()
                .filter_map(|(_, r)| r.as_ref().ok())
                .map(Record::len);
            columns = (1..=widest.max().unwrap_or(0))
                .map(|i| i.to_string())
                .collect();
        }
        Ok(Self {
            format,
            columns,
            rows,
        })
    }

    fn jsonl(bytes: &[u8], origin: &str) -> Result<Self> {
        let mut rows = Vec::new();
        for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let row = match std::str::from_utf8(raw) {
                Err(e) => Err(format!(
                    "invalid UTF-8 at byte {} of the line",
                    e.valid_up_to()
                )),
                Ok(text) => match serde_json::from_str::<Value>(text) {
                    Ok(Value::Object(map)) => Ok(Record::Object(map)),
                    Ok(_) => Err("expected a JSON object".to_string()),
                    Err(e) => Err(format!("invalid JSON: {e}")),
                },
            };
            rows.push((i + 1, row));
        }
        let columns = match rows.iter().find_map(|(_, r)| r.as_ref().ok()) {
            Some(Record::Object(first)) => first.keys().cloned().collect(),
            _ => match rows.first() {
                Some((line, Err(reason))) => {
                    return Err(Error::Input(format!("{origin}: line {line}: {reason}")))
                }
                _ => {
                    return Err(Error::Input(format!(
                        "{origin}: the file is empty: expected JSON objects"
                    )))
                }
            },
        };
        Ok(Self {
            format: TableFormat::Jsonl,
            columns,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_names_the_line() {
        let err = lines_from_bytes(b"ok\nalso ok\nbad \xff here\n", "in.txt").unwrap_err();
        assert_eq!(
            err.to_string(),
            "in.txt: line 3: invalid UTF-8 at byte 4 of the line"
        );
    }

    fn column(name: &str, body: &str, col: &str) -> Result<Vec<String>> {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(name);
        std::fs::write(&path, body).unwrap();
        read_column(&path, col)
    }

    #[test]
    fn columns_of_quoted_csv_tsv_and_jsonl() {
        let csv = "id,sentence\n1,\"a, quoted\ntext\"\n\n2,plain\n";
        assert_eq!(
            column("in.csv", csv, "sentence").unwrap(),
            ["a, quoted\ntext", "plain"]
        );
        let tsv = "sentence\tlabel\nsays \"hi\t1\n";
        assert_eq!(column("in.tsv", tsv, "sentence").unwrap(), ["says \"hi"]);
        let jsonl = "{\"text\": \"one\"}\n{\"text\": \"two\"}\n";
        assert_eq!(column("in.jsonl", jsonl, "text").unwrap(), ["one", "two"]);
        let err = column("in.csv", csv, "text").unwrap_err().to_string();
        assert!(
            err.contains("no column `text`") && err.contains("`sentence`"),
            "{err}"
        );
        let err = column("in.csv", "a,b\n1\n", "b").unwrap_err().to_string();
        assert!(err.ends_with("line 2: no field `b`"), "{err}");
    }

    #[test]
    fn streamed_lines_and_counts_match_the_whole_file_reader() {
        let tmp = tempfile::tempdir().unwrap();
        let cases: [&[u8]; 7] = [
            b"",
            b"a",
            b"a\n",
            b"a\r\n\nb",
            b"a\n\n",
            b"\n",
            b"one\ntwo \xff\nthree\n",
        ];
        for (i, bytes) in cases.iter().enumerate() {
            let whole = lines_from_bytes(bytes, "in.txt").map_err(|e| e.to_string());
            let streamed: std::result::Result<Vec<String>, String> = Lines::new(*bytes, "in.txt")
                .map(|l| l.map_err(|e| e.to_string()))
                .collect();
            assert_eq!(streamed, whole, "case {i}");
            let path = tmp.path().join(format!("{i}.txt"));
            std::fs::write(&path, bytes).unwrap();
            assert_eq!(
                count_lines(&path).unwrap(),
                Lines::new(*bytes, "x").count(),
                "case {i}"
            );
        }
        let mut lines = Lines::new(&b"ok\nbad \xff\n"[..], "stdin");
        assert_eq!(lines.next().unwrap().unwrap(), "ok");
        assert_eq!(
            lines.next().unwrap().unwrap_err().to_string(),
            "stdin: line 2: invalid UTF-8 at byte 4 of the line"
        );
        assert_eq!(lines.lines_read(), 2);
    }

    #[test]
    fn empty_lines_are_kept_and_crlf_is_stripped() {
        let lines = lines_from_bytes(b"a\r\n\nb", "x").unwrap();
        assert_eq!(lines, vec!["a", "", "b"]);
    }
}
