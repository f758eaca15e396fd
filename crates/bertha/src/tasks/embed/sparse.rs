//! SPLADE's sparse vectors (pooling `splade`), like sentence-transformers'
//! SparseEncoder and TEI's `/embed_sparse`: the encoder's token states
//! through the checkpoint's masked-LM head, pooled over the vocabulary.

use candle_core::{Device, Tensor};

use super::{Embedder, EncodeOptions};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::tokenizer::Encoded;
use crate::model::{BertForMaskedLM, BertHead, HeadInit, HeadKind};
use crate::pooling;
use crate::splade::{SparseVector, SpladeHead, SpladeOptions};

impl Embedder {
    /// Whether this embedder makes sparse vectors (pooling `splade`).
    pub fn is_sparse(&self) -> bool {
        self.splade.is_some()
    }

    /// The SPLADE settings (pooling `splade` only).
    pub fn splade_options(&self) -> Option<SpladeOptions> {
        self.splade.as_ref().map(SpladeHead::options)
    }

    /// Changes the SPLADE settings; an error unless pooling is `splade`.
    pub fn set_splade_options(&mut self, options: SpladeOptions) -> Result<()> {
        self.splade_head_mut()?.set_options(options);
        Ok(())
    }

    /// Caps the tokens whose MLM logits (a vocabulary's worth of floats
    /// each) are held at once; `0` is the default (32 MB of logits). The
    /// vectors do not depend on it. An error unless pooling is `splade`.
    pub fn set_splade_chunk_tokens(&mut self, tokens: usize) -> Result<()> {
        self.splade_head_mut()?.set_chunk_tokens(tokens);
        Ok(())
    }

    fn splade_head_mut(&mut self) -> Result<&mut SpladeHead> {
        let pooling = self.pooling.name();
        self.splade.as_mut().ok_or_else(|| {
            Error::Input(format!(
                "this embedder pools `{pooling}`, not `splade`: it has no SPLADE settings"
            ))
        })
    }

    /// Sparse vectors of `encs`, text `i` pooled from token `starts[i]`.
    fn run_sparse(&self, encs: &[&Encoded], starts: &[usize]) -> Result<Vec<SparseVector>> {
        let mut rows = vec![SparseVector::default(); encs.len()];
        self.run_splade(encs, starts, &mut |i, mut row| {
            if self.normalize {
                pooling::normalize_in_place(&mut row);
            }
            rows[i] = SparseVector::from_dense(&row);
            Ok(())
        })?;
        Ok(rows)
    }

    /// The SPLADE vector of each of `encs` (from token `starts[i]` on),
    /// handed to `emit` one at a time: the encoder's states of the real
    /// tokens through the MLM head, a bounded number of tokens at a time.
    pub(super) fn run_splade(
        &self,
        encs: &[&Encoded],
        starts: &[usize],
        emit: &mut dyn FnMut(usize, Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        let head = self
            .splade
            .as_ref()
            .ok_or_else(|| Error::Input("pooling `splade` needs the MLM head".into()))?;
        let from = |i: usize, tokens: usize| starts[i].min(tokens.saturating_sub(1));
        let texts: Vec<Tensor> = if let Some(states) = self.packed_states(encs, None)? {
            let d = states.hidden;
            (0..states.len())
                .map(|s| {
                    let seq = states.sequence(s);
                    let n = seq.len() / d.max(1);
                    let f = from(s, n);
                    Tensor::from_slice(&seq[f * d..n * d], (n - f, d), self.model.device())
                })
                .collect::<candle_core::Result<_>>()?
        } else {
            let (_, out) = self.forward(encs)?;
            encs.iter()
                .enumerate()
                .map(|(r, e)| {
                    let f = from(r, e.len());
                    out.last_hidden_state.get(r)?.narrow(0, f, e.len() - f)
                })
                .collect::<candle_core::Result<_>>()?
        };
        head.pool(&texts, emit)
    }

    /// One sparse vector per text (pooling `splade`), in input order: the
    /// nonzero entries of the vocabulary-sized SPLADE vector, as
    /// sentence-transformers' SparseEncoder and TEI's `/embed_sparse`.
    /// Texts run as in [`Embedder::embed`].
    pub fn embed_sparse<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.embed_sparse_with(texts, &EncodeOptions::default(), batch_size, progress)
    }

    /// As [`Embedder::embed_sparse`], with a call's prompt (`dimensions`
    /// is refused: a sparse vector's entries are vocabulary ids).
    pub fn embed_sparse_with<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EncodeOptions,
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.check_sparse(opts)?;
        let encodings = self.encode_texts(texts, opts)?;
        self.embed_sparse_encoded_with(&encodings, opts, batch_size, progress)
    }

    /// Sparse vectors of what [`Embedder::encode_texts`] made of the texts
    /// for the same `opts` (pooled past the prompt when the folder says so).
    pub fn embed_sparse_encoded_with(
        &self,
        encodings: &[Encoded],
        opts: &EncodeOptions,
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.check_sparse(opts)?;
        let start = self.prompt(opts)?.map_or(0, |p| p.pool_start);
        self.embed_sparse_encoded_from(
            encodings,
            &vec![start; encodings.len()],
            batch_size,
            progress,
        )
    }

    /// Sparse vectors of texts already tokenized, text `i` pooled from its
    /// token `pool_start[i]` on (0: every token), in input order. Batches
    /// are length-sorted and capped as [`Embedder::embed_encoded_from`]'s,
    /// and only one batch's dense vectors are held at once.
    pub fn embed_sparse_encoded_from(
        &self,
        encodings: &[Encoded],
        pool_start: &[usize],
        batch_size: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<SparseVector>> {
        self.check_sparse(&EncodeOptions::default())?;
        self.in_pooled_batches(
            encodings,
            pool_start,
            batch_size,
            progress,
            |encs, starts| self.run_sparse(encs, starts),
        )
    }

    /// Sparse vectors need pooling `splade`, and take no `dimensions`.
    fn check_sparse(&self, opts: &EncodeOptions) -> Result<()> {
        if self.splade.is_none() {
            return Err(Error::Input(format!(
                "sparse vectors need pooling `splade` (this embedder pools `{}`)",
                self.pooling.name()
            )));
        }
        if opts.dimensions.is_some() {
            return Err(Error::option(
                "dimensions",
                "applies to dense vectors: a SPLADE vector's entries are vocabulary ids, kept whole",
            ));
        }
        Ok(())
    }
}

/// The encoder and MLM head of a checkpoint, for pooling `splade`; a
/// checkpoint without the head is an error naming the missing tensor.
pub(super) fn load_mlm_head(
    weights: crate::io::weights::Weights,
    config: BertConfig,
    device: &Device,
) -> Result<BertForMaskedLM> {
    if let Some(missing) = HeadKind::MaskedLM.missing_tensor(&weights, &config) {
        let saved_as = if config.architectures.is_empty() {
            "config.json names no architecture".to_string()
        } else {
            format!("saved as {}", config.architectures.join(", "))
        };
        return Err(Error::Weights {
            path: weights.origin().to_path_buf(),
            reason: format!(
                "pooling `splade` reads the masked-LM head ({}), and this checkpoint has none: \
                 missing tensor `{missing}` ({saved_as}). Use a SPLADE or masked-LM checkpoint, \
                 or another pooling",
                HeadKind::MaskedLM.class_name(&config.family)
            ),
        });
    }
    BertForMaskedLM::from_weights(weights, config, HeadInit::FromCheckpoint, device)
}
