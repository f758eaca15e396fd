//! The points of a map as CSV: `line,x,y,label,text`, quoted where needed
//! (RFC 4180), written to a temporary file that is renamed into place.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `bytes` to `path` through a temporary file in the same folder:
/// the file appears complete or not at all.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = temp_beside(path, ".tmp", "")?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.flush())
        .map_err(|e| Error::io(tmp.path(), e))?;
    persist(tmp, path)
}

/// A temporary file in `path`'s folder (named `prefix…suffix`), to be
/// [`persist`]ed as `path` once complete.
pub(crate) fn temp_beside(
    path: &Path,
    prefix: &str,
    suffix: &str,
) -> Result<tempfile::NamedTempFile> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, e))
}

/// Renames a finished temporary file to `path`, readable by all like a
/// file created normally (temporary files are created owner-only).
pub(crate) fn persist(tmp: tempfile::NamedTempFile, path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(|e| Error::io(tmp.path(), e))?;
    }
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// The CSV text: one row per point with the input line it came from, its
/// coordinates (shortest round-trip decimals), label (empty without labels)
/// and text.
pub fn to_csv(
    points: &[[f64; 2]],
    texts: &[String],
    labels: Option<&[String]>,
    lines: &[usize],
) -> Result<Vec<u8>> {
    if texts.len() != points.len() || lines.len() != points.len() {
        return Err(Error::Input(format!(
            "{} points but {} texts and {} line numbers",
            points.len(),
            texts.len(),
            lines.len()
        )));
    }
    if let Some(l) = labels {
        if l.len() != points.len() {
            return Err(Error::Input(format!(
                "{} points but {} labels",
                points.len(),
                l.len()
            )));
        }
    }
    let csv_error = |e: csv::Error| Error::Input(format!("writing CSV: {e}"));
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["line", "x", "y", "label", "text"])
        .map_err(csv_error)?;
    for (i, p) in points.iter().enumerate() {
        let label = labels.map_or("", |l| l[i].as_str());
        w.write_record([
            lines[i].to_string().as_str(),
            p[0].to_string().as_str(),
            p[1].to_string().as_str(),
            label,
            texts[i].as_str(),
        ])
        .map_err(csv_error)?;
    }
    w.into_inner()
        .map_err(|e| Error::Input(format!("writing CSV: {}", e.error())))
}

/// [`to_csv`], written atomically to `path`.
pub fn write_csv(
    path: &Path,
    points: &[[f64; 2]],
    texts: &[String],
    labels: Option<&[String]>,
    lines: &[usize],
) -> Result<()> {
    write_atomically(path, &to_csv(points, texts, labels, lines)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_commas_quotes_and_newlines() {
        let csv = to_csv(
            &[[1.5, -2.0], [0.1, 3.0]],
            &["a, b".into(), "say \"hi\"\nthere".into()],
            Some(&["x".into(), "y".into()]),
            &[2, 3],
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "line,x,y,label,text\n2,1.5,-2,x,\"a, b\"\n3,0.1,3,y,\"say \"\"hi\"\"\nthere\"\n"
        );
    }
}
