//! `BertForNextSentencePrediction`: the NSP classifier on the pooled output.

use candle_core::{Module, Result as CResult};
use candle_nn::VarBuilder;

use super::loss::class_cross_entropy;
use super::{pooled, Head, HeadOutput, HeadPass, HeadSource};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::nn::Dense;

super::declare_head! {
    /// `BertForNextSentencePrediction`'s module: `cls.seq_relationship`.
    BertForNextSentencePrediction: NextSentencePrediction -> HeadOutput,
    NextSentenceModule { seq_relationship: Dense }
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

impl NextSentenceModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let seq_relationship = load_seq_relationship(from.root(), from.config())?;
        Ok(Head::new(from.encoder()?, Self { seq_relationship }))
    }

    /// `labels` [B]: 0 when B follows A, 1 when B is random. Logits [B, 2].
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let out = pass.encode()?;
        let logits = self.seq_relationship.forward(pooled(&out)?)?;
        HeadOutput::with_loss(out, logits, pass.labels.labels, class_cross_entropy)
    }
}
