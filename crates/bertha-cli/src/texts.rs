//! The texts a command works on (arguments, `--input FILE`, or stdin) and
//! the progress bar shown while working through them.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Result};
use bertha::io::texts;

#[derive(clap::Args, Debug, Clone)]
pub struct TextArgs {
    /// Texts to process. Without any, texts are read from --input or stdin.
    pub texts: Vec<String>,

    /// Read texts from FILE, one per line ("-" for stdin).
    #[arg(long, short = 'i')]
    pub input: Option<PathBuf>,

    /// Treat --input as a TSV/CSV with a header and take this column (e.g. `sentence`).
    #[arg(long, requires = "input")]
    pub column: Option<String>,
}

impl TextArgs {
    pub fn read(&self) -> Result<Vec<String>> {
        if !self.texts.is_empty() {
            if self.input.is_some() {
                bail!("give texts either as arguments or with --input, not both");
            }
            return Ok(self.texts.clone());
        }
        match &self.input {
            Some(p) if p.as_os_str() == "-" => Ok(texts::read_lines_from_reader(
                std::io::stdin().lock(),
                "stdin",
            )?),
            Some(p) => Ok(match &self.column {
                Some(c) => texts::read_column(p, c)?,
                None => texts::read_lines_from_file(p)?,
            }),
            None => {
                if std::io::stdin().is_terminal() {
                    bail!("no texts: pass them as arguments, with --input FILE, or on stdin");
                }
                Ok(texts::read_lines_from_reader(
                    std::io::stdin().lock(),
                    "stdin",
                )?)
            }
        }
    }
}

/// Texts one at a time, for commands that work through inputs of any size
/// in bounded memory.
pub struct TextStream {
    pub texts: Box<dyn Iterator<Item = bertha::Result<String>>>,
    /// How many texts there are, when known without reading them all
    /// (arguments, a file's lines, a table's column; not stdin).
    pub total: Option<usize>,
}

impl TextArgs {
    /// As [`TextArgs::read`], one text at a time: lines of a file or of
    /// stdin are read as they are needed. A table's column (`--column`) is
    /// read whole first (quoted CSV fields may span lines).
    pub fn stream(&self) -> Result<TextStream> {
        if !self.texts.is_empty() && self.input.is_some() {
            bail!("give texts either as arguments or with --input, not both");
        }
        let lines = |path: &std::path::Path| -> Result<TextStream> {
            let total = texts::count_lines(path)?;
            let file = std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
            let reader = std::io::BufReader::with_capacity(1 << 20, file);
            Ok(TextStream {
                texts: Box::new(texts::Lines::new(reader, path.display().to_string())),
                total: Some(total),
            })
        };
        let stdin = || TextStream {
            texts: Box::new(texts::Lines::new(std::io::stdin().lock(), "stdin")),
            total: None,
        };
        let all = |v: Vec<String>| TextStream {
            total: Some(v.len()),
            texts: Box::new(v.into_iter().map(Ok)),
        };
        match (&self.input, &self.column) {
            (Some(p), None) if p.as_os_str() == "-" => Ok(stdin()),
            (Some(p), None) => lines(p),
            (Some(_), Some(_)) => Ok(all(self.read()?)),
            (None, _) if !self.texts.is_empty() => Ok(all(self.texts.clone())),
            (None, _) => {
                if std::io::stdin().is_terminal() {
                    bail!("no texts: pass them as arguments, with --input FILE, or on stdin");
                }
                Ok(stdin())
            }
        }
    }
}

/// A progress bar on stderr for long inputs, hidden when stderr is not a
/// terminal.
pub fn progress_bar(total: usize) -> indicatif::ProgressBar {
    if total < 256 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} texts  {per_sec}  eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// [`progress_bar`] for a stream: a count with texts/s when the total is
/// unknown (stdin).
pub fn stream_progress_bar(total: Option<usize>) -> indicatif::ProgressBar {
    match total {
        Some(n) => progress_bar(n),
        None if std::io::stderr().is_terminal() => {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {pos} texts  {per_sec}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar
        }
        None => indicatif::ProgressBar::hidden(),
    }
}

/// Tells the user how many texts lost tokens to truncation.
pub fn report_truncation(encodings: &[bertha::Encoded], max_length: usize) {
    let mut tally = Truncations::default();
    tally.add(encodings);
    tally.report(max_length);
}

/// Texts truncated so far, counted chunk by chunk, for one warning at the end.
#[derive(Default)]
pub struct Truncations {
    /// Texts seen so far (skipped ones included), to number the first truncated one.
    seen: usize,
    checked: usize,
    truncated: usize,
    first: Option<usize>,
}

impl Truncations {
    /// A tally whose first text is number `skipped + 1`.
    pub fn after(skipped: usize) -> Self {
        Self {
            seen: skipped,
            ..Self::default()
        }
    }

    pub fn add(&mut self, encodings: &[bertha::Encoded]) {
        for e in encodings {
            self.seen += 1;
            self.checked += 1;
            if e.truncated {
                self.truncated += 1;
                self.first.get_or_insert(self.seen);
            }
        }
    }

    pub fn report(&self, max_length: usize) {
        if let Some(first) = self.first {
            eprintln!(
                "warning: {} of {} texts were truncated to {max_length} tokens (first: text {first}); \
                 use --max-length to change this",
                self.truncated, self.checked
            );
        }
    }
}
