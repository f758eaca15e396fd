//! JSON Lines to stdout, or to a file that appears only when complete.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub struct JsonLines {
    sink: Sink,
}

enum Sink {
    Stdout(BufWriter<std::io::Stdout>),
    File {
        writer: BufWriter<tempfile::NamedTempFile>,
        path: PathBuf,
    },
}

impl JsonLines {
    /// Writes to `path` through a temporary file in the same folder, renamed
    /// into place by [`JsonLines::finish`]; an error leaves nothing behind.
    pub fn open(path: Option<&Path>) -> Result<Self> {
        let sink = match path {
            None => Sink::Stdout(BufWriter::new(std::io::stdout())),
            Some(p) => {
                let dir = p
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let tmp = tempfile::NamedTempFile::new_in(dir)
                    .with_context(|| format!("cannot create a file in {}", dir.display()))?;
                Sink::File {
                    writer: BufWriter::new(tmp),
                    path: p.to_path_buf(),
                }
            }
        };
        Ok(Self { sink })
    }

    pub fn write(&mut self, value: &impl serde::Serialize) -> Result<()> {
        let w: &mut dyn Write = match &mut self.sink {
            Sink::Stdout(w) => w,
            Sink::File { writer, .. } => writer,
        };
        serde_json::to_writer(&mut *w, value)?;
        w.write_all(b"\n")?;
        Ok(())
    }

    pub fn finish(self) -> Result<()> {
        match self.sink {
            Sink::Stdout(mut w) => w.flush().context("writing to stdout")?,
            Sink::File { writer, path } => {
                let tmp = writer
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .context("writing output")?;
                tmp.persist(&path)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
        }
        Ok(())
    }
}
