//! ModernBERT's classifier side on the fast path: its `head` (dense →
//! activation → LayerNorm, transformers' `ModernBertPredictionHead`) with
//! its backward, and the mean pooling its sequence classifier may read
//! (`classifier_pooling: mean`).

use super::encoder::{Linear, Norm};
use super::Param;
use crate::error::Result;
use crate::fast::buffers::{recycle, scratch, zeros};
use crate::fast::kernels::Act;
use crate::model::family::modernbert::PredictionHead as ModelHead;
use crate::model::ops::{bias_act_backward, bias_act_forward};

/// `head`: dense → activation → LayerNorm on rows `[n, D]`.
pub(super) struct PredictionHead<'a> {
    dense: Linear<'a>,
    act: Act,
    norm: Norm<'a>,
}

/// What [`PredictionHead::forward`] keeps for the backward: the dense
/// layer's output before bias and activation, and the norm's input (the
/// head's input stays the caller's).
pub(super) struct HeadTape {
    pre: Vec<f32>,
    u: Vec<f32>,
}

impl<'a> PredictionHead<'a> {
    pub fn of(head: &'a ModelHead) -> Result<Self> {
        Ok(Self {
            dense: Linear::with_any_bias(&head.dense)?,
            act: head.act.into(),
            norm: Norm::of(&head.norm)?,
        })
    }

    /// `x` `[n, D]` → `[n, D]`, and the tape of the pass.
    pub fn forward(&self, x: &[f32]) -> (Vec<f32>, HeadTape) {
        let d = self.norm.gamma.data.len();
        let n = x.len() / d.max(1);
        let mut pre = zeros(n * d);
        let dense = &self.dense;
        dense.compute.forward(x, &dense.w.data, None, &mut pre, n);
        let mut u = scratch(n * d);
        bias_act_forward(&pre, &dense.b.data, &mut u, self.act);
        let mut y = scratch(n * d);
        self.norm.forward(&u, &mut y);
        (y, HeadTape { pre, u })
    }

    /// The gradient of the input `x` (the forward's) from the output's
    /// `dy`; adds the parameters'.
    pub fn backward(&mut self, x: &[f32], tape: HeadTape, dy: &[f32]) -> Vec<f32> {
        let d = self.norm.gamma.data.len();
        let n = dy.len() / d.max(1);
        let mut du = scratch(n * d);
        self.norm.backward(&tape.u, dy, &mut du);
        let mut dpre = scratch(n * d);
        let (bias, dbias) = self.dense.b.data_and_grad();
        bias_act_backward(&tape.pre, bias, &du, &mut dpre, dbias, self.act);
        let compute = self.dense.compute;
        self.dense
            .w
            .grad_product(|dw| compute.weight_grad_into(&dpre, x, dw, n));
        let mut dx = zeros(n * d);
        compute.input_grad(&dpre, &self.dense.w.data, &mut dx, n, false);
        for v in [du, dpre, tape.pre, tape.u] {
            recycle(v);
        }
        dx
    }

    pub fn params_mut(&mut self) -> [&mut Param<'a>; 4] {
        [
            &mut self.dense.w,
            &mut self.dense.b,
            &mut self.norm.gamma,
            &mut self.norm.beta,
        ]
    }
}

/// Each packed sequence's mean row (`[N, D]` from `[T, D]`, sequence `s`
/// owning rows `offsets[s]..offsets[s + 1]`): the mean over its tokens, as
/// ModernBERT's mean pooling over an attention mask of ones.
pub(super) fn mean_rows(hidden: &[f32], offsets: &[usize], d: usize) -> Vec<f32> {
    let mut out = zeros((offsets.len() - 1) * d);
    for (s, w) in offsets.windows(2).enumerate() {
        let row = &mut out[s * d..(s + 1) * d];
        for r in w[0]..w[1] {
            for (o, v) in row.iter_mut().zip(&hidden[r * d..(r + 1) * d]) {
                *o += v;
            }
        }
        let len = (w[1] - w[0]).max(1) as f32;
        row.iter_mut().for_each(|v| *v /= len);
    }
    out
}

/// [`mean_rows`]' backward: each sequence's gradient `dmean` `[N, D]`
/// shared by its rows, added into `dhidden` `[T, D]`.
pub(super) fn spread_means(dmean: &[f32], offsets: &[usize], dhidden: &mut [f32], d: usize) {
    for (s, w) in offsets.windows(2).enumerate() {
        let len = (w[1] - w[0]).max(1) as f32;
        let g = &dmean[s * d..(s + 1) * d];
        for r in w[0]..w[1] {
            for (o, v) in dhidden[r * d..(r + 1) * d].iter_mut().zip(g) {
                *o += v / len;
            }
        }
    }
}
