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

/// JSON Lines written as they are made: to stdout, or to `PATH.partial`
/// (renamed to `PATH` by [`StreamedLines::finish`]), so the output grows
/// while the command runs, memory stays bounded, and `PATH` itself is only
/// ever complete. An interrupted run leaves `PATH.partial` with whole lines
/// and at most one partial last line, which [`StreamedLines::resume`] cuts
/// off before going on.
pub struct StreamedLines {
    writer: BufWriter<Box<dyn Write>>,
    origin: String,
    /// `(PATH.partial, PATH)` when writing a file.
    rename: Option<(PathBuf, PathBuf)>,
    /// Lines in the output so far (those of a resumed file included).
    lines: usize,
    finished: bool,
}

/// Where a streamed `path` is written until it is complete.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

impl StreamedLines {
    /// Writes `path` from nothing (through `PATH.partial`), or stdout.
    pub fn create(path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self::new(
                Box::new(std::io::stdout()),
                "stdout".into(),
                None,
                0,
            ));
        };
        let partial = partial_path(path);
        let file = std::fs::File::create(&partial)
            .with_context(|| format!("cannot create {}", partial.display()))?;
        Ok(Self::new(
            Box::new(file),
            partial.display().to_string(),
            Some((partial, path.to_path_buf())),
            0,
        ))
    }

    /// Goes on with `PATH.partial` after its last complete line (or with a
    /// complete `PATH`, to add what a longer input has more), and says how
    /// many lines are already there: 0 when there is neither. A partial
    /// last line is cut off; a last complete line that is not JSON stops
    /// the resume, as the file is then not this command's output.
    pub fn resume(path: &Path) -> Result<(Self, usize)> {
        use std::io::{BufRead, Seek};
        let partial = partial_path(path);
        if !partial.exists() && path.exists() {
            std::fs::rename(path, &partial).with_context(|| {
                format!("cannot rename {} to {}", path.display(), partial.display())
            })?;
        }
        let mut file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&partial)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Self::create(Some(path))?, 0));
            }
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", partial.display())),
        };
        let (mut lines, mut complete, mut last) = (0usize, 0u64, Vec::new());
        {
            let mut reader = std::io::BufReader::with_capacity(1 << 20, &mut file);
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = reader
                    .read_until(b'\n', &mut line)
                    .with_context(|| format!("reading {}", partial.display()))?;
                if n == 0 || line.last() != Some(&b'\n') {
                    break;
                }
                lines += 1;
                complete += n as u64;
                std::mem::swap(&mut last, &mut line);
            }
        }
        if lines > 0 && serde_json::from_slice::<serde::de::IgnoredAny>(&last).is_err() {
            anyhow::bail!(
                "{}: line {lines} is not JSON, so the file is not this command's output; \
                 not resuming onto it",
                partial.display()
            );
        }
        file.set_len(complete)
            .and_then(|()| file.seek(std::io::SeekFrom::End(0)).map(drop))
            .with_context(|| format!("cannot cut {} after line {lines}", partial.display()))?;
        let origin = partial.display().to_string();
        let out = Self::new(
            Box::new(file),
            origin,
            Some((partial, path.to_path_buf())),
            lines,
        );
        Ok((out, lines))
    }

    fn new(
        sink: Box<dyn Write>,
        origin: String,
        rename: Option<(PathBuf, PathBuf)>,
        lines: usize,
    ) -> Self {
        Self {
            writer: BufWriter::with_capacity(1 << 20, sink),
            origin,
            rename,
            lines,
            finished: false,
        }
    }

    pub fn write(&mut self, value: &impl serde::Serialize) -> Result<()> {
        serde_json::to_writer(&mut self.writer, value)
            .and_then(|()| self.writer.write_all(b"\n").map_err(serde_json::Error::io))
            .with_context(|| format!("writing {}", self.origin))?;
        self.lines += 1;
        Ok(())
    }

    /// Pushes what was written so far out (after each chunk of texts).
    pub fn flush(&mut self) -> Result<()> {
        self.writer
            .flush()
            .with_context(|| format!("writing {}", self.origin))
    }

    /// Flushes, and renames `PATH.partial` to `PATH`.
    pub fn finish(mut self) -> Result<()> {
        self.flush()?;
        self.finished = true;
        if let Some((partial, path)) = &self.rename {
            std::fs::rename(partial, path).with_context(|| {
                format!("cannot rename {} to {}", partial.display(), path.display())
            })?;
        }
        Ok(())
    }
}

impl Drop for StreamedLines {
    /// A run that fails before its first line leaves no file behind; one
    /// that fails later keeps `PATH.partial` for `--resume-output`.
    fn drop(&mut self) {
        if let (false, 0, Some((partial, _))) = (self.finished, self.lines, &self.rename) {
            let _ = std::fs::remove_file(partial);
        }
    }
}
