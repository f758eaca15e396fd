//! The backward pass: each task's dQ, dK and dV from the context's
//! gradient, the saved probabilities and the dropout bits the forward drew.

use rayon::prelude::*;

use super::forward::head_product;
use super::masks::{drop_in_place, dropped};
use super::packing::{mask_words, probability_offsets, tasks, Heads, Packing, Task};
use super::pairs::{backward_pairs, PairScratch};
use super::qkv::{Qkv, QkvGrad};
use crate::fast::matmul::{as_words, Strided};
use crate::fast::train::products::Compute;
use crate::model::ops::softmax_backward;
use crate::model::DropoutMask;

/// Per-task buffers of the backward pass.
#[derive(Default)]
struct Scratch {
    dropped: Vec<f32>,
    dp: Vec<f32>,
    ds: Vec<f32>,
}

/// The backward of [`forward`](super::forward::forward): dQ, dK and dV
/// into `dqkv` from `dctx` (the query rows; bf16 pairs when `qkv` holds
/// pairs), the saved probabilities and the dropout mask with the bits the
/// forward drew. dK and dV are written on key rows only, and not at all
/// for sequences without queries.
pub(crate) fn backward(
    qkv: Qkv,
    probs: &[f32],
    dctx: &[f32],
    dqkv: QkvGrad,
    packing: Packing,
    (heads, compute): (Heads, Compute),
    dropout: Option<(&DropoutMask, &[u32])>,
) {
    let d = heads.width();
    let tokens = packing.offsets.last().copied().unwrap_or(0);
    let queries = packing.rows().count();
    assert!(qkv.covers(queries, tokens, d), "attention backward: qkv");
    if let Some((_, bits)) = dropout {
        let words = mask_words(packing, heads);
        assert_eq!(bits.len(), words, "attention backward: dropout bits");
    }
    // A task's bits: its rows' words.
    let bits_of = |t: &Task| dropout.map(|(m, b)| (m, &b[t.bits_at..][..t.len * t.row_words()]));
    assert!(dqkv.covers(queries, tokens, d), "attention backward: dqkv");
    // dctx as pairs beside Q, K and V as pairs (see forward).
    let width = if qkv.pairs { d / 2 } else { d };
    assert_eq!(dctx.len(), queries * width, "attention backward: dctx");
    let (p_offsets, total) = probability_offsets(packing, heads);
    assert_eq!(probs.len(), total, "attention backward: probabilities");
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let out = &dqkv;
    if qkv.pairs {
        assert!(
            compute == Compute::Bf16 && heads.dim % 2 == 0,
            "attention backward: bf16 pairs need bf16 products and an even head width"
        );
        let run = |sc: &mut PairScratch, t: Task| {
            let p = &probs[t.p_at..t.p_at + t.len * t.keys];
            let dc = &as_words(dctx)[t.q_start * width + t.h * heads.dim / 2..];
            let dropout = bits_of(&t);
            // SAFETY: the task's rows and head columns of dQ, dK and dV
            // are written by no other task (extents asserted above).
            unsafe { backward_pairs(sc, qkv, (t, heads), (p, dc), out, dropout) }
        };
        let each = tasks(packing, heads, &p_offsets).into_par_iter();
        return each.for_each_init(PairScratch::default, run);
    }
    tasks(packing, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Scratch::default, |sc, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let p = &probs[t.p_at..t.p_at + len * nk];
            let q = &qkv.q[t.q_start * qkv.q_stride + t.h * hd..];
            let k = &qkv.kv[t.start * qkv.kv_stride + t.h * hd..];
            let v = &k[d..];
            let dc = &dctx[t.q_start * d + t.h * hd..];
            let dropout = bits_of(&t);
            let used = dropped(dropout, t, p, &mut sc.dropped);
            sc.dp.resize(len * nk, 0.0);
            sc.ds.resize(len * nk, 0.0);
            let dq_at = out.q.at(t.q_start * out.q_stride + t.h * hd);
            let dk_at = out.kv.at(t.start * out.kv_stride + t.h * hd);
            let dv_at = dk_at.wrapping_add(d);
            // SAFETY: the operands lie inside qkv / dctx / the scratch
            // (asserted extents); the task's rows and head columns of dQ,
            // dK and dV are written by no other task.
            unsafe {
                // dV = usedᵀ · dctx (key rows only; padding rows are no keys)
                head_product(
                    compute,
                    (nk, hd, len),
                    (dv_at, out.kv_stride),
                    false,
                    Strided::transposed(used, nk),
                    Strided::rows(dc, d),
                    1.0,
                );
                // d(used) = dctx · Vᵀ, then through the mask.
                head_product(
                    compute,
                    (len, nk, hd),
                    (sc.dp.as_mut_ptr(), nk),
                    false,
                    Strided::rows(dc, d),
                    Strided::transposed(v, qkv.kv_stride),
                    1.0,
                );
            }
            drop_in_place(dropout, t, &mut sc.dp);
            softmax_backward(p, &sc.dp, &mut sc.ds, nk.max(1));
            // SAFETY: as above.
            unsafe {
                // dQ = scale · dS · K
                head_product(
                    compute,
                    (len, hd, nk),
                    (dq_at, out.q_stride),
                    false,
                    Strided::rows(&sc.ds, nk),
                    Strided::rows(k, qkv.kv_stride),
                    scale,
                );
                // dK = scale · dSᵀ · Q (key rows only)
                head_product(
                    compute,
                    (nk, hd, len),
                    (dk_at, out.kv_stride),
                    false,
                    Strided::transposed(&sc.ds, nk),
                    Strided::rows(q, qkv.q_stride),
                    scale,
                );
            }
        });
}
