//! Reading user texts: one text per line, from a file or a reader, with
//! invalid UTF-8 reported by line number instead of a crash.

use std::io::Read;
use std::path::Path;

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

/// Reads one column of a delimited file with a header row (TSV, or CSV
/// without quoted delimiters), e.g. `sentence` of GLUE's SST-2.
pub fn read_column(path: &Path, column: &str) -> Result<Vec<String>> {
    let lines = read_lines_from_file(path)?;
    let mut it = lines.into_iter();
    let header = it.next().ok_or_else(|| {
        Error::Input(format!(
            "{}: empty file, expected a header row",
            path.display()
        ))
    })?;
    let sep = if header.contains('\t') { '\t' } else { ',' };
    let idx = header
        .split(sep)
        .position(|h| h.trim() == column)
        .ok_or_else(|| {
            Error::Input(format!(
                "{}: no column `{column}` in header `{header}`",
                path.display()
            ))
        })?;
    it.enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(n, l)| {
            l.split(sep).nth(idx).map(str::to_string).ok_or_else(|| {
                Error::Input(format!(
                    "{}: line {}: no field {} (`{column}`)",
                    path.display(),
                    n + 2,
                    idx + 1
                ))
            })
        })
        .collect()
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

    #[test]
    fn empty_lines_are_kept_and_crlf_is_stripped() {
        let lines = lines_from_bytes(b"a\r\n\nb", "x").unwrap();
        assert_eq!(lines, vec!["a", "", "b"]);
    }
}
