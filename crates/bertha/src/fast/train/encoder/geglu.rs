//! GeGLU (ModernBERT's FFN) for training: the forward is the inference
//! path's ([`crate::fast::modernbert::geglu`]); its backward carries the
//! gated product's gradient to FFN-in's `[input | gate]` rows.

use rayon::prelude::*;

use crate::fast::kernels::{gelu_erf, gelu_tanh, multiversion, tanh, Act, ROWS_PER_TASK};
use crate::model::ops::act_grad;

pub(super) use crate::fast::modernbert::geglu as forward;

multiversion! {
    fn backward_rows = backward_rows_body(both: &[f32], dg: &[f32], dboth: &mut [f32], inter: usize, act: Act);
}

/// For `g = act(a) · b` on rows `[a | b]` of `both` `[n, 2·I]` (`inter` =
/// I): `da = dg · b · act'(a)` and `db = dg · act(a)` into `dboth`
/// `[n, 2·I]`, from `dg` `[n, I]`.
pub(super) fn backward(both: &[f32], dg: &[f32], dboth: &mut [f32], inter: usize, act: Act) {
    let rows = dg.len() / inter.max(1);
    assert!(
        dg.len() == rows * inter && both.len() == 2 * dg.len() && dboth.len() == both.len(),
        "geglu backward: the gradient is not [{rows}, {inter}] beside [{rows}, {}] rows",
        2 * inter
    );
    if rows <= ROWS_PER_TASK {
        return backward_rows(both, dg, dboth, inter, act);
    }
    let wide = 2 * inter * ROWS_PER_TASK;
    dboth
        .par_chunks_mut(wide)
        .zip(both.par_chunks(wide))
        .zip(dg.par_chunks(inter * ROWS_PER_TASK))
        .for_each(|((out, b), g)| backward_rows(b, g, out, inter, act));
}

/// `act(z)`.
#[inline(always)]
fn value(z: f32, act: Act) -> f32 {
    match act {
        Act::GeluErf => gelu_erf(z),
        Act::GeluTanh => gelu_tanh(z),
        Act::Relu => z.max(0.0),
        Act::Tanh => tanh(z),
    }
}

#[inline(always)]
fn backward_rows_body(both: &[f32], dg: &[f32], dboth: &mut [f32], inter: usize, act: Act) {
    let rows = both
        .chunks_exact(2 * inter)
        .zip(dg.chunks_exact(inter))
        .zip(dboth.chunks_exact_mut(2 * inter));
    for ((row, g), out) in rows {
        let (a, b) = row.split_at(inter);
        let (da, db) = out.split_at_mut(inter);
        for j in 0..inter {
            da[j] = g[j] * b[j] * act_grad(a[j], act);
            db[j] = g[j] * value(a[j], act);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backward is the derivative of the forward: central differences
    /// of `Σ w · geglu(both)` in f64 match `dboth` for `dg = w`.
    #[test]
    fn backward_is_the_forwards_derivative() {
        let (rows, inter) = (19, 5);
        let both: Vec<f32> = (0..rows * 2 * inter)
            .map(|i| ((i as f32) * 0.73).sin() * 2.0)
            .collect();
        let w: Vec<f32> = (0..rows * inter)
            .map(|i| ((i as f32) * 0.31).cos())
            .collect();
        for act in [Act::GeluErf, Act::GeluTanh, Act::Tanh] {
            let mut dboth = vec![f32::NAN; both.len()];
            backward(&both, &w, &mut dboth, inter, act);
            let loss = |x: &[f32]| -> f64 {
                let mut g = vec![0f32; rows * inter];
                forward(x, &mut g, inter, act);
                g.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            for i in [0, 3, inter + 1, 2 * inter * 7 + 2, both.len() - 1] {
                let h = 1e-2f32;
                let (mut up, mut down) = (both.clone(), both.clone());
                up[i] += h;
                down[i] -= h;
                let numeric = (loss(&up) - loss(&down)) / (2.0 * h as f64);
                let got = dboth[i] as f64;
                assert!(
                    (numeric - got).abs() <= 2e-3 * (1.0 + got.abs()),
                    "{act:?} element {i}: {got} vs numeric {numeric}"
                );
            }
        }
    }
}
