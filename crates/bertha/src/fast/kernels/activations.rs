//! The FFN non-linearities ([`Act`]), and the branch-free exp, erf and
//! tanh they are built from (the softmax and the losses use `fast_exp`
//! too).

/// The FFN non-linearity, in place (tanh: RoBERTa's classification
/// head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    GeluErf,
    GeluTanh,
    Relu,
    Tanh,
}

impl From<crate::config::Activation> for Act {
    fn from(a: crate::config::Activation) -> Self {
        use crate::config::Activation;
        match a {
            Activation::Gelu => Act::GeluErf,
            Activation::GeluTanh => Act::GeluTanh,
            Activation::Relu => Act::Relu,
            Activation::Tanh => Act::Tanh,
        }
    }
}

#[inline(always)]
pub(crate) fn activate_body(x: &mut [f32], act: Act) {
    match act {
        Act::GeluErf => x.iter_mut().for_each(|v| *v = gelu_erf(*v)),
        Act::GeluTanh => x.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        Act::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
        Act::Tanh => x.iter_mut().for_each(|v| *v = tanh(*v)),
    }
}

/// e^x for f32, branch-free so loops over it vectorise: range reduction
/// to 2^n · e^r with |r| ≤ ln2/2 and a degree-6 polynomial (relative
/// error ~2e-7 over the whole range; underflows to 0 below -87).
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.7);
    // Round to nearest with the 1.5·2^23 trick: `f32::round` is a libm
    // call on baseline x86-64 and would stop the loop from vectorising.
    const SHIFT: f32 = 12_582_912.0;
    let shifted = x * std::f32::consts::LOG2_E + SHIFT;
    let n = shifted - SHIFT;
    // ln 2 split in two so n·ln2 is exact in the first part.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^n from the bits of `shifted` (1.5·2^23 + n: the integer n sits in
    // the low mantissa bits), not from `n as i32`: Rust's saturating
    // float-to-int cast is done one lane at a time, which made the
    // softmax and GELU loops half scalar. n is in [-126, 128] after the
    // clamp; wrapping ops keep debug builds' overflow checks (a branch to
    // a panic) out of the loop.
    let bits = shifted
        .to_bits()
        .wrapping_sub(SHIFT.to_bits())
        .wrapping_add(127)
        << 23;
    p * f32::from_bits(bits)
}

/// erf(x) via Abramowitz & Stegun 7.1.26 (absolute error ≤ 1.5e-7).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    erf_and_gauss(x).0
}

/// erf(x) as [`erf`] computes it, and the `exp(-x²)` it computes on the
/// way (GELU's derivative needs both: one exponential instead of two).
#[inline(always)]
pub(crate) fn erf_and_gauss(x: f32) -> (f32, f32) {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let gauss = fast_exp(-a * a);
    let y = 1.0 - poly * gauss;
    (y.copysign(x), gauss)
}

#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + gelu_tanh_inner(x))
}

/// tanh(x) = 1 - 2 / (e^{2x} + 1), branch-free so loops over it
/// vectorise (absolute error ~2e-7).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (fast_exp(2.0 * x) + 1.0)
}

/// `tanh(√(2/π)·(x + 0.044715·x³))`, the tanh of the GELU approximation
/// (its derivative needs it too).
#[inline(always)]
pub(crate) fn gelu_tanh_inner(x: f32) -> f32 {
    tanh(0.797_884_6 * (x + 0.044_715 * x * x * x))
}
