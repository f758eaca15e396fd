//! `BertForMultipleChoice`: each (context, choice) pair through the
//! encoder, pooler → dropout → a one-output classifier, scores [B, C].

use candle_core::{Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::init::load_bert;
use super::loss::class_cross_entropy;
use super::{pooled, BertHead, Classifier, HeadLabels, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::model::bert::{BertInput, BertModel, ForwardOptions};

/// `BertForMultipleChoice`.
#[derive(Debug, Clone)]
pub struct BertForMultipleChoice {
    bert: BertModel,
    classifier: Classifier,
}

super::impl_bert_head!(BertForMultipleChoice, MultipleChoice, HeadOutput);

impl BertForMultipleChoice {
    /// `input` tensors are [B, C, T] (C choices per example); `labels` [B]
    /// the index of the right choice.
    fn run(&self, input: &BertInput, labels: &HeadLabels, opts: HeadOptions) -> Result<HeadOutput> {
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
        let out = self.bert.forward(&flat_input, opts.forward)?;
        let logits = self
            .classifier
            .forward(pooled(&out)?, opts.forward.train)?
            .reshape((b, c))?;
        let loss = labels
            .labels
            .map(|l| class_cross_entropy(&logits, l, "labels"))
            .transpose()?;
        Ok(HeadOutput::new(out, logits, loss))
    }

    fn load_head(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let classifier = Classifier::load(root.pp("classifier"), &config, 1)?;
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self { bert, classifier })
    }
}

super::labels_forward!(BertForMultipleChoice);
