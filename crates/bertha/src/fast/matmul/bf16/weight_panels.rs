//! A weight packed for both products of a training step that read it,
//! by the optimizer as it updates the weight's rows.

use super::operands::{Right, Strided};
use super::panels::{pack_panel, panels_len};
use crate::fast::matmul::NR;

/// A weight `w` `[n, k]` (`nn.Linear`'s `[out, in]`) packed for both
/// products of a training step that read it: the forward `x · wᵀ` (the
/// panels of `wᵀ` `[k, n]`) and the input gradient `dy · w` (the panels of
/// `w` `[n, k]`), the bits [`pack_panels`] makes of each. Written block of
/// rows by block ([`PanelWriter::pack_rows`]) by the optimizer as it
/// updates the rows, while they are in cache: packed in the step instead,
/// every weight was read from memory twice more per step.
///
/// [`pack_panels`]: super::panels::pack_panels
#[derive(Debug)]
pub(crate) struct WeightPanels {
    forward: Vec<u16>,
    backward: Vec<u16>,
    n: usize,
    k: usize,
}

impl WeightPanels {
    pub fn new(n: usize, k: usize) -> Self {
        Self {
            forward: vec![0; panels_len(k, n)],
            backward: vec![0; panels_len(n, k)],
            n,
            k,
        }
    }

    /// The weight's shape `[n, k]`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The forward product's right operand `wᵀ` `[k, n]`.
    pub fn forward(&self) -> Right<'_> {
        Right::Packed(&self.forward)
    }

    /// The input gradient's right operand `w` `[n, k]`.
    pub fn backward(&self) -> Right<'_> {
        Right::Packed(&self.backward)
    }

    /// A writer of blocks of rows, which threads share.
    pub fn writer(&mut self) -> PanelWriter<'_> {
        PanelWriter {
            forward: self.forward.as_mut_ptr(),
            backward: self.backward.as_mut_ptr(),
            n: self.n,
            k: self.k,
            _panels: std::marker::PhantomData,
        }
    }
}

/// Packs blocks of a weight's rows into its [`WeightPanels`], from any
/// thread: each block writes its own forward panels and its own pair rows
/// of every backward panel.
pub(crate) struct PanelWriter<'a> {
    forward: *mut u16,
    backward: *mut u16,
    n: usize,
    k: usize,
    _panels: std::marker::PhantomData<&'a mut WeightPanels>,
}

// SAFETY: blocks of rows starting at multiples of NR write disjoint values
// (pack_rows), and the writer borrows the panels mutably.
unsafe impl Send for PanelWriter<'_> {}
unsafe impl Sync for PanelWriter<'_> {}

impl PanelWriter<'_> {
    /// Packs rows `r0..r0 + rows.len() / k` of the weight, whose values
    /// `rows` holds. `r0` must be a multiple of [`NR`] (a block starts a
    /// forward panel and a pair row); blocks packed at once must not
    /// overlap.
    pub fn pack_rows(&self, r0: usize, rows: &[f32]) {
        let (n, k) = (self.n, self.k);
        let count = rows.len() / k.max(1);
        assert!(
            r0.is_multiple_of(NR) && rows.len() == count * k && r0 + count <= n,
            "pack_rows: rows {r0}..+{count} of a [{n}, {k}] weight from {} values",
            rows.len()
        );
        if count == 0 || k == 0 {
            return;
        }
        // Forward: the panels of these rows' columns of wᵀ.
        let (k2, wt) = (k.div_ceil(2), Strided::transposed(rows, k));
        for p in r0 / NR..(r0 + count).div_ceil(NR) {
            let (c0, cols) = (p * NR - r0, NR.min(r0 + count - p * NR));
            // SAFETY: panel p lies in the forward panels (p < ⌈n / NR⌉),
            // written by this block only (its rows are the panel's).
            let panel = unsafe {
                std::slice::from_raw_parts_mut(self.forward.add(p * k2 * NR * 2), k2 * NR * 2)
            };
            if cols < NR {
                panel.fill(0);
            }
            pack_panel(&wt, k, c0, cols, panel);
        }
        // Backward: these rows' pair rows of every panel of w.
        let (n2, pairs, w) = (n.div_ceil(2), count.div_ceil(2), Strided::rows(rows, k));
        for q in 0..k.div_ceil(NR) {
            let (c0, cols) = (q * NR, NR.min(k - q * NR));
            // SAFETY: pair rows r0 / 2.. of panel q (r0 even), as many as
            // the block's rows make, lie inside the backward panels and
            // belong to this block only.
            let panel = unsafe {
                let at = (q * n2 + r0 / 2) * NR * 2;
                std::slice::from_raw_parts_mut(self.backward.add(at), pairs * NR * 2)
            };
            if cols < NR {
                panel.fill(0);
            }
            pack_panel(&w, count, c0, cols, panel);
        }
    }
}
