//! The bf16 pairs path against the fp32-operand path, which it must
//! equal bit for bit.

use super::*;
use crate::fast::matmul::{as_words_mut, round_row};
use crate::fast::train::products::Compute;
use crate::fast::train::rows::Selection;
use crate::model::Dropout;

fn val(i: usize, seed: usize) -> f32 {
    (((i * 7 + seed * 13) as f32) * 0.618).sin() * 2.0
}

/// `rows` rows of `width` values rounded to bf16 pairs (as the QKV
/// product's tiles store them), in fp32 storage.
fn as_pairs(x: &[f32], width: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len() / 2];
    for (row, pairs) in x
        .chunks_exact(width)
        .zip(as_words_mut(&mut out).chunks_exact_mut(width / 2))
    {
        round_row(row, pairs);
    }
    out
}

/// Q, K and V kept as bf16 pairs give, bit for bit, what the bf16
/// products give from fp32 Q, K and V (they round them the same way):
/// context (stored as pairs then: compared with the fp32 context
/// rounded), probabilities, dQ, dK and dV from the context's gradient
/// (as pairs, or rounded by the products), with and without dropout, on
/// every row and on selected queries, with padding rows that are no
/// keys and sequences of odd lengths (a partial tile, an odd pair).
#[test]
fn pairs_equal_rounding_fp32_operands() {
    let heads = Heads { count: 2, dim: 16 };
    let d = heads.width();
    let offsets = [0usize, 13, 13 + 40, 13 + 40 + 7];
    let keys = [13usize, 37, 7];
    let n = offsets[3];
    let selection =
        Selection::new(vec![[0, 2], [1, 0], [1, 5], [1, 39], [2, 6]], &offsets).unwrap();
    let drop = Dropout::new(0.25);
    for (queries, dropout) in [
        (None, None),
        (None, drop.next_mask(true)),
        (Some(&selection), drop.next_mask(true)),
    ] {
        let packing = Packing {
            offsets: &offsets,
            keys: &keys,
            queries,
            window: None,
        };
        let m = packing.rows().count();
        // The fp32 operands, rounded as the pairs are, so both paths
        // multiply the same values.
        let (q_w, kv_w) = match queries {
            None => (0, 3 * d),
            Some(_) => (d, 2 * d),
        };
        let kv: Vec<f32> = (0..n * kv_w).map(|i| val(i, 1)).collect();
        let q: Vec<f32> = (0..m * q_w).map(|i| val(i, 2)).collect();
        let (kv_pairs, q_pairs) = (as_pairs(&kv, kv_w), as_pairs(&q, q_w.max(2)));
        let (qkv_f32, qkv_bf16) = match queries {
            None => (Qkv::fused(&kv, d, false), Qkv::fused(&kv_pairs, d, true)),
            Some(_) => (
                Qkv::split(&q, &kv, d, false),
                Qkv::split(&q_pairs, &kv_pairs, d, true),
            ),
        };
        let (_, total) = probability_offsets(packing, heads);
        // The context's gradient, and with pairs, as pairs (the
        // context comes as pairs then: compared rounded).
        let dctx: Vec<f32> = (0..m * d).map(|i| val(i, 3)).collect();
        let dctx_pairs = as_pairs(&dctx, d);
        let mut outs = Vec::new();
        for (qkv, dctx) in [(qkv_f32, &dctx), (qkv_bf16, &dctx_pairs)] {
            let mut ctx = vec![f32::NAN; dctx.len()];
            let mut probs = vec![f32::NAN; total];
            let cfg = (heads, Compute::Bf16);
            let mut bits = vec![u32::MAX; mask_words(packing, heads)];
            let drawn = dropout.as_ref().map(|m| (m, &mut bits[..]));
            forward(qkv, &mut ctx, &mut probs, packing, cfg, drawn);
            let (mut dq, mut dkv) = (vec![0f32; m * q_w], vec![0f32; n * kv_w]);
            let grad = match queries {
                None => QkvGrad::fused(&mut dkv, d),
                Some(_) => QkvGrad::split(&mut dq, &mut dkv, d),
            };
            let drawn = dropout.as_ref().map(|m| (m, &bits[..]));
            backward(qkv, &probs, dctx, grad, packing, cfg, drawn);
            if !qkv.pairs {
                ctx = as_pairs(&ctx, d);
            }
            outs.push([ctx, probs, dq, dkv]);
        }
        for (what, (a, b)) in ["ctx", "probs", "dq", "dkv"]
            .iter()
            .zip(outs[0].iter().zip(&outs[1]))
        {
            assert!(
                a.iter().all(|v| v.is_finite()),
                "{what}: not every value written"
            );
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{what} differs (queries {}, dropout {})",
                queries.is_some(),
                dropout.is_some()
            );
            assert!(
                a.is_empty() || a.iter().any(|v| *v != 0.0),
                "{what}: all zero"
            );
        }
    }
}
