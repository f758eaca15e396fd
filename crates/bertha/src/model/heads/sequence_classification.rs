//! `BertForSequenceClassification`: pooler → dropout → classifier, with
//! the loss its `problem_type` says.

use candle_core::{DType, Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::init::load_bert;
use super::loss::{bce_with_logits, class_cross_entropy, float_labels};
use super::{pooled, BertHead, Classifier, HeadLabels, HeadOptions, HeadOutput};
use crate::config::{BertConfig, ProblemType};
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel, ForwardOptions};

/// `BertForSequenceClassification`.
#[derive(Debug, Clone)]
pub struct BertForSequenceClassification {
    bert: BertModel,
    classifier: Classifier,
    num_labels: usize,
}

super::impl_bert_head!(
    BertForSequenceClassification,
    SequenceClassification,
    HeadOutput
);

impl BertForSequenceClassification {
    /// `labels`: [B] class ids (single-label), [B, num_labels] 0/1 floats
    /// (multi-label) or [B] / [B, num_labels] floats (regression).
    fn run(&self, input: &BertInput, labels: &HeadLabels, opts: HeadOptions) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts.forward)?;
        let logits = self.classifier.forward(pooled(&out)?, opts.forward.train)?;
        let loss = labels.labels.map(|l| self.loss(&logits, l)).transpose()?;
        Ok(HeadOutput::new(out, logits, loss))
    }

    fn load_head(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let num_labels = config.num_labels();
        let classifier = Classifier::load(root.pp("classifier"), &config, num_labels)?;
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            classifier,
            num_labels,
        })
    }
}

impl BertForSequenceClassification {
    pub fn num_labels(&self) -> usize {
        self.num_labels
    }

    /// The loss transformers would use for these labels: the config's
    /// `problem_type`, else regression for one label, single-label
    /// classification for integer labels and multi-label otherwise.
    pub fn problem_type(&self, labels: &Tensor) -> ProblemType {
        match self.config().problem_type {
            Some(p) => p,
            None if self.num_labels == 1 => ProblemType::Regression,
            None if matches!(labels.dtype(), DType::U8 | DType::U32 | DType::I64) => {
                ProblemType::SingleLabelClassification
            }
            None => ProblemType::MultiLabelClassification,
        }
    }

    fn loss(&self, logits: &Tensor, l: &Tensor) -> Result<Tensor> {
        Ok(match self.problem_type(l) {
            ProblemType::SingleLabelClassification => class_cross_entropy(logits, l, "labels")?,
            ProblemType::MultiLabelClassification => {
                bce_with_logits(logits, &float_labels(l, logits.dims(), "labels")?)?
            }
            ProblemType::Regression => {
                let target = if self.num_labels == 1 {
                    float_labels(l, &[logits.dim(0)?], "labels")?.unsqueeze(1)?
                } else {
                    float_labels(l, logits.dims(), "labels")?
                };
                (logits - &target)?.sqr()?.mean_all()?
            }
        })
    }
}

super::labels_forward!(BertForSequenceClassification);
