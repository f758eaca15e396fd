//! Extractive question answering, with the rule of transformers' v4
//! `question-answering` pipeline: the question and (a window of) the
//! context go through the model as a pair; the answer is the span of
//! context tokens with start ≤ end and at most `max_answer_len` tokens that
//! maximises `softmax(start)[s] · softmax(end)[e]`, the softmaxes taken over
//! the window's context tokens. Contexts longer than the model's window
//! are split into windows overlapping by `doc_stride` tokens; the best
//! span of any window wins. `start`/`end` are character offsets into the
//! context.

use std::path::Path;

use candle_core::Device;
use tokenizers::Encoding;

use super::pipeline::{self, softmax, PipelineHead};
use super::PipelineOptions;
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::model::{BertForQuestionAnswering, BertHead};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QaOptions {
    /// How many answers (distinct spans), best first.
    pub top_k: usize,
    /// The longest answer, in tokens.
    pub max_answer_len: usize,
    /// Tokens shared by consecutive windows (default: min(128, max_seq_len / 2),
    /// lowered when the question leaves less room than that).
    pub doc_stride: Option<usize>,
    /// Tokens per window, special tokens and question included (default:
    /// min(384, max_position_embeddings)).
    pub max_seq_len: Option<usize>,
}

/// Limits on one [`QuestionAnswerer::answer_within`] call.
pub struct QaBounds {
    /// Most windows the context may be cut into (default: no limit).
    pub max_windows: usize,
    /// Checked between model passes: `true` stops the work.
    pub stop: Option<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl Default for QaBounds {
    fn default() -> Self {
        Self {
            max_windows: usize::MAX,
            stop: None,
        }
    }
}

impl Default for QaOptions {
    fn default() -> Self {
        Self {
            top_k: 1,
            max_answer_len: 15,
            doc_stride: None,
            max_seq_len: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Answer {
    pub score: f32,
    /// Character offsets into the context.
    pub start: usize,
    pub end: usize,
    pub answer: String,
}

/// One window: `[CLS] question [SEP] context[from..from+len] [SEP]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    /// Index in `input_ids` of the first context token.
    pub context_start: usize,
    /// Index of the first context token in the whole context.
    pub from: usize,
    /// Number of context tokens.
    pub len: usize,
}

pub struct QuestionAnswerer {
    model: PipelineHead<BertForQuestionAnswering>,
    /// The folder's tokenizer without truncation (windows are cut here).
    tokenizer: tokenizers::Tokenizer,
    cls_id: u32,
    sep_id: u32,
    pad_id: u32,
}

impl QuestionAnswerer {
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_dir_with(dir, device, &PipelineOptions::default())
    }

    /// [`QuestionAnswerer::from_dir`] at the precision `opts` asks.
    pub fn from_dir_with(dir: &Path, device: &Device, opts: &PipelineOptions) -> Result<Self> {
        let (model, tokenizer) = pipeline::load(dir, device, None, opts)?;
        Self::build(model, &tokenizer)
    }

    /// A pipeline over `model` in fp32.
    pub fn new(model: BertForQuestionAnswering, tokenizer: &Tokenizer) -> Result<Self> {
        Self::build(PipelineHead::f32(model), tokenizer)
    }

    fn build(model: PipelineHead<BertForQuestionAnswering>, tokenizer: &Tokenizer) -> Result<Self> {
        let mut inner = tokenizer.inner().clone();
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        // BERT's `[CLS]`/`[SEP]`, or RoBERTa's `<s>`/`</s>`.
        let id = |t: &str, alt: &str| {
            tokenizer
                .token_to_id(t)
                .or_else(|| tokenizer.token_to_id(alt))
                .ok_or_else(|| {
                    Error::Tokenizer(format!("the vocabulary has no `{t}` (or `{alt}`) token"))
                })
        };
        Ok(Self {
            cls_id: id("[CLS]", "<s>")?,
            sep_id: id("[SEP]", "</s>")?,
            pad_id: tokenizer.pad_id(),
            model,
            tokenizer: inner,
        })
    }

    /// The precision the encoder runs at.
    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    fn encode(&self, text: &str) -> Result<Encoding> {
        self.tokenizer
            .encode_char_offsets(text, false)
            .map_err(|e| Error::Tokenizer(format!("encoding text: {e}")))
    }

    fn max_seq_len(&self, opts: &QaOptions) -> Result<usize> {
        let config = self.model.head().config();
        let limit = config.max_sequence_length();
        match opts.max_seq_len {
            Some(n) if n > limit => Err(Error::Input(format!(
                "max_seq_len {n} is longer than the model's limit of {limit} tokens (max_position_embeddings {})",
                config.max_position_embeddings
            ))),
            Some(n) => Ok(n),
            None => Ok(limit.min(384)),
        }
    }

    /// The windows the context is cut into for this question.
    pub fn windows(&self, question: &str, context: &str, opts: &QaOptions) -> Result<Vec<Window>> {
        let q = self.encode(question)?;
        let c = self.encode(context)?;
        self.windows_of(&q, &c, opts, usize::MAX)
    }

    fn windows_of(
        &self,
        q: &Encoding,
        c: &Encoding,
        opts: &QaOptions,
        max_windows: usize,
    ) -> Result<Vec<Window>> {
        if q.get_ids().is_empty() {
            return Err(Error::Input("the question is empty".into()));
        }
        if c.get_ids().is_empty() {
            return Err(Error::Input("the context is empty".into()));
        }
        let max_seq_len = self.max_seq_len(opts)?;
        let q_len = q.get_ids().len();
        let room = max_seq_len.saturating_sub(q_len + 3);
        if room == 0 {
            return Err(Error::Input(format!(
                "the question ({q_len} tokens) does not leave room for the context in a window of \
                 {max_seq_len} tokens ([CLS] question [SEP] context [SEP]); shorten the question"
            )));
        }
        let stride = match opts.doc_stride {
            Some(s) if s >= room => {
                return Err(Error::Input(format!(
                    "doc_stride {s} must be smaller than the {room} context tokens a window holds \
                     next to this question (max_seq_len {max_seq_len})"
                )))
            }
            Some(s) => s,
            None => (max_seq_len / 2).min(128).min(room / 2),
        };
        let n = c.get_ids().len();
        let step = room - stride;
        // Counted before any is built: 90k windows of a long context and a
        // small stride took a minute of CPU (and their ids hundreds of MB).
        let count = if n <= room {
            1
        } else {
            1 + (n - room).div_ceil(step)
        };
        if count > max_windows {
            return Err(Error::Input(format!(
                "the context ({n} tokens) makes {count} windows of {max_seq_len} tokens at \
                 doc_stride {stride}, more than the {max_windows} allowed: shorten the context \
                 or use a smaller doc_stride"
            )));
        }
        let mut windows = Vec::with_capacity(count);
        let mut from = 0;
        loop {
            let len = room.min(n - from);
            let mut ids = vec![self.cls_id];
            ids.extend_from_slice(q.get_ids());
            ids.push(self.sep_id);
            let context_start = ids.len();
            ids.extend_from_slice(&c.get_ids()[from..from + len]);
            ids.push(self.sep_id);
            let mut types = vec![0u32; context_start];
            types.resize(ids.len(), 1);
            windows.push(Window {
                input_ids: ids,
                token_type_ids: types,
                context_start,
                from,
                len,
            });
            if from + len >= n {
                break;
            }
            from += step;
        }
        Ok(windows)
    }

    /// The `top_k` best answers to `question` in `context`.
    pub fn answer(&self, question: &str, context: &str, opts: &QaOptions) -> Result<Vec<Answer>> {
        self.answer_within(question, context, opts, &QaBounds::default())
    }

    /// [`QuestionAnswerer::answer`] within `bounds`: at most
    /// `max_windows` windows (refused before any model work), and given
    /// up between passes once `stop` says so (a server's client gone).
    pub fn answer_within(
        &self,
        question: &str,
        context: &str,
        opts: &QaOptions,
        bounds: &QaBounds,
    ) -> Result<Vec<Answer>> {
        if opts.top_k == 0 {
            return Err(Error::Input("top_k must be at least 1".into()));
        }
        if opts.max_answer_len == 0 {
            return Err(Error::Input("max_answer_len must be at least 1".into()));
        }
        let q = self.encode(question)?;
        let c = self.encode(context)?;
        let windows = self.windows_of(&q, &c, opts, bounds.max_windows)?;
        let offsets = c.get_offsets();
        let mut best = TopSpans::new(opts.top_k);
        let per_pass = (TOKENS_PER_PASS / self.max_seq_len(opts)?).max(1);
        for chunk in windows.chunks(per_pass) {
            if bounds.stop.as_ref().is_some_and(|stop| stop()) {
                return Err(Error::Input(
                    "stopped: the answer is no longer wanted".into(),
                ));
            }
            let ids: Vec<Vec<u32>> = chunk.iter().map(|w| w.input_ids.clone()).collect();
            let types: Vec<Vec<u32>> = chunk.iter().map(|w| w.token_type_ids.clone()).collect();
            let out = self.model.forward(&ids, &types, self.pad_id)?;
            let starts = out.start_logits.to_vec2::<f32>()?;
            let ends = out.end_logits.to_vec2::<f32>()?;
            for (b, w) in chunk.iter().enumerate() {
                let ctx = w.context_start..w.context_start + w.len;
                let ps = softmax(&starts[b][ctx.clone()]);
                let pe = softmax(&ends[b][ctx]);
                for (i, &s) in ps.iter().enumerate() {
                    for (j, &e) in pe.iter().enumerate().skip(i).take(opts.max_answer_len) {
                        let span = (offsets[w.from + i].0, offsets[w.from + j].1);
                        best.offer(s * e, span);
                    }
                }
            }
        }
        let answers = best
            .into_sorted()
            .into_iter()
            .map(|(score, (start, end))| Answer {
                score,
                start,
                end,
                answer: pipeline::char_slice(context, start, end),
            })
            .collect();
        Ok(answers)
    }
}

/// Window tokens run through the model in one pass (10 windows of 384
/// tokens): bounds the activations however long the context, while short
/// windows still go many at a time.
const TOKENS_PER_PASS: usize = 4096;

/// The `k` best distinct answers (character spans) among every candidate
/// (score, span) of every window, in bounded memory: a span keeps its best
/// score, ties go to the earlier candidate, and once more than `2k` spans
/// are held the worst are dropped. Exact: a span's best score only grows
/// and so does the k-th best, so a dropped span can only come back with a
/// higher score, which it then keeps; for the same reason a candidate
/// scoring below the k-th best at the last drop is passed over at once.
/// (Collecting every candidate took `windows × context tokens ×
/// max_answer_len` entries: ~70 MB for a 1 MB context.)
struct TopSpans {
    k: usize,
    /// span → (best score, the number of the candidate that gave it).
    held: std::collections::HashMap<(usize, usize), (f32, u64)>,
    /// The k-th best score when the worst were last dropped.
    floor: f32,
    seen: u64,
}

impl TopSpans {
    fn new(k: usize) -> Self {
        Self {
            k,
            held: std::collections::HashMap::new(),
            floor: f32::NEG_INFINITY,
            seen: 0,
        }
    }

    fn offer(&mut self, score: f32, span: (usize, usize)) {
        let seq = self.seen;
        self.seen += 1;
        if score.total_cmp(&self.floor).is_lt() {
            return;
        }
        let held = self.held.entry(span).or_insert((score, seq));
        if score.total_cmp(&held.0).is_gt() {
            *held = (score, seq);
        }
        if self.held.len() > self.k.saturating_mul(2).max(64) {
            let mut keep = self.sorted();
            keep.truncate(self.k);
            if let Some(last) = keep.last() {
                self.floor = last.0;
            }
            self.held = keep
                .into_iter()
                .map(|(s, q, span)| (span, (s, q)))
                .collect();
        }
    }

    /// Best first; equal scores in the order they were seen.
    fn sorted(&self) -> Vec<(f32, u64, (usize, usize))> {
        let mut all: Vec<_> = self
            .held
            .iter()
            .map(|(&span, &(s, q))| (s, q, span))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        all
    }

    fn into_sorted(self) -> Vec<(f32, (usize, usize))> {
        let mut all = self.sorted();
        all.truncate(self.k);
        all.into_iter().map(|(s, _, span)| (s, span)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The rule [`TopSpans`] replaces: every candidate kept, sorted best
    /// first (stable, so ties keep their order), the first of each span.
    fn naive(cands: &[(f32, (usize, usize))], k: usize) -> Vec<(f32, (usize, usize))> {
        let mut all = cands.to_vec();
        all.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut out: Vec<(f32, (usize, usize))> = Vec::new();
        for c in all {
            if out.iter().all(|o| o.1 != c.1) {
                out.push(c);
            }
            if out.len() == k {
                break;
            }
        }
        out
    }

    #[test]
    fn bounded_top_spans_equal_keeping_every_candidate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..200 {
            let k = [1, 2, 5, 40][round % 4];
            let spans = rng.random_range(1..300);
            // Coarse scores make ties; few spans make repeats.
            let cands: Vec<(f32, (usize, usize))> = (0..rng.random_range(1..3000))
                .map(|_| {
                    let s = rng.random_range(0..spans);
                    (rng.random_range(0..50) as f32 / 50.0, (s, s + 3))
                })
                .collect();
            let mut top = TopSpans::new(k);
            for &(score, span) in &cands {
                top.offer(score, span);
            }
            assert!(top.held.len() <= (2 * k).max(64) + 1);
            assert_eq!(top.into_sorted(), naive(&cands, k), "round {round}");
        }
    }
}
