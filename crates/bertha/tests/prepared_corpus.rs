//! A prepared corpus (tokenized once into memory-mapped shards) gives the
//! very sequences the text reader gives, windows and NSP pairs alike, with
//! documents spread over several shards; it refuses another tokenizer, a
//! damaged shard and an existing folder it was not told to replace.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bertha::data::prepared::tokenizer_hash;
use bertha::data::{prepare_corpus, Corpus, CorpusOptions, PrepareOptions, PreparedCorpus};
use bertha::Tokenizer;
use common::fixtures;

fn tokenizer() -> (Tokenizer, PathBuf) {
    let dir = fixtures().join("minilm-tokenizer");
    (Tokenizer::from_dir(&dir, 512).unwrap(), dir)
}

fn corpus() -> PathBuf {
    fixtures().join("corpus-wiki-slice.txt")
}

fn prepare(out: &Path, sentences: bool, shard_tokens: usize) -> PreparedCorpus {
    let (tok, dir) = tokenizer();
    let opts = PrepareOptions {
        sentences,
        shard_tokens,
        overwrite: false,
    };
    prepare_corpus(&[corpus()], &tok, &dir, &opts, out).unwrap();
    PreparedCorpus::open(out, Some(tokenizer_hash(&dir).unwrap())).unwrap()
}

fn same_sequences(nsp: bool, seq_len: usize) {
    let (tok, _) = tokenizer();
    let tmp = tempfile::tempdir().unwrap();
    // Small shards: documents end up in many of them.
    let prepared = Arc::new(prepare(&tmp.path().join("c"), nsp, 700));
    assert!(
        prepared.header.shards.len() > 5,
        "{:?}",
        prepared.header.shards.len()
    );
    let opts = CorpusOptions {
        seq_len,
        nsp,
        seed: 7,
    };
    let text = Corpus::read(&[corpus()], &tok, &opts).unwrap();
    assert_eq!(prepared.header.documents, text.documents);
    assert_eq!(prepared.header.tokens, text.tokens);
    let seqs = prepared.sequences(&tok, &opts).unwrap();
    assert_eq!(seqs.len(), text.len());
    assert!(text.len() > 50, "{}", text.len());
    for (i, want) in text.examples.iter().enumerate() {
        assert_eq!(seqs.length(i), want.input_ids.len(), "sequence {i}");
        assert_eq!(seqs.example(i).as_ref(), want, "sequence {i}");
    }
}

#[test]
fn prepared_windows_equal_the_text_readers() {
    same_sequences(false, 32);
}

#[test]
fn prepared_nsp_pairs_equal_the_text_readers() {
    same_sequences(true, 64);
}

#[test]
fn ids_of_a_small_vocabulary_take_two_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prepare(&tmp.path().join("c"), false, 1 << 20);
    assert_eq!(p.header.token_bytes, 2);
    assert_eq!(p.header.shards.len(), 1);
    let shard = tmp.path().join("c").join(&p.header.shards[0].file);
    let len = std::fs::metadata(&shard).unwrap().len() as usize;
    // Header, 2 bytes a token (padded to 8), then the piece and document ends.
    assert!(len >= 48 + 2 * p.header.tokens && len < 48 + 4 * p.header.tokens + 8 * 4000);
}

#[test]
fn refusals_name_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let p = prepare(&out, false, 1 << 20);
    let (tok, dir) = tokenizer();
    // An existing folder is not replaced unless asked.
    let opts = PrepareOptions {
        sentences: false,
        shard_tokens: 1 << 20,
        overwrite: false,
    };
    let err = prepare_corpus(&[corpus()], &tok, &dir, &opts, &out)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--overwrite"), "{err}");
    // Another tokenizer.
    let err = PreparedCorpus::open(&out, Some(12345))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("another tokenizer"), "{err}");
    // NSP needs sentences.
    let prepared = Arc::new(PreparedCorpus::open(&out, None).unwrap());
    let nsp = CorpusOptions {
        seq_len: 64,
        nsp: true,
        seed: 0,
    };
    let err = prepared.sequences(&tok, &nsp).err().unwrap().to_string();
    assert!(err.contains("prepare-corpus --nsp"), "{err}");
    // A truncated shard.
    let shard = out.join(&p.header.shards[0].file);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 8]).unwrap();
    let err = PreparedCorpus::open(&out, None).err().unwrap().to_string();
    assert!(err.contains("its header describes"), "{err}");
    // Nothing half-written is left beside the output.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["c"]);
}

fn opts(overwrite: bool) -> PrepareOptions {
    PrepareOptions {
        sentences: false,
        shard_tokens: 1 << 20,
        overwrite,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Issue 46, case 1: `--overwrite` replaced whatever `--out` was, the
/// corpus folder itself included. Now it replaces only a prepared corpus,
/// and refuses before reading anything.
#[test]
fn overwrite_never_deletes_what_prepare_corpus_did_not_write() {
    let (tok, dir) = tokenizer();
    let tmp = tempfile::tempdir().unwrap();
    // The corpus folder as the output.
    let cdir = tmp.path().join("cdir");
    std::fs::create_dir(&cdir).unwrap();
    std::fs::copy(corpus(), cdir.join("text.txt")).unwrap();
    let err = prepare_corpus(std::slice::from_ref(&cdir), &tok, &dir, &opts(true), &cdir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds the corpus"), "{err}");
    assert_eq!(names(&cdir), ["text.txt"]);
    // A folder of other files.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let err = prepare_corpus(&[corpus()], &tok, &dir, &opts(true), &other)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a prepared corpus"), "{err}");
    assert_eq!(names(&other), ["notes.txt"]);
    // A prepared corpus with a file of the user's added: refused, kept.
    let out = tmp.path().join("c");
    prepare(&out, false, 1 << 20);
    std::fs::write(out.join("keep.md"), "mine").unwrap();
    let err = prepare_corpus(&[corpus()], &tok, &dir, &opts(true), &out)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`keep.md`, which prepare-corpus did not write"),
        "{err}"
    );
    assert!(out.join("keep.md").is_file());
    // A prepared corpus alone is replaced.
    std::fs::remove_file(out.join("keep.md")).unwrap();
    prepare_corpus(&[corpus()], &tok, &dir, &opts(true), &out).unwrap();
    assert_eq!(names(&out), ["corpus.json", "shard-00000.bin"]);
    assert_eq!(names(tmp.path()), ["c", "cdir", "other"]);
}

/// Issue 46, case 12: a killed run's `.OUT.tmp-PID` stayed forever, and
/// `--out FILE --overwrite` tokenized everything before failing and left
/// a temporary folder of shards.
#[test]
fn temporaries_of_dead_runs_are_removed_and_a_file_is_refused_at_once() {
    let (tok, dir) = tokenizer();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    // A process id that is not running: a finished child's.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = tmp.path().join(format!(".c.tmp-{dead}"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("shard-00000.bin"), b"partial").unwrap();
    prepare_corpus(&[corpus()], &tok, &dir, &opts(false), &out).unwrap();
    assert_eq!(names(tmp.path()), ["c"]);
    // A file as --out: refused before any tokenizing, nothing left.
    let file = tmp.path().join("f");
    std::fs::write(&file, "user data").unwrap();
    let t0 = std::time::Instant::now();
    let err = prepare_corpus(&[corpus()], &tok, &dir, &opts(true), &file)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a folder"), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "user data");
    assert_eq!(names(tmp.path()), ["c", "f"]);
}

/// Issue 46, case 14: the content hash was never checked again, and a
/// shard could be named outside the folder.
#[test]
fn damaged_tokens_and_foreign_shard_names_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let p = prepare(&out, false, 1 << 20);
    // One token changed, sizes and ends intact.
    let shard = out.join(&p.header.shards[0].file);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[48 + 2 * 10] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let err = PreparedCorpus::open(&out, None).err().unwrap().to_string();
    assert!(err.contains("content hash"), "{err}");
    bytes[48 + 2 * 10] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    PreparedCorpus::open(&out, None).unwrap();
    // corpus.json naming a file outside the folder.
    let json = out.join("corpus.json");
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::write(&json, text.replace("shard-00000.bin", "../x")).unwrap();
    let err = PreparedCorpus::open(&out, None).err().unwrap().to_string();
    assert!(
        err.contains("`../x` is not a shard-NNNNN.bin file"),
        "{err}"
    );
}

/// Issue 46, case 11: a long line was tokenized whole (50 MB: 6.8 GB) and
/// a long document at once. Now lines are read in bounded pieces and a
/// document handed on in parts; the ids are the same as before.
#[test]
fn long_lines_and_documents_are_read_in_bounded_parts() {
    use bertha::data::corpus_read::{read_documents, LINE_BYTES, PART_BYTES};
    let (tok, _) = tokenizer();
    let tmp = tempfile::tempdir().unwrap();
    let sentence = "the city was known for its university and its old bridges. ";
    let line = sentence.repeat(4 * LINE_BYTES / sentence.len());
    // One document: a long line, then many short lines, past PART_BYTES.
    let short = format!("{sentence}\n").repeat(2 * PART_BYTES / sentence.len());
    let path = tmp.path().join("big.txt");
    std::fs::write(&path, format!("{line}\n{short}\nsecond document\n")).unwrap();
    let mut parts = Vec::new();
    let stats = read_documents(&[path], &tok, false, |batch| {
        parts.extend(batch);
        Ok(())
    })
    .unwrap();
    assert_eq!(stats.documents, 2);
    let ends: Vec<bool> = parts.iter().map(|p| p.ends).collect();
    assert!(ends.len() >= 4, "{ends:?}");
    assert_eq!(ends.iter().filter(|e| **e).count(), 2);
    assert!(ends[ends.len() - 1] && ends[ends.len() - 2]);
    // Every piece of the long line is bounded, and the ids are the line's.
    let ids: Vec<u32> = parts[0].pieces.iter().take(4).flatten().copied().collect();
    let whole = tok.inner().encode(line.trim(), false).unwrap();
    let n = ids.len().min(whole.get_ids().len());
    assert_eq!(&ids[..n], &whole.get_ids()[..n]);
    let max_piece = parts
        .iter()
        .flat_map(|p| &p.pieces)
        .map(Vec::len)
        .max()
        .unwrap();
    assert!(max_piece < LINE_BYTES / 2, "{max_piece}");
}
