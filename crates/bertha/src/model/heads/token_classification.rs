//! `BertForTokenClassification`: dropout → classifier on every token.

use candle_core::{Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::init::load_bert;
use super::loss::token_cross_entropy;
use super::{BertHead, Classifier, HeadLabels, HeadOptions, HeadOutput};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel, ForwardOptions};

/// `BertForTokenClassification`.
#[derive(Debug, Clone)]
pub struct BertForTokenClassification {
    bert: BertModel,
    classifier: Classifier,
    num_labels: usize,
}

super::impl_bert_head!(BertForTokenClassification, TokenClassification, HeadOutput);

impl BertForTokenClassification {
    /// `labels` [B, T]: class ids, -100 where a token has none.
    fn run(&self, input: &BertInput, labels: &HeadLabels, opts: HeadOptions) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts.forward)?;
        let logits = self
            .classifier
            .forward(&out.last_hidden_state, opts.forward.train)?;
        let loss = labels
            .labels
            .map(|l| token_cross_entropy(&logits, l, "labels"))
            .transpose()?;
        Ok(HeadOutput::new(out, logits, loss))
    }

    fn load_head(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let num_labels = config.num_labels();
        let classifier = Classifier::load(root.pp("classifier"), &config, num_labels)?;
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            classifier,
            num_labels,
        })
    }
}

impl BertForTokenClassification {
    pub fn num_labels(&self) -> usize {
        self.num_labels
    }
}

super::labels_forward!(BertForTokenClassification);
