//! `BertForMultipleChoice`: each (context, choice) pair through the
//! encoder, pooler → dropout → a one-output classifier, scores [B, C].

use candle_core::{Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::loss::class_cross_entropy;
use super::{pooled, Classifier, Head, HeadKind, HeadLabels, HeadModule, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::model::bert::{BertInput, BertModel};

/// `BertForMultipleChoice`.
pub type BertForMultipleChoice = Head<MultipleChoiceModule>;

/// `BertForMultipleChoice`'s module: a one-output classifier on the
/// pooled output of each choice.
#[derive(Debug, Clone)]
pub struct MultipleChoiceModule {
    classifier: Classifier,
}

impl HeadModule for MultipleChoiceModule {
    const KIND: HeadKind = HeadKind::MultipleChoice;
    type Output = HeadOutput;

    fn load(
        root: VarBuilder,
        config: &BertConfig,
        encoder: impl FnOnce() -> CResult<BertModel>,
    ) -> CResult<(BertModel, Self)> {
        let classifier = Classifier::load(root.pp("classifier"), config, 1)?;
        Ok((encoder()?, Self { classifier }))
    }

    /// `input` tensors are [B, C, T] (C choices per example); `labels` [B]
    /// the index of the right choice.
    fn forward(
        &self,
        bert: &BertModel,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<HeadOutput> {
        let (b, c, t) = input.input_ids.dims3().map_err(|_| {
            Error::Input(format!(
                "multiple choice needs input_ids of shape [batch, choices, seq], got {:?}",
                input.input_ids.dims()
            ))
        })?;
        let flat = |x: &Tensor| x.reshape((b * c, t));
        let flat_input = BertInput {
            input_ids: flat(&input.input_ids)?,
            token_type_ids: input.token_type_ids.as_ref().map(flat).transpose()?,
            attention_mask: input.attention_mask.as_ref().map(flat).transpose()?,
        };
        let out = bert.forward(&flat_input, opts.forward)?;
        let logits = self
            .classifier
            .forward(pooled(&out)?, opts.forward.train)?
            .reshape((b, c))?;
        HeadOutput::with_loss(out, logits, labels.labels, |logits, l| {
            class_cross_entropy(logits, l, "labels")
        })
    }
}
