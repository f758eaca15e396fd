//! Dynamic batching: requests queue their tokenized inputs; one worker
//! thread (off the async runtime) takes everything queued, up to
//! `max_batch_tokens`, runs it as one batch, and answers each request
//! with its own rows, in its own order. (On the CPU fast path the embedder
//! runs a batch of several texts as one part per core, side by side.)
//!
//! One request must never fail another: inputs are checked against the
//! model's vocabulary before they join the queue, and should a shared batch
//! still fail, each of its requests is run again alone so that only the
//! culprit gets the error.

use std::sync::Arc;
use std::time::Instant;

use bertha::tasks::TokenEmbeddings;
use bertha::{Embedder, Encoded, SparseVector};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a request wants from the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// One pooled (unnormalised) vector per input.
    Pooled,
    /// One vector per token per input.
    Tokens,
    /// One SPLADE sparse vector per input (a SPLADE model only).
    Sparse,
}

pub enum Output {
    Pooled(Vec<Vec<f32>>),
    Tokens(Vec<TokenEmbeddings>),
    Sparse(Vec<SparseVector>),
}

struct Job {
    inputs: Vec<Encoded>,
    /// The first token each input's pooled vector takes (past a prompt).
    pool_start: usize,
    want: Want,
    reply: oneshot::Sender<Result<Output, String>>,
}

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::UnboundedSender<Job>,
    metrics: Arc<Metrics>,
    /// The model's `vocab_size`: ids from here on have no embedding.
    vocab_size: usize,
}

impl Batcher {
    /// Starts the worker thread. The embedder must not normalise: requests
    /// choose normalisation for themselves.
    pub fn start(embedder: Arc<Embedder>, max_batch_tokens: usize, metrics: Arc<Metrics>) -> Self {
        let vocab_size = embedder.model().config().vocab_size;
        let (tx, rx) = mpsc::unbounded_channel();
        let worker_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("bertha-batcher".into())
            .spawn(move || worker(rx, embedder, max_batch_tokens, worker_metrics))
            .expect("spawning the batching thread");
        Self {
            tx,
            metrics,
            vocab_size,
        }
    }

    /// Runs `inputs` in the next batch. Inputs the model cannot take are a
    /// 422 for this request alone; a model failure is a 500.
    pub async fn run(&self, inputs: Vec<Encoded>, want: Want) -> Result<Output, ApiError> {
        self.run_from(inputs, 0, want).await
    }

    /// As [`Batcher::run`], pooling each input from its token `pool_start`
    /// on (a prompt left out of the pooled vector).
    pub async fn run_from(
        &self,
        inputs: Vec<Encoded>,
        pool_start: usize,
        want: Want,
    ) -> Result<Output, ApiError> {
        self.check_ids(&inputs)?;
        let (reply, rx) = oneshot::channel();
        self.metrics.queue_depth.inc();
        if self
            .tx
            .send(Job {
                inputs,
                pool_start,
                want,
                reply,
            })
            .is_err()
        {
            self.metrics.queue_depth.dec();
            return Err(ApiError::backend("the model worker has stopped"));
        }
        rx.await
            .map_err(|_| ApiError::backend("the model worker dropped the request"))?
            .map_err(ApiError::backend)
    }

    /// Every token id must have an embedding row.
    fn check_ids(&self, inputs: &[Encoded]) -> Result<(), ApiError> {
        for (i, input) in inputs.iter().enumerate() {
            if let Some(id) = input
                .input_ids
                .iter()
                .find(|&&id| id as usize >= self.vocab_size)
            {
                return Err(ApiError::validation(format!(
                    "Input validation error: `inputs[{i}]` has token id {id}, outside the model's vocabulary of {} ids",
                    self.vocab_size
                )));
            }
        }
        Ok(())
    }
}

fn worker(
    mut rx: mpsc::UnboundedReceiver<Job>,
    embedder: Arc<Embedder>,
    max_batch_tokens: usize,
    metrics: Arc<Metrics>,
) {
    let mut pending: Option<Job> = None;
    loop {
        let first = match pending.take() {
            Some(job) => job,
            None => match rx.blocking_recv() {
                Some(job) => job,
                None => return,
            },
        };
        // Take whatever else is queued for the same kind of work, within
        // the token budget.
        let want = first.want;
        let mut tokens: usize = first.inputs.iter().map(Encoded::len).sum();
        let mut jobs = vec![first];
        while let Ok(job) = rx.try_recv() {
            let n: usize = job.inputs.iter().map(Encoded::len).sum();
            if job.want != want || tokens + n > max_batch_tokens {
                pending = Some(job);
                break;
            }
            tokens += n;
            jobs.push(job);
        }
        for _ in &jobs {
            metrics.queue_depth.dec();
        }
        let started = Instant::now();
        let all: Vec<Encoded> = jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
        let starts: Vec<usize> = jobs
            .iter()
            .flat_map(|j| std::iter::repeat_n(j.pool_start, j.inputs.len()))
            .collect();
        metrics.batch_texts.observe(all.len() as f64);
        metrics.batch_tokens.observe(tokens as f64);
        metrics.input_tokens.inc_by(tokens as u64);
        let result = forward(&embedder, &all, &starts, want);
        tracing::debug!(
            texts = all.len(),
            tokens,
            ms = started.elapsed().as_millis() as u64,
            "batch"
        );
        match result {
            Err(e) if jobs.len() == 1 => {
                tracing::error!(texts = all.len(), "model batch failed: {e}");
                let _ = jobs.remove(0).reply.send(Err(e.to_string()));
            }
            Err(e) => {
                // Find the culprit: each request again, on its own.
                tracing::warn!(
                    requests = jobs.len(),
                    "model batch failed, running its requests one by one: {e}"
                );
                for job in jobs {
                    let starts = vec![job.pool_start; job.inputs.len()];
                    let alone = forward(&embedder, &job.inputs, &starts, want).map_err(|e| {
                        tracing::error!(texts = job.inputs.len(), "model request failed: {e}");
                        e.to_string()
                    });
                    let _ = job.reply.send(alone);
                }
            }
            Ok(Output::Pooled(mut rows)) => {
                for job in jobs.into_iter().rev() {
                    let mine = rows.split_off(rows.len() - job.inputs.len());
                    let _ = job.reply.send(Ok(Output::Pooled(mine)));
                }
            }
            Ok(Output::Tokens(mut rows)) => {
                for job in jobs.into_iter().rev() {
                    let mine = rows.split_off(rows.len() - job.inputs.len());
                    let _ = job.reply.send(Ok(Output::Tokens(mine)));
                }
            }
            Ok(Output::Sparse(mut rows)) => {
                for job in jobs.into_iter().rev() {
                    let mine = rows.split_off(rows.len() - job.inputs.len());
                    let _ = job.reply.send(Ok(Output::Sparse(mine)));
                }
            }
        }
    }
}

/// One model call over `inputs`, pooled from `starts`.
fn forward(
    embedder: &Embedder,
    inputs: &[Encoded],
    starts: &[usize],
    want: Want,
) -> bertha::Result<Output> {
    match want {
        Want::Pooled => embedder
            .embed_encoded_from(inputs, starts, inputs.len().max(1), &mut |_| {})
            .map(Output::Pooled),
        Want::Tokens => embedder
            .embed_tokens_encoded(inputs, inputs.len().max(1), &mut |_| {})
            .map(Output::Tokens),
        // The MLM logits run a bounded number of tokens at a time, and each
        // text's vocabulary-sized vector is made sparse as soon as it is
        // complete: a batch holds its encoder states, one chunk of logits
        // and its sparse answers.
        Want::Sparse => embedder
            .embed_sparse_encoded_from(inputs, starts, inputs.len().max(1), &mut |_| {})
            .map(Output::Sparse),
    }
}
