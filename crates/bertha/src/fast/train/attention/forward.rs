//! The forward pass: each task's scores, softmax, dropout and context,
//! on fp32 operands (fp32 or bf16 products) or on bf16 pairs.

use rayon::prelude::*;

use super::masks::{draw_mask, dropped, mask_window};
use super::packing::{mask_words, probability_offsets, tasks, Heads, Packing, Task};
use super::pairs::{forward_pairs, PairScratch};
use super::qkv::{Qkv, Shared};
use crate::fast::matmul::{product_bf16_serial, Strided};
use crate::fast::train::products::{product, Compute};
use crate::model::ops::softmax_rows;
use crate::model::DropoutMask;

/// `dst[m, n] (+)= scale · a[m, k] · b[k, n]` (rows `dst_rs` apart) on
/// the calling thread, in `compute`: fp32 (our AVX2 tiles or the gemm
/// crate), or bf16 operands with fp32 sums on the register tiles (`scale`
/// applied to the sums).
///
/// # Safety
/// `dst` must address `m` rows of `n` values, `dst_rs` apart, that no one
/// else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn head_product(
    compute: Compute,
    dims: (usize, usize, usize),
    (dst, dst_rs): (*mut f32, usize),
    accumulate: bool,
    a: Strided,
    b: Strided,
    scale: f32,
) {
    // SAFETY: the caller's contract for dst; a and b address the
    // operands' own slices (bf16 checks their extents, gemm trusts them).
    unsafe {
        match compute {
            Compute::F32 => product(
                dims,
                dst,
                dst_rs,
                accumulate,
                a.into(),
                b.into(),
                scale,
                false,
            ),
            Compute::Bf16 => product_bf16_serial(dims, a, b, (dst, dst_rs), accumulate, scale),
        }
    }
}

/// `ctx = dropout(softmax(Q Kᵀ / √d)) V` per (sequence, head) from the
/// `qkv` rows, `ctx` on the query rows (as bf16 pairs when `qkv` holds
/// pairs); `probs` receives the softmax output and, with dropout, the
/// mask's `bits` (its [`mask_words`] words) the keep bits drawn, for the
/// backward. The two products run in `compute`; the softmax in fp32.
pub(crate) fn forward(
    qkv: Qkv,
    ctx: &mut [f32],
    probs: &mut [f32],
    packing: Packing,
    (heads, compute): (Heads, Compute),
    dropout: Option<(&DropoutMask, &mut [u32])>,
) {
    let d = heads.width();
    let tokens = packing.offsets.last().copied().unwrap_or(0);
    let queries = packing.rows().count();
    assert!(
        qkv.covers(queries, tokens, d),
        "attention: Q, K, V do not cover {queries} queries and {tokens} keys"
    );
    // With Q, K and V as pairs, ctx is stored as pairs too (the words of
    // fp32 storage): only the attention output's products read it.
    let width = if qkv.pairs { d / 2 } else { d };
    assert_eq!(
        ctx.len(),
        queries * width,
        "attention: ctx is not [{queries}, {width}]"
    );
    let (p_offsets, total) = probability_offsets(packing, heads);
    assert_eq!(probs.len(), total, "attention: probabilities buffer");
    let dropout = dropout.map(|(mask, bits)| {
        let words = mask_words(packing, heads);
        assert_eq!(bits.len(), words, "attention: dropout bits");
        (mask, Shared(bits.as_mut_ptr()))
    });
    let scale = 1.0 / (heads.dim as f32).sqrt();
    let (ctx_out, p_out) = (Shared(ctx.as_mut_ptr()), Shared(probs.as_mut_ptr()));
    if qkv.pairs {
        assert!(
            compute == Compute::Bf16 && heads.dim % 2 == 0,
            "attention: bf16 pairs need bf16 products and an even head width"
        );
        let run = |sc: &mut PairScratch, t: Task| {
            // SAFETY: the task's probabilities and bits blocks are its own
            // (offsets from probability_offsets and tasks, totals
            // asserted); its ctx rows and head columns are written by no
            // other task.
            unsafe {
                let p = std::slice::from_raw_parts_mut(p_out.at(t.p_at), t.len * t.keys);
                let ctx = ctx_out.at(t.q_start * width + t.h * heads.dim / 2).cast();
                let dropout = dropout.map(|(mask, bits)| (mask, bits.task_bits(t)));
                forward_pairs(sc, qkv, (t, heads, packing), p, ctx, dropout)
            }
        };
        let each = tasks(packing, heads, &p_offsets).into_par_iter();
        return each.for_each_init(PairScratch::default, run);
    }
    tasks(packing, heads, &p_offsets)
        .into_par_iter()
        .for_each_init(Vec::new, |dropped_buf: &mut Vec<f32>, t| {
            let (len, hd, nk) = (t.len, heads.dim, t.keys);
            let q = &qkv.q[t.q_start * qkv.q_stride + t.h * hd..];
            let k = &qkv.kv[t.start * qkv.kv_stride + t.h * hd..];
            let v = &k[d..];
            // SAFETY: the task's probabilities and bits blocks are its own;
            // Q, K, V of its rows lie inside qkv (asserted extents); its ctx
            // rows and head columns are written by no other task.
            unsafe {
                let p = std::slice::from_raw_parts_mut(p_out.at(t.p_at), len * nk);
                head_product(
                    compute,
                    (len, nk, hd),
                    (p.as_mut_ptr(), nk),
                    false,
                    Strided::rows(q, qkv.q_stride),
                    Strided::transposed(k, qkv.kv_stride),
                    scale,
                );
                mask_window(p, t, packing);
                softmax_rows(p, nk.max(1));
                let drawn = dropout.map(|(mask, bits)| {
                    let bits = bits.task_bits(t);
                    draw_mask(mask, bits, t, packing);
                    (mask, &*bits)
                });
                let used = dropped(drawn, t, p, dropped_buf);
                head_product(
                    compute,
                    (len, hd, nk),
                    (ctx_out.at(t.q_start * d + t.h * hd), d),
                    false,
                    Strided::rows(used, nk),
                    Strided::rows(v, qkv.kv_stride),
                    1.0,
                );
            }
        });
}
