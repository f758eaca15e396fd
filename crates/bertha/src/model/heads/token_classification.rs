//! `BertForTokenClassification`: dropout → classifier on every token.

use candle_core::Result as CResult;

use super::loss::token_cross_entropy;
use super::{Classifier, Head, HeadOutput, HeadPass, HeadSource};
use crate::error::Result;
use crate::model::nn::{Dense, Dropout};

super::declare_head! {
    /// `BertForTokenClassification`'s module: the classifier on every token.
    BertForTokenClassification: TokenClassification -> HeadOutput,
    TokenClassificationModule { classifier: Classifier }
}

impl TokenClassificationModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let classifier = Classifier::load(from, from.config().num_labels())?;
        Ok(Head::new(from.encoder()?, Self { classifier }))
    }

    /// `labels` [B, T]: class ids, -100 where a token has none.
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let out = pass.encode()?;
        let logits = self
            .classifier
            .forward(&out.last_hidden_state, pass.train())?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, token_cross_entropy)
    }
}

impl BertForTokenClassification {
    pub fn num_labels(&self) -> usize {
        self.module.classifier.outputs()
    }

    /// The classifier on every token and the dropout before it.
    pub fn classifier(&self) -> (&Dense, Dropout) {
        self.module.classifier.parts()
    }

    /// The family's module on every token before the dropout (ModernBERT's
    /// `head`).
    pub(crate) fn classifier_head(&self) -> Option<&crate::model::family::PredictionHead> {
        self.module.classifier.head()
    }
}
