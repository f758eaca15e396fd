//! AdamW (decoupled weight decay, as `torch.optim.AdamW`) with global-norm
//! gradient clipping, on flat f32 buffers updated in parallel.
//!
//! The moments live in plain vectors so a checkpoint stores them exactly
//! and resuming continues bit for bit.

use std::collections::{BTreeMap, HashMap};

use candle_core::{backprop::GradStore, Tensor};
use rayon::prelude::*;

use super::params::ParamStore;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this; `None` leaves it.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    /// transformers' Trainer defaults (betas 0.9/0.999, eps 1e-8, clip 1.0),
    /// with BERT's weight decay of 0.01.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
        }
    }
}

/// Biases and LayerNorm weights get no weight decay (as BERT and
/// transformers' Trainer).
pub fn decays(name: &str) -> bool {
    !(name.ends_with(".bias")
        || name.contains("LayerNorm")
        || name.contains("layer_norm")
        || name.contains("layernorm"))
}

#[derive(Debug, Clone)]
struct Moments {
    m: Vec<f32>,
    v: Vec<f32>,
}

/// The optimiser: its config, the number of steps taken and per-parameter
/// moments.
#[derive(Debug, Clone)]
pub struct AdamW {
    pub config: AdamWConfig,
    pub step: u64,
    moments: HashMap<String, Moments>,
}

/// Gradients summed over micro-batches, by parameter name.
#[derive(Debug, Default)]
pub struct GradAccumulator {
    /// Name order, so the global norm sums in the same order every run.
    grads: BTreeMap<String, Vec<f32>>,
    micro_batches: usize,
}

impl GradAccumulator {
    /// Adds one backward pass's gradients.
    pub fn add(&mut self, params: &ParamStore, grads: &GradStore) -> Result<()> {
        for (name, var) in params.vars() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let g = g.flatten_all()?.to_vec1::<f32>()?;
            match self.grads.get_mut(name) {
                Some(acc) => acc.par_iter_mut().zip(&g).for_each(|(a, b)| *a += b),
                None => {
                    self.grads.insert(name.to_string(), g);
                }
            }
        }
        self.micro_batches += 1;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.micro_batches == 0
    }

    /// Micro-batches summed so far (the update averages over them).
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// The summed gradient of parameter `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.grads.get(name).map(Vec::as_slice)
    }

    /// Replaces (or gives) parameter `name`'s summed gradient, e.g. by the
    /// sum over data-parallel processes.
    pub fn set(&mut self, name: &str, grad: Vec<f32>) {
        self.grads.insert(name.to_string(), grad);
    }

    /// Replaces (or gives) parameter `name`'s summed gradient by `grad`,
    /// reusing its buffer.
    pub fn set_from(&mut self, name: &str, grad: &[f32]) {
        match self.grads.get_mut(name) {
            Some(g) if g.len() == grad.len() => g.copy_from_slice(grad),
            _ => {
                self.grads.insert(name.to_string(), grad.to_vec());
            }
        }
    }

    /// Sets how many micro-batches the update averages over (in a
    /// data-parallel run: those with targets on any process, not only on
    /// this one).
    pub fn set_micro_batches(&mut self, n: usize) {
        self.micro_batches = n;
    }

    /// The summed gradients by parameter name, in name order (the same on
    /// every process: what an all-reduce walks).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut [f32])> {
        self.grads
            .iter_mut()
            .map(|(name, g)| (name.as_str(), g.as_mut_slice()))
    }
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            step: 0,
            moments: HashMap::new(),
        }
    }

    /// Applies one update at rate `lr` from the accumulated gradients
    /// (averaged over micro-batches); returns the global gradient norm
    /// before clipping.
    pub fn step(&mut self, params: &ParamStore, acc: GradAccumulator, lr: f64) -> Result<f64> {
        let scale_acc = 1.0 / acc.micro_batches.max(1) as f64;
        let mut grads = acc.grads;
        // Fixed chunks, summed in order: the same bits on every run
        // (a rayon reduction's tree depends on work stealing).
        let norm_sq: f64 = grads
            .values()
            .map(|g| {
                g.par_chunks(1 << 14)
                    .map(|c| c.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>())
                    .collect::<Vec<f64>>()
                    .iter()
                    .sum::<f64>()
            })
            .sum::<f64>()
            * scale_acc
            * scale_acc;
        let norm = norm_sq.sqrt();
        if !norm.is_finite() {
            return Err(Error::Diverged {
                what: "gradient norm",
                value: norm,
                step: self.step + 1,
                last_good: None,
            });
        }
        let clip = match self.config.max_grad_norm {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        let gscale = (scale_acc * clip) as f32;
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        // torch: p -= lr·wd·p; p -= (lr / bc1) · m / (sqrt(v)/sqrt(bc2) + eps)
        let step_size = (lr / bc1) as f32;
        let bc2_sqrt = bc2.sqrt() as f32;
        let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.eps as f32);
        for (name, var) in params.vars() {
            let Some(g) = grads.remove(name) else {
                continue;
            };
            let tensor = var.as_tensor();
            let mut p = tensor.flatten_all()?.to_vec1::<f32>()?;
            if p.len() != g.len() {
                return Err(Error::Input(format!(
                    "parameter `{name}`: {} values but a gradient of {}",
                    p.len(),
                    g.len()
                )));
            }
            let mo = self
                .moments
                .entry(name.to_string())
                .or_insert_with(|| Moments {
                    m: vec![0.0; p.len()],
                    v: vec![0.0; p.len()],
                });
            let decay = if decays(name) {
                (1.0 - lr * c.weight_decay) as f32
            } else {
                1.0
            };
            p.par_iter_mut()
                .zip(mo.m.par_iter_mut())
                .zip(mo.v.par_iter_mut())
                .zip(g.par_iter())
                .for_each(|(((p, m), v), g)| {
                    let g = g * gscale;
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    *p *= decay;
                    *p -= step_size * *m / (v.sqrt() / bc2_sqrt + eps);
                });
            var.set(&Tensor::from_vec(p, tensor.shape(), tensor.device())?)?;
        }
        Ok(norm)
    }

    /// The moments as tensors (`{name}.exp_avg`, `{name}.exp_avg_sq`) for a
    /// checkpoint.
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (name, mo) in &self.moments {
            let dev = &candle_core::Device::Cpu;
            out.insert(
                format!("{name}.exp_avg"),
                Tensor::from_slice(&mo.m, mo.m.len(), dev)?,
            );
            out.insert(
                format!("{name}.exp_avg_sq"),
                Tensor::from_slice(&mo.v, mo.v.len(), dev)?,
            );
        }
        Ok(out)
    }

    /// Restores the moments written by [`AdamW::state_tensors`].
    pub fn load_state(&mut self, step: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.step = step;
        self.moments.clear();
        for (key, m) in tensors {
            let Some(name) = key.strip_suffix(".exp_avg") else {
                continue;
            };
            let v = tensors.get(&format!("{name}.exp_avg_sq")).ok_or_else(|| {
                Error::Input(format!("optimizer state: `{name}.exp_avg_sq` is missing"))
            })?;
            self.moments.insert(
                name.to_string(),
                Moments {
                    m: m.flatten_all()?.to_vec1()?,
                    v: v.flatten_all()?.to_vec1()?,
                },
            );
        }
        Ok(())
    }
}
