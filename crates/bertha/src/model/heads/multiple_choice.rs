//! `BertForMultipleChoice`: each (context, choice) pair through the
//! encoder, pooler → dropout → a one-output classifier, scores [B, C].
//! DistilBERT and DeBERTa-v2 run their sequence classifier's first-token
//! head in place of the pooler, ModernBERT its encoder's pooling (cls or
//! mean) and `head`, ELECTRA its `sequence_summary`.

use std::path::Path;

use candle_core::{Result as CResult, Tensor};

use super::loss::class_cross_entropy;
use super::sequence_classification::FirstTokenDense;
use super::sequence_summary::SequenceSummary;
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
    MultipleChoiceModule { sentence: Sentence, classifier: Classifier }
}

/// What makes each choice's vector under the classifier.
#[derive(Debug, Clone)]
enum Sentence {
    /// The encoder's pooler (BERT, RoBERTa, ALBERT) or pooling
    /// (ModernBERT).
    Pooled,
    /// The family's first-token head (DistilBERT, DeBERTa-v2).
    FirstToken(FirstTokenDense),
    /// ELECTRA's `sequence_summary`.
    Summary(SequenceSummary),
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
    /// DeBERTa-v2; ELECTRA's `sequence_summary` when it is one): its
    /// dropout, dense layer and activation.
    pub fn first_token(&self) -> Option<(Dropout, &Dense, Activation)> {
        match &self.module.sentence {
            Sentence::FirstToken(head) => Some(head.parts()),
            Sentence::Summary(summary) => summary.as_first_token(),
            Sentence::Pooled => None,
        }
    }

    /// Whether the sentence module is ELECTRA's `sequence_summary`.
    pub fn has_summary(&self) -> bool {
        matches!(self.module.sentence, Sentence::Summary(_))
    }

    /// Whether the head reads rows past each choice's first, padding
    /// rows included (ELECTRA's `summary_type` `last` or `mean`): its
    /// scores then depend on how the batch is padded, as transformers'
    /// do, and on the states at padding rows.
    pub fn reads_padding_rows(&self) -> bool {
        match &self.module.sentence {
            Sentence::Summary(summary) => summary.reads_every_row(),
            Sentence::Pooled | Sentence::FirstToken(_) => false,
        }
    }
}

impl MultipleChoiceModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let config = from.config();
        let summary = config
            .sequence_summary(Path::new("config.json"))
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let (sentence, classifier) = match summary {
            Some(spec) => {
                let (summary, classifier) = SequenceSummary::load_with_classifier(from, &spec, 1)?;
                (Sentence::Summary(summary), classifier)
            }
            None => {
                let spec = layout(&config.family).multiple_choice_head(config);
                match FirstTokenDense::load_with_classifier(from, spec, 1)? {
                    (Some(head), classifier) => (Sentence::FirstToken(head), classifier),
                    (None, classifier) => (Sentence::Pooled, classifier),
                }
            }
        };
        let module = Self {
            sentence,
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
        let hidden = &out.last_hidden_state;
        let sentence = match &self.sentence {
            Sentence::FirstToken(head) => head.forward(hidden, pass.train())?,
            Sentence::Summary(summary) => summary.forward(hidden, pass.train())?,
            Sentence::Pooled => pooled(&out)?.clone(),
        };
        let logits = self
            .classifier
            .forward(&sentence, pass.train())?
            .reshape((b, c))?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, class_cross_entropy)
    }
}
