//! `BertForPreTraining`: the masked-LM and next-sentence heads together.

use candle_core::{Module, Result as CResult, Tensor};

use super::loss::{class_cross_entropy, token_cross_entropy};
use super::next_sentence::load_seq_relationship;
use super::{pooled, BertHead, BertLMPredictionHead, Head, HeadLabels, HeadPass, HeadSource};
use crate::error::Result;
use crate::model::bert::{BertInput, ForwardOptions};
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

super::declare_head! {
    /// `BertForPreTraining`'s module (transformers' `BertPreTrainingHeads`):
    /// the MLM prediction head and the NSP classifier.
    BertForPreTraining: PreTraining -> PreTrainingOutput,
    PreTrainingModule { predictions: BertLMPredictionHead, seq_relationship: Dense }
}

impl PreTrainingModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let bert = from.encoder()?;
        let predictions = BertLMPredictionHead::load(
            from.root().pp("cls").pp("predictions"),
            from.config(),
            bert.embeddings().word_embeddings(),
        )?;
        let seq_relationship = load_seq_relationship(from.root(), from.config())?;
        let module = Self {
            predictions,
            seq_relationship,
        };
        Ok(Head::new(bert, module))
    }

    /// `labels` [B, T] (token ids, -100 where not masked) and
    /// `next_sentence_label` [B] (0: B follows A, 1: random B): the loss is
    /// the sum of both cross-entropies, computed when both are given (with
    /// `labelled_rows_only`, from whichever are given).
    fn run(&self, pass: HeadPass) -> Result<PreTrainingOutput> {
        let out = pass.encode()?;
        let nsp = pass.labels.next_sentence_label;
        let (prediction_logits, mlm_loss, nsp_loss, seq_relationship_logits);
        if pass.opts.labelled_rows_only {
            (prediction_logits, mlm_loss) = self
                .predictions
                .labelled_rows(&out.last_hidden_state, pass.labels.labels)?;
            seq_relationship_logits = self.seq_relationship.forward(pooled(&out)?)?;
            nsp_loss = nsp
                .map(|n| class_cross_entropy(&seq_relationship_logits, n, "next_sentence_label"))
                .transpose()?;
        } else {
            prediction_logits = self.predictions.forward(&out.last_hidden_state)?;
            seq_relationship_logits = self.seq_relationship.forward(pooled(&out)?)?;
            (mlm_loss, nsp_loss) = match (pass.labels.labels, nsp) {
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
