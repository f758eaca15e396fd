//! Next-sentence prediction: how likely text B follows text A, from a
//! checkpoint with BERT's NSP head (`BertForNextSentencePrediction` or
//! `BertForPreTraining`).

use std::path::Path;

use candle_core::Device;

use super::pipeline::{self, softmax, PipelineHead};
use super::PipelineOptions;
use crate::error::Result;
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::model::BertForNextSentencePrediction;

/// Probabilities of BERT's two NSP classes (label 0: B follows A).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct NextSentenceScore {
    pub is_next: f32,
    pub not_next: f32,
}

pub struct NextSentence {
    model: PipelineHead<BertForNextSentencePrediction>,
    tokenizer: Tokenizer,
}

impl NextSentence {
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_dir_with(dir, device, &PipelineOptions::default())
    }

    /// [`NextSentence::from_dir`] at the precision `opts` asks.
    pub fn from_dir_with(dir: &Path, device: &Device, opts: &PipelineOptions) -> Result<Self> {
        let (model, tokenizer) = pipeline::load(dir, device, None, opts)?;
        Ok(Self { model, tokenizer })
    }

    /// A pipeline over `model` in fp32.
    pub fn new(model: BertForNextSentencePrediction, tokenizer: Tokenizer) -> Self {
        let model = PipelineHead::f32(model);
        Self { model, tokenizer }
    }

    /// The precision the encoder runs at.
    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    pub fn predict(&self, a: &str, b: &str) -> Result<NextSentenceScore> {
        let enc = self.tokenizer.encode_pair(a, b)?;
        pipeline::warn_truncated(&enc, self.tokenizer.max_length());
        let pad = self.tokenizer.pad_id();
        let logits = self
            .model
            .single_logits(&enc.input_ids, &enc.token_type_ids, pad)?
            .to_vec1::<f32>()?;
        let p = softmax(&logits);
        Ok(NextSentenceScore {
            is_next: p[0],
            not_next: p[1],
        })
    }
}
