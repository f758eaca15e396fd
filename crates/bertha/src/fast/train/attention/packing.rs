//! How the work is laid out: the heads, the packed sequences with their
//! keys and queries, and the tasks, one per (sequence, head), with their
//! blocks of probabilities and dropout bits.

use crate::fast::train::rows::{Rows, Selection};

/// The attention's shape: heads and their width.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub count: usize,
    pub dim: usize,
}

impl Heads {
    pub(super) fn width(&self) -> usize {
        self.count * self.dim
    }
}

/// How the rows are packed: each sequence's rows, which of them are keys
/// and which are queries.
#[derive(Clone, Copy)]
pub(crate) struct Packing<'a> {
    /// Sequence `s`'s rows are `offsets[s]..offsets[s + 1]`.
    pub offsets: &'a [usize],
    /// The leading rows of each sequence that are keys (empty: all).
    pub keys: &'a [usize],
    /// The query rows (`None`: every row).
    pub queries: Option<&'a Selection>,
    /// A sliding-window layer's half window: the query at position `i`
    /// sees the keys at `|i − j| ≤ w` only (`None`: every key).
    pub window: Option<usize>,
}

impl<'a> Packing<'a> {
    /// A layer's packing: its queries are `outputs` in the last layer
    /// (`last`), every row elsewhere.
    pub fn of_layer(
        offsets: &'a [usize],
        keys: &'a [usize],
        outputs: Option<&'a Selection>,
        last: bool,
    ) -> Self {
        Self {
            offsets,
            keys,
            queries: outputs.filter(|_| last),
            window: None,
        }
    }

    /// This packing under a sliding window of half-width `window`.
    pub fn windowed(self, window: Option<usize>) -> Self {
        Self { window, ..self }
    }

    fn sequences(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Sequence `s`'s query rows: where they start in Q, and how many.
    fn queries_of(&self, s: usize) -> (usize, usize) {
        match self.queries {
            Some(sel) => sel.of_sequence(s),
            None => (self.offsets[s], self.offsets[s + 1] - self.offsets[s]),
        }
    }

    /// Query row `i` of sequence `s`'s position in it (its dropout key).
    pub(super) fn position(&self, s: usize, i: usize) -> usize {
        match self.queries {
            Some(sel) => sel.key(sel.of_sequence(s).0 + i)[1],
            None => i,
        }
    }

    /// The rows of sequence `s`'s tasks' scores: its keys, or under a
    /// sliding window every row, padding too. A padding row whose window
    /// holds no key then sees every row at `f32::MIN`, a uniform softmax
    /// over the padded sequence, as the candle path's (and transformers'
    /// eager) mask gives it ([`super::masks::mask_window`]).
    fn key_count(&self, s: usize) -> usize {
        let len = self.offsets[s + 1] - self.offsets[s];
        match self.window {
            Some(_) => len,
            None => self.real_keys(s),
        }
    }

    /// Sequence `s`'s keys: its first `keys[s]` rows (the rest padding), or
    /// all of them.
    pub(super) fn real_keys(&self, s: usize) -> usize {
        let len = self.offsets[s + 1] - self.offsets[s];
        self.keys.get(s).map_or(len, |&k| k.min(len))
    }

    /// The query rows: every packed row, or the selection.
    pub fn rows(&self) -> Rows<'a> {
        match self.queries {
            Some(sel) => Rows::Selected(sel),
            None => Rows::Packed(self.offsets),
        }
    }
}

/// Where each (sequence, head)'s `queries × keys` probabilities start in
/// the probabilities buffer, and its total length.
pub(crate) fn probability_offsets(packing: Packing, heads: Heads) -> (Vec<usize>, usize) {
    let mut at = Vec::with_capacity(packing.sequences() * heads.count);
    let mut total = 0;
    for s in 0..packing.sequences() {
        let len = packing.queries_of(s).1;
        for _ in 0..heads.count {
            at.push(total);
            total += len * packing.key_count(s);
        }
    }
    (at, total)
}

/// The words (32 keep bits each) of the dropout mask of every (sequence,
/// head)'s `queries × keys` probabilities, each query's row of keys in
/// whole words: the size of [`forward`](super::forward::forward)'s and
/// [`backward`](super::backward::backward)'s `bits`.
pub(crate) fn mask_words(packing: Packing, heads: Heads) -> usize {
    (0..packing.sequences())
        .map(|s| packing.queries_of(s).1 * packing.key_count(s).div_ceil(32) * heads.count)
        .sum()
}

/// One task: sequence `s` (its queries `q_start..q_start + len` of Q,
/// its rows from `start` in K and V, the first `keys` of them keys), head
/// `h`, its probabilities at `p_at`. Sequences without queries have none.
#[derive(Clone, Copy)]
pub(super) struct Task {
    pub(super) s: usize,
    pub(super) q_start: usize,
    pub(super) len: usize,
    pub(super) start: usize,
    pub(super) keys: usize,
    pub(super) h: usize,
    pub(super) p_at: usize,
    /// Its dropout mask's words (`len` rows of `⌈keys / 32⌉`), in the
    /// order of [`mask_words`].
    pub(super) bits_at: usize,
}

impl Task {
    /// The words of one query's row of dropout bits.
    pub(super) fn row_words(&self) -> usize {
        self.keys.div_ceil(32)
    }
}

pub(super) fn tasks(packing: Packing, heads: Heads, p_offsets: &[usize]) -> Vec<Task> {
    let (mut out, mut bits_at) = (Vec::with_capacity(p_offsets.len()), 0);
    for s in 0..packing.sequences() {
        let (q_start, len) = packing.queries_of(s);
        if len == 0 {
            continue;
        }
        for h in 0..heads.count {
            let task = Task {
                s,
                q_start,
                len,
                start: packing.offsets[s],
                keys: packing.key_count(s),
                h,
                p_at: p_offsets[s * heads.count + h],
                bits_at,
            };
            bits_at += len * task.row_words();
            out.push(task);
        }
    }
    out
}
