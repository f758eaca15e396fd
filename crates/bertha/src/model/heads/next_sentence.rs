//! `BertForNextSentencePrediction`: the NSP classifier on the pooled output.

use candle_core::{Module, Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::init::load_bert;
use super::loss::class_cross_entropy;
use super::{pooled, BertHead, HeadLabels, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel, ForwardOptions};
use crate::model::nn::Dense;

/// `BertForNextSentencePrediction`.
#[derive(Debug, Clone)]
pub struct BertForNextSentencePrediction {
    bert: BertModel,
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

super::impl_bert_head!(
    BertForNextSentencePrediction,
    NextSentencePrediction,
    HeadOutput
);

impl BertForNextSentencePrediction {
    /// `labels` [B]: 0 when B follows A, 1 when B is random. Logits [B, 2].
    fn run(&self, input: &BertInput, labels: &HeadLabels, opts: HeadOptions) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts.forward)?;
        let logits = self.seq_relationship.forward(pooled(&out)?)?;
        let loss = labels
            .labels
            .map(|l| class_cross_entropy(&logits, l, "labels"))
            .transpose()?;
        Ok(HeadOutput::new(out, logits, loss))
    }

    fn load_head(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let seq_relationship = load_seq_relationship(&root, &config)?;
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            seq_relationship,
        })
    }
}

super::labels_forward!(BertForNextSentencePrediction);
