//! One vector per token (pooling `none`), like TEI's `/embed_all`.

use candle_core::Tensor;

use super::{Embedder, EncodeOptions};
use crate::error::Result;
use crate::io::tokenizer::Encoded;
use crate::pooling;

/// One vector per token of one text (pooling `none`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenEmbeddings {
    pub tokens: Vec<String>,
    pub embeddings: Vec<Vec<f32>>,
}

impl Embedder {
    /// One vector per token for each text (TEI's `/embed_all`), in input
    /// order; normalised per token when normalisation is on.
    pub fn embed_tokens<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenEmbeddings>> {
        let encodings = self.encode_texts(texts, &EncodeOptions::default())?;
        self.embed_tokens_encoded(&encodings, batch_size, progress)
    }

    /// As [`Embedder::embed_tokens`], on texts already tokenized.
    pub fn embed_tokens_encoded(
        &self,
        encodings: &[Encoded],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenEmbeddings>> {
        self.in_batches(encodings, batch_size, progress, |batch| {
            self.run_tokens(&batch.iter().map(|&i| &encodings[i]).collect::<Vec<_>>())
        })
    }

    fn run_tokens(&self, encs: &[&Encoded]) -> Result<Vec<TokenEmbeddings>> {
        if let Some(states) = self.packed_states(encs, None)? {
            return Ok(encs
                .iter()
                .enumerate()
                .map(|(s, e)| {
                    let mut vectors: Vec<Vec<f32>> = states
                        .sequence(s)
                        .chunks(states.hidden)
                        .map(<[f32]>::to_vec)
                        .collect();
                    if self.normalize {
                        vectors
                            .iter_mut()
                            .for_each(|v| pooling::normalize_in_place(v));
                    }
                    TokenEmbeddings {
                        tokens: e.tokens.clone(),
                        embeddings: vectors,
                    }
                })
                .collect());
        }
        let (_, res) = self.forward(encs)?;
        encs.iter()
            .enumerate()
            .map(|(row, e)| {
                let mut states: Tensor = res.last_hidden_state.get(row)?.narrow(0, 0, e.len())?;
                if self.normalize {
                    states = pooling::normalize(&states)?;
                }
                Ok(TokenEmbeddings {
                    tokens: e.tokens.clone(),
                    embeddings: states.to_vec2::<f32>()?,
                })
            })
            .collect()
    }
}
