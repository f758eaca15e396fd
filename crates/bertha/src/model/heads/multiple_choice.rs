//! `BertForMultipleChoice`: each (context, choice) pair through the
//! encoder, pooler → dropout → a one-output classifier, scores [B, C].

use candle_core::{Result as CResult, Tensor};

use super::loss::class_cross_entropy;
use super::{pooled, Classifier, Head, HeadOutput, HeadPass, HeadSource};
use crate::error::{Error, Result};
use crate::model::bert::BertInput;
use crate::model::nn::{Dense, Dropout};

super::declare_head! {
    /// `BertForMultipleChoice`'s module: a one-output classifier on the
    /// pooled output of each choice.
    BertForMultipleChoice: MultipleChoice -> HeadOutput,
    MultipleChoiceModule { classifier: Classifier }
}

impl BertForMultipleChoice {
    /// The one-output classifier on the pooled output and the dropout
    /// before it.
    pub fn classifier(&self) -> (&Dense, Dropout) {
        self.module.classifier.parts()
    }
}

impl MultipleChoiceModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let classifier = Classifier::load(from, 1)?;
        Ok(Head::new(from.encoder()?, Self { classifier }))
    }

    /// `input` tensors are [B, C, T] (C choices per example); `labels` [B]
    /// the index of the right choice.
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let input = pass.input;
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
        let out = pass.encode_input(&flat_input)?;
        let logits = self
            .classifier
            .forward(pooled(&out)?, pass.train())?
            .reshape((b, c))?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, class_cross_entropy)
    }
}
