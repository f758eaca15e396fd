//! `encoder`: the stack of layers (and, for pre-LN models that have one,
//! the final LayerNorm). What a family varies plugs in here: shared
//! layers (`steps`), an input projection, a [`PassContext`] its
//! attention reads, or, for a family whose layers are not BERT's at all
//! (ModernBERT), its own [`LayerStack`].

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use candle_core::{Device, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::attention::LayerPass;
use super::layer::BertLayer;
use crate::config::BertConfig;
use crate::model::nn::{Dense, LayerNorm};

/// What a family computes once per forward pass for every layer's
/// [`ScoreBias`](super::ScoreBias) (DeBERTa's relative-position table).
pub trait PassContext: Debug + Send + Sync {
    /// The shared state for sequences of `len` tokens.
    fn context(&self, len: usize, device: &Device) -> Result<Box<dyn Any>>;
}

/// A family's own layers, run in place of BERT's (ModernBERT: rotary
/// positions, fused QKV, GeGLU, local attention), with the same inputs
/// and outputs as [`BertEncoder::forward`].
pub trait LayerStack: Debug + Send + Sync {
    /// `x` [B, T, D] the embeddings, `mask` the additive padding mask
    /// [B, 1, 1, T] (0 to attend, `f32::MIN` at padding), `keep` whether
    /// to return (hidden states, attentions).
    fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        keep: (bool, bool),
        train: bool,
    ) -> Result<EncoderOutput>;

    fn num_layers(&self) -> usize;

    /// The family's sentence vector from the last hidden state [B, T, D]
    /// and the attention mask [B, T] (1 for tokens): what its sequence
    /// classifier reads, as `pooler_output`; `None` when it has none.
    fn pool(&self, _last: &Tensor, _attention_mask: Option<&Tensor>) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// The stack as its concrete type, for a reader that knows it (the
    /// packed fast path copies ModernBERT's weights); `None` by default.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

#[derive(Debug, Clone)]
pub struct BertEncoder {
    /// The distinct layers (ALBERT: group g's layer i at g · inner + i).
    pub(crate) layers: Vec<BertLayer>,
    /// For each of the `num_hidden_layers` steps, the layers it runs in
    /// order (BERT: step i runs layer i). A hidden state is kept after
    /// each step, an attention map after each layer.
    pub(crate) steps: Vec<Vec<usize>>,
    /// A projection of the embeddings to the hidden size (ALBERT's
    /// `embedding_hidden_mapping_in`).
    pub(crate) input_projection: Option<Dense>,
    /// Shared per-pass state for the attention (DeBERTa's relative
    /// embeddings).
    pub(crate) pass_context: Option<Arc<dyn PassContext>>,
    pub(crate) final_layer_norm: Option<LayerNorm>,
    /// A family's own layers, in place of `layers` (which is then empty).
    pub(crate) stack: Option<Arc<dyn LayerStack>>,
}

/// What the encoder returns: the last state, and on request every layer's
/// input/output and attention probabilities.
pub struct EncoderOutput {
    pub last_hidden_state: Tensor,
    pub hidden_states: Option<Vec<Tensor>>,
    pub attentions: Option<Vec<Tensor>>,
}

impl BertEncoder {
    /// BERT's `encoder`: `layer.N` and, with `final_layer_norm`, a last
    /// `LayerNorm`.
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| BertLayer::load(vb.pp(format!("layer.{i}")), cfg))
            .collect::<Result<_>>()?;
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let final_layer_norm = LayerNorm::load_optional(cfg.final_layer_norm, &vb, d, eps)?;
        Ok(Self {
            final_layer_norm,
            ..Self::from_layers(layers)
        })
    }

    /// One step per layer, nothing else.
    pub fn from_layers(layers: Vec<BertLayer>) -> Self {
        Self {
            steps: (0..layers.len()).map(|i| vec![i]).collect(),
            layers,
            input_projection: None,
            pass_context: None,
            final_layer_norm: None,
            stack: None,
        }
    }

    /// An encoder that runs a family's own layers.
    pub fn from_stack(stack: Arc<dyn LayerStack>) -> Self {
        Self {
            stack: Some(stack),
            ..Self::from_layers(Vec::new())
        }
    }

    /// The family's sentence vector ([`LayerStack::pool`]); `None` for
    /// BERT's layers, whose pooler is its own module.
    pub fn pool(&self, last: &Tensor, attention_mask: Option<&Tensor>) -> Result<Option<Tensor>> {
        match &self.stack {
            Some(s) => s.pool(last, attention_mask),
            None => Ok(None),
        }
    }

    /// The family's own layers, when it has them ([`LayerStack`]).
    pub(crate) fn stack(&self) -> Option<&dyn LayerStack> {
        self.stack.as_deref()
    }

    /// The layer each pass runs, in order (every step's layers, one step
    /// after another), when the layers are BERT's with no relative
    /// positions (ALBERT's shared layers included): what the fast paths
    /// run (`fast::bert_layout`).
    pub(crate) fn layer_order(&self) -> Option<Vec<usize>> {
        (self.pass_context.is_none() && self.stack.is_none()).then(|| self.steps.concat())
    }

    /// The number of steps (`num_hidden_layers`).
    pub fn num_layers(&self) -> usize {
        match &self.stack {
            Some(s) => s.num_layers(),
            None => self.steps.len(),
        }
    }

    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        keep_hidden: bool,
        keep_attentions: bool,
        train: bool,
    ) -> Result<EncoderOutput> {
        if let Some(stack) = &self.stack {
            return stack.forward(x, mask, (keep_hidden, keep_attentions), train);
        }
        let x = match &self.input_projection {
            Some(p) => p.forward(x)?,
            None => x.clone(),
        };
        let context = match &self.pass_context {
            Some(c) => Some(c.context(x.dim(1)?, x.device())?),
            None => None,
        };
        let mut hidden = keep_hidden.then(|| vec![x.clone()]);
        let mut attentions = keep_attentions.then(Vec::new);
        let pass = LayerPass {
            mask,
            context: context.as_deref(),
            train,
        };
        let mut x = x;
        for step in &self.steps {
            for &i in step {
                let (y, probs) = self.layers[i].forward(&x, pass)?;
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
