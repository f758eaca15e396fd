//! `embeddings`: word + learned position (+ token type), LayerNorm, dropout.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Embedding, Init, VarBuilder};

use super::nn::{Dropout, LayerNorm};
use crate::config::BertConfig;

#[derive(Debug, Clone)]
pub struct BertEmbeddings {
    pub(crate) word_embeddings: Embedding,
    pub(crate) position_embeddings: Embedding,
    /// Absent when `type_vocab_size` is 0 (the seed's mini BERT).
    pub(crate) token_type_embeddings: Option<Embedding>,
    /// Absent when `embedding_layer_norm` is false.
    pub(crate) layer_norm: Option<LayerNorm>,
    pub(crate) dropout: Dropout,
    max_positions: usize,
}

fn embedding(vb: VarBuilder, rows: usize, dim: usize, std: f64) -> Result<Embedding> {
    let w = vb.get_with_hints(
        (rows, dim),
        "weight",
        Init::Randn {
            mean: 0.0,
            stdev: std,
        },
    )?;
    Ok(Embedding::new(w, dim))
}

impl BertEmbeddings {
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<Self> {
        let d = cfg.hidden_size;
        let std = cfg.initializer_range;
        Ok(Self {
            word_embeddings: embedding(vb.pp("word_embeddings"), cfg.vocab_size, d, std)?,
            position_embeddings: embedding(
                vb.pp("position_embeddings"),
                cfg.max_position_embeddings,
                d,
                std,
            )?,
            token_type_embeddings: if cfg.type_vocab_size > 0 {
                Some(embedding(
                    vb.pp("token_type_embeddings"),
                    cfg.type_vocab_size,
                    d,
                    std,
                )?)
            } else {
                None
            },
            layer_norm: if cfg.embedding_layer_norm {
                Some(LayerNorm::load(vb.pp("LayerNorm"), d, cfg.layer_norm_eps)?)
            } else {
                None
            },
            dropout: Dropout::new(cfg.hidden_dropout_prob),
            max_positions: cfg.max_position_embeddings,
        })
    }

    /// The word-embedding matrix [vocab, hidden] (tied to the MLM decoder).
    pub fn word_embeddings(&self) -> &Tensor {
        self.word_embeddings.embeddings()
    }

    /// `input_ids` and `token_type_ids` are [batch, seq] u32.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor> {
        let (_, seq_len) = input_ids.dims2()?;
        if seq_len > self.max_positions {
            candle_core::bail!(
                "sequence of {seq_len} tokens is longer than max_position_embeddings {}",
                self.max_positions
            );
        }
        let positions = Tensor::arange(0u32, seq_len as u32, input_ids.device())?;
        let mut x = self
            .word_embeddings
            .forward(input_ids)?
            .broadcast_add(&self.position_embeddings.forward(&positions)?)?;
        if let Some(tt) = &self.token_type_embeddings {
            let types = match token_type_ids {
                Some(t) => t.clone(),
                None => input_ids.zeros_like()?,
            };
            x = (x + tt.forward(&types.to_dtype(DType::U32)?)?)?;
        }
        if let Some(ln) = &self.layer_norm {
            x = ln.forward(&x)?;
        }
        self.dropout.forward(&x, train)
    }
}
