//! [`PackedBert`]'s reduced-precision linears: bf16 packing, int8
//! calibration and quantization, and the stored form `bertha quantize`
//! folders hold.

use std::path::Path;

use super::{Layer, Linear, PackedBert, Weights};
use crate::error::{Error, Result};
use crate::fast::matmul::{I8Scheme, PackedBf16, PackedI8};
use crate::fast::site::{Site, SITES};
use crate::io::quantized::{PackedData, PackedLinear};

impl Linear {
    /// The stored form of reduced-precision weights (`None` for fp32).
    fn to_parts(&self) -> Option<PackedData> {
        match &self.weights {
            Weights::F32(_) => None,
            Weights::Bf16(w) => Some(w.to_parts()),
            Weights::I8(w) => Some(w.to_parts()),
        }
    }

    fn in_dim(&self) -> usize {
        match &self.weights {
            Weights::F32(w) => w.in_dim(),
            Weights::Bf16(w) => w.in_dim(),
            Weights::I8(w) => w.in_dim(),
        }
    }

    /// Re-packs fp32 weights as bf16.
    fn pack_bf16(&mut self) {
        if let Weights::F32(w) = &self.weights {
            let packed = PackedBf16::new(&w.unpack(), w.in_dim(), w.out_dim());
            self.weights = Weights::Bf16(packed);
        }
    }

    /// Re-packs fp32 weights as int8, smoothed by `act_max`.
    fn quantize(&mut self, act_max: &[f32], scheme: I8Scheme) {
        if let Weights::F32(w) = &self.weights {
            let packed = PackedI8::new(&w.unpack(), w.in_dim(), w.out_dim(), Some(act_max), scheme);
            self.weights = Weights::I8(packed);
        }
    }
}

impl Layer {
    fn site(&self, site: Site) -> &Linear {
        match site {
            Site::Qkv => &self.qkv,
            Site::AttnOut => &self.attn_out,
            Site::FfnIn => &self.ffn_in,
            Site::FfnOut => &self.ffn_out,
        }
    }

    fn site_mut(&mut self, site: Site) -> &mut Linear {
        match site {
            Site::Qkv => &mut self.qkv,
            Site::AttnOut => &mut self.attn_out,
            Site::FfnIn => &mut self.ffn_in,
            Site::FfnOut => &mut self.ffn_out,
        }
    }
}

impl PackedBert {
    /// Switches the four linear layers of every encoder layer to bf16
    /// weights and multiply inputs, fp32 sums. The pooler stays fp32 (one
    /// row per text: nothing to gain), as do the embeddings, LayerNorm,
    /// softmax and GELU. The attention products take bf16 inputs too.
    pub fn to_bf16(&mut self) {
        for l in &mut self.layers {
            for lin in [&mut l.qkv, &mut l.attn_out, &mut l.ffn_in, &mut l.ffn_out] {
                lin.pack_bf16();
            }
        }
    }

    /// Switches the four linear layers of every encoder layer to int8
    /// (weights per output column and channel group, activations per
    /// token and channel group, smoothed with the activation ranges this
    /// runs `calibration` to find; see `Site::int8_scheme`). The pooler
    /// stays fp32 (one row per text), as do the embeddings, LayerNorm,
    /// softmax and GELU; the attention products run in bf16 (on CPUs
    /// with AVX512-BF16, else fp32).
    pub fn quantize_int8(&mut self, calibration: &[(&[u32], &[u32])]) -> Result<()> {
        if calibration.is_empty() {
            return Err(Error::Input(
                "int8 quantization needs at least one calibration text".into(),
            ));
        }
        let mut act_max: Vec<[Vec<f32>; 4]> = self
            .layers
            .iter()
            .map(|l| SITES.map(|s| vec![0f32; l.site(s).in_dim()]))
            .collect();
        self.forward_observed(
            calibration,
            None,
            Some(&mut |layer, site, x| {
                let m = &mut act_max[layer][site as usize];
                for row in x.chunks_exact(m.len()) {
                    for (a, v) in m.iter_mut().zip(row) {
                        *a = a.max(v.abs());
                    }
                }
            }),
        )?;
        for (layer, maxima) in self.layers.iter_mut().zip(&act_max) {
            for site in SITES {
                layer
                    .site_mut(site)
                    .quantize(&maxima[site as usize], site.int8_scheme());
            }
        }
        Ok(())
    }

    /// The reduced-precision linears in their stored form (for
    /// `bertha quantize`), named `layers.{l}.{site}`.
    pub fn packed_linears(&self) -> Vec<PackedLinear> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for site in SITES {
                let lin = layer.site(site);
                if let Some(data) = lin.to_parts() {
                    out.push(PackedLinear {
                        name: format!("layers.{l}.{}", site.name()),
                        in_dim: lin.in_dim(),
                        out_dim: lin.out_dim,
                        data,
                    });
                }
            }
        }
        out
    }

    /// Puts stored linears (read from `path`) in place of the fp32 ones:
    /// every linear of every layer must be there, with this model's shapes.
    pub fn load_packed(&mut self, linears: &[PackedLinear], path: &Path) -> Result<()> {
        let wrong = |reason: String| Error::Weights {
            path: path.to_path_buf(),
            reason,
        };
        let by_name: std::collections::HashMap<&str, &PackedLinear> =
            linears.iter().map(|l| (l.name.as_str(), l)).collect();
        let expected = self.layers.len() * SITES.len();
        if linears.len() != expected {
            return Err(wrong(format!(
                "holds {} linear layers, the model has {expected} ({} layers × 4)",
                linears.len(),
                self.layers.len()
            )));
        }
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for site in SITES {
                let name = format!("layers.{l}.{}", site.name());
                let stored = by_name
                    .get(name.as_str())
                    .ok_or_else(|| wrong(format!("`{name}` is missing")))?;
                let lin = layer.site_mut(site);
                let (k, n) = (lin.in_dim(), lin.out_dim);
                if (stored.in_dim, stored.out_dim) != (k, n) {
                    return Err(wrong(format!(
                        "`{name}` is [{}, {}], the model's is [{k}, {n}]",
                        stored.in_dim, stored.out_dim
                    )));
                }
                lin.weights = match &stored.data {
                    PackedData::I8 {
                        panels,
                        w_scales,
                        x_scales,
                        group,
                    } => Weights::I8(
                        PackedI8::from_parts(
                            panels.clone(),
                            w_scales.clone(),
                            x_scales.clone(),
                            *group,
                            k,
                            n,
                        )
                        .map_err(|e| wrong(format!("`{name}`: {e}")))?,
                    ),
                    PackedData::Bf16 { panels } => Weights::Bf16(
                        PackedBf16::from_parts(panels.clone(), k, n)
                            .map_err(|e| wrong(format!("`{name}`: {e}")))?,
                    ),
                };
            }
        }
        Ok(())
    }
}
