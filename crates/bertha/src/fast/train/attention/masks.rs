//! The masks on a task's scores and probabilities: a sliding window's,
//! and dropout's, drawn as bits by the forward and applied again by the
//! backward.

use super::packing::{Packing, Task};
use crate::model::DropoutMask;

/// Task `t`'s scores `p` (`len` rows of `keys`) outside the packing's
/// window, and at padding keys, set to `f32::MIN`, which the softmax turns
/// into 0, as the candle path's mask chooses `f32::MIN` there. The
/// probabilities outside the window are then 0, so the backward needs no
/// mask of its own. A padding row whose window holds no key is `f32::MIN`
/// throughout: uniform over every row, padding too, as the candle path's
/// softmax of `score + f32::MIN` is (and its gradient flows to the scores
/// as the candle path's does through the sum).
pub(super) fn mask_window(p: &mut [f32], t: Task, packing: Packing) {
    let Some(w) = packing.window else {
        return;
    };
    let keys = packing.real_keys(t.s);
    for (i, row) in p.chunks_exact_mut(t.keys.max(1)).take(t.len).enumerate() {
        let at = packing.position(t.s, i);
        let lo = at.saturating_sub(w).min(keys);
        let hi = at.saturating_add(w + 1).clamp(lo, keys);
        row[..lo].fill(f32::MIN);
        row[hi..].fill(f32::MIN);
    }
}

/// Draws task `t`'s dropout mask into its `bits`, a row of words per query
/// (keyed as the candle modules key row `[s, h, position]`).
pub(super) fn draw_mask(mask: &DropoutMask, bits: &mut [u32], t: Task, packing: Packing) {
    let w = t.row_words();
    for (i, words) in bits.chunks_exact_mut(w.max(1)).take(t.len).enumerate() {
        let key = [t.s, t.h, packing.position(t.s, i)];
        mask.row_bits(mask.row_key(&key), words);
    }
}

/// Task `t`'s probabilities `p` (`len` rows of `keys`) as the forward
/// multiplied V by: through the dropout mask's bits into `into`, or as
/// they are without dropout.
pub(super) fn dropped<'a>(
    dropout: Option<(&DropoutMask, &[u32])>,
    t: Task,
    p: &'a [f32],
    into: &'a mut Vec<f32>,
) -> &'a [f32] {
    let Some((mask, bits)) = dropout else {
        return p;
    };
    into.resize(p.len(), 0.0);
    let (w, nk) = (t.row_words(), t.keys.max(1));
    for ((row, out), words) in p
        .chunks_exact(nk)
        .zip(into.chunks_exact_mut(nk))
        .zip(bits.chunks(w.max(1)))
    {
        mask.apply_bits_into(words, row, out);
    }
    into
}

/// `x` (task `t`'s `len` rows of `keys`) through its dropout mask's bits,
/// in place.
pub(super) fn drop_in_place(dropout: Option<(&DropoutMask, &[u32])>, t: Task, x: &mut [f32]) {
    if let Some((mask, bits)) = dropout {
        let (w, nk) = (t.row_words(), t.keys.max(1));
        for (row, words) in x.chunks_exact_mut(nk).zip(bits.chunks(w.max(1))) {
            mask.apply_bits_in_place(words, row);
        }
    }
}
