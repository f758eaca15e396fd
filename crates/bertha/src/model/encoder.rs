//! `encoder`: the stack of layers (and, for pre-LN models that have one,
//! the final LayerNorm).

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::layer::BertLayer;
use super::nn::LayerNorm;
use crate::config::BertConfig;

#[derive(Debug, Clone)]
pub struct BertEncoder {
    pub(crate) layers: Vec<BertLayer>,
    pub(crate) final_layer_norm: Option<LayerNorm>,
}

/// What the encoder returns: the last state, and on request every layer's
/// input/output and attention probabilities.
pub struct EncoderOutput {
    pub last_hidden_state: Tensor,
    pub hidden_states: Option<Vec<Tensor>>,
    pub attentions: Option<Vec<Tensor>>,
}

impl BertEncoder {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| BertLayer::load(vb.pp(format!("layer.{i}")), cfg))
            .collect::<Result<_>>()?;
        let final_layer_norm = if cfg.final_layer_norm {
            Some(LayerNorm::load(
                vb.pp("LayerNorm"),
                cfg.hidden_size,
                cfg.layer_norm_eps,
            )?)
        } else {
            None
        };
        Ok(Self {
            layers,
            final_layer_norm,
        })
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        keep_hidden: bool,
        keep_attentions: bool,
        train: bool,
    ) -> Result<EncoderOutput> {
        let mut hidden = keep_hidden.then(|| vec![x.clone()]);
        let mut attentions = keep_attentions.then(Vec::new);
        let mut x = x.clone();
        for layer in &self.layers {
            let (y, probs) = layer.forward(&x, mask, train)?;
            x = y;
            if let Some(h) = hidden.as_mut() {
                h.push(x.clone());
            }
            if let Some(a) = attentions.as_mut() {
                a.push(probs);
            }
        }
        if let Some(ln) = &self.final_layer_norm {
            x = ln.forward(&x)?;
        }
        Ok(EncoderOutput {
            last_hidden_state: x,
            hidden_states: hidden,
            attentions,
        })
    }
}
