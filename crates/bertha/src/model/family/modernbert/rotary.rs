//! NeoX-style rotary position embeddings (`rotate_half`), as transformers'
//! default RoPE computes them: in f32, `inv_freq[i] = 1 / θ^(2i / d)`,
//! angles `p · inv_freq` repeated over both halves of the head.

use candle_core::{Device, Result, Tensor, D};

/// `cos` and `sin` [T, head_dim] for positions `0..T` and base `theta`.
#[derive(Debug, Clone)]
pub struct RotaryTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl RotaryTables {
    pub fn new(len: usize, head_dim: usize, theta: f64, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let (cos_half, sin_half) = half_tables(len, head_dim, theta);
        let mut cos = Vec::with_capacity(len * head_dim);
        let mut sin = Vec::with_capacity(len * head_dim);
        for (c, s) in cos_half
            .chunks(half.max(1))
            .zip(sin_half.chunks(half.max(1)))
        {
            for _ in 0..2 {
                cos.extend_from_slice(c);
                sin.extend_from_slice(s);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (len, head_dim), device)?,
            sin: Tensor::from_vec(sin, (len, head_dim), device)?,
        })
    }

    /// `x · cos + rotate_half(x) · sin` for `x` [B, H, T, head_dim].
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let rotated = rotate_half(x)?;
        x.broadcast_mul(&self.cos)?
            .add(&rotated.broadcast_mul(&self.sin)?)
    }
}

/// `cos` and `sin` `[len, head_dim / 2]` of the angles `p · inv_freq[i]`
/// (both halves of a head share them). f32 throughout, as torch computes
/// the table (its pow, product and cos are all single precision); the
/// packed fast path reads the same numbers.
pub(crate) fn half_tables(len: usize, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let base = theta as f32;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(len * half);
    let mut sin = Vec::with_capacity(len * half);
    for p in 0..len {
        for f in &inv_freq {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    (cos, sin)
}

/// `[x1, x2] → [−x2, x1]` over the last dimension's halves.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d - d / 2)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rotating a query and a key by their positions leaves their dot
    /// product a function of the distance only: the point of RoPE.
    #[test]
    fn scores_depend_on_the_distance_only() {
        let dev = Device::Cpu;
        let t = RotaryTables::new(8, 4, 10_000.0, &dev).unwrap();
        let v = Tensor::new(&[0.3f32, -1.2, 0.7, 2.0], &dev).unwrap();
        let at = |p: usize| {
            let x = v
                .reshape((1, 1, 1, 4))
                .unwrap()
                .broadcast_as((1, 1, 8, 4))
                .unwrap();
            t.apply(&x.contiguous().unwrap())
                .unwrap()
                .get(0)
                .unwrap()
                .get(0)
                .unwrap()
                .get(p)
                .unwrap()
        };
        let dot = |a: usize, b: usize| {
            (at(a) * at(b))
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        assert!((dot(1, 3) - dot(4, 6)).abs() < 1e-5);
        assert!((dot(0, 5) - dot(2, 7)).abs() < 1e-5);
        assert!((dot(0, 1) - dot(0, 5)).abs() > 1e-3);
        // Position 0 is the identity.
        let first = at(0).to_vec1::<f32>().unwrap();
        assert_eq!(first, vec![0.3, -1.2, 0.7, 2.0]);
    }
}
