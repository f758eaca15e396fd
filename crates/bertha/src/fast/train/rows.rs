//! Rows of packed sequences, and a selection of them: the rows whose last
//! hidden states a head reads. An MLM head reads the masked rows (and the
//! `[CLS]` rows with NSP), a sequence classifier the `[CLS]` rows only, so
//! the last layer needs its queries, attention output, FFN and LayerNorms
//! at those rows alone; its keys and values still cover every row. The
//! loss and every gradient are those of the whole layer: the rows left out
//! reach nothing the loss reads.

use crate::error::{Error, Result};
use crate::fast::buffers::{add, scratch};

/// Some rows of packed sequences, in packing order.
pub(crate) struct Selection {
    /// The packed rows, ascending.
    rows: Vec<usize>,
    /// Sequence `s`'s selected rows are `starts[s]..starts[s + 1]` of
    /// `rows`.
    starts: Vec<usize>,
    /// Each selected row's `[sequence, position]`: where it sits, and the
    /// key of its dropout masks.
    keys: Vec<[usize; 2]>,
}

impl Selection {
    /// The rows `keys` (`[sequence, position]`, ascending, each once) of
    /// the sequences packed at `offsets`.
    pub fn new(keys: Vec<[usize; 2]>, offsets: &[usize]) -> Result<Self> {
        let sequences = offsets.len().saturating_sub(1);
        let mut rows = Vec::with_capacity(keys.len());
        let mut starts = vec![0; sequences + 1];
        for (i, &[s, p]) in keys.iter().enumerate() {
            if s >= sequences || p >= offsets[s + 1] - offsets[s] {
                return Err(Error::Input(format!(
                    "output row {p} of sequence {s} is outside the batch"
                )));
            }
            if i > 0 && keys[i - 1] >= [s, p] {
                return Err(Error::Input(format!(
                    "output rows must ascend, each once: ({s}, {p}) follows {:?}",
                    keys[i - 1]
                )));
            }
            rows.push(offsets[s] + p);
            starts[s + 1] = i + 1;
        }
        // Sequences without a selected row start where the last one ended.
        for s in 1..=sequences {
            starts[s] = starts[s].max(starts[s - 1]);
        }
        Ok(Self { rows, starts, keys })
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Where sequence `s`'s selected rows start among the selection, and
    /// how many there are.
    pub fn of_sequence(&self, s: usize) -> (usize, usize) {
        (self.starts[s], self.starts[s + 1] - self.starts[s])
    }

    /// Selected row `i`'s `[sequence, position]`.
    pub fn key(&self, i: usize) -> [usize; 2] {
        self.keys[i]
    }

    /// The index among the selection of row `position` of sequence `s`.
    pub fn index_of(&self, s: usize, position: usize) -> Option<usize> {
        self.keys.binary_search(&[s, position]).ok()
    }

    /// The selected rows of `x` (rows of `d`), `[len, d]`.
    pub fn gather(&self, x: &[f32], d: usize) -> Vec<f32> {
        let mut out = scratch(self.len() * d);
        for (dst, &r) in out.chunks_exact_mut(d.max(1)).zip(&self.rows) {
            dst.copy_from_slice(&x[r * d..(r + 1) * d]);
        }
        out
    }

    /// Adds selected row `i` of `src` (`[len, d]`) into its packed row of
    /// `dst`.
    pub fn scatter_add(&self, src: &[f32], dst: &mut [f32], d: usize) {
        for (row, &r) in src.chunks_exact(d.max(1)).zip(&self.rows) {
            add(&mut dst[r * d..(r + 1) * d], row);
        }
    }

    /// Adds each selected row's packed row of `src` into row `i` of `dst`
    /// (`[len, d]`).
    pub fn add_gathered(&self, dst: &mut [f32], src: &[f32], d: usize) {
        for (row, &r) in dst.chunks_exact_mut(d.max(1)).zip(&self.rows) {
            add(row, &src[r * d..(r + 1) * d]);
        }
    }
}

/// The rows a pass runs on: every packed row, or a selection.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// Every row of the sequences packed at these offsets.
    Packed(&'a [usize]),
    Selected(&'a Selection),
}

impl Rows<'_> {
    /// Row `r`'s `[sequence, position]`.
    pub fn key(&self, r: usize) -> [usize; 2] {
        match self {
            Rows::Packed(offsets) => {
                let s = offsets.partition_point(|&o| o <= r) - 1;
                [s, r - offsets[s]]
            }
            Rows::Selected(sel) => sel.key(r),
        }
    }

    /// The packed row of pass row `r`.
    pub fn packed(&self, r: usize) -> usize {
        match self {
            Rows::Packed(_) => r,
            Rows::Selected(sel) => sel.rows[r],
        }
    }

    pub fn count(&self) -> usize {
        match self {
            Rows::Packed(offsets) => offsets.last().copied().unwrap_or(0),
            Rows::Selected(sel) => sel.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_maps_keys_to_packed_rows() {
        // Three sequences of 3, 0 and 4 rows.
        let offsets = [0, 3, 3, 7];
        let sel = Selection::new(vec![[0, 0], [0, 2], [2, 1], [2, 3]], &offsets).unwrap();
        assert_eq!(sel.rows, [0, 2, 4, 6]);
        assert_eq!(sel.of_sequence(0), (0, 2));
        assert_eq!(sel.of_sequence(1), (2, 0));
        assert_eq!(sel.of_sequence(2), (2, 2));
        assert_eq!(sel.index_of(2, 1), Some(2));
        assert_eq!(sel.index_of(2, 2), None);
        let x: Vec<f32> = (0..14).map(|v| v as f32).collect();
        let g = sel.gather(&x, 2);
        assert_eq!(g, [0., 1., 4., 5., 8., 9., 12., 13.]);
        let mut back = vec![0.0; 14];
        sel.scatter_add(&g, &mut back, 2);
        assert_eq!(back[8..10], [8., 9.]);
        assert_eq!(back[2..4], [0., 0.]);
        let mut sums = vec![1.0; 8];
        sel.add_gathered(&mut sums, &x, 2);
        assert_eq!(sums[6..], [13., 14.]);
        assert_eq!(Rows::Selected(&sel).key(3), [2, 3]);
        assert_eq!(Rows::Packed(&offsets).key(4), [2, 1]);
        assert_eq!(Rows::Packed(&offsets).count(), 7);
        // Out of range, repeated or unordered rows are refused.
        assert!(Selection::new(vec![[1, 0]], &offsets).is_err());
        assert!(Selection::new(vec![[0, 3]], &offsets).is_err());
        assert!(Selection::new(vec![[0, 1], [0, 1]], &offsets).is_err());
        assert!(Selection::new(vec![[2, 0], [0, 1]], &offsets).is_err());
    }
}
