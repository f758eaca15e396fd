//! Text classification, like transformers' `text-classification`
//! pipeline: label scores for a text (or a text pair), by softmax, by
//! sigmoid for multi-label models, raw for regression.

use std::path::Path;

use candle_core::Device;

use super::pipeline::{self, sigmoid, softmax, PipelineHead};
use super::rerank::Activation;
use super::PipelineOptions;
use crate::config::{BertConfig, ProblemType};
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::model::{BertForSequenceClassification, BertHead};

/// How logits become scores (transformers' `function_to_apply`: `softmax`,
/// `sigmoid`, `none`; and a cross-encoder folder's `tanh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreFunction {
    Softmax,
    Sigmoid,
    /// The raw logits.
    None,
    /// tanh of each logit: only as a cross-encoder folder's
    /// `activation_fn` names it (not one of transformers' choices, so
    /// requests and flags cannot ask for it).
    #[serde(skip_deserializing)]
    Tanh,
}

impl ScoreFunction {
    /// transformers' default for a config: none for regression, sigmoid for
    /// multi-label or single-output models, else softmax.
    pub fn default_for(config: &BertConfig) -> Self {
        match config.problem_type {
            Some(ProblemType::Regression) => Self::None,
            Some(ProblemType::MultiLabelClassification) => Self::Sigmoid,
            _ if config.num_labels() == 1 => Self::Sigmoid,
            _ => Self::Softmax,
        }
    }
}

impl std::str::FromStr for ScoreFunction {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "softmax" => Ok(Self::Softmax),
            "sigmoid" => Ok(Self::Sigmoid),
            "none" => Ok(Self::None),
            other => Err(Error::option(
                "function",
                format!("`{other}` is not one of softmax, sigmoid, none"),
            )),
        }
    }
}

/// A label with its score.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LabelScore {
    pub label: String,
    pub score: f32,
}

pub struct Classifier {
    model: PipelineHead<BertForSequenceClassification>,
    tokenizer: Tokenizer,
    function: ScoreFunction,
    batch_size: usize,
}

/// Texts a forward pass of [`Classifier::classify_many`] takes by default
/// (transformers' pipelines take a `batch_size`, TEI batches by tokens).
const CLASSIFY_BATCH_SIZE: usize = 32;

impl Classifier {
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::from_dir_with(dir, device, &PipelineOptions::default())
    }

    /// [`Classifier::from_dir`] at the precision `opts` asks. A
    /// sentence-transformers cross-encoder's folder gives the score
    /// function its `activation_fn` names.
    pub fn from_dir_with(dir: &Path, device: &Device, opts: &PipelineOptions) -> Result<Self> {
        let (model, tokenizer) = pipeline::load(dir, device, None, opts)?;
        let mut classifier = Self::build(model, tokenizer);
        let default = Activation::default_for(classifier.labels().len());
        if let Some(a) = Activation::named_in(dir, default)? {
            classifier.function = a.score_function();
        }
        Ok(classifier)
    }

    /// A pipeline over `model` in fp32.
    pub fn new(model: BertForSequenceClassification, tokenizer: Tokenizer) -> Self {
        Self::build(PipelineHead::f32(model), tokenizer)
    }

    fn build(model: PipelineHead<BertForSequenceClassification>, tokenizer: Tokenizer) -> Self {
        let function = ScoreFunction::default_for(model.head().config());
        Self {
            model,
            tokenizer,
            function,
            batch_size: CLASSIFY_BATCH_SIZE,
        }
    }

    /// Texts per forward pass of [`Classifier::classify_many`] (at least 1).
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    pub fn with_function(mut self, function: ScoreFunction) -> Self {
        self.function = function;
        self
    }

    /// Label names in id order.
    pub fn labels(&self) -> Vec<String> {
        let cfg = self.model.head().config();
        (0..cfg.num_labels()).map(|i| cfg.label_name(i)).collect()
    }

    pub fn function(&self) -> ScoreFunction {
        self.function
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The precision the encoder runs at.
    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    /// Every label's score, best first (`top_k: None`), or the `k` best.
    pub fn classify(
        &self,
        text: &str,
        pair: Option<&str>,
        top_k: Option<usize>,
    ) -> Result<Vec<LabelScore>> {
        self.classify_with(text, pair, top_k, self.function)
    }

    /// As [`Classifier::classify`], with this call's score function.
    pub fn classify_with(
        &self,
        text: &str,
        pair: Option<&str>,
        top_k: Option<usize>,
        function: ScoreFunction,
    ) -> Result<Vec<LabelScore>> {
        let mut one = self.classify_many(&[(text, pair)], top_k, function)?;
        Ok(one.pop().unwrap_or_default())
    }

    /// [`Classifier::classify_with`] of many texts (each with its optional
    /// pair) at once, in their order: texts of similar length share a
    /// forward pass of up to [`Classifier::with_batch_size`] texts, and on
    /// the packed CPU path these batches run side by side, one per core.
    /// Each text's scores are its scores alone, to fp32 rounding.
    pub fn classify_many<S: AsRef<str>>(
        &self,
        inputs: &[(S, Option<S>)],
        top_k: Option<usize>,
        function: ScoreFunction,
    ) -> Result<Vec<Vec<LabelScore>>> {
        if top_k == Some(0) {
            return Err(Error::Input("top_k must be at least 1".into()));
        }
        let encs = inputs
            .iter()
            .map(|(text, pair)| {
                let enc = match pair {
                    Some(p) => self.tokenizer.encode_pair(text.as_ref(), p.as_ref())?,
                    None => self.tokenizer.encode(text.as_ref())?,
                };
                pipeline::warn_truncated(&enc, self.tokenizer.max_length());
                Ok(enc)
            })
            .collect::<Result<Vec<_>>>()?;
        let pad = self.tokenizer.pad_id();
        let seqs: Vec<(&[u32], &[u32])> = encs
            .iter()
            .map(|e| (&e.input_ids[..], &e.token_type_ids[..]))
            .collect();
        let logits = self.model.many_logits(&seqs, self.batch_size, pad)?;
        Ok(logits
            .into_iter()
            .map(|l| self.scores(l, top_k, function))
            .collect())
    }

    /// The labels' scores of one text's `logits`, best first (the `top_k`
    /// best when given).
    fn scores(
        &self,
        logits: Vec<f32>,
        top_k: Option<usize>,
        function: ScoreFunction,
    ) -> Vec<LabelScore> {
        let scores = match function {
            ScoreFunction::Softmax => softmax(&logits),
            ScoreFunction::Sigmoid => logits.iter().map(|&x| sigmoid(x)).collect(),
            ScoreFunction::None => logits,
            ScoreFunction::Tanh => logits.iter().map(|x| x.tanh()).collect(),
        };
        let k = top_k.unwrap_or(scores.len()).min(scores.len());
        let config = self.model.head().config();
        pipeline::top_k(&scores, k)
            .into_iter()
            .map(|i| LabelScore {
                label: config.label_name(i),
                score: scores[i],
            })
            .collect()
    }
}
