//! `pooler`: dense + tanh on the first ([CLS]) token.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::config::BertConfig;
use crate::model::nn::Dense;

#[derive(Debug, Clone)]
pub struct BertPooler {
    pub(crate) dense: Dense,
}

impl BertPooler {
    /// From `vb` at the pooler's dense layer (`pooler.dense` in BERT,
    /// `pooler` in ALBERT: the family's `Layout::pooler_dense`).
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        Ok(Self {
            dense: Dense::load(vb, cfg.hidden_size, cfg.hidden_size, cfg.initializer_range)?,
        })
    }

    /// `hidden` [B, T, D] → [B, D].
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let cls = hidden.narrow(1, 0, 1)?.squeeze(1)?;
        self.dense.forward(&cls)?.tanh()
    }
}
