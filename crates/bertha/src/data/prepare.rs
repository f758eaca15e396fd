//! Writing a prepared corpus (`bertha prepare-corpus`): documents are
//! tokenized ([`super::corpus_read`]) into shards in a temporary folder
//! beside the output, renamed into place when complete.
//!
//! The output folder is bertha's only when bertha made it: `--overwrite`
//! replaces a prepared corpus (its `corpus.json` and `shard-NNNNN.bin`
//! files, nothing else in it) and refuses anything else, a file, a folder
//! of other files, a folder that holds the corpus being read, before any
//! text is tokenized. A temporary folder left by a killed run (its process
//! gone) is removed by the next run for the same output.

use std::path::{Path, PathBuf};

use super::corpus_read::{read_documents, DocPart};
use super::prepared::{
    tokenizer_hash, CorpusHeader, Layout, ShardEntry, CORPUS_FILE, FORMAT, MAGIC,
};
use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::training::distributed::Hash64;

/// How to prepare a corpus.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// Pieces are sentences (what NSP pairs need) rather than lines.
    pub sentences: bool,
    /// Tokens per shard, at most (a shard ends at a document's end).
    pub shard_tokens: usize,
    /// Replace a prepared corpus already in the output folder.
    pub overwrite: bool,
}

/// Whether `name` is one of the shard files bertha writes.
pub(super) fn is_shard_name(name: &str) -> bool {
    name.strip_prefix("shard-")
        .and_then(|r| r.strip_suffix(".bin"))
        .is_some_and(|n| n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a folder entry is one bertha writes into a prepared corpus.
fn is_ours(name: &str) -> bool {
    name == CORPUS_FILE || is_shard_name(name)
}

/// Tokenizes `paths` (in parallel) into a prepared corpus in `out`, written
/// into a temporary folder renamed into place when complete.
pub fn prepare_corpus(
    paths: &[PathBuf],
    tokenizer: &Tokenizer,
    tokenizer_source: &Path,
    opts: &PrepareOptions,
    out: &Path,
) -> Result<CorpusHeader> {
    check_output(paths, out, opts.overwrite)?;
    let name = out
        .file_name()
        .ok_or_else(|| Error::Input(format!("{}: not a folder name", out.display())))?
        .to_string_lossy()
        .into_owned();
    remove_stale_temporaries(out, &name);
    let tmp = out.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        remove_ours(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = write_shards(paths, tokenizer, tokenizer_source, opts, &tmp)
        .and_then(|header| replace(&tmp, out, &name).map(|()| header));
    if result.is_err() {
        let _ = remove_ours(&tmp);
    }
    result
}

fn write_shards(
    paths: &[PathBuf],
    tokenizer: &Tokenizer,
    tokenizer_source: &Path,
    opts: &PrepareOptions,
    tmp: &Path,
) -> Result<CorpusHeader> {
    let vocab_size = tokenizer.vocab_size();
    let token_bytes = if vocab_size <= 1 << 16 { 2 } else { 4 };
    let mut writer = ShardWriter {
        dir: tmp.to_path_buf(),
        token_bytes,
        limit: opts.shard_tokens.max(1),
        tokens: Vec::new(),
        piece_ends: Vec::new(),
        doc_ends: Vec::new(),
        shards: Vec::new(),
        hash: Hash64::default(),
    };
    let stats = read_documents(paths, tokenizer, opts.sentences, |parts| {
        parts.iter().try_for_each(|part| writer.push(part))
    })?;
    writer.finish_shard()?;
    let header = CorpusHeader {
        format: FORMAT.into(),
        tokenizer: tokenizer_source.display().to_string(),
        tokenizer_hash: format!("{:016x}", tokenizer_hash(tokenizer_source)?),
        vocab_size,
        pieces: if opts.sentences { "sentences" } else { "lines" }.into(),
        token_bytes,
        documents: stats.documents,
        tokens: stats.tokens,
        content_hash: format!("{:016x}", writer.hash.finish()),
        shards: std::mem::take(&mut writer.shards),
    };
    let text = serde_json::to_string_pretty(&header).map_err(|e| Error::Serialise {
        what: CORPUS_FILE.into(),
        source: e,
    })?;
    let path = tmp.join(CORPUS_FILE);
    std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))?;
    Ok(header)
}

/// Refuses, before any work, an output bertha may not write: an existing
/// one without `overwrite`; with it, anything but a prepared corpus
/// folder holding only bertha's files; and a folder a corpus path lies in.
fn check_output(paths: &[PathBuf], out: &Path, overwrite: bool) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::Input(format!(
            "{}: {why}; --overwrite replaces only a prepared corpus (corpus.json and \
             shard-NNNNN.bin files): choose another --out",
            out.display()
        )))
    };
    // The corpus must not be inside (or be) the output: replacing the
    // output would delete it.
    if let Ok(o) = out.canonicalize() {
        for p in paths {
            if p.canonicalize().is_ok_and(|p| p.starts_with(&o)) {
                return refuse(format!("holds the corpus {} being read", p.display()));
            }
        }
    }
    if !out.exists() && out.symlink_metadata().is_err() {
        return Ok(());
    }
    if !overwrite {
        return Err(Error::Input(format!(
            "{} exists; pass --overwrite to replace it",
            out.display()
        )));
    }
    let meta = out.symlink_metadata().map_err(|e| Error::io(out, e))?;
    if !meta.is_dir() {
        return refuse("is not a folder".into());
    }
    let header = out.join(CORPUS_FILE);
    let is_corpus = std::fs::read_to_string(&header)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("format")?
                .as_str()
                .map(|f| f.starts_with("bertha-corpus/"))
        })
        .unwrap_or(false);
    if !is_corpus {
        return refuse(format!(
            "is not a prepared corpus (no bertha {CORPUS_FILE})"
        ));
    }
    for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let file = entry.file_type().is_ok_and(|t| t.is_file());
        if !(file && is_ours(&name)) {
            return refuse(format!(
                "holds `{name}`, which prepare-corpus did not write"
            ));
        }
    }
    Ok(())
}

/// Moves the complete `tmp` to `out`: an old corpus there is moved aside
/// first and its files removed only once the new one is in place (it is
/// put back if the move fails).
fn replace(tmp: &Path, out: &Path, name: &str) -> Result<()> {
    if out.symlink_metadata().is_err() {
        return std::fs::rename(tmp, out).map_err(|e| Error::io(out, e));
    }
    let old = out.with_file_name(format!(".{name}.old-{}", std::process::id()));
    std::fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
    if let Err(e) = std::fs::rename(tmp, out) {
        let _ = std::fs::rename(&old, out);
        return Err(Error::io(out, e));
    }
    remove_ours(&old)
}

/// Removes bertha's files from `dir`, then `dir` if that left it empty: a
/// file bertha did not write is never removed.
fn remove_ours(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_ours(&name) && entry.file_type().is_ok_and(|t| t.is_file()) {
            let p = entry.path();
            std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    // Fails, harmlessly, when something else is in it.
    let _ = std::fs::remove_dir(dir);
    Ok(())
}

/// Removes the temporary folders (`.NAME.tmp-PID`, `.NAME.old-PID`) of
/// earlier runs for this output whose process is gone (killed): their
/// partial shards would otherwise stay forever.
fn remove_stale_temporaries(out: &Path, name: &str) {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let pid = [".tmp-", ".old-"].iter().find_map(|kind| {
            file_name
                .strip_prefix(&format!(".{name}{kind}"))?
                .parse::<u32>()
                .ok()
        });
        if let Some(pid) = pid {
            if pid != std::process::id() && !process_alive(pid) {
                tracing::info!(
                    "removing {} (left by a stopped run)",
                    entry.path().display()
                );
                let _ = remove_ours(&entry.path());
            }
        }
    }
}

/// Whether process `pid` runs (on other systems than Unix: assumed so,
/// and nothing is removed).
fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Collects documents into the current shard and writes it when full (a
/// shard ends at a document's end).
struct ShardWriter {
    dir: PathBuf,
    token_bytes: usize,
    limit: usize,
    tokens: Vec<u32>,
    piece_ends: Vec<u64>,
    doc_ends: Vec<u64>,
    shards: Vec<ShardEntry>,
    hash: Hash64,
}

impl ShardWriter {
    fn push(&mut self, part: &DocPart) -> Result<()> {
        for piece in &part.pieces {
            self.tokens.extend_from_slice(piece);
            self.piece_ends.push(self.tokens.len() as u64);
            for &t in piece {
                self.hash.word(u64::from(t));
            }
            self.hash.word(u64::MAX);
        }
        if !part.ends {
            return Ok(());
        }
        self.doc_ends.push(self.piece_ends.len() as u64);
        self.hash.word(u64::MAX - 1);
        if self.tokens.len() >= self.limit {
            self.finish_shard()?;
        }
        Ok(())
    }

    fn finish_shard(&mut self) -> Result<()> {
        if self.doc_ends.is_empty() {
            return Ok(());
        }
        let file = format!("shard-{:05}.bin", self.shards.len());
        let path = self.dir.join(&file);
        let n = self.tokens.len();
        let layout = Layout::new(
            n,
            self.token_bytes,
            self.piece_ends.len(),
            self.doc_ends.len(),
        )
        .ok_or_else(|| Error::Input(format!("{}: shard too large", path.display())))?;
        let mut bytes = Vec::with_capacity(layout.len);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(self.token_bytes as u32).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        for count in [n, self.piece_ends.len(), self.doc_ends.len()] {
            bytes.extend_from_slice(&(count as u64).to_le_bytes());
        }
        for &t in &self.tokens {
            if self.token_bytes == 2 {
                let t = u16::try_from(t).map_err(|_| {
                    Error::Tokenizer(format!(
                        "token id {t} at or above the vocabulary size the shard was sized for"
                    ))
                })?;
                bytes.extend_from_slice(&t.to_le_bytes());
            } else {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
        }
        bytes.resize(layout.ends_at, 0);
        for v in self.piece_ends.iter().chain(&self.doc_ends) {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        std::fs::write(&path, &bytes).map_err(|e| Error::io(&path, e))?;
        self.shards.push(ShardEntry {
            file,
            documents: self.doc_ends.len(),
            tokens: n,
        });
        self.tokens.clear();
        self.piece_ends.clear();
        self.doc_ends.clear();
        Ok(())
    }
}
