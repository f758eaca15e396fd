//! Task heads on top of [`BertModel`], one struct per transformers class
//! (`BertForMaskedLM`, `BertForSequenceClassification`, ...), loaded from
//! the same checkpoint names, with the same training losses.
//!
//! Every head is a [`BertHead`]: the encoder, a small module and the loss
//! inside [`BertHead::forward`], which returns the head's typed outputs
//! (transformers' shape). [`BertForTask`] is the one dispatch over them,
//! for callers that pick the head at run time.
//!
//! Each head loads from a `VarBuilder` rooted at the checkpoint root (the
//! encoder under `bert.`, or at the root for checkpoints saved from a bare
//! `BertModel`). [`BertHead::from_dir`] finds the weights of a model folder
//! and either insists that the head's tensors are there (a clear error
//! naming the head and the missing tensor otherwise) or, with
//! [`HeadInit::Fresh`], initialises missing head tensors like transformers
//! (normal(0, `initializer_range`) weights, zero biases) for fine-tuning.

mod head;
mod init;
mod kind;
mod lm;
mod loss;
mod masked_lm;
mod multiple_choice;
mod next_sentence;
mod pretraining;
mod question_answering;
mod replaced_token;
mod sequence_classification;
mod sequence_summary;
mod token_classification;

use std::path::Path;

use candle_core::{Module, Result as CResult, Tensor};
use candle_nn::VarBuilder;

pub use self::head::{Head, HeadModule, HeadPass, HeadSource};
pub use self::init::HeadInit;
pub use self::kind::HeadKind;
pub use self::lm::BertLMPredictionHead;
pub use self::loss::{bce_with_logits, cross_entropy_with_ignore, IGNORE_INDEX};
pub use self::masked_lm::{BertForMaskedLM, MaskedLmModule};
pub use self::multiple_choice::{BertForMultipleChoice, MultipleChoiceModule};
pub use self::next_sentence::{BertForNextSentencePrediction, NextSentenceModule};
pub use self::pretraining::{BertForPreTraining, PreTrainingModule, PreTrainingOutput};
pub use self::question_answering::{
    BertForQuestionAnswering, QuestionAnsweringModule, QuestionAnsweringOutput,
};
pub use self::replaced_token::{replaced_token_loss, DiscriminatorModule, ElectraForPreTraining};
pub use self::sequence_classification::{
    BertForSequenceClassification, SequenceClassificationModule,
};
pub use self::token_classification::{BertForTokenClassification, TokenClassificationModule};

use super::bert::{read_model_dir, BertInput, BertModel, BertOutput, ForwardOptions};
use super::family::{layout, PredictionHead};
use super::nn::{Dense, Dropout};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;

/// Every head: how it loads, what it is called, and its forward pass with
/// the loss.
pub trait BertHead: Sized {
    const KIND: HeadKind;
    /// The head's typed outputs ([`HeadOutput`] for the one-logits heads).
    type Output: Into<TaskOutput>;

    /// Loads the head and its encoder: `base` is rooted at the encoder
    /// (`bert.` in transformers' layout), `root` at the checkpoint root
    /// (where `cls.`, `classifier.` and `qa_outputs.` live).
    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self>;

    /// The encoder under the head.
    fn bert(&self) -> &BertModel;

    /// Runs the encoder and the head; the loss is computed from the labels
    /// the head reads (see [`HeadLabels`]) when they are given.
    fn forward(
        &self,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<Self::Output>;

    /// [`BertHead::forward`] on encoder outputs computed elsewhere:
    /// `encoded` must be the encoder's outputs on `input` (for multiple
    /// choice, on its [B·C, T] flattening); the head's own layers run on
    /// them. The pipelines' reduced-precision path runs the encoder on the
    /// packed fast path and the head here, in fp32.
    fn forward_encoded(
        &self,
        input: &BertInput,
        encoded: &BertOutput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<Self::Output>;

    fn config(&self) -> &BertConfig {
        self.bert().config()
    }

    /// Loads from a `VarBuilder` in transformers' layout (encoder under
    /// `bert.`), e.g. a `VarMap` for training.
    fn load(vb: VarBuilder, config: BertConfig) -> CResult<Self> {
        Self::load_parts(vb.pp(config.family.prefix()), vb, config)
    }

    /// Loads `config.json` and the weights of a model folder.
    fn from_dir(dir: &Path, init: HeadInit, device: &candle_core::Device) -> Result<Self> {
        let (config, weights) = read_model_dir(dir)?;
        Self::from_weights(weights, config, init, device)
    }

    /// Loads from named tensors, with or without the `bert.` prefix.
    fn from_weights(
        weights: Weights,
        config: BertConfig,
        init: HeadInit,
        device: &candle_core::Device,
    ) -> Result<Self> {
        init::load_head(weights, config, init, device)
    }
}

/// The labels a head's loss reads, by transformers' argument names; a
/// head ignores the ones it does not use.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadLabels<'a> {
    /// MLM / token classification: `[B, T]` (-100 where none); sequence
    /// classification, NSP, multiple choice: `[B]` (or `[B, num_labels]`).
    pub labels: Option<&'a Tensor>,
    /// Pre-training's NSP labels `[B]`.
    pub next_sentence_label: Option<&'a Tensor>,
    /// Question answering: answer start and end token indices `[B]`.
    pub start_positions: Option<&'a Tensor>,
    pub end_positions: Option<&'a Tensor>,
}

impl<'a> HeadLabels<'a> {
    /// Only `labels` (or nothing).
    pub fn labels(labels: Option<&'a Tensor>) -> Self {
        Self {
            labels,
            ..Self::default()
        }
    }

    /// Only QA's answer positions, `start_positions` and `end_positions`
    /// [B] each.
    pub fn spans(start_positions: &'a Tensor, end_positions: &'a Tensor) -> Self {
        Self {
            start_positions: Some(start_positions),
            end_positions: Some(end_positions),
            ..Self::default()
        }
    }
}

/// How a head runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadOptions {
    /// The encoder's options (dropout, hidden states, attentions).
    pub forward: ForwardOptions,
    /// MLM heads: decode only the positions that carry a label, giving
    /// logits [N labelled, V] (batch-major) and the same loss as the full
    /// logits: pre-training's shortcut past the vocabulary-sized decoder.
    /// The pre-training head then also returns each loss it has labels
    /// for (MLM, NSP or both).
    pub labelled_rows_only: bool,
}

impl From<ForwardOptions> for HeadOptions {
    fn from(forward: ForwardOptions) -> Self {
        Self {
            forward,
            labelled_rows_only: false,
        }
    }
}

/// The outputs every one-logits head shares with `BertModel`.
#[derive(Debug, Clone)]
pub struct HeadOutput {
    /// The training loss (a scalar), when labels were given.
    pub loss: Option<Tensor>,
    /// [B, T, V] (MLM), [B, num_labels] (sequence classification),
    /// [B, T, num_labels] (token classification), [B, 2] (NSP),
    /// [B, C] (multiple choice).
    pub logits: Tensor,
    pub hidden_states: Option<Vec<Tensor>>,
    pub attentions: Option<Vec<Tensor>>,
}

impl HeadOutput {
    /// The head's logits and loss with the encoder's optional outputs.
    fn new(out: BertOutput, logits: Tensor, loss: Option<Tensor>) -> Self {
        Self {
            loss,
            logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        }
    }

    /// The head's logits, with the loss `loss_fn(logits, labels,
    /// "labels")` when `labels` are given.
    fn with_loss(
        out: BertOutput,
        logits: Tensor,
        labels: Option<&Tensor>,
        loss_fn: impl FnOnce(&Tensor, &Tensor, &str) -> Result<Tensor>,
    ) -> Result<Self> {
        let loss = labels.map(|l| loss_fn(&logits, l, "labels")).transpose()?;
        Ok(Self::new(out, logits, loss))
    }
}

/// Any head's outputs, as [`BertForTask::forward`] returns them.
#[derive(Debug, Clone)]
pub enum TaskOutput {
    Logits(HeadOutput),
    PreTraining(PreTrainingOutput),
    QuestionAnswering(QuestionAnsweringOutput),
}

impl TaskOutput {
    /// The training loss, when labels were given.
    pub fn loss(&self) -> Option<&Tensor> {
        match self {
            Self::Logits(o) => o.loss.as_ref(),
            Self::PreTraining(o) => o.loss.as_ref(),
            Self::QuestionAnswering(o) => o.loss.as_ref(),
        }
    }
}

/// Each head output is the [`TaskOutput`] variant of its kind.
macro_rules! task_outputs {
    ($($variant:ident($output:ty)),*) => {
        $(impl From<$output> for TaskOutput {
            fn from(o: $output) -> Self {
                Self::$variant(o)
            }
        })*
    };
}
task_outputs!(
    Logits(HeadOutput),
    PreTraining(PreTrainingOutput),
    QuestionAnswering(QuestionAnsweringOutput)
);

/// Declares a head: the `BertFor*` alias of [`Head`], its module struct
/// (the fields above the encoder) and the module's [`HeadModule`] impl,
/// which calls the module's own `load_head` and `run`.
macro_rules! declare_head {
    (
        $(#[$doc:meta])*
        $alias:ident: $kind:ident -> $output:ty,
        $module:ident { $($field:ident: $ty:ty),+ }
    ) => {
        #[doc = concat!("`", stringify!($alias), "`: the encoder and [`", stringify!($module), "`].")]
        pub type $alias = super::Head<$module>;

        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $module {
            $($field: $ty),+
        }

        impl super::HeadModule for $module {
            const KIND: super::HeadKind = super::HeadKind::$kind;
            type Output = $output;

            fn load(from: &super::HeadSource) -> candle_core::Result<super::Head<Self>> {
                Self::load_head(from)
            }

            fn forward(&self, pass: super::HeadPass) -> $crate::Result<$output> {
                self.run(pass)
            }
        }
    };
}
use declare_head;

/// The pooled output, which the pooler heads need.
fn pooled(out: &BertOutput) -> Result<&Tensor> {
    out.pooler_output
        .as_ref()
        .ok_or_else(|| Error::Input("this head needs the pooler, which the model lacks".into()))
}

/// transformers' classifier block: dropout (`classifier_dropout`, else
/// the hidden dropout) then a linear layer.
#[derive(Debug, Clone)]
struct Classifier {
    /// A family's module before the dropout (ModernBERT's `head`).
    head: Option<PredictionHead>,
    dropout: Dropout,
    dense: Dense,
    outputs: usize,
}

impl Classifier {
    /// `classifier` at the checkpoint root, with `outputs` outputs.
    fn load(from: &HeadSource, outputs: usize) -> CResult<Self> {
        Self::load_at(from, "classifier", outputs)
    }

    /// The linear layer at `name` (from the checkpoint root).
    fn load_at(from: &HeadSource, name: &str, outputs: usize) -> CResult<Self> {
        let config = from.config();
        let vb = from.root().pp(name);
        let dense = Dense::load(vb, config.hidden_size, outputs, config.initializer_range)?;
        let dropout = Dropout::new(
            config
                .classifier_dropout
                .unwrap_or(config.hidden_dropout_prob),
        );
        let head = layout(&config.family).classifier_head(from.root(), config)?;
        Ok(Self {
            head,
            dropout,
            dense,
            outputs,
        })
    }

    /// The number of outputs (labels).
    fn outputs(&self) -> usize {
        self.outputs
    }

    /// The linear layer and the dropout before it (the training fast path
    /// runs them on its own buffers).
    fn parts(&self) -> (&Dense, Dropout) {
        (&self.dense, self.dropout)
    }

    /// The family's module before the dropout (ModernBERT's `head`).
    fn head(&self) -> Option<&PredictionHead> {
        self.head.as_ref()
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let x = match &self.head {
            Some(head) => head.forward(x)?,
            None => x.clone(),
        };
        let x = self.dropout.forward(&x, train)?;
        Ok(self.dense.forward(&x)?)
    }
}

/// Any head, as chosen by `config.json`'s `architectures`.
#[derive(Debug, Clone)]
pub enum BertForTask {
    PreTraining(BertForPreTraining),
    MaskedLM(BertForMaskedLM),
    NextSentencePrediction(BertForNextSentencePrediction),
    SequenceClassification(BertForSequenceClassification),
    TokenClassification(BertForTokenClassification),
    QuestionAnswering(BertForQuestionAnswering),
    MultipleChoice(BertForMultipleChoice),
    ReplacedTokenDetection(ElectraForPreTraining),
}

/// Runs `$body` with `$m` bound to the head inside any variant.
macro_rules! each_head {
    ($task:expr, $m:ident => $body:expr) => {
        match $task {
            BertForTask::PreTraining($m) => $body,
            BertForTask::MaskedLM($m) => $body,
            BertForTask::NextSentencePrediction($m) => $body,
            BertForTask::SequenceClassification($m) => $body,
            BertForTask::TokenClassification($m) => $body,
            BertForTask::QuestionAnswering($m) => $body,
            BertForTask::MultipleChoice($m) => $body,
            BertForTask::ReplacedTokenDetection($m) => $body,
        }
    };
}

/// How a head is loaded, whichever head it is: [`BertForTask`] picks the
/// head type, the loader its source.
trait LoadHead {
    fn load<H: BertHead>(self) -> Result<H>;
}

/// From a model folder's named tensors.
struct FromWeights<'a> {
    weights: Weights,
    config: BertConfig,
    init: HeadInit,
    device: &'a candle_core::Device,
}

impl LoadHead for FromWeights<'_> {
    fn load<H: BertHead>(self) -> Result<H> {
        H::from_weights(self.weights, self.config, self.init, self.device)
    }
}

/// From a `VarBuilder` in transformers' layout (training's parameters).
struct FromVarBuilder<'a> {
    vb: VarBuilder<'a>,
    config: BertConfig,
}

impl LoadHead for FromVarBuilder<'_> {
    fn load<H: BertHead>(self) -> Result<H> {
        Ok(H::load(self.vb, self.config)?)
    }
}

impl BertForTask {
    /// The head named by the first `architectures` entry bertha knows.
    pub fn kind_from_config(config: &BertConfig, origin: &Path) -> Result<HeadKind> {
        config
            .architectures
            .iter()
            .find_map(|a| HeadKind::from_any_architecture(a))
            .ok_or_else(|| {
                let known: Vec<&str> = HeadKind::ALL.iter().map(|k| k.architecture()).collect();
                Error::config(
                    origin,
                    "architectures",
                    format!(
                        "{:?} names no task head (known: {}); this is a bare encoder: ask for a head explicitly",
                        config.architectures,
                        known.join(", ")
                    ),
                )
            })
    }

    /// Loads a model folder with the head `kind`, or the one its
    /// `architectures` names when `kind` is `None`.
    pub fn from_dir(
        dir: &Path,
        kind: Option<HeadKind>,
        init: HeadInit,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let (config, weights) = read_model_dir(dir)?;
        let kind = match kind {
            Some(k) => k,
            None => Self::kind_from_config(&config, &dir.join("config.json"))?,
        };
        Self::from_weights(weights, config, kind, init, device)
    }

    pub fn from_weights(
        weights: Weights,
        config: BertConfig,
        kind: HeadKind,
        init: HeadInit,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let source = FromWeights {
            weights,
            config,
            init,
            device,
        };
        Self::load_kind(kind, source)
    }

    /// Loads head `kind` from a `VarBuilder` in transformers' layout
    /// (encoder under `bert.`), e.g. training's parameters.
    pub fn load(vb: VarBuilder, config: BertConfig, kind: HeadKind) -> Result<Self> {
        Self::load_kind(kind, FromVarBuilder { vb, config })
    }

    fn load_kind(kind: HeadKind, source: impl LoadHead) -> Result<Self> {
        Ok(match kind {
            HeadKind::PreTraining => Self::PreTraining(source.load()?),
            HeadKind::MaskedLM => Self::MaskedLM(source.load()?),
            HeadKind::NextSentencePrediction => Self::NextSentencePrediction(source.load()?),
            HeadKind::SequenceClassification => Self::SequenceClassification(source.load()?),
            HeadKind::TokenClassification => Self::TokenClassification(source.load()?),
            HeadKind::QuestionAnswering => Self::QuestionAnswering(source.load()?),
            HeadKind::MultipleChoice => Self::MultipleChoice(source.load()?),
            HeadKind::ReplacedTokenDetection => Self::ReplacedTokenDetection(source.load()?),
        })
    }

    pub fn kind(&self) -> HeadKind {
        fn kind_of<H: BertHead>(_: &H) -> HeadKind {
            H::KIND
        }
        each_head!(self, m => kind_of(m))
    }

    pub fn bert(&self) -> &BertModel {
        each_head!(self, m => m.bert())
    }

    pub fn config(&self) -> &BertConfig {
        self.bert().config()
    }

    /// The head's [`BertHead::forward`], whichever head it is.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<TaskOutput> {
        each_head!(self, m => BertHead::forward(m, input, labels, opts).map(Into::into))
    }

    /// The head's [`BertHead::forward_encoded`], whichever head it is.
    pub fn forward_encoded(
        &self,
        input: &BertInput,
        encoded: &BertOutput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<TaskOutput> {
        each_head!(self, m => BertHead::forward_encoded(m, input, encoded, labels, opts).map(Into::into))
    }
}
