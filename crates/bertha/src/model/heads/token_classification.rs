//! `BertForTokenClassification`: dropout → classifier on every token.

use candle_core::Result as CResult;
use candle_nn::VarBuilder;

use super::loss::token_cross_entropy;
use super::{Classifier, Head, HeadKind, HeadLabels, HeadModule, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel};

/// `BertForTokenClassification`.
pub type BertForTokenClassification = Head<TokenClassificationModule>;

/// `BertForTokenClassification`'s module: the classifier on every token.
#[derive(Debug, Clone)]
pub struct TokenClassificationModule {
    classifier: Classifier,
}

impl HeadModule for TokenClassificationModule {
    const KIND: HeadKind = HeadKind::TokenClassification;
    type Output = HeadOutput;

    fn load(
        root: VarBuilder,
        config: &BertConfig,
        encoder: impl FnOnce() -> CResult<BertModel>,
    ) -> CResult<(BertModel, Self)> {
        let classifier = Classifier::load(root.pp("classifier"), config, config.num_labels())?;
        Ok((encoder()?, Self { classifier }))
    }

    /// `labels` [B, T]: class ids, -100 where a token has none.
    fn forward(
        &self,
        bert: &BertModel,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<HeadOutput> {
        let out = bert.forward(input, opts.forward)?;
        let logits = self
            .classifier
            .forward(&out.last_hidden_state, opts.forward.train)?;
        HeadOutput::with_loss(out, logits, labels.labels, |logits, l| {
            token_cross_entropy(logits, l, "labels")
        })
    }
}

impl BertForTokenClassification {
    pub fn num_labels(&self) -> usize {
        self.module.classifier.outputs()
    }
}
