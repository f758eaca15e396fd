//! `BertForMaskedLM`: the encoder and the family's MLM head.

use candle_core::Result as CResult;

use super::loss::token_cross_entropy;
use super::{BertLMPredictionHead, Head, HeadOutput, HeadPass, HeadSource};
use crate::error::Result;

super::declare_head! {
    /// `BertForMaskedLM`'s module: the family's MLM prediction head.
    BertForMaskedLM: MaskedLM -> HeadOutput,
    MaskedLmModule { predictions: BertLMPredictionHead }
}

impl MaskedLmModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let bert = from.encoder()?;
        let predictions = BertLMPredictionHead::load_for(
            from.root().clone(),
            from.config(),
            bert.embeddings().word_embeddings(),
        )?;
        Ok(Head::new(bert, Self { predictions }))
    }

    /// `labels` [B, T]: the token to predict, -100 where nothing is.
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let out = pass.encode()?;
        if pass.opts.labelled_rows_only {
            let (logits, loss) = self
                .predictions
                .labelled_rows(&out.last_hidden_state, pass.labels.labels)?;
            return Ok(HeadOutput::new(out, logits, loss));
        }
        let logits = self.predictions.forward(&out.last_hidden_state)?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, token_cross_entropy)
    }
}

impl BertForMaskedLM {
    pub fn predictions(&self) -> &BertLMPredictionHead {
        &self.module.predictions
    }
}
