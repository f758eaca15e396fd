//! `BertForPreTraining`: the masked-LM and next-sentence heads together.

use candle_core::{Module, Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::loss::{class_cross_entropy, token_cross_entropy};
use super::next_sentence::load_seq_relationship;
use super::{
    pooled, BertHead, BertLMPredictionHead, Head, HeadKind, HeadLabels, HeadModule, HeadOptions,
};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel, ForwardOptions};
use crate::model::nn::Dense;

/// `BertForPreTraining`'s outputs.
#[derive(Debug, Clone)]
pub struct PreTrainingOutput {
    /// MLM + NSP loss.
    pub loss: Option<Tensor>,
    /// The MLM part of `loss`.
    pub mlm_loss: Option<Tensor>,
    /// The NSP part of `loss`.
    pub nsp_loss: Option<Tensor>,
    /// [B, T, V] ([N labelled, V] with `labelled_rows_only`).
    pub prediction_logits: Tensor,
    /// [B, 2]
    pub seq_relationship_logits: Tensor,
    pub hidden_states: Option<Vec<Tensor>>,
    pub attentions: Option<Vec<Tensor>>,
}

/// `BertForPreTraining`.
pub type BertForPreTraining = Head<PreTrainingModule>;

/// `BertForPreTraining`'s module (transformers' `BertPreTrainingHeads`):
/// the MLM prediction head and the NSP classifier.
#[derive(Debug, Clone)]
pub struct PreTrainingModule {
    predictions: BertLMPredictionHead,
    seq_relationship: Dense,
}

impl HeadModule for PreTrainingModule {
    const KIND: HeadKind = HeadKind::PreTraining;
    type Output = PreTrainingOutput;

    fn load(
        root: VarBuilder,
        config: &BertConfig,
        encoder: impl FnOnce() -> CResult<BertModel>,
    ) -> CResult<(BertModel, Self)> {
        let bert = encoder()?;
        let predictions = BertLMPredictionHead::load(
            root.pp("cls").pp("predictions"),
            config,
            bert.embeddings().word_embeddings(),
        )?;
        let seq_relationship = load_seq_relationship(&root, config)?;
        let module = Self {
            predictions,
            seq_relationship,
        };
        Ok((bert, module))
    }

    /// `labels` [B, T] (token ids, -100 where not masked) and
    /// `next_sentence_label` [B] (0: B follows A, 1: random B): the loss is
    /// the sum of both cross-entropies, computed when both are given (with
    /// `labelled_rows_only`, from whichever are given).
    fn forward(
        &self,
        bert: &BertModel,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<PreTrainingOutput> {
        let out = bert.forward(input, opts.forward)?;
        let nsp = labels.next_sentence_label;
        let (prediction_logits, mlm_loss, nsp_loss, seq_relationship_logits);
        if opts.labelled_rows_only {
            (prediction_logits, mlm_loss) = self
                .predictions
                .labelled_rows(&out.last_hidden_state, labels.labels)?;
            seq_relationship_logits = self.seq_relationship.forward(pooled(&out)?)?;
            nsp_loss = nsp
                .map(|n| class_cross_entropy(&seq_relationship_logits, n, "next_sentence_label"))
                .transpose()?;
        } else {
            prediction_logits = self.predictions.forward(&out.last_hidden_state)?;
            seq_relationship_logits = self.seq_relationship.forward(pooled(&out)?)?;
            (mlm_loss, nsp_loss) = match (labels.labels, nsp) {
                (Some(l), Some(n)) => (
                    Some(token_cross_entropy(&prediction_logits, l, "labels")?),
                    Some(class_cross_entropy(
                        &seq_relationship_logits,
                        n,
                        "next_sentence_label",
                    )?),
                ),
                _ => (None, None),
            };
        }
        let loss = match (&mlm_loss, &nsp_loss) {
            (Some(m), Some(n)) => Some((m + n)?),
            (m, n) => m.clone().or_else(|| n.clone()),
        };
        Ok(PreTrainingOutput {
            loss,
            mlm_loss,
            nsp_loss,
            prediction_logits,
            seq_relationship_logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

impl BertForPreTraining {
    pub fn predictions(&self) -> &BertLMPredictionHead {
        &self.module.predictions
    }

    /// The NSP classifier on the pooled output, [B, D] → [B, 2].
    pub fn seq_relationship(&self) -> &Dense {
        &self.module.seq_relationship
    }

    /// [`BertHead::forward`] with the MLM and NSP labels.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        next_sentence_label: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<PreTrainingOutput> {
        let labels = HeadLabels {
            labels,
            next_sentence_label,
            ..HeadLabels::default()
        };
        BertHead::forward(self, input, &labels, opts.into())
    }
}
