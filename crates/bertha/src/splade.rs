//! SPLADE: sparse, vocabulary-sized text vectors from a masked-LM head,
//! as sentence-transformers' `SpladePooling` and TEI's `splade` pooling
//! compute them. Every real token's MLM logits go through
//! log(1 + relu(·)) (twice for `log1p_relu`), then are pooled over the
//! text's tokens by max (SPLADE v2 and later, the default) or sum
//! (the original SPLADE); padding never takes part.
//!
//! The logits of a batch are [tokens, vocabulary]: 16,384 tokens of a
//! 30,522-word BERT would be 2 GB at once. [`SpladeHead`] runs the MLM
//! head over a bounded number of tokens at a time (see
//! [`SpladeHead::set_chunk_tokens`]), folds each chunk into the one
//! text still open, and hands every text's vector on as soon as its last
//! token is in, so memory stays one chunk of logits and one vector.

use std::str::FromStr;

use candle_core::{DType, Tensor};

use crate::error::{Error, Result};
use crate::model::BertLMPredictionHead;

/// How token scores become one score per vocabulary entry
/// (sentence-transformers' `pooling_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpladeStrategy {
    /// The largest over the text's tokens (SPLADE v2 and later; TEI's only one).
    #[default]
    Max,
    /// The sum over the text's tokens (the original SPLADE).
    Sum,
}

/// What each logit goes through before pooling
/// (sentence-transformers' `activation_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpladeActivation {
    /// log(1 + relu(x)): every SPLADE model.
    #[default]
    Relu,
    /// log(1 + log(1 + relu(x))): OpenSearch's sparse models.
    Log1pRelu,
}

impl FromStr for SpladeStrategy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "max" => Ok(Self::Max),
            "sum" => Ok(Self::Sum),
            other => Err(Error::option(
                "pooling_strategy",
                format!("`{other}` is unknown (expected max or sum)"),
            )),
        }
    }
}

impl FromStr for SpladeActivation {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "relu" => Ok(Self::Relu),
            "log1p_relu" => Ok(Self::Log1pRelu),
            other => Err(Error::option(
                "activation_function",
                format!("`{other}` is unknown (expected relu or log1p_relu)"),
            )),
        }
    }
}

/// A SpladePooling module's settings. The default (max, relu) is what
/// `--pooling splade` and TEI use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpladeOptions {
    pub strategy: SpladeStrategy,
    pub activation: SpladeActivation,
}

impl SpladeOptions {
    /// One logit's score: log1p(relu(x)), log1p'd again for `log1p_relu`.
    pub fn activate(self, x: f32) -> f32 {
        let y = x.max(0.0).ln_1p();
        match self.activation {
            SpladeActivation::Relu => y,
            SpladeActivation::Log1pRelu => y.ln_1p(),
        }
    }
}

/// One entry of a sparse vector: a vocabulary id and its weight, in TEI's
/// field names (`/embed_sparse` answers a list of these per text).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SparseValue {
    pub index: u32,
    pub value: f32,
}

/// The nonzero entries of a vocabulary-sized vector, by increasing index.
/// Serialises as TEI's `[{"index": .., "value": ..}, ..]`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct SparseVector(pub Vec<SparseValue>);

impl SparseVector {
    /// The nonzero entries of `dense` (TEI keeps every value `!= 0.0`).
    pub fn from_dense(dense: &[f32]) -> Self {
        Self(
            dense
                .iter()
                .enumerate()
                .filter(|(_, v)| **v != 0.0)
                .map(|(i, v)| SparseValue {
                    index: i as u32,
                    value: *v,
                })
                .collect(),
        )
    }

    /// The dense vector of `dim` entries. An index at or past `dim` is an
    /// error naming it.
    pub fn to_dense(&self, dim: usize) -> Result<Vec<f32>> {
        let mut dense = vec![0f32; dim];
        for e in &self.0 {
            let slot = dense.get_mut(e.index as usize).ok_or_else(|| {
                Error::Input(format!(
                    "sparse index {} is outside the {dim} dimensions",
                    e.index
                ))
            })?;
            *slot = e.value;
        }
        Ok(dense)
    }

    /// `(index, value)` pairs.
    pub fn pairs(&self) -> Vec<(u32, f32)> {
        self.0.iter().map(|e| (e.index, e.value)).collect()
    }

    pub fn indices(&self) -> Vec<u32> {
        self.0.iter().map(|e| e.index).collect()
    }

    pub fn values(&self) -> Vec<f32> {
        self.0.iter().map(|e| e.value).collect()
    }

    /// The number of nonzero entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The dot product with another sparse vector (SPLADE's similarity).
    pub fn dot(&self, other: &SparseVector) -> f32 {
        let (mut i, mut j, mut sum) = (0, 0, 0f64);
        while i < self.0.len() && j < other.0.len() {
            let (a, b) = (&self.0[i], &other.0[j]);
            match a.index.cmp(&b.index) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    sum += f64::from(a.value) * f64::from(b.value);
                    i += 1;
                    j += 1;
                }
            }
        }
        sum as f32
    }
}

/// Logits held at once by default: 8 M floats (32 MB), e.g. 274 tokens of
/// a 30,522-word vocabulary.
pub const DEFAULT_CHUNK_LOGITS: usize = 1 << 23;

/// The MLM head and a SpladePooling module's settings: token states in,
/// one vocabulary-sized vector per text out.
#[derive(Debug, Clone)]
pub struct SpladeHead {
    predictions: BertLMPredictionHead,
    options: SpladeOptions,
    /// Tokens whose logits are computed at once; 0: from
    /// [`DEFAULT_CHUNK_LOGITS`].
    chunk_tokens: usize,
}

/// Part of one text's tokens in a chunk.
struct Piece {
    text: usize,
    rows: usize,
    /// The text's last tokens: its vector is complete after this piece.
    last: bool,
}

impl SpladeHead {
    pub fn new(predictions: BertLMPredictionHead, options: SpladeOptions) -> Self {
        Self {
            predictions,
            options,
            chunk_tokens: 0,
        }
    }

    pub fn options(&self) -> SpladeOptions {
        self.options
    }

    pub fn set_options(&mut self, options: SpladeOptions) {
        self.options = options;
    }

    /// The vocabulary size: the length of every vector.
    pub fn vocab_size(&self) -> usize {
        self.predictions.decoder_weight().dim(0).unwrap_or(0)
    }

    /// Caps the tokens whose logits are held at once (at least 1); `0`
    /// goes back to the default ([`DEFAULT_CHUNK_LOGITS`] floats).
    /// Results do not depend on it.
    pub fn set_chunk_tokens(&mut self, tokens: usize) {
        self.chunk_tokens = tokens;
    }

    /// Tokens whose logits are computed at once.
    pub fn chunk_tokens(&self) -> usize {
        match self.chunk_tokens {
            0 => (DEFAULT_CHUNK_LOGITS / self.vocab_size().max(1)).max(1),
            n => n,
        }
    }

    /// Pools each text's token states (`texts[i]`: [tokens, hidden], the
    /// real tokens only) to one vocabulary-sized vector, and hands each
    /// to `emit(i, vector)` once its last token is in (texts in order; a
    /// text with no tokens gets zeros).
    pub fn pool(
        &self,
        texts: &[Tensor],
        emit: &mut dyn FnMut(usize, Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        let chunk = self.chunk_tokens();
        let mut open = Open::new(self.vocab_size(), self.options);
        let mut pieces: Vec<Tensor> = Vec::new();
        let mut layout: Vec<Piece> = Vec::new();
        let mut filled = 0;
        for (text, states) in texts.iter().enumerate() {
            let (n, _) = states.dims2()?;
            if n == 0 {
                emit(text, vec![0.0; self.vocab_size()])?;
                continue;
            }
            let mut at = 0;
            while at < n {
                let take = (n - at).min(chunk - filled);
                pieces.push(states.narrow(0, at, take)?);
                at += take;
                layout.push(Piece {
                    text,
                    rows: take,
                    last: at == n,
                });
                filled += take;
                if filled == chunk {
                    self.run_chunk(&pieces, &layout, &mut open, emit)?;
                    pieces.clear();
                    layout.clear();
                    filled = 0;
                }
            }
        }
        if filled > 0 {
            self.run_chunk(&pieces, &layout, &mut open, emit)?;
        }
        Ok(())
    }

    /// The MLM logits of one chunk, folded into the open text's vector.
    fn run_chunk(
        &self,
        pieces: &[Tensor],
        layout: &[Piece],
        open: &mut Open,
        emit: &mut dyn FnMut(usize, Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        let states = Tensor::cat(pieces, 0)?.to_dtype(DType::F32)?;
        let logits = self.predictions.forward(&states)?.to_dtype(DType::F32)?;
        let mut row = 0;
        for piece in layout {
            let rows = logits.narrow(0, row, piece.rows)?;
            row += piece.rows;
            match self.options.strategy {
                // log1p∘relu never decreases, so the largest score is
                // that of the largest logit: reduce first (on the device),
                // activate once.
                SpladeStrategy::Max => open.max(&rows.max(0)?.to_vec1::<f32>()?),
                SpladeStrategy::Sum => open.add(&rows.flatten_all()?.to_vec1::<f32>()?),
            }
            if piece.last {
                emit(piece.text, open.finish())?;
            }
        }
        Ok(())
    }
}

/// The vector of the text whose tokens are being folded in.
struct Open {
    acc: Vec<f32>,
    options: SpladeOptions,
}

impl Open {
    fn new(vocab: usize, options: SpladeOptions) -> Self {
        let mut open = Self {
            acc: Vec::new(),
            options,
        };
        open.reset(vocab);
        open
    }

    fn reset(&mut self, vocab: usize) {
        let start = match self.options.strategy {
            SpladeStrategy::Max => f32::NEG_INFINITY,
            SpladeStrategy::Sum => 0.0,
        };
        self.acc = vec![start; vocab];
    }

    /// Max strategy: the largest logit of each entry so far.
    fn max(&mut self, logits: &[f32]) {
        self.acc
            .iter_mut()
            .zip(logits)
            .for_each(|(a, x)| *a = a.max(*x));
    }

    /// Sum strategy: `logits` holds whole rows of the vocabulary.
    fn add(&mut self, logits: &[f32]) {
        let v = self.acc.len();
        for row in logits.chunks(v.max(1)) {
            self.acc
                .iter_mut()
                .zip(row)
                .for_each(|(a, x)| *a += self.options.activate(*x));
        }
    }

    /// The finished vector; the next text starts from nothing.
    fn finish(&mut self) -> Vec<f32> {
        let vocab = self.acc.len();
        let mut done = std::mem::take(&mut self.acc);
        if self.options.strategy == SpladeStrategy::Max {
            done.iter_mut().for_each(|x| *x = self.options.activate(*x));
        }
        self.reset(vocab);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_vectors_keep_nonzeros_in_index_order() {
        let v = SparseVector::from_dense(&[0.0, 1.5, 0.0, 0.25]);
        assert_eq!(v.pairs(), vec![(1, 1.5), (3, 0.25)]);
        assert_eq!(v.to_dense(4).unwrap(), vec![0.0, 1.5, 0.0, 0.25]);
        let err = v.to_dense(3).unwrap_err().to_string();
        assert!(
            err.contains("index 3") && err.contains("3 dimensions"),
            "{err}"
        );
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(
            json,
            r#"[{"index":1,"value":1.5},{"index":3,"value":0.25}]"#
        );
        let w = SparseVector::from_dense(&[2.0, 2.0, 0.0, 4.0]);
        assert_eq!(v.dot(&w), 1.5 * 2.0 + 0.25 * 4.0);
    }

    #[test]
    fn activations_are_log1p_of_relu() {
        let relu = SpladeOptions::default();
        assert_eq!(relu.activate(-3.0), 0.0);
        assert_eq!(relu.activate(2.0), 2f32.ln_1p());
        let twice = SpladeOptions {
            activation: SpladeActivation::Log1pRelu,
            ..relu
        };
        assert_eq!(twice.activate(2.0), 2f32.ln_1p().ln_1p());
        assert!("mean".parse::<SpladeStrategy>().is_err());
        assert_eq!(
            "log1p_relu".parse::<SpladeActivation>().unwrap(),
            SpladeActivation::Log1pRelu
        );
    }
}
