//! Reading a plain-text corpus as a stream of tokenized documents, in
//! memory bounded by constants rather than by the largest line or
//! document: lines are read [`LINE_BYTES`] at a time (a longer line is cut
//! at whitespace into several pieces), a document longer than
//! [`PART_BYTES`] is handed on in parts, and at most [`BATCH_BYTES`] of
//! text (or [`DOCS_PER_BATCH`] documents) is tokenized at once. Before
//! this, a 50 MB line was tokenized in one call and peaked near 7 GB.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::corpus::split_sentences;
use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;

/// Documents tokenized per parallel batch: enough work for every core,
/// little text held at once.
const DOCS_PER_BATCH: usize = 512;
/// Text tokenized per parallel batch, at most (a tokenizer's encodings
/// weigh tens of times their text).
pub const BATCH_BYTES: usize = 4 << 20;
/// A document is handed on in parts of about this much text.
pub const PART_BYTES: usize = 256 << 10;
/// The longest piece read at once: a longer line becomes several pieces,
/// cut at whitespace (at a character boundary when it has none). For
/// WordPiece vocabularies the ids are those of the whole line.
pub const LINE_BYTES: usize = 64 << 10;

/// Part of a document: its next pieces' token ids; `ends` on its last
/// part. Parts of one document come in order and nothing comes between.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DocPart {
    pub pieces: Vec<Vec<u32>>,
    pub ends: bool,
}

/// What [`read_documents`] read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadStats {
    pub documents: usize,
    /// Word-piece tokens (without special tokens).
    pub tokens: usize,
}

/// Text lines of one document part, before tokenizing.
struct TextPart {
    lines: Vec<String>,
    ends: bool,
}

/// Reads the corpus files a batch of documents at a time, tokenized in
/// parallel (each document: its pieces' ids, sentences with `sentences`,
/// else lines; empty pieces and documents left out), handing each batch
/// of parts to `sink` in order. Refuses a corpus without text.
pub fn read_documents(
    paths: &[PathBuf],
    tokenizer: &Tokenizer,
    sentences: bool,
    mut sink: impl FnMut(Vec<DocPart>) -> Result<()>,
) -> Result<ReadStats> {
    let mut tk = tokenizer.inner().clone();
    tk.with_truncation(None)
        .map_err(|e| Error::Tokenizer(format!("disabling truncation: {e}")))?;
    tk.with_padding(None);

    let files = expand(paths)?;
    let mut batcher = Batcher {
        pending: Vec::new(),
        bytes: 0,
        // Whether the document being read has had a non-empty part.
        open_has_tokens: false,
        stats: ReadStats::default(),
    };
    let mut flush = |b: &mut Batcher| -> Result<()> {
        let parts: Vec<(Vec<Vec<u32>>, bool)> = std::mem::take(&mut b.pending)
            .into_par_iter()
            .map(|part| {
                let pieces: Vec<String> = if sentences {
                    part.lines
                        .iter()
                        .flat_map(|l| split_sentences(l))
                        .map(str::to_string)
                        .collect()
                } else {
                    part.lines
                };
                let enc = tk
                    .encode_batch(pieces, false)
                    .map_err(|e| Error::Tokenizer(format!("encoding corpus: {e}")))?;
                let ids: Vec<Vec<u32>> = enc
                    .into_iter()
                    .map(|e| e.get_ids().to_vec())
                    .filter(|ids| !ids.is_empty())
                    .collect();
                Ok((ids, part.ends))
            })
            .collect::<Result<_>>()?;
        b.bytes = 0;
        let mut out = Vec::with_capacity(parts.len());
        for (pieces, ends) in parts {
            let has = !pieces.is_empty();
            b.stats.tokens += pieces.iter().map(Vec::len).sum::<usize>();
            // A document that tokenized to nothing is left out whole.
            if has || (ends && b.open_has_tokens) {
                out.push(DocPart { pieces, ends });
            }
            b.open_has_tokens |= has;
            if ends {
                b.stats.documents += usize::from(b.open_has_tokens);
                b.open_has_tokens = false;
            }
        }
        sink(out)
    };
    for file in &files {
        let f = std::fs::File::open(file).map_err(|e| Error::io(file, e))?;
        let mut lines = Lines::new(BufReader::new(f), file);
        let mut doc: Vec<String> = Vec::new();
        let mut doc_bytes = 0;
        loop {
            let line = lines.next_piece()?;
            let Some((text, whole)) = line else {
                if !doc.is_empty() {
                    batcher.push(std::mem::take(&mut doc), true);
                }
                break;
            };
            let text = text.trim();
            if text.is_empty() {
                // Only a whole blank line ends a document; a cut-off run
                // of spaces inside a long line does not.
                if whole && !doc.is_empty() {
                    batcher.push(std::mem::take(&mut doc), true);
                    doc_bytes = 0;
                }
            } else {
                doc_bytes += text.len();
                doc.push(text.to_string());
                if doc_bytes >= PART_BYTES {
                    batcher.push(std::mem::take(&mut doc), false);
                    doc_bytes = 0;
                }
            }
            if batcher.full() {
                flush(&mut batcher)?;
            }
        }
    }
    flush(&mut batcher)?;
    let stats = batcher.stats;
    if stats.tokens == 0 {
        return Err(Error::Input(format!(
            "the corpus ({}) holds no text",
            files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(stats)
}

/// Parts waiting to be tokenized.
struct Batcher {
    pending: Vec<TextPart>,
    bytes: usize,
    open_has_tokens: bool,
    stats: ReadStats,
}

impl Batcher {
    fn push(&mut self, lines: Vec<String>, ends: bool) {
        self.bytes += lines.iter().map(String::len).sum::<usize>();
        self.pending.push(TextPart { lines, ends });
    }

    fn full(&self) -> bool {
        self.pending.len() >= DOCS_PER_BATCH || self.bytes >= BATCH_BYTES
    }
}

/// A file's lines, [`LINE_BYTES`] at most at a time.
struct Lines<'a, R> {
    reader: R,
    file: &'a Path,
    buf: Vec<u8>,
    /// Bytes of a cut line that belong to its next piece.
    carry: Vec<u8>,
    line_no: usize,
}

impl<'a, R: BufRead> Lines<'a, R> {
    fn new(reader: R, file: &'a Path) -> Self {
        Self {
            reader,
            file,
            buf: Vec::new(),
            carry: Vec::new(),
            line_no: 1,
        }
    }

    /// The next piece of text and whether it ends its line (`None` at the
    /// end of the file).
    fn next_piece(&mut self) -> Result<Option<(&str, bool)>> {
        self.buf.clear();
        self.buf.append(&mut self.carry);
        let room = (LINE_BYTES + 1).saturating_sub(self.buf.len()) as u64;
        let n = (&mut self.reader)
            .take(room)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| Error::io(self.file, e))?;
        if n == 0 && self.buf.is_empty() {
            return Ok(None);
        }
        let whole = self.buf.last() == Some(&b'\n') || n == 0 || self.buf.len() <= LINE_BYTES;
        if whole {
            let line_no = self.line_no;
            self.line_no += 1;
            let text = std::str::from_utf8(&self.buf).map_err(|e| self.bad_utf8(line_no, e))?;
            return Ok(Some((text, true)));
        }
        let cut = cut_point(&self.buf).map_err(|e| self.bad_utf8(self.line_no, e))?;
        self.carry = self.buf.split_off(cut);
        // `cut_point` checked the bytes before the cut.
        let text = std::str::from_utf8(&self.buf).map_err(|e| self.bad_utf8(self.line_no, e))?;
        Ok(Some((text, false)))
    }

    fn bad_utf8(&self, line_no: usize, e: std::str::Utf8Error) -> Error {
        Error::Input(format!(
            "{}:{line_no}: invalid UTF-8 ({e})",
            self.file.display()
        ))
    }
}

/// Where to cut an over-long line: after its last whitespace, else at its
/// last character boundary; the bytes before the cut are valid UTF-8.
fn cut_point(buf: &[u8]) -> std::result::Result<usize, std::str::Utf8Error> {
    let valid = match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        // A character cut off at the end of the buffer: cut before it.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(e) => return Err(e),
    };
    let at = buf[..valid]
        .iter()
        .rposition(u8::is_ascii_whitespace)
        .map_or(valid, |i| i + 1);
    Ok(if at == 0 { valid } else { at })
}

pub(crate) fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| Error::io(p, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && !is_hidden_or_doc(p))
                .collect();
            entries.sort();
            files.extend(entries);
        } else if p.is_file() {
            files.push(p.clone());
        } else {
            return Err(Error::io(
                p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
            ));
        }
    }
    if files.is_empty() {
        return Err(Error::Input("no corpus files given".into()));
    }
    Ok(files)
}

/// Folders of data sets carry a SOURCE.md / README.md that is not corpus.
fn is_hidden_or_doc(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with('.') || matches!(name, "SOURCE.md" | "README.md")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &[u8]) -> Vec<(String, bool)> {
        let mut lines = Lines::new(std::io::Cursor::new(text.to_vec()), Path::new("t"));
        let mut out = Vec::new();
        while let Some((t, whole)) = lines.next_piece().unwrap() {
            out.push((t.to_string(), whole));
        }
        out
    }

    #[test]
    fn long_lines_are_cut_at_whitespace_into_bounded_pieces() {
        let word = "abcdefg ";
        let long = word.repeat(3 * LINE_BYTES / word.len());
        let text = format!("short\n{long}\nend");
        let got = pieces(text.as_bytes());
        assert_eq!(got[0], ("short\n".into(), true));
        assert_eq!(got.last().unwrap(), &("end".to_string(), true));
        let middle = &got[1..got.len() - 1];
        assert!(middle.len() >= 3, "{}", middle.len());
        assert!(middle.iter().all(|(t, _)| t.len() <= LINE_BYTES + 1));
        // Cut after a space: no word is split, nothing lost.
        assert!(middle[..middle.len() - 1]
            .iter()
            .all(|(t, whole)| t.ends_with(' ') && !whole));
        let joined: String = middle.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(joined, format!("{long}\n"));
    }

    #[test]
    fn a_line_without_whitespace_is_cut_between_characters() {
        let long = "é".repeat(LINE_BYTES);
        let got = pieces(long.as_bytes());
        assert!(got.len() >= 2);
        let joined: String = got.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(joined, long);
    }
}
