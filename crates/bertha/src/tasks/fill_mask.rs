//! Fill-mask, like transformers' `fill-mask` pipeline: for each mask token
//! in a text, the `top_k` most likely tokens with their probabilities and
//! the text with the mask filled in.

use std::path::Path;

use candle_core::{Device, Tensor};

use super::pipeline::{self, softmax, PipelineHead};
use super::PipelineOptions;
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::model::{BertForMaskedLM, BertHead, HeadLabels, IGNORE_INDEX};

/// One candidate for one mask, with transformers' field names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MaskPrediction {
    /// Softmax probability over the vocabulary.
    pub score: f32,
    /// The token id.
    pub token: u32,
    /// The token decoded on its own (`##s` stays `##s`).
    pub token_str: String,
    /// The text with this mask filled in (with a single mask: special
    /// tokens dropped; with several: the other masks kept, as transformers).
    pub sequence: String,
}

pub struct FillMask {
    model: PipelineHead<BertForMaskedLM>,
    tokenizer: Tokenizer,
    mask_id: u32,
    mask_token: String,
}

impl FillMask {
    /// Loads a masked-LM (or pre-training) checkpoint and its tokenizer.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_dir_with(dir, device, &PipelineOptions::default())
    }

    /// [`FillMask::from_dir`] at the precision `opts` asks.
    pub fn from_dir_with(dir: &Path, device: &Device, opts: &PipelineOptions) -> Result<Self> {
        let (model, tokenizer) = pipeline::load(dir, device, None, opts)?;
        Self::build(model, tokenizer)
    }

    /// A pipeline over `model` in fp32.
    pub fn new(model: BertForMaskedLM, tokenizer: Tokenizer) -> Result<Self> {
        Self::build(PipelineHead::f32(model), tokenizer)
    }

    fn build(model: PipelineHead<BertForMaskedLM>, tokenizer: Tokenizer) -> Result<Self> {
        // BERT's `[MASK]`, or RoBERTa's / DeBERTa's `<mask>`.
        let (mask_token, mask_id) = ["[MASK]", "<mask>"]
            .iter()
            .find_map(|t| tokenizer.token_to_id(t).map(|id| (t.to_string(), id)))
            .ok_or_else(|| {
                Error::Tokenizer(
                    "the vocabulary has no mask token (`[MASK]` or `<mask>`), so fill-mask cannot work"
                        .into(),
                )
            })?;
        Ok(Self {
            model,
            tokenizer,
            mask_id,
            mask_token,
        })
    }

    pub fn mask_token(&self) -> &str {
        &self.mask_token
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The precision the encoder runs at.
    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    fn device(&self) -> &Device {
        self.model.head().bert().device()
    }

    /// The `top_k` candidates for each mask of `text`, masks in order.
    pub fn fill(&self, text: &str, top_k: usize) -> Result<Vec<Vec<MaskPrediction>>> {
        if top_k == 0 {
            return Err(Error::Input("top_k must be at least 1".into()));
        }
        if !text.contains(&self.mask_token) {
            return Err(Error::Input(format!(
                "no mask token {} in the text {text:?}: fill-mask needs at least one",
                self.mask_token
            )));
        }
        let enc = self.tokenizer.encode(text)?;
        let masks: Vec<usize> = enc
            .input_ids
            .iter()
            .enumerate()
            .filter(|(_, &id)| id == self.mask_id)
            .map(|(i, _)| i)
            .collect();
        // Every mask of the text is answered, or none: a mask past the
        // truncation point is an error, even when others survive.
        let written = text.matches(self.mask_token.as_str()).count();
        if enc.truncated && masks.len() < written {
            let cut = masks.len() + 1;
            let which = if cut == written {
                format!("mask {cut} of {written} was")
            } else {
                format!("masks {cut} to {written} of {written} were")
            };
            return Err(Error::Input(format!(
                "{which} cut off by truncation at {} tokens ({} in {}): \
                 shorten the text so that every mask fits",
                self.tokenizer.max_length(),
                self.mask_token,
                preview(text)
            )));
        }
        if masks.is_empty() {
            return Err(Error::Input(format!(
                "the mask token {} of {} gave no mask id once tokenized",
                self.mask_token,
                preview(text)
            )));
        }
        let pad = self.tokenizer.pad_id();
        // The vocabulary-sized decoder runs at the masks' rows alone
        // (pre-training's `labelled_rows_only`: those rows of the full
        // logits, in order). A label only marks its row; the loss that
        // comes with them is not read.
        let mut marks = vec![IGNORE_INDEX; enc.input_ids.len()];
        for &pos in &masks {
            marks[pos] = i64::from(enc.input_ids[pos]);
        }
        let marks = Tensor::from_vec(marks, (1, enc.input_ids.len()), self.device())?;
        let logits = self
            .model
            .forward_labelled(
                std::slice::from_ref(&enc.input_ids),
                std::slice::from_ref(&enc.token_type_ids),
                pad,
                &HeadLabels::labels(Some(&marks)),
                true,
            )?
            .logits;
        let single = masks.len() == 1;
        let mut out = Vec::with_capacity(masks.len());
        for (row, &pos) in masks.iter().enumerate() {
            let probs = softmax(&logits.get(row)?.to_vec1::<f32>()?);
            let k = top_k.min(probs.len());
            let mut row = Vec::with_capacity(k);
            for id in pipeline::top_k(&probs, k) {
                let id = id as u32;
                let mut ids = enc.input_ids.clone();
                ids[pos] = id;
                ids.retain(|&t| t != self.tokenizer.pad_id());
                row.push(MaskPrediction {
                    score: probs[id as usize],
                    token: id,
                    token_str: self.tokenizer.decode(&[id], false)?,
                    sequence: self.tokenizer.decode(&ids, single)?,
                });
            }
            out.push(row);
        }
        Ok(out)
    }
}

/// The text for an error message: quoted, cut to its first 60 characters.
fn preview(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((at, _)) => format!("{:?}…", &text[..at]),
        None => format!("{text:?}"),
    }
}
