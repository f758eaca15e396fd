//! `BertForMultipleChoice`: each (context, choice) pair through the
//! encoder, pooler → dropout → a one-output classifier, scores [B, C].
//! DistilBERT and DeBERTa-v2 run their sequence classifier's first-token
//! head in place of the pooler, ModernBERT its encoder's pooling (cls or
//! mean) and `head`.

use candle_core::{Result as CResult, Tensor};

use super::loss::class_cross_entropy;
use super::sequence_classification::FirstTokenDense;
use super::{pooled, Classifier, Head, HeadOutput, HeadPass, HeadSource};
use crate::config::Activation;
use crate::error::{Error, Result};
use crate::model::bert::BertInput;
use crate::model::family::layout;
use crate::model::nn::{Dense, Dropout};

super::declare_head! {
    /// `BertForMultipleChoice`'s module: a one-output classifier on the
    /// pooled output of each choice.
    BertForMultipleChoice: MultipleChoice -> HeadOutput,
    MultipleChoiceModule { first_token: Option<FirstTokenDense>, classifier: Classifier }
}

impl BertForMultipleChoice {
    /// The one-output classifier on the pooled output and the dropout
    /// before it.
    pub fn classifier(&self) -> (&Dense, Dropout) {
        self.module.classifier.parts()
    }

    /// The family's module on the pooled vector before the dropout
    /// (ModernBERT's `head`).
    pub(crate) fn classifier_head(&self) -> Option<&crate::model::family::PredictionHead> {
        self.module.classifier.head()
    }

    /// The family's first-token head in place of the pooler (DistilBERT,
    /// DeBERTa-v2): its dropout, dense layer and activation.
    pub fn first_token(&self) -> Option<(Dropout, &Dense, Activation)> {
        self.module.first_token.as_ref().map(FirstTokenDense::parts)
    }
}

impl MultipleChoiceModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let config = from.config();
        let spec = layout(&config.family).multiple_choice_head(config);
        let (first_token, classifier) = FirstTokenDense::load_with_classifier(from, spec, 1)?;
        let module = Self {
            first_token,
            classifier,
        };
        Ok(Head::new(from.encoder()?, module))
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
        let sentence = match &self.first_token {
            Some(head) => head.forward(&out.last_hidden_state, pass.train())?,
            None => pooled(&out)?.clone(),
        };
        let logits = self
            .classifier
            .forward(&sentence, pass.train())?
            .reshape((b, c))?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, class_cross_entropy)
    }
}
