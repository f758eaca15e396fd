//! `BertForSequenceClassification`: pooler → dropout → classifier, with
//! the loss its `problem_type` says. Families with their own head on the
//! first token (RoBERTa, DistilBERT, DeBERTa, ELECTRA) run it in place of
//! the pooler.

use candle_core::{DType, Module, Result as CResult, Tensor};

use super::loss::{bce_with_logits, class_cross_entropy, float_labels};
use super::{pooled, Classifier, Head, HeadOutput, HeadPass, HeadSource};
use crate::config::{Activation, BertConfig, ProblemType};
use crate::error::Result;
use crate::model::family::{layout, FirstTokenHead};
use crate::model::nn::{activate, Dense, Dropout};

super::declare_head! {
    /// `BertForSequenceClassification`'s module: the classifier on the
    /// pooled output (or on the family's own head over the first token).
    BertForSequenceClassification: SequenceClassification -> HeadOutput,
    SequenceClassificationModule { first_token: Option<FirstTokenDense>, classifier: Classifier }
}

/// A family's dropout → dense → activation on the first token, in place
/// of BERT's pooler.
#[derive(Debug, Clone)]
pub struct FirstTokenDense {
    dropout: Dropout,
    dense: Dense,
    act: Activation,
}

impl FirstTokenDense {
    /// `hidden` [B, T, D] → [B, D].
    pub(super) fn forward(&self, hidden: &Tensor, train: bool) -> Result<Tensor> {
        let first = hidden.narrow(1, 0, 1)?.squeeze(1)?;
        let x = self.dropout.forward(&first, train)?;
        Ok(activate(&self.dense.forward(&x)?, self.act)?)
    }
}

impl FirstTokenDense {
    /// The family's first-token head `spec` (`None`: BERT's pooler) and
    /// the classifier of `outputs` over it.
    pub(super) fn load_with_classifier(
        from: &HeadSource,
        spec: Option<FirstTokenHead>,
        outputs: usize,
    ) -> CResult<(Option<Self>, Classifier)> {
        let Some(spec) = spec else {
            return Ok((None, Classifier::load(from, outputs)?));
        };
        let config = from.config();
        let classifier = Classifier::load_at(from, spec.out, outputs)?;
        let d = config.hidden_size;
        let dropout = match spec.dropout {
            Some(rate) => Dropout::new(rate),
            None => classifier.parts().1,
        };
        let first = Self {
            dropout,
            dense: Dense::load(from.root().pp(spec.dense), d, d, config.initializer_range)?,
            act: spec.act,
        };
        Ok((Some(first), classifier))
    }

    /// Its dropout, dense layer and activation.
    pub(super) fn parts(&self) -> (Dropout, &Dense, Activation) {
        (self.dropout, &self.dense, self.act)
    }
}

impl SequenceClassificationModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let config = from.config();
        let spec = layout(&config.family).first_token_head(config);
        let (first_token, classifier) =
            FirstTokenDense::load_with_classifier(from, spec, config.num_labels())?;
        let module = Self {
            first_token,
            classifier,
        };
        Ok(Head::new(from.encoder()?, module))
    }

    /// `labels`: [B] class ids (single-label), [B, num_labels] 0/1 floats
    /// (multi-label) or [B] / [B, num_labels] floats (regression).
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let out = pass.encode()?;
        let sentence = match &self.first_token {
            Some(head) => head.forward(&out.last_hidden_state, pass.train())?,
            None => pooled(&out)?.clone(),
        };
        let logits = self.classifier.forward(&sentence, pass.train())?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, |logits, l, _| {
            self.loss(pass.bert.config(), logits, l)
        })
    }
}

impl BertForSequenceClassification {
    pub fn num_labels(&self) -> usize {
        self.module.classifier.outputs()
    }

    /// The family's first-token head (the dropout before it, its dense
    /// layer and activation), when it has one in place of the pooler.
    pub fn first_token(&self) -> Option<(Dropout, &Dense, Activation)> {
        self.module.first_token.as_ref().map(FirstTokenDense::parts)
    }

    /// The classifier on the pooled output and the dropout before it.
    pub fn classifier(&self) -> (&Dense, Dropout) {
        self.module.classifier.parts()
    }

    /// The family's module on the pooled vector before the dropout
    /// (ModernBERT's `head`).
    pub(crate) fn classifier_head(&self) -> Option<&crate::model::family::PredictionHead> {
        self.module.classifier.head()
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
