//! ModernBERT's layers, one struct per transformers module:
//! `ModernBertAttention` (`attn`), `ModernBertMLP` (`mlp`),
//! `ModernBertEncoderLayer` (`layers.N`) and the stack with `final_norm`.
//!
//! Every op here has a backward pass (LayerNorm and softmax through
//! `model::ops`, the rest plain candle ops), so the same modules train.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use super::rotary::RotaryTables;
use crate::config::{Activation, AttentionKind, BertConfig, ClassifierPooling, ModernBertOptions};
use crate::model::bert::{EncoderOutput, LayerStack};
use crate::model::nn::{activate, Dense, Dropout, LayerNorm};
use crate::model::ops;

/// `attn`: fused `Wqkv`, rotary positions on Q and K, scaled dot-product
/// attention with the layer's mask, `Wo`.
#[derive(Debug, Clone)]
pub struct ModernBertAttention {
    pub(crate) wqkv: Dense,
    pub(crate) wo: Dense,
    num_heads: usize,
    head_dim: usize,
    /// On the probabilities, and again after `Wo` (transformers'
    /// `attention_dropout` and `out_drop` share the rate).
    dropout: Dropout,
}

impl ModernBertAttention {
    fn load(vb: VarBuilder, cfg: &BertConfig, o: &ModernBertOptions) -> Result<Self> {
        let d = cfg.hidden_size;
        let std = cfg.initializer_range;
        Ok(Self {
            wqkv: Dense::load_with_bias(vb.pp("Wqkv"), (d, 3 * d), std, o.attention_bias)?,
            wo: Dense::load_with_bias(vb.pp("Wo"), (d, d), std, o.attention_bias)?,
            num_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim(),
            dropout: Dropout::new(cfg.attention_probs_dropout_prob),
        })
    }

    /// `x` [B, T, D], `mask` additive [B or 1, 1, T or 1, T]. Returns the
    /// block's output [B, T, D] and the probabilities [B, H, T, T].
    fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rope: &RotaryTables,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let (b, t, d) = x.dims3()?;
        // [B, T, 3, H, hd]: Q, K, V each split into heads, as `view(..., 3, -1, hd)`.
        let qkv = self
            .wqkv
            .forward(x)?
            .reshape((b, t, 3, self.num_heads, self.head_dim))?;
        let part = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = rope.apply(&part(0)?)?;
        let k = rope.apply(&part(1)?)?;
        let v = part(2)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let probs = ops::softmax_last_dim(&scores)?;
        let dropped = self.dropout.forward(&probs, train)?;
        let context = dropped.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
        let out = self.dropout.forward(&self.wo.forward(&context)?, train)?;
        Ok((out, probs))
    }
}

/// `mlp`: GeGLU. `Wi` gives the input and gate halves; `Wo(act(input) ·
/// gate)`.
#[derive(Debug, Clone)]
pub struct ModernBertMlp {
    pub(crate) wi: Dense,
    pub(crate) wo: Dense,
    act: Activation,
    intermediate: usize,
    dropout: Dropout,
}

impl ModernBertMlp {
    fn load(vb: VarBuilder, cfg: &BertConfig, o: &ModernBertOptions) -> Result<Self> {
        let (d, i) = (cfg.hidden_size, cfg.intermediate_size);
        let std = cfg.initializer_range;
        Ok(Self {
            wi: Dense::load_with_bias(vb.pp("Wi"), (d, 2 * i), std, o.mlp_bias)?,
            wo: Dense::load_with_bias(vb.pp("Wo"), (i, d), std, o.mlp_bias)?,
            act: cfg.hidden_act,
            intermediate: i,
            dropout: Dropout::new(cfg.hidden_dropout_prob),
        })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let both = self.wi.forward(x)?;
        let input = both.narrow(D::Minus1, 0, self.intermediate)?;
        let gate = both.narrow(D::Minus1, self.intermediate, self.intermediate)?;
        let gated = (activate(&input, self.act)? * gate)?;
        self.wo.forward(&self.dropout.forward(&gated, train)?)
    }
}

/// `layers.N`: `x + attn(attn_norm(x))`, then `+ mlp(mlp_norm(·))`.
#[derive(Debug, Clone)]
pub struct ModernBertEncoderLayer {
    /// Absent in layer 0 (transformers' `nn.Identity`): the embeddings'
    /// norm precedes it.
    pub(crate) attn_norm: Option<LayerNorm>,
    pub(crate) attn: ModernBertAttention,
    pub(crate) mlp_norm: LayerNorm,
    pub(crate) mlp: ModernBertMlp,
    pub(crate) kind: AttentionKind,
}

impl ModernBertEncoderLayer {
    fn load(vb: VarBuilder, cfg: &BertConfig, o: &ModernBertOptions, i: usize) -> Result<Self> {
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let attn_norm = if i == 0 {
            None
        } else {
            Some(LayerNorm::load_with_bias(
                vb.pp("attn_norm"),
                d,
                eps,
                o.norm_bias,
            )?)
        };
        Ok(Self {
            attn_norm,
            attn: ModernBertAttention::load(vb.pp("attn"), cfg, o)?,
            mlp_norm: LayerNorm::load_with_bias(vb.pp("mlp_norm"), d, eps, o.norm_bias)?,
            mlp: ModernBertMlp::load(vb.pp("mlp"), cfg, o)?,
            kind: o.layer_types[i],
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rope: &RotaryTables,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let normed = match &self.attn_norm {
            Some(n) => n.forward(x)?,
            None => x.clone(),
        };
        let (attended, probs) = self.attn.forward(&normed, mask, rope, train)?;
        let h = (x + attended)?;
        let y = (&h + self.mlp.forward(&self.mlp_norm.forward(&h)?, train)?)?;
        Ok((y, probs))
    }
}

/// The layers and `final_norm`, with what every pass shares: the rotary
/// bases and the window.
#[derive(Debug, Clone)]
pub struct ModernBertEncoder {
    pub(crate) layers: Vec<ModernBertEncoderLayer>,
    pub(crate) final_norm: LayerNorm,
    global_theta: f64,
    local_theta: f64,
    half_window: usize,
    head_dim: usize,
    pooling: ClassifierPooling,
}

impl ModernBertEncoder {
    /// `vb` rooted at the base model (`model.`).
    pub fn load(vb: VarBuilder, cfg: &BertConfig, o: &ModernBertOptions) -> Result<Self> {
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| ModernBertEncoderLayer::load(vb.pp(format!("layers.{i}")), cfg, o, i))
            .collect::<Result<_>>()?;
        Ok(Self {
            layers,
            final_norm: LayerNorm::load_with_bias(
                vb.pp("final_norm"),
                cfg.hidden_size,
                cfg.layer_norm_eps,
                o.norm_bias,
            )?,
            global_theta: o.global_rope_theta,
            local_theta: o.local_rope_theta,
            half_window: o.half_window(),
            head_dim: cfg.head_dim(),
            pooling: o.classifier_pooling,
        })
    }
}

/// [T, T] u8: 1 where `|i − j| ≤ half_window` (a sliding layer's token
/// `i` may attend to token `j`).
pub fn sliding_window_band(len: usize, half_window: usize, device: &Device) -> Result<Tensor> {
    let band: Vec<u8> = (0..len)
        .flat_map(|i| (0..len).map(move |j| u8::from(i.abs_diff(j) <= half_window)))
        .collect();
    Tensor::from_vec(band, (len, len), device)
}

/// The sliding layers' additive mask [B or 1, 1, T, T]: the padding mask
/// inside the window, `f32::MIN` outside. Chosen, not summed, so a row
/// whose window holds only padding stays finite (as transformers' eager
/// mask) rather than −∞ and NaN after the softmax.
fn sliding_mask(
    padding: Option<&Tensor>,
    len: usize,
    half_window: usize,
    device: &Device,
) -> Result<Tensor> {
    let band = sliding_window_band(len, half_window, device)?;
    let shape = match padding {
        Some(m) => (m.dim(0)?, 1, len, len),
        None => (1, 1, len, len),
    };
    let inside = match padding {
        Some(m) => m.broadcast_as(shape)?.contiguous()?,
        None => Tensor::zeros(shape, DType::F32, device)?,
    };
    let outside = Tensor::full(f32::MIN, shape, device)?;
    band.reshape((1, 1, len, len))?
        .broadcast_as(shape)?
        .contiguous()?
        .where_cond(&inside, &outside)
}

impl LayerStack for ModernBertEncoder {
    fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        (keep_hidden, keep_attentions): (bool, bool),
        train: bool,
    ) -> Result<EncoderOutput> {
        let (_, t, _) = x.dims3()?;
        let device = x.device();
        let global = RotaryTables::new(t, self.head_dim, self.global_theta, device)?;
        let local = RotaryTables::new(t, self.head_dim, self.local_theta, device)?;
        let sliding = if self.layers.iter().any(|l| l.kind == AttentionKind::Sliding) {
            Some(sliding_mask(mask, t, self.half_window, device)?)
        } else {
            None
        };
        let mut hidden = keep_hidden.then(|| vec![x.clone()]);
        let mut attentions = keep_attentions.then(Vec::new);
        let mut x = x.clone();
        for layer in &self.layers {
            let (layer_mask, rope) = match layer.kind {
                AttentionKind::Full => (mask, &global),
                AttentionKind::Sliding => (sliding.as_ref(), &local),
            };
            let (y, probs) = layer.forward(&x, layer_mask, rope, train)?;
            x = y;
            if let Some(a) = attentions.as_mut() {
                a.push(probs);
            }
            if let Some(h) = hidden.as_mut() {
                h.push(x.clone());
            }
        }
        let last = self.final_norm.forward(&x)?;
        // transformers 5 records each layer's output and then puts the
        // final-normed state in place of the last one.
        if let Some(h) = hidden.as_mut() {
            if let Some(end) = h.last_mut() {
                *end = last.clone();
            }
        }
        Ok(EncoderOutput {
            last_hidden_state: last,
            hidden_states: hidden,
            attentions,
        })
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    /// `classifier_pooling`: the first token, or the mean over attended
    /// tokens (all tokens without a mask).
    fn pool(&self, last: &Tensor, attention_mask: Option<&Tensor>) -> Result<Option<Tensor>> {
        let pooled = match (self.pooling, attention_mask) {
            (ClassifierPooling::Cls, _) => last.narrow(1, 0, 1)?.squeeze(1)?,
            (ClassifierPooling::Mean, None) => last.mean(1)?,
            (ClassifierPooling::Mean, Some(m)) => {
                let m = m.to_dtype(last.dtype())?.unsqueeze(D::Minus1)?; // [B, T, 1]
                let sum = last.broadcast_mul(&m)?.sum(1)?; // [B, D]
                sum.broadcast_div(&m.sum(1)?)?
            }
        };
        Ok(Some(pooled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_reaches_half_of_local_attention_each_way() {
        let band = sliding_window_band(6, 2, &Device::Cpu)
            .unwrap()
            .to_vec2::<u8>()
            .unwrap();
        assert_eq!(band[0], vec![1, 1, 1, 0, 0, 0]);
        assert_eq!(band[3], vec![0, 1, 1, 1, 1, 1]);
        assert_eq!(band[5], vec![0, 0, 0, 1, 1, 1]);
    }

    /// A padded row whose whole window is padding keeps a finite mask, and
    /// padding outside the window stays masked.
    #[test]
    fn the_sliding_mask_chooses_rather_than_adds() {
        let dev = Device::Cpu;
        let padding = Tensor::new(&[0f32, 0.0, f32::MIN, f32::MIN], &dev)
            .unwrap()
            .reshape((1, 1, 1, 4))
            .unwrap();
        let m = sliding_mask(Some(&padding), 4, 1, &dev).unwrap();
        let rows = m.get(0).unwrap().get(0).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(rows[0], vec![0.0, 0.0, f32::MIN, f32::MIN]);
        assert_eq!(rows[3], vec![f32::MIN; 4]);
        assert!(rows.iter().flatten().all(|x| x.is_finite()));
    }
}
