//! A prepared pre-training corpus: tokenized once (`bertha prepare-corpus`)
//! into memory-mapped shards, so `pretrain` starts (and resumes) without
//! tokenizing again and holds only the sequences' plans in memory: a
//! batch's tokens are read from the shards when it is trained on, and each
//! data-parallel process reads only its own rows.
//!
//! A folder holds `corpus.json` (the format, the tokenizer's hash, counts,
//! a hash of the content and the shard list) and `shard-NNNNN.bin` files:
//! a 48-byte header (magic, token width, token / piece / document counts),
//! the token ids in the narrowest little-endian integer the vocabulary
//! allows (2 bytes up to 65,536 tokens, else 4), padded to 8 bytes, then
//! each piece's end (u64, in tokens) and each document's end (u64, in
//! pieces). Pieces are sentences (`--nsp`) or lines.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::corpus::{check_seq_len, plan, specials, CorpusOptions, Example};
use super::packing::{materialize, Documents, ExamplePlan, Specials, Stream};
use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::training::distributed::Hash64;

/// The folder's description file.
pub const CORPUS_FILE: &str = "corpus.json";
pub(super) const MAGIC: &[u8; 16] = b"BERTHA-CORPUS\0\0\x01";
pub(super) const HEADER: usize = 48;
pub(super) const FORMAT: &str = "bertha-corpus/1";

/// A hash of the tokenizer's files in `source` (a folder or a vocab file):
/// a prepared corpus is read with the tokenizer it was made with only.
pub fn tokenizer_hash(source: &Path) -> Result<u64> {
    let files: Vec<PathBuf> = if source.is_dir() {
        [
            "tokenizer.json",
            "vocab.txt",
            "tokenizer_config.json",
            "special_tokens_map.json",
        ]
        .iter()
        .map(|f| source.join(f))
        .filter(|p| p.is_file())
        .collect()
    } else {
        vec![source.to_path_buf()]
    };
    let mut h = Hash64::default();
    for f in files {
        h.bytes(&std::fs::read(&f).map_err(|e| Error::io(&f, e))?);
    }
    Ok(h.finish())
}

/// `corpus.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CorpusHeader {
    pub format: String,
    /// Where the tokenizer was read from, and its files' hash.
    pub tokenizer: String,
    pub tokenizer_hash: String,
    pub vocab_size: usize,
    /// `sentences` (for NSP pairs) or `lines`.
    pub pieces: String,
    pub token_bytes: usize,
    pub documents: usize,
    pub tokens: usize,
    pub content_hash: String,
    pub shards: Vec<ShardEntry>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ShardEntry {
    pub file: String,
    pub documents: usize,
    pub tokens: usize,
}

/// Where a shard's parts lie: tokens from [`HEADER`], then (8-byte
/// aligned) the piece ends and the document ends.
pub(super) struct Layout {
    /// Byte offset of the piece ends.
    pub(super) ends_at: usize,
    /// The file's length.
    pub(super) len: usize,
}

impl Layout {
    /// `None` when the sizes overflow (a damaged header).
    pub(super) fn new(
        tokens: usize,
        token_bytes: usize,
        pieces: usize,
        docs: usize,
    ) -> Option<Self> {
        let padded = tokens
            .checked_mul(token_bytes)?
            .checked_next_multiple_of(8)?;
        let ends_at = HEADER.checked_add(padded)?;
        let len = ends_at.checked_add(pieces.checked_add(docs)?.checked_mul(8)?)?;
        Some(Self { ends_at, len })
    }
}

/// One memory-mapped shard.
struct Shard {
    map: Mmap,
    path: PathBuf,
    token_bytes: usize,
    tokens: usize,
    pieces: usize,
    docs: usize,
    ends_at: usize,
}

impl Shard {
    fn open(path: &Path, token_bytes: usize) -> Result<Self> {
        let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the shard is read only; a file changed underneath a
        // running job is outside what any reader can guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        if map.len() < HEADER || &map[..16] != MAGIC {
            return Err(bad("not a bertha corpus shard".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes([map[o], map[o + 1], map[o + 2], map[o + 3]]);
        let width = u32_at(16) as usize;
        if width != token_bytes {
            return Err(bad(format!(
                "tokens of {width} bytes, corpus.json says {token_bytes}"
            )));
        }
        let count = |o: usize| usize::try_from(u64_at(&map, o)).unwrap_or(usize::MAX);
        let (tokens, pieces, docs) = (count(24), count(32), count(40));
        let layout = Layout::new(tokens, token_bytes, pieces, docs)
            .filter(|l| l.len == map.len())
            .ok_or_else(|| {
                bad(format!(
                    "{} bytes, not what its header describes ({tokens} tokens, {pieces} pieces, \
                     {docs} documents)",
                    map.len()
                ))
            })?;
        let shard = Self {
            path: path.to_path_buf(),
            token_bytes,
            tokens,
            pieces,
            docs,
            ends_at: layout.ends_at,
            map,
        };
        // Ends that only grow and stay inside the shard: every later read
        // of a token range is then in bounds.
        if !ascending_to((0..pieces).map(|p| shard.piece_end(p)), tokens)
            || !ascending_to((0..docs).map(|d| shard.doc_end(d)), pieces)
        {
            return Err(bad("its piece or document ends are out of order".into()));
        }
        Ok(shard)
    }

    fn piece_end(&self, p: usize) -> usize {
        u64_at(&self.map, self.ends_at + 8 * p) as usize
    }

    fn doc_end(&self, d: usize) -> usize {
        u64_at(&self.map, self.ends_at + 8 * (self.pieces + d)) as usize
    }

    /// Pieces of local document `d`.
    fn doc_pieces(&self, d: usize) -> Range<usize> {
        let start = if d == 0 { 0 } else { self.doc_end(d - 1) };
        start..self.doc_end(d)
    }

    fn piece_start(&self, p: usize) -> usize {
        if p == 0 {
            0
        } else {
            self.piece_end(p - 1)
        }
    }

    fn extend(&self, tokens: Range<usize>, out: &mut Vec<u32>) {
        let at = HEADER + tokens.start * self.token_bytes;
        let bytes = &self.map[at..HEADER + tokens.end * self.token_bytes];
        if self.token_bytes == 2 {
            out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
            );
        } else {
            out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
    }
}

/// Whether `ends` never decrease and the last is `last` (none: `last` 0).
fn ascending_to(ends: impl Iterator<Item = usize>, last: usize) -> bool {
    let mut prev = 0;
    for e in ends {
        if e < prev {
            return false;
        }
        prev = e;
    }
    prev == last
}

fn u64_at(map: &[u8], o: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&map[o..o + 8]);
    u64::from_le_bytes(b)
}

/// A prepared corpus, its shards mapped.
pub struct PreparedCorpus {
    pub header: CorpusHeader,
    shards: Vec<Shard>,
    /// The first global document of each shard.
    first_doc: Vec<usize>,
}

impl PreparedCorpus {
    /// Opens the folder `dir`; with `tokenizer` (its source's hash), refuses
    /// a corpus made with another tokenizer.
    pub fn open(dir: &Path, tokenizer: Option<u64>) -> Result<Self> {
        let path = dir.join(CORPUS_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let header: CorpusHeader = serde_json::from_str(&text).map_err(|e| Error::Json {
            path: path.clone(),
            source: e,
        })?;
        if header.format != FORMAT {
            return Err(Error::Input(format!(
                "{}: format `{}`, this bertha reads `{FORMAT}`",
                path.display(),
                header.format
            )));
        }
        if let Some(h) = tokenizer {
            if format!("{h:016x}") != header.tokenizer_hash {
                return Err(Error::Input(format!(
                    "{} was prepared with another tokenizer ({}); prepare it again with this one",
                    dir.display(),
                    header.tokenizer
                )));
            }
        }
        if !matches!(header.token_bytes, 2 | 4) {
            return Err(Error::Input(format!(
                "{}: token_bytes {}, expected 2 or 4",
                path.display(),
                header.token_bytes
            )));
        }
        let mut shards = Vec::with_capacity(header.shards.len());
        let mut first_doc = Vec::with_capacity(header.shards.len());
        let mut docs = 0;
        for entry in &header.shards {
            // A plain shard name: `../x` or an absolute path would read
            // (and trust) a file outside the folder.
            if !super::prepare::is_shard_name(&entry.file) {
                return Err(Error::Input(format!(
                    "{}: shard `{}` is not a shard-NNNNN.bin file of this folder",
                    path.display(),
                    entry.file
                )));
            }
            let shard = Shard::open(&dir.join(&entry.file), header.token_bytes)?;
            if shard.docs != entry.documents || shard.tokens != entry.tokens {
                return Err(Error::Input(format!(
                    "{}: {} documents and {} tokens, corpus.json says {} and {}",
                    shard.path.display(),
                    shard.docs,
                    shard.tokens,
                    entry.documents,
                    entry.tokens
                )));
            }
            first_doc.push(docs);
            docs += shard.docs;
            shards.push(shard);
        }
        let tokens: usize = shards.iter().map(|s| s.tokens).sum();
        if docs != header.documents || tokens != header.tokens {
            return Err(Error::Input(format!(
                "{}: {} documents and {} tokens, its shards hold {docs} and {tokens}",
                path.display(),
                header.documents,
                header.tokens
            )));
        }
        let corpus = Self {
            header,
            shards,
            first_doc,
        };
        let hash = format!("{:016x}", corpus.content_hash());
        if hash != corpus.header.content_hash {
            return Err(Error::Input(format!(
                "{}: the shards' content hash is {hash}, corpus.json says {}: a shard was \
                 changed or damaged; prepare the corpus again",
                path.display(),
                corpus.header.content_hash
            )));
        }
        Ok(corpus)
    }

    /// The hash `prepare-corpus` recorded, recomputed from the shards: every
    /// token, a mark after each piece and each document.
    fn content_hash(&self) -> u64 {
        let mut h = Hash64::default();
        for s in &self.shards {
            let mut tokens = Vec::new();
            for d in 0..s.docs {
                for p in s.doc_pieces(d) {
                    tokens.clear();
                    s.extend(s.piece_start(p)..s.piece_end(p), &mut tokens);
                    tokens.iter().for_each(|&t| h.word(u64::from(t)));
                    h.word(u64::MAX);
                }
                h.word(u64::MAX - 1);
            }
        }
        h.finish()
    }

    fn locate(&self, doc: usize) -> (&Shard, usize) {
        let s = self.first_doc.partition_point(|&f| f <= doc) - 1;
        (&self.shards[s], doc - self.first_doc[s])
    }

    /// The sequences of a run's options over this corpus, read on demand
    /// (`tokenizer`: its `[CLS]` / `[SEP]`).
    pub fn sequences(
        self: &Arc<Self>,
        tokenizer: &Tokenizer,
        opts: &CorpusOptions,
    ) -> Result<PreparedSequences> {
        check_seq_len(opts.seq_len)?;
        if opts.nsp && self.header.pieces != "sentences" {
            return Err(Error::option(
                "nsp",
                "needs a corpus prepared with sentences (prepare-corpus --nsp)",
            ));
        }
        let stream = Stream::new(self.as_ref());
        let plans = plan(self.as_ref(), &stream, opts)?;
        Ok(PreparedSequences {
            corpus: self.clone(),
            stream: Arc::new(stream),
            specials: specials(tokenizer)?,
            plans,
            identity: format!(
                "{} seq_len {} nsp {} seed {}",
                self.header.content_hash, opts.seq_len, opts.nsp, opts.seed
            ),
        })
    }
}

impl Documents for PreparedCorpus {
    fn count(&self) -> usize {
        self.header.documents
    }

    fn pieces(&self, doc: usize) -> usize {
        let (s, d) = self.locate(doc);
        s.doc_pieces(d).len()
    }

    fn piece_len(&self, doc: usize, piece: usize) -> usize {
        let (s, d) = self.locate(doc);
        let p = s.doc_pieces(d).start + piece;
        s.piece_end(p) - s.piece_start(p)
    }

    fn doc_len(&self, doc: usize) -> usize {
        let (s, d) = self.locate(doc);
        let pieces = s.doc_pieces(d);
        if pieces.is_empty() {
            return 0;
        }
        s.piece_end(pieces.end - 1) - s.piece_start(pieces.start)
    }

    fn extend_tokens(&self, doc: usize, range: Range<usize>, out: &mut Vec<u32>) {
        let (s, d) = self.locate(doc);
        let start = s.piece_start(s.doc_pieces(d).start);
        s.extend(start + range.start..start + range.end, out);
    }
}

/// The sequences of a run over a prepared corpus: plans in memory, tokens
/// read from the shards when asked for.
pub struct PreparedSequences {
    corpus: Arc<PreparedCorpus>,
    stream: Arc<Stream>,
    specials: Specials,
    plans: Vec<ExamplePlan>,
    identity: String,
}

impl PreparedSequences {
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Sequence `i`, read from the shards.
    pub fn example(&self, i: usize) -> Cow<'_, Example> {
        Cow::Owned(materialize(
            self.corpus.as_ref(),
            &self.stream,
            self.specials,
            &self.plans[i],
        ))
    }

    pub fn length(&self, i: usize) -> usize {
        self.plans[i].len()
    }

    /// The content hash and the options the sequences were planned with.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Moves the last `n` sequences into a set of their own (held out).
    pub fn split_off_last(&mut self, n: usize) -> PreparedSequences {
        let at = self.plans.len().saturating_sub(n);
        let held_out = PreparedSequences {
            corpus: self.corpus.clone(),
            stream: self.stream.clone(),
            specials: self.specials,
            plans: self.plans.split_off(at),
            identity: format!("{} the last {n}", self.identity),
        };
        self.identity = format!("{} but the last {n}", self.identity);
        held_out
    }
}
