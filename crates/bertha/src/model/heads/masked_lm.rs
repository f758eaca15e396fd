//! `BertForMaskedLM`: the encoder and the family's MLM head.

use candle_core::Result as CResult;
use candle_nn::VarBuilder;

use super::loss::token_cross_entropy;
use super::{
    BertLMPredictionHead, Head, HeadKind, HeadLabels, HeadModule, HeadOptions, HeadOutput,
};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel};

/// `BertForMaskedLM`.
pub type BertForMaskedLM = Head<MaskedLmModule>;

/// `BertForMaskedLM`'s module: the family's MLM prediction head.
#[derive(Debug, Clone)]
pub struct MaskedLmModule {
    predictions: BertLMPredictionHead,
}

impl HeadModule for MaskedLmModule {
    const KIND: HeadKind = HeadKind::MaskedLM;
    type Output = HeadOutput;

    fn load(
        root: VarBuilder,
        config: &BertConfig,
        encoder: impl FnOnce() -> CResult<BertModel>,
    ) -> CResult<(BertModel, Self)> {
        let bert = encoder()?;
        let predictions =
            BertLMPredictionHead::load_for(root, config, bert.embeddings().word_embeddings())?;
        Ok((bert, Self { predictions }))
    }

    /// `labels` [B, T]: the token to predict, -100 where nothing is.
    fn forward(
        &self,
        bert: &BertModel,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<HeadOutput> {
        let out = bert.forward(input, opts.forward)?;
        if opts.labelled_rows_only {
            let (logits, loss) = self
                .predictions
                .labelled_rows(&out.last_hidden_state, labels.labels)?;
            return Ok(HeadOutput::new(out, logits, loss));
        }
        let logits = self.predictions.forward(&out.last_hidden_state)?;
        HeadOutput::with_loss(out, logits, labels.labels, |logits, l| {
            token_cross_entropy(logits, l, "labels")
        })
    }
}

impl BertForMaskedLM {
    pub fn predictions(&self) -> &BertLMPredictionHead {
        &self.module.predictions
    }
}
