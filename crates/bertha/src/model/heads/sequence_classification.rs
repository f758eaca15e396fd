//! `BertForSequenceClassification`: pooler → dropout → classifier, with
//! the loss its `problem_type` says.

use candle_core::{DType, Result as CResult, Tensor};

use super::loss::{bce_with_logits, class_cross_entropy, float_labels};
use super::{pooled, Classifier, Head, HeadOutput, HeadPass, HeadSource};
use crate::config::{BertConfig, ProblemType};
use crate::error::Result;
use crate::model::nn::{Dense, Dropout};

super::declare_head! {
    /// `BertForSequenceClassification`'s module: the classifier on the
    /// pooled output.
    BertForSequenceClassification: SequenceClassification -> HeadOutput,
    SequenceClassificationModule { classifier: Classifier }
}

impl SequenceClassificationModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let classifier = Classifier::load(from, from.config().num_labels())?;
        Ok(Head::new(from.encoder()?, Self { classifier }))
    }

    /// `labels`: [B] class ids (single-label), [B, num_labels] 0/1 floats
    /// (multi-label) or [B] / [B, num_labels] floats (regression).
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let out = pass.encode()?;
        let logits = self.classifier.forward(pooled(&out)?, pass.train())?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, |logits, l, _| {
            self.loss(pass.bert.config(), logits, l)
        })
    }
}

impl BertForSequenceClassification {
    pub fn num_labels(&self) -> usize {
        self.module.classifier.outputs()
    }

    /// The classifier on the pooled output and the dropout before it.
    pub fn classifier(&self) -> (&Dense, Dropout) {
        self.module.classifier.parts()
    }

    /// The loss transformers would use for these labels: the config's
    /// `problem_type`, else regression for one label, single-label
    /// classification for integer labels and multi-label otherwise.
    pub fn problem_type(&self, labels: &Tensor) -> ProblemType {
        self.module.problem_type(self.bert.config(), labels)
    }
}

impl SequenceClassificationModule {
    fn problem_type(&self, config: &BertConfig, labels: &Tensor) -> ProblemType {
        match config.problem_type {
            Some(p) => p,
            None if self.classifier.outputs() == 1 => ProblemType::Regression,
            None if matches!(labels.dtype(), DType::U8 | DType::U32 | DType::I64) => {
                ProblemType::SingleLabelClassification
            }
            None => ProblemType::MultiLabelClassification,
        }
    }

    fn loss(&self, config: &BertConfig, logits: &Tensor, l: &Tensor) -> Result<Tensor> {
        Ok(match self.problem_type(config, l) {
            ProblemType::SingleLabelClassification => class_cross_entropy(logits, l, "labels")?,
            ProblemType::MultiLabelClassification => {
                bce_with_logits(logits, &float_labels(l, logits.dims(), "labels")?)?
            }
            ProblemType::Regression => {
                let target = if self.classifier.outputs() == 1 {
                    float_labels(l, &[logits.dim(0)?], "labels")?.unsqueeze(1)?
                } else {
                    float_labels(l, logits.dims(), "labels")?
                };
                (logits - &target)?.sqr()?.mean_all()?
            }
        })
    }
}
