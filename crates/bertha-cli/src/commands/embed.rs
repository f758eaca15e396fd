//! `bertha embed`: streams. Texts are read, embedded and written a chunk at
//! a time (each chunk length-sorted into batches, its lines written in
//! input order and flushed), so memory stays bounded whatever the input's
//! size, the output grows from the first chunk (in `OUT.partial`, renamed
//! to `OUT` when complete), and `--resume-output` continues an interrupted
//! run after its last complete line.
//!
//! Each line is `{"embedding": [..]}`; with `--pooling splade` (or a
//! SparseEncoder folder) the vector is sparse, in TEI's `/embed_sparse`
//! shape: `{"embedding": [{"index": 2023, "value": 1.52}, ..]}`, the
//! nonzero vocabulary entries by increasing index.

use anyhow::{bail, Result};
use bertha::{Embedder, EncodeOptions, Pooling};
use serde_json::json;

use super::EmbedTextArgs;
use crate::output::{LineCheck, StreamedLines};
use crate::texts::{stream_progress_bar, Truncations};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: EmbedTextArgs,

    /// Continue an interrupted run: OUT.partial (or OUT) is kept up to its
    /// last complete line and the texts it has lines for are skipped.
    /// Without it, OUT is written from the start.
    #[arg(long, requires = "output")]
    pub resume_output: bool,
}

/// Texts per chunk: enough for length-sorted batches to waste little on
/// padding (pooled vectors are small), fewer for token vectors, which
/// weigh `tokens × hidden` floats each.
fn chunk_texts(pooling: Pooling, batch_size: usize) -> usize {
    let batch = batch_size.max(1);
    if pooling == Pooling::None {
        batch * 2
    } else {
        (batch * 64).clamp(1024, 16384)
    }
}

pub fn run(args: Args) -> Result<()> {
    let a = &args.common;
    let embedder = a.embed.load()?;
    let opts = a.encode_options();
    // Checks the prompt and dimensions before any output is made.
    embedder.encode_texts::<&str>(&[], &opts)?;
    if embedder.is_sparse() {
        embedder.embed_sparse_with::<&str>(&[], &opts, 1, &mut |_| {})?;
    }
    let mut stream = a.texts.stream()?;
    let (mut out, done) = match &a.output {
        Some(path) if args.resume_output => {
            let check = line_check(&embedder, &opts);
            let resume = StreamedLines::resume(path, &*check)?;
            let done = resume.lines();
            // Counted before any file is touched: a refusal leaves the
            // output as it was.
            for skipped in 0..done {
                if stream.texts.next().transpose()?.is_none() {
                    bail!(
                        "{} already holds {done} lines but the input has only {skipped} texts: \
                         is it the output of this input?",
                        path.display()
                    );
                }
            }
            if done > 0 {
                eprintln!("resuming after the {done} lines already written");
            }
            (resume.start()?, done)
        }
        path => (StreamedLines::create(path.as_deref())?, 0),
    };
    let bar = stream_progress_bar(stream.total.map(|n| n.saturating_sub(done)));
    let mut tally = Truncations::after(done);
    // The first chunk is one batch and each next one twice the last, up
    // to the full size: the output starts within a second, not after the
    // first full chunk.
    let full = chunk_texts(embedder.pooling(), a.embed.batch_size);
    let mut chunk = a.embed.batch_size.clamp(1, full);
    let mut texts = Vec::with_capacity(full);
    let mut finished = 0;
    loop {
        texts.clear();
        for text in stream.texts.by_ref().take(chunk) {
            texts.push(text?);
        }
        if texts.is_empty() {
            break;
        }
        let start = finished;
        let mut progress = |n: usize| bar.set_position((start + n) as u64);
        embed_chunk(
            &embedder,
            &texts,
            &opts,
            a.embed.batch_size,
            &mut progress,
            &mut tally,
            &mut out,
        )?;
        out.flush()?;
        chunk = (chunk * 2).min(full);
        finished += texts.len();
        bar.set_position(finished as u64);
    }
    bar.finish_and_clear();
    tally.report(embedder.tokenizer().max_length());
    out.finish()
}

/// Embeds one chunk and writes its lines in input order.
fn embed_chunk(
    embedder: &Embedder,
    texts: &[String],
    opts: &EncodeOptions,
    batch_size: usize,
    progress: &mut dyn FnMut(usize),
    tally: &mut Truncations,
    out: &mut StreamedLines,
) -> Result<()> {
    let encodings = embedder.encode_texts(texts, opts)?;
    tally.add(&encodings);
    if embedder.pooling() == Pooling::None {
        for row in embedder.embed_tokens_encoded(&encodings, batch_size, progress)? {
            out.write(&row)?;
        }
    } else if embedder.is_sparse() {
        for row in embedder.embed_sparse_encoded_with(&encodings, opts, batch_size, progress)? {
            out.write(&json!({ "embedding": row }))?;
        }
    } else {
        for row in embedder.embed_encoded_with(&encodings, opts, batch_size, progress)? {
            out.write(&json!({ "embedding": row }))?;
        }
    }
    Ok(())
}

/// What a line of this run looks like, for `--resume-output` to keep only
/// such lines: `{"embedding": [..]}` of the run's dimension; for SPLADE,
/// entries `{"index", "value"}` inside the vocabulary; for token vectors,
/// `{"tokens", "embeddings"}` of the hidden size, one vector a token.
fn line_check(embedder: &Embedder, opts: &EncodeOptions) -> Box<LineCheck> {
    use serde_json::Value;
    fn fields(v: &Value, want: &[&str]) -> std::result::Result<(), String> {
        let obj = v.as_object().ok_or("not a JSON object")?;
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        if keys != want {
            return Err(format!("fields {keys:?}, expected {want:?}"));
        }
        Ok(())
    }
    fn numbers(v: &Value, n: usize, what: &str) -> std::result::Result<(), String> {
        let a = v.as_array().ok_or(format!("{what} is not a list"))?;
        if a.len() != n {
            return Err(format!(
                "{what} has {} values, this run writes {n}",
                a.len()
            ));
        }
        if !a.iter().all(Value::is_number) {
            return Err(format!("{what} holds a value that is not a number"));
        }
        Ok(())
    }
    if embedder.pooling() == Pooling::None {
        let hidden = embedder.model().config().hidden_size;
        return Box::new(move |v| {
            fields(v, &["embeddings", "tokens"])?;
            let tokens = v["tokens"].as_array().ok_or("`tokens` is not a list")?;
            let vectors = v["embeddings"]
                .as_array()
                .ok_or("`embeddings` is not a list")?;
            if tokens.len() != vectors.len() || !tokens.iter().all(Value::is_string) {
                return Err("`tokens` and `embeddings` do not pair up".into());
            }
            vectors
                .iter()
                .try_for_each(|e| numbers(e, hidden, "a token's vector"))
        });
    }
    if embedder.is_sparse() {
        let vocab = embedder.dimension();
        return Box::new(move |v| {
            fields(v, &["embedding"])?;
            let entries = v["embedding"]
                .as_array()
                .ok_or("`embedding` is not a list")?;
            for e in entries {
                fields(e, &["index", "value"])?;
                let index = e["index"]
                    .as_u64()
                    .ok_or("an index is not a whole number")?;
                if index >= vocab as u64 || !e["value"].is_number() {
                    return Err(format!("entry {e} is outside a vocabulary of {vocab}"));
                }
            }
            Ok(())
        });
    }
    let dim = opts.dimensions.unwrap_or(embedder.dimension());
    Box::new(move |v| {
        fields(v, &["embedding"])?;
        numbers(&v["embedding"], dim, "`embedding`")
    })
}
