//! JSON Lines to stdout, or to a file that appears only when complete.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

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

    /// Reads what an interrupted run left, `PATH.partial` (or a complete
    /// `PATH`, to add what a longer input has more), and checks every
    /// complete line with `check` (the command's kind of line: its fields
    /// and dimension), without changing any file: the caller checks the
    /// count against its input before [`Resume::start`] goes on. A partial
    /// last line of `PATH.partial` is cut off then; a complete `PATH`
    /// ending in a partial line, or any line `check` refuses, means the
    /// file is not this command's output, and nothing is resumed.
    pub fn resume(path: &Path, check: &LineCheck) -> Result<Resume> {
        use std::io::BufRead;
        let partial = partial_path(path);
        let (source, complete_output) = if partial.exists() {
            (partial.clone(), false)
        } else if path.exists() {
            (path.to_path_buf(), true)
        } else {
            return Ok(Resume {
                path: path.to_path_buf(),
                partial,
                complete_output: false,
                lines: 0,
                bytes: 0,
                exists: false,
            });
        };
        let file = std::fs::File::open(&source)
            .with_context(|| format!("cannot open {}", source.display()))?;
        let (mut lines, mut complete) = (0usize, 0u64);
        let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .with_context(|| format!("reading {}", source.display()))?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') {
                if complete_output {
                    bail!(
                        "{}: line {} is cut off, so the file is not this command's complete \
                         output; not resuming onto it",
                        source.display(),
                        lines + 1
                    );
                }
                break;
            }
            lines += 1;
            complete += n as u64;
            let value: serde_json::Value = serde_json::from_slice(&line).map_err(|_| {
                anyhow::anyhow!(
                    "{}: line {lines} is not JSON, so the file is not this command's output; \
                     not resuming onto it",
                    source.display()
                )
            })?;
            if let Err(why) = check(&value) {
                bail!(
                    "{}: line {lines} is not a line this command writes ({why}), so the file is \
                     not its output of these options; not resuming onto it",
                    source.display()
                );
            }
        }
        Ok(Resume {
            path: path.to_path_buf(),
            partial,
            complete_output,
            lines,
            bytes: complete,
            exists: true,
        })
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

/// A kept line's check: `Err` says what is wrong with it.
pub type LineCheck = dyn Fn(&serde_json::Value) -> std::result::Result<(), String>;

/// An output to resume, checked but not yet touched (see
/// [`StreamedLines::resume`]).
pub struct Resume {
    path: PathBuf,
    partial: PathBuf,
    /// The lines are `PATH`'s (complete), not `PATH.partial`'s.
    complete_output: bool,
    lines: usize,
    /// The bytes of the complete lines.
    bytes: u64,
    exists: bool,
}

impl Resume {
    /// The complete lines already written.
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// Goes on after the last complete line: a complete `PATH` becomes
    /// `PATH.partial` again until this run finishes.
    pub fn start(self) -> Result<StreamedLines> {
        use std::io::Seek;
        if !self.exists {
            return StreamedLines::create(Some(&self.path));
        }
        if self.complete_output {
            std::fs::rename(&self.path, &self.partial).with_context(|| {
                format!(
                    "cannot rename {} to {}",
                    self.path.display(),
                    self.partial.display()
                )
            })?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.partial)
            .with_context(|| format!("cannot open {}", self.partial.display()))?;
        file.set_len(self.bytes)
            .and_then(|()| file.seek(std::io::SeekFrom::End(0)).map(drop))
            .with_context(|| {
                format!(
                    "cannot cut {} after line {}",
                    self.partial.display(),
                    self.lines
                )
            })?;
        let origin = self.partial.display().to_string();
        Ok(StreamedLines::new(
            Box::new(file),
            origin,
            Some((self.partial, self.path)),
            self.lines,
        ))
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
