//! `BertForMaskedLM`: the encoder and the family's MLM head.

use candle_core::{Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::init::load_bert;
use super::loss::token_cross_entropy;
use super::{BertHead, BertLMPredictionHead, HeadLabels, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel, ForwardOptions};

/// `BertForMaskedLM`.
#[derive(Debug, Clone)]
pub struct BertForMaskedLM {
    bert: BertModel,
    predictions: BertLMPredictionHead,
}

super::impl_bert_head!(BertForMaskedLM, MaskedLM, HeadOutput);

impl BertForMaskedLM {
    /// `labels` [B, T]: the token to predict, -100 where nothing is.
    fn run(&self, input: &BertInput, labels: &HeadLabels, opts: HeadOptions) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts.forward)?;
        let (logits, loss) = if opts.labelled_rows_only {
            self.predictions
                .labelled_rows(&out.last_hidden_state, labels.labels)?
        } else {
            let logits = self.predictions.forward(&out.last_hidden_state)?;
            let loss = labels
                .labels
                .map(|l| token_cross_entropy(&logits, l, "labels"))
                .transpose()?;
            (logits, loss)
        };
        Ok(HeadOutput::new(out, logits, loss))
    }

    fn load_head(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let bert = load_bert(base, config.clone(), Self::KIND)?;
        let predictions =
            BertLMPredictionHead::load_for(root, &config, bert.embeddings().word_embeddings())?;
        Ok(Self { bert, predictions })
    }
}

impl BertForMaskedLM {
    pub fn predictions(&self) -> &BertLMPredictionHead {
        &self.predictions
    }
}

super::labels_forward!(BertForMaskedLM);
