//! `encoder`: the stack of layers (and, for pre-LN models that have one,
//! the final LayerNorm). The family's variations: ALBERT's input
//! projection and shared layers, DeBERTa's relative embeddings.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::deberta_v2::RelativeEmbeddings;
use super::layer::BertLayer;
use super::nn::{Dense, LayerNorm};
use crate::config::{BertConfig, Family};

#[derive(Debug, Clone)]
pub struct BertEncoder {
    /// The distinct layers (ALBERT: group g's layer i at g · inner + i).
    pub(crate) layers: Vec<BertLayer>,
    /// For each of the `num_hidden_layers` steps, the layers it runs in
    /// order (BERT: step i runs layer i). A hidden state is kept after
    /// each step, an attention map after each layer.
    pub(crate) steps: Vec<Vec<usize>>,
    /// ALBERT's `embedding_hidden_mapping_in` (embedding_size → hidden).
    pub(crate) input_projection: Option<Dense>,
    /// DeBERTa's `rel_embeddings` (+ `LayerNorm`).
    pub(crate) relative: Option<RelativeEmbeddings>,
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
        let n = cfg.num_hidden_layers;
        let plain_steps = (0..n).map(|i| vec![i]).collect();
        match &cfg.family {
            Family::DistilBert => {
                let layers = (0..n)
                    .map(|i| super::distilbert::load_layer(vb.pp(format!("layer.{i}")), cfg))
                    .collect::<Result<_>>()?;
                return Ok(Self {
                    layers,
                    steps: plain_steps,
                    input_projection: None,
                    relative: None,
                    final_layer_norm: None,
                });
            }
            Family::Albert(a) => {
                let (layers, steps) = super::albert::load_layers(vb.clone(), cfg, a)?;
                let input_projection = Dense::load(
                    vb.pp("embedding_hidden_mapping_in"),
                    a.embedding_size,
                    cfg.hidden_size,
                    cfg.initializer_range,
                )?;
                return Ok(Self {
                    layers,
                    steps,
                    input_projection: Some(input_projection),
                    relative: None,
                    final_layer_norm: None,
                });
            }
            Family::DebertaV2(o) => {
                let layers = (0..n)
                    .map(|i| super::deberta_v2::load_layer(vb.pp(format!("layer.{i}")), cfg, o))
                    .collect::<Result<_>>()?;
                let relative = if o.relative_attention {
                    Some(RelativeEmbeddings::load(vb.clone(), cfg, o)?)
                } else {
                    None
                };
                return Ok(Self {
                    layers,
                    steps: plain_steps,
                    input_projection: None,
                    relative,
                    final_layer_norm: None,
                });
            }
            Family::Bert | Family::Roberta => {}
        }
        let layers = (0..n)
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
            steps: plain_steps,
            input_projection: None,
            relative: None,
            final_layer_norm,
        })
    }

    /// One layer per step, no projection, no relative positions: what the
    /// packed fast path can run.
    pub fn is_plain(&self) -> bool {
        self.input_projection.is_none()
            && self.relative.is_none()
            && self.steps.len() == self.layers.len()
            && self.steps.iter().enumerate().all(|(i, s)| s == &[i])
    }

    /// The number of steps (`num_hidden_layers`).
    pub fn num_layers(&self) -> usize {
        self.steps.len()
    }

    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        keep_hidden: bool,
        keep_attentions: bool,
        train: bool,
    ) -> Result<EncoderOutput> {
        let x = match &self.input_projection {
            Some(p) => p.forward(x)?,
            None => x.clone(),
        };
        let rel = match &self.relative {
            Some(r) => Some(r.context(x.dim(1)?, x.device())?),
            None => None,
        };
        let mut hidden = keep_hidden.then(|| vec![x.clone()]);
        let mut attentions = keep_attentions.then(Vec::new);
        let mut x = x;
        for step in &self.steps {
            for &i in step {
                let (y, probs) = self.layers[i].forward_rel(&x, mask, rel.as_ref(), train)?;
                x = y;
                if let Some(a) = attentions.as_mut() {
                    a.push(probs);
                }
            }
            if let Some(h) = hidden.as_mut() {
                h.push(x.clone());
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
