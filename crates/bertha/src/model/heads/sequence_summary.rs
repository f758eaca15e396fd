//! ELECTRA's `sequence_summary` (`ElectraSequenceSummary`), the sentence
//! module of `ElectraForMultipleChoice`: a state of each sequence (the
//! first token's, the last row's or the mean of the rows, as
//! `summary_type` says), dropout (`summary_first_dropout`), the linear
//! layer `sequence_summary.summary` (`summary_use_proj`), the activation
//! (`summary_activation`); then dropout (`summary_last_dropout`) and the
//! one-output `classifier`.

use candle_core::{Module, Result as CResult, Tensor};

use super::{Classifier, HeadSource};
use crate::config::{Activation, SummarySpec, SummaryToken};
use crate::error::Result;
use crate::model::nn::{activate, Dense, Dropout};

/// `sequence_summary` up to its last dropout (which is the classifier
/// block's).
#[derive(Debug, Clone)]
pub struct SequenceSummary {
    token: SummaryToken,
    first_dropout: Dropout,
    summary: Option<Dense>,
    act: Option<Activation>,
}

impl SequenceSummary {
    /// The module `spec` describes and the classifier of `outputs` over
    /// it, its dropout `summary_last_dropout`.
    pub(super) fn load_with_classifier(
        from: &HeadSource,
        spec: &SummarySpec,
        outputs: usize,
    ) -> CResult<(Self, Classifier)> {
        let config = from.config();
        let d = config.hidden_size;
        let summary = spec
            .projection
            .then(|| {
                let vb = from.root().pp("sequence_summary").pp("summary");
                Dense::load(vb, d, d, config.initializer_range)
            })
            .transpose()?;
        let classifier = Classifier {
            dropout: Dropout::new(spec.last_dropout),
            ..Classifier::load(from, outputs)?
        };
        let module = Self {
            token: spec.token,
            first_dropout: Dropout::new(spec.first_dropout),
            summary,
            act: spec.activation,
        };
        Ok((module, classifier))
    }

    /// `hidden` [B, T, D] → [B, D].
    pub(super) fn forward(&self, hidden: &Tensor, train: bool) -> Result<Tensor> {
        let t = hidden.dim(1)?;
        let x = match self.token {
            SummaryToken::First => hidden.narrow(1, 0, 1)?.squeeze(1)?,
            SummaryToken::Last => hidden.narrow(1, t.saturating_sub(1), 1)?.squeeze(1)?,
            SummaryToken::Mean => hidden.mean(1)?,
        };
        let x = self.first_dropout.forward(&x, train)?;
        let x = match &self.summary {
            Some(dense) => dense.forward(&x)?,
            None => x,
        };
        Ok(match self.act {
            Some(act) => activate(&x, act)?,
            None => x,
        })
    }

    /// The module as a first-token head (its first dropout, layer and
    /// activation), when it is one: `summary_type` `first`, with the
    /// layer and an activation (ELECTRA's defaults).
    pub(super) fn as_first_token(&self) -> Option<(Dropout, &Dense, Activation)> {
        match (self.token, &self.summary, self.act) {
            (SummaryToken::First, Some(dense), Some(act)) => Some((self.first_dropout, dense, act)),
            _ => None,
        }
    }

    /// Whether it reads rows past the first: padding rows too (`last`,
    /// `mean`).
    pub(super) fn reads_every_row(&self) -> bool {
        self.token != SummaryToken::First
    }
}
