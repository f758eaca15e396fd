//! `BertForNextSentencePrediction`: the NSP classifier on the pooled output.

use candle_core::{Module, Result as CResult};
use candle_nn::VarBuilder;

use super::loss::class_cross_entropy;
use super::{pooled, Head, HeadKind, HeadLabels, HeadModule, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel};
use crate::model::nn::Dense;

/// `BertForNextSentencePrediction`.
pub type BertForNextSentencePrediction = Head<NextSentenceModule>;

/// `BertForNextSentencePrediction`'s module: `cls.seq_relationship`.
#[derive(Debug, Clone)]
pub struct NextSentenceModule {
    seq_relationship: Dense,
}

/// `cls.seq_relationship`: [B, D] pooled → [B, 2].
pub(super) fn load_seq_relationship(root: &VarBuilder, config: &BertConfig) -> CResult<Dense> {
    Dense::load(
        root.pp("cls").pp("seq_relationship"),
        config.hidden_size,
        2,
        config.initializer_range,
    )
}

impl HeadModule for NextSentenceModule {
    const KIND: HeadKind = HeadKind::NextSentencePrediction;
    type Output = HeadOutput;

    fn load(
        root: VarBuilder,
        config: &BertConfig,
        encoder: impl FnOnce() -> CResult<BertModel>,
    ) -> CResult<(BertModel, Self)> {
        let seq_relationship = load_seq_relationship(&root, config)?;
        Ok((encoder()?, Self { seq_relationship }))
    }

    /// `labels` [B]: 0 when B follows A, 1 when B is random. Logits [B, 2].
    fn forward(
        &self,
        bert: &BertModel,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<HeadOutput> {
        let out = bert.forward(input, opts.forward)?;
        let logits = self.seq_relationship.forward(pooled(&out)?)?;
        HeadOutput::with_loss(out, logits, labels.labels, |logits, l| {
            class_cross_entropy(logits, l, "labels")
        })
    }
}
