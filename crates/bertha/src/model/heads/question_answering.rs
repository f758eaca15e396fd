//! `BertForQuestionAnswering`: `qa_outputs` → start and end logits (after
//! the family's dropout: DistilBERT's `qa_dropout`). ModernBERT's runs its
//! `head` on every token first, then `drop` and `classifier` (two outputs).

use candle_core::{Module, Result as CResult, Tensor, D};

use super::loss::{cross_entropy_with_ignore, label_values};
use super::{BertHead, Head, HeadLabels, HeadPass, HeadSource};
use crate::error::Result;
use crate::model::bert::{BertInput, ForwardOptions};
use crate::model::family::{layout, PredictionHead};
use crate::model::nn::{Dense, Dropout};

/// `BertForQuestionAnswering`'s outputs.
#[derive(Debug, Clone)]
pub struct QuestionAnsweringOutput {
    pub loss: Option<Tensor>,
    /// [B, T]
    pub start_logits: Tensor,
    /// [B, T]
    pub end_logits: Tensor,
    pub hidden_states: Option<Vec<Tensor>>,
    pub attentions: Option<Vec<Tensor>>,
}

super::declare_head! {
    /// `BertForQuestionAnswering`'s module: `qa_outputs`, the start and end
    /// logits of every token (ModernBERT: `head`, then `classifier`).
    BertForQuestionAnswering: QuestionAnswering -> QuestionAnsweringOutput,
    QuestionAnsweringModule { head: Option<PredictionHead>, dropout: Dropout, qa_outputs: Dense }
}

impl QuestionAnsweringModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let config = from.config();
        let (d, std) = (config.hidden_size, config.initializer_range);
        let family = layout(&config.family);
        let qa_outputs = Dense::load(from.root().pp(family.qa_outputs()), d, 2, std)?;
        let head = family.classifier_head(from.root(), config)?;
        let dropout = Dropout::new(family.qa_dropout(config));
        Ok(Head::new(
            from.encoder()?,
            Self {
                head,
                dropout,
                qa_outputs,
            },
        ))
    }

    /// `start_positions` / `end_positions` [B]: token indices of the answer.
    /// As in transformers, positions outside the sequence are clamped to
    /// its length and then ignored; the loss is (start CE + end CE) / 2.
    fn run(&self, pass: HeadPass) -> Result<QuestionAnsweringOutput> {
        let out = pass.encode()?;
        let hidden = match &self.head {
            Some(head) => head.forward(&out.last_hidden_state)?,
            None => out.last_hidden_state.clone(),
        };
        let hidden = self.dropout.forward(&hidden, pass.train())?;
        let logits = self.qa_outputs.forward(&hidden)?;
        let start_logits = logits.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
        let end_logits = logits.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
        let loss = match (pass.labels.start_positions, pass.labels.end_positions) {
            (Some(s), Some(e)) => {
                let t = start_logits.dim(1)? as i64;
                let clamp = |v: Vec<i64>| v.into_iter().map(|x| x.clamp(0, t)).collect::<Vec<_>>();
                let s = clamp(label_values(s, "start_positions")?);
                let e = clamp(label_values(e, "end_positions")?);
                let ls = cross_entropy_with_ignore(&start_logits, &s, t, "start_positions")?;
                let le = cross_entropy_with_ignore(&end_logits, &e, t, "end_positions")?;
                Some(((ls + le)? / 2.0)?)
            }
            _ => None,
        };
        Ok(QuestionAnsweringOutput {
            loss,
            start_logits,
            end_logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

impl BertForQuestionAnswering {
    /// `qa_outputs` (ModernBERT's `classifier`): [D] → (start, end) logits
    /// per token.
    pub fn qa_outputs(&self) -> &Dense {
        &self.module.qa_outputs
    }

    /// The dropout before `qa_outputs` (rate 0 but for DistilBERT and
    /// ModernBERT).
    pub fn dropout(&self) -> Dropout {
        self.module.dropout
    }

    /// The family's module on every token before the dropout (ModernBERT's
    /// `head`).
    pub(crate) fn classifier_head(&self) -> Option<&PredictionHead> {
        self.module.head.as_ref()
    }

    /// [`BertHead::forward`] with the answer positions.
    pub fn forward(
        &self,
        input: &BertInput,
        start_positions: Option<&Tensor>,
        end_positions: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<QuestionAnsweringOutput> {
        let labels = HeadLabels {
            start_positions,
            end_positions,
            ..HeadLabels::default()
        };
        BertHead::forward(self, input, &labels, opts.into())
    }
}
