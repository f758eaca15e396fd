//! One task of each pass on Q, K and V kept as the bf16 pairs the QKV
//! product's tiles stored: the products read them as stored.

use super::masks::{draw_mask, drop_in_place, dropped, mask_window};
use super::packing::{Heads, Packing, Task};
use super::qkv::{Qkv, QkvGrad};
use crate::fast::matmul::{
    as_words, interleave_transposed, pack_row_pairs, pack_transposed_pairs, product_pairs_serial,
    product_pairs_serial_to_pairs, round_rows_serial, LeftPairs,
};
use crate::model::ops::{softmax_backward, softmax_rows};
use crate::model::DropoutMask;

/// Per-task buffers of the bf16 pairs path.
#[derive(Default)]
pub(super) struct PairScratch {
    panels: Vec<u16>,
    left: Vec<u32>,
    dropped: Vec<f32>,
    dp: Vec<f32>,
    ds: Vec<f32>,
}

/// The rows of one head of Q, K and V as pairs: (words, stride) each.
struct HeadPairs<'a> {
    q: (&'a [u32], usize),
    k: (&'a [u32], usize),
    v: (&'a [u32], usize),
}

fn head_pairs<'a>(qkv: Qkv<'a>, t: Task, heads: Heads) -> HeadPairs<'a> {
    let (hw, d2) = (heads.dim / 2, heads.width() / 2);
    let (q, kv) = (as_words(qkv.q), as_words(qkv.kv));
    let k_at = t.start * qkv.kv_stride + t.h * hw;
    HeadPairs {
        q: (&q[t.q_start * qkv.q_stride + t.h * hw..], qkv.q_stride),
        k: (&kv[k_at..], qkv.kv_stride),
        v: (kv.get(k_at + d2..).unwrap_or(&[]), qkv.kv_stride),
    }
}

/// One task of [`forward`](super::forward::forward) on bf16 pairs: the
/// products read Q, K and V as stored (K's and V's panels moved as words,
/// no rounding); the probabilities after dropout are rounded once, as the
/// next product's operand. The bits of the fp32-operand path.
///
/// # Safety
/// `ctx` must address the task's `len` rows (`D / 2` words apart) of its
/// head's pairs, written by no one else meanwhile.
pub(super) unsafe fn forward_pairs(
    sc: &mut PairScratch,
    qkv: Qkv,
    (t, heads, packing): (Task, Heads, Packing),
    p: &mut [f32],
    ctx: *mut u32,
    dropout: Option<(&DropoutMask, &mut [u32])>,
) {
    let (len, hd, nk) = (t.len, heads.dim, t.keys);
    let (hw, nk2, d2) = (hd / 2, nk.div_ceil(2), heads.width() / 2);
    let scale = 1.0 / (hd as f32).sqrt();
    let h = head_pairs(qkv, t, heads);
    pack_transposed_pairs(h.k.0, h.k.1, (nk, hw), &mut sc.panels);
    let q = LeftPairs::Rows {
        words: h.q.0,
        stride: h.q.1,
    };
    // SAFETY: p is the task's len × nk block; the operands' extents are
    // checked by the product.
    unsafe { product_pairs_serial(q, (len, nk, hw), &sc.panels, (p.as_mut_ptr(), nk), scale) };
    mask_window(p, t, packing);
    softmax_rows(p, nk.max(1));
    let drawn = dropout.map(|(mask, bits)| {
        draw_mask(mask, bits, t, packing);
        (mask, &*bits)
    });
    let used = dropped(drawn, t, p, &mut sc.dropped);
    round_rows_serial(used, (len, nk), &mut sc.left);
    pack_row_pairs(h.v.0, h.v.1, (nk, hd), &mut sc.panels);
    let used = LeftPairs::Rows {
        words: &sc.left,
        stride: nk2,
    };
    // SAFETY: the caller's contract for ctx.
    unsafe { product_pairs_serial_to_pairs(used, (len, hd, nk2), &sc.panels, (ctx, d2)) };
}

/// One task of [`backward`](super::backward::backward) on bf16 pairs
/// (see [`forward_pairs`]), with the task's dropout bits.
///
/// # Safety
/// The task's rows and head columns of `out` must be written by no one
/// else meanwhile.
pub(super) unsafe fn backward_pairs(
    sc: &mut PairScratch,
    qkv: Qkv,
    (t, heads): (Task, Heads),
    (p, dc): (&[f32], &[u32]),
    out: &QkvGrad,
    dropout: Option<(&DropoutMask, &[u32])>,
) {
    let (len, hd, nk) = (t.len, heads.dim, t.keys);
    let (hw, nk2, len2, d) = (hd / 2, nk.div_ceil(2), len.div_ceil(2), heads.width());
    let d2 = d / 2;
    let scale = 1.0 / (hd as f32).sqrt();
    let h = head_pairs(qkv, t, heads);
    let dq_at = out.q.at(t.q_start * out.q_stride + t.h * hd);
    let dk_at = out.kv.at(t.start * out.kv_stride + t.h * hd);
    let dv_at = dk_at.wrapping_add(d);
    // The probabilities the forward multiplied V by.
    let used = dropped(dropout, t, p, &mut sc.dropped);
    // SAFETY (all products): the destinations are the task's own rows and
    // head columns (the caller's contract) or its scratch; the operands'
    // extents are checked by the products.
    // dV = usedᵀ · dctx (key rows only; padding rows are no keys)
    interleave_transposed(used, nk, (len, nk), &mut sc.left);
    pack_row_pairs(dc, d2, (len, hd), &mut sc.panels);
    let used_t = LeftPairs::Interleaved(&sc.left);
    unsafe {
        product_pairs_serial(
            used_t,
            (nk, hd, len2),
            &sc.panels,
            (dv_at, out.kv_stride),
            1.0,
        )
    };
    // d(used) = dctx · Vᵀ, then through the mask.
    pack_transposed_pairs(h.v.0, h.v.1, (nk, hw), &mut sc.panels);
    sc.dp.resize(len * nk, 0.0);
    let dc_pairs = LeftPairs::Rows {
        words: dc,
        stride: d2,
    };
    unsafe {
        product_pairs_serial(
            dc_pairs,
            (len, nk, hw),
            &sc.panels,
            (sc.dp.as_mut_ptr(), nk),
            1.0,
        )
    };
    drop_in_place(dropout, t, &mut sc.dp);
    sc.ds.resize(len * nk, 0.0);
    softmax_backward(p, &sc.dp, &mut sc.ds, nk.max(1));
    // dQ = scale · dS · K
    round_rows_serial(&sc.ds, (len, nk), &mut sc.left);
    pack_row_pairs(h.k.0, h.k.1, (nk, hd), &mut sc.panels);
    let ds = LeftPairs::Rows {
        words: &sc.left,
        stride: nk2,
    };
    unsafe { product_pairs_serial(ds, (len, hd, nk2), &sc.panels, (dq_at, out.q_stride), scale) };
    // dK = scale · dSᵀ · Q (key rows only)
    interleave_transposed(&sc.ds, nk, (len, nk), &mut sc.left);
    pack_row_pairs(h.q.0, h.q.1, (len, hd), &mut sc.panels);
    let ds_t = LeftPairs::Interleaved(&sc.left);
    unsafe {
        product_pairs_serial(
            ds_t,
            (nk, hd, len2),
            &sc.panels,
            (dk_at, out.kv_stride),
            scale,
        )
    };
}
