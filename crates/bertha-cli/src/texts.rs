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

/// Tells the user how many texts lost tokens to truncation.
pub fn report_truncation(encodings: &[bertha::Encoded], max_length: usize) {
    let truncated: Vec<usize> = encodings
        .iter()
        .enumerate()
        .filter(|(_, e)| e.truncated)
        .map(|(i, _)| i + 1)
        .collect();
    if let Some(first) = truncated.first() {
        eprintln!(
            "warning: {} of {} texts were truncated to {max_length} tokens (first: text {first}); \
             use --max-length to change this",
            truncated.len(),
            encodings.len()
        );
    }
}
