//! Packing tokenized documents into pre-training sequences, as plans: the
//! document token ranges each sequence is made of, decided from lengths
//! alone. The in-memory reader ([`super::Corpus`]) builds every sequence
//! at once; a prepared corpus ([`super::prepared`]) keeps only the plans
//! and reads a sequence's tokens from its memory-mapped shards when a batch
//! needs it. Both run the same planning, so they give the same sequences.

use std::ops::Range;

use rand::Rng;

use super::corpus::{CorpusOptions, Example};
use crate::rng::rng_for;

/// Tokenized documents, each a list of pieces (sentences with NSP, lines
/// without) whose tokens follow one another.
pub trait Documents {
    fn count(&self) -> usize;

    fn pieces(&self, doc: usize) -> usize;

    fn piece_len(&self, doc: usize, piece: usize) -> usize;

    /// Appends tokens `range` of document `doc` (its pieces joined).
    fn extend_tokens(&self, doc: usize, range: Range<usize>, out: &mut Vec<u32>);

    fn doc_len(&self, doc: usize) -> usize {
        (0..self.pieces(doc)).map(|p| self.piece_len(doc, p)).sum()
    }
}

impl Documents for [Vec<Vec<u32>>] {
    fn count(&self) -> usize {
        self.len()
    }

    fn pieces(&self, doc: usize) -> usize {
        self[doc].len()
    }

    fn piece_len(&self, doc: usize, piece: usize) -> usize {
        self[doc][piece].len()
    }

    fn extend_tokens(&self, doc: usize, range: Range<usize>, out: &mut Vec<u32>) {
        let mut at = 0;
        for piece in &self[doc] {
            let (lo, hi) = (at, at + piece.len());
            if hi > range.start && lo < range.end {
                let from = range.start.max(lo) - lo;
                let to = range.end.min(hi) - lo;
                out.extend_from_slice(&piece[from..to]);
            }
            at = hi;
            if at >= range.end {
                break;
            }
        }
    }
}

/// Where one sequence's tokens come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExamplePlan {
    /// `[CLS] … [SEP]` around tokens `start..end` of the stream
    /// `doc0 [SEP] doc1 [SEP] doc2 …`.
    Window { start: u64, end: u64 },
    /// `[CLS] A [SEP] B [SEP]`; `label` 0: B follows A, 1: B is random.
    Pair { a: Segment, b: Segment, label: u32 },
}

/// Tokens `from..to` of document `doc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub doc: u32,
    pub from: u32,
    pub to: u32,
}

impl Segment {
    fn len(&self) -> usize {
        (self.to - self.from) as usize
    }
}

impl ExamplePlan {
    /// The sequence's length, special tokens included.
    pub fn len(&self) -> usize {
        match self {
            Self::Window { start, end } => (end - start) as usize + 2,
            Self::Pair { a, b, .. } => a.len() + b.len() + 3,
        }
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// The special tokens around and between segments.
#[derive(Debug, Clone, Copy)]
pub struct Specials {
    pub cls: u32,
    pub sep: u32,
}

/// Where each document starts in the stream `doc0 [SEP] doc1 [SEP] …`
/// (the separator before document `d` sits at `starts[d] - 1`), and the
/// stream's length.
pub struct Stream {
    starts: Vec<u64>,
    lens: Vec<u64>,
}

impl Stream {
    pub fn new(docs: &(impl Documents + ?Sized)) -> Self {
        let mut starts = Vec::with_capacity(docs.count());
        let mut lens = Vec::with_capacity(docs.count());
        let mut at = 0u64;
        for d in 0..docs.count() {
            if d > 0 {
                at += 1;
            }
            starts.push(at);
            let len = docs.doc_len(d) as u64;
            lens.push(len);
            at += len;
        }
        Self { starts, lens }
    }

    fn total(&self) -> u64 {
        self.starts
            .last()
            .map_or(0, |s| s + self.lens[self.lens.len() - 1])
    }

    fn is_sep(&self, pos: u64) -> bool {
        let d = self.starts.partition_point(|&s| s <= pos);
        // Between document d-1's end and document d's start.
        d < self.starts.len() && self.starts[d] == pos + 1
    }

    /// Appends stream tokens `start..end`.
    fn extend(
        &self,
        docs: &(impl Documents + ?Sized),
        sep: u32,
        start: u64,
        end: u64,
        out: &mut Vec<u32>,
    ) {
        let mut pos = start;
        let mut d = self.starts.partition_point(|&s| s <= pos).saturating_sub(1);
        while pos < end && d < self.starts.len() {
            let (s, len) = (self.starts[d], self.lens[d]);
            if pos < s {
                // The separator before document d.
                out.push(sep);
                pos += 1;
                continue;
            }
            let to = end.min(s + len);
            if to > pos {
                docs.extend_tokens(d, (pos - s) as usize..(to - s) as usize, out);
                pos = to;
            }
            d += 1;
        }
    }
}

/// Without NSP: the stream cut into full windows of `seq_len - 2` tokens;
/// a tail shorter than a quarter window is dropped, as transformers'
/// `group_texts` drops any remainder.
pub fn plan_windows(stream: &Stream, seq_len: usize) -> Vec<ExamplePlan> {
    let body = (seq_len - 2) as u64;
    let total = stream.total();
    let full = total / body;
    let mut plans: Vec<ExamplePlan> = (0..full)
        .map(|k| ExamplePlan::Window {
            start: k * body,
            end: (k + 1) * body,
        })
        .collect();
    let tail = total % body;
    let only_sep = tail == 1 && stream.is_sep(full * body);
    if tail > 0 && tail >= body / 4 && !only_sep {
        plans.push(ExamplePlan::Window {
            start: full * body,
            end: total,
        });
    }
    plans
}

/// With NSP: `[CLS] A [SEP] B [SEP]` pairs as BERT's
/// `create_pretraining_data.py` builds them: each document's pieces are
/// gathered until the target length, A takes a random number of them, B is
/// the rest (label 0) or, half the time, pieces from another document
/// (label 1, the unused pieces read again); the longer segment is trimmed
/// at a random end until the pair fits. Needs at least two documents.
pub fn plan_pairs(docs: &(impl Documents + ?Sized), opts: &CorpusOptions) -> Vec<ExamplePlan> {
    let target = opts.seq_len - 3;
    let mut rng = rng_for(opts.seed, 0x4e5350, 0);
    let n_docs = docs.count();
    let mut plans = Vec::new();
    // Token offset of each piece of a document, and its end.
    let offsets = |d: usize| -> Vec<u32> {
        let mut off = Vec::with_capacity(docs.pieces(d) + 1);
        let mut at = 0u32;
        off.push(0);
        for p in 0..docs.pieces(d) {
            at += docs.piece_len(d, p) as u32;
            off.push(at);
        }
        off
    };
    for d in 0..n_docs {
        let off = offsets(d);
        let pieces = docs.pieces(d);
        // The chunk: pieces first..first + count.
        let (mut first, mut count, mut len) = (0usize, 0usize, 0usize);
        let mut i = 0;
        while i < pieces {
            if count == 0 {
                first = i;
            }
            count += 1;
            len += docs.piece_len(d, i);
            if i == pieces - 1 || len >= target {
                let a_end = if count >= 2 {
                    rng.random_range(1..count)
                } else {
                    1
                };
                let seg = |doc: usize, from: u32, to: u32| Segment {
                    doc: doc as u32,
                    from,
                    to,
                };
                let mut a = seg(d, off[first], off[first + a_end]);
                let real_next = rng.random::<f64>() >= 0.5;
                let (mut b, label) = if real_next && count == 1 && a.len() >= 2 {
                    // One long piece: its second part is the real
                    // continuation (BERT would always draw a random B here,
                    // skewing the labels on corpora of short paragraphs).
                    let cut = rng.random_range(1..a.len()) as u32;
                    let b = seg(d, a.from + cut, a.to);
                    a.to = a.from + cut;
                    (b, 0)
                } else if count == 1 || !real_next {
                    // A random B from another document; the unused pieces
                    // of this chunk are read again.
                    let mut other = rng.random_range(0..n_docs - 1);
                    if other >= d {
                        other += 1;
                    }
                    let start = rng.random_range(0..docs.pieces(other));
                    let want = target.saturating_sub(a.len()).max(1);
                    let o_off = offsets(other);
                    let mut end = start;
                    while end < docs.pieces(other) {
                        end += 1;
                        if (o_off[end] - o_off[start]) as usize >= want {
                            break;
                        }
                    }
                    i -= count - a_end;
                    (seg(other, o_off[start], o_off[end]), 1)
                } else {
                    (seg(d, off[first + a_end], off[first + count]), 0)
                };
                // Trim the longer segment until the pair fits.
                while a.len() + b.len() > target {
                    let longer = if a.len() > b.len() { &mut a } else { &mut b };
                    if rng.random::<bool>() {
                        longer.from += 1;
                    } else {
                        longer.to -= 1;
                    }
                }
                if a.len() > 0 && b.len() > 0 {
                    plans.push(ExamplePlan::Pair { a, b, label });
                }
                count = 0;
                len = 0;
            }
            i += 1;
        }
    }
    plans
}

/// The sequence a plan describes.
pub fn materialize(
    docs: &(impl Documents + ?Sized),
    stream: &Stream,
    specials: Specials,
    plan: &ExamplePlan,
) -> Example {
    let mut input_ids = Vec::with_capacity(plan.len());
    input_ids.push(specials.cls);
    match plan {
        ExamplePlan::Window { start, end } => {
            stream.extend(docs, specials.sep, *start, *end, &mut input_ids);
            input_ids.push(specials.sep);
            let n = input_ids.len();
            Example {
                input_ids,
                token_type_ids: vec![0; n],
                next_sentence_label: None,
            }
        }
        ExamplePlan::Pair { a, b, label } => {
            let range = |s: &Segment| s.from as usize..s.to as usize;
            docs.extend_tokens(a.doc as usize, range(a), &mut input_ids);
            input_ids.push(specials.sep);
            let na = input_ids.len();
            docs.extend_tokens(b.doc as usize, range(b), &mut input_ids);
            input_ids.push(specials.sep);
            let mut token_type_ids = vec![0; na];
            token_type_ids.resize(input_ids.len(), 1);
            Example {
                input_ids,
                token_type_ids,
                next_sentence_label: Some(*label),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_stream_with_separators() {
        let docs: Vec<Vec<Vec<u32>>> = vec![
            vec![vec![5u32; 252]],
            vec![vec![6u32; 50], vec![7u32; 10]],
            vec![vec![8u32; 200]],
        ];
        let stream = Stream::new(docs.as_slice());
        let plans = plan_windows(&stream, 128);
        let sp = Specials { cls: 1, sep: 2 };
        let ex: Vec<Example> = plans
            .iter()
            .map(|p| materialize(docs.as_slice(), &stream, sp, p))
            .collect();
        let lens: Vec<usize> = ex.iter().map(|e| e.input_ids.len()).collect();
        // 252 fill two windows exactly; the separator starts the third; a
        // tail of 10 tokens is dropped.
        assert_eq!(lens, vec![128, 128, 128, 128]);
        assert_eq!(ex[2].input_ids[..3], [1, 2, 6]);
        assert!(ex
            .iter()
            .all(|e| e.input_ids[0] == 1 && *e.input_ids.last().unwrap() == 2));
        // Every token of the stream, in order, up to the dropped tail.
        let body: Vec<u32> = ex
            .iter()
            .flat_map(|e| e.input_ids[1..e.input_ids.len() - 1].to_vec())
            .collect();
        let mut want = vec![5u32; 252];
        want.push(2);
        want.extend([6u32; 50]);
        want.extend([7u32; 10]);
        want.push(2);
        want.extend([8u32; 200]);
        assert_eq!(body[..], want[..body.len()]);
        assert_eq!(want.len() - body.len(), 10);
    }

    #[test]
    fn pieces_are_read_across_their_boundaries() {
        let docs: Vec<Vec<Vec<u32>>> = vec![vec![vec![1, 2, 3], vec![4], vec![5, 6]]];
        let mut out = Vec::new();
        docs.as_slice().extend_tokens(0, 2..5, &mut out);
        assert_eq!(out, [3, 4, 5]);
    }
}
