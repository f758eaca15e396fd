//! Next-sentence prediction: how likely text B follows text A, from a
//! checkpoint with BERT's NSP head (`BertForNextSentencePrediction` or
//! `BertForPreTraining`).

use std::path::Path;

use candle_core::Device;

use super::pipeline::{self, softmax};
use crate::error::Result;
use crate::io::tokenizer::Tokenizer;
use crate::model::BertForNextSentencePrediction;

/// Probabilities of BERT's two NSP classes (label 0: B follows A).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct NextSentenceScore {
    pub is_next: f32,
    pub not_next: f32,
}

pub struct NextSentence {
    model: BertForNextSentencePrediction,
    tokenizer: Tokenizer,
}

impl NextSentence {
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        let (model, tokenizer) =
            pipeline::load::<BertForNextSentencePrediction>(dir, device, None)?;
        Ok(Self::new(model, tokenizer))
    }

    pub fn new(model: BertForNextSentencePrediction, tokenizer: Tokenizer) -> Self {
        Self { model, tokenizer }
    }

    pub fn predict(&self, a: &str, b: &str) -> Result<NextSentenceScore> {
        let enc = self.tokenizer.encode_pair(a, b)?;
        pipeline::warn_truncated(&enc, self.tokenizer.max_length());
        let pad = self.tokenizer.pad_id();
        let logits =
            pipeline::single_logits(&self.model, &enc.input_ids, &enc.token_type_ids, pad)?
                .to_vec1::<f32>()?;
        let p = softmax(&logits);
        Ok(NextSentenceScore {
            is_next: p[0],
            not_next: p[1],
        })
    }
}
