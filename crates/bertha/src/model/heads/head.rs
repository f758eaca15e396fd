//! A head as transformers builds one: the encoder and a small module
//! above it, with the loss inside the forward pass.

use candle_core::{Result as CResult, Tensor};
use candle_nn::VarBuilder;

use super::init::load_bert;
use super::{BertHead, HeadKind, HeadLabels, HeadOptions, HeadOutput, TaskOutput};
use crate::config::BertConfig;
use crate::error::Result;
use crate::model::bert::{BertInput, BertModel, BertOutput, ForwardOptions};

/// A head: the encoder and the module above it. The head names are
/// aliases of it ([`BertForMaskedLM`](super::BertForMaskedLM) is
/// `Head<MaskedLmModule>`).
#[derive(Debug, Clone)]
pub struct Head<M> {
    pub(super) bert: BertModel,
    pub(super) module: M,
}

/// The part of a head above the encoder: its tensors, its forward pass
/// with the loss, its outputs.
pub trait HeadModule: Sized {
    const KIND: HeadKind;
    /// The head's typed outputs ([`HeadOutput`] for the one-logits heads).
    type Output: Into<TaskOutput>;

    /// Loads the module and the encoder under it (in the order the
    /// module needs: see [`HeadSource::encoder`]).
    fn load(from: &HeadSource) -> CResult<Head<Self>>;

    /// Runs the encoder and the module; the loss is computed from the
    /// labels the module reads when they are given.
    fn forward(&self, pass: HeadPass) -> Result<Self::Output>;
}

/// Where a head loads from.
pub struct HeadSource<'a> {
    base: VarBuilder<'a>,
    root: VarBuilder<'a>,
    config: BertConfig,
    kind: HeadKind,
}

impl<'a> HeadSource<'a> {
    /// Rooted at the checkpoint root, where `cls.`, `classifier.` and
    /// `qa_outputs.` live.
    pub fn root(&self) -> &VarBuilder<'a> {
        &self.root
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Loads the encoder: a module whose tensors read it (a decoder tied
    /// to the word embeddings) calls this first, the others after their
    /// own tensors.
    pub fn encoder(&self) -> CResult<BertModel> {
        load_bert(self.base.clone(), self.config.clone(), self.kind)
    }
}

/// One forward pass through a head.
pub struct HeadPass<'a> {
    pub bert: &'a BertModel,
    pub input: &'a BertInput,
    pub labels: &'a HeadLabels<'a>,
    pub opts: HeadOptions,
    /// The encoder's outputs when computed elsewhere (the packed fast
    /// path at a reduced precision): the module then reads these instead
    /// of running the encoder.
    pub encoded: Option<&'a BertOutput>,
}

impl HeadPass<'_> {
    /// The encoder on the input.
    pub fn encode(&self) -> Result<BertOutput> {
        self.encode_input(self.input)
    }

    /// The encoder on `input` (a module's reshaped input), or the outputs
    /// the pass was given.
    pub fn encode_input(&self, input: &BertInput) -> Result<BertOutput> {
        match self.encoded {
            Some(out) => Ok(out.clone()),
            None => self.bert.forward(input, self.opts.forward),
        }
    }

    /// Whether dropout is on.
    pub fn train(&self) -> bool {
        self.opts.forward.train
    }
}

impl<M> Head<M> {
    pub(super) fn new(bert: BertModel, module: M) -> Self {
        Self { bert, module }
    }

    /// The module above the encoder.
    pub fn module(&self) -> &M {
        &self.module
    }
}

impl<M: HeadModule> BertHead for Head<M> {
    const KIND: HeadKind = M::KIND;
    type Output = M::Output;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let kind = M::KIND;
        M::load(&HeadSource {
            base,
            root,
            config,
            kind,
        })
    }

    fn bert(&self) -> &BertModel {
        &self.bert
    }

    fn forward(
        &self,
        input: &BertInput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<M::Output> {
        self.pass(input, None, labels, opts)
    }

    fn forward_encoded(
        &self,
        input: &BertInput,
        encoded: &BertOutput,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<M::Output> {
        self.pass(input, Some(encoded), labels, opts)
    }
}

impl<M: HeadModule> Head<M> {
    /// The module's forward pass, on `encoded` when given, else on the
    /// encoder's outputs.
    fn pass(
        &self,
        input: &BertInput,
        encoded: Option<&BertOutput>,
        labels: &HeadLabels,
        opts: HeadOptions,
    ) -> Result<M::Output> {
        self.module.forward(HeadPass {
            bert: &self.bert,
            input,
            labels,
            opts,
            encoded,
        })
    }
}

impl<M: HeadModule<Output = HeadOutput>> Head<M> {
    /// [`BertHead::forward`] with only `labels`.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<HeadOutput> {
        BertHead::forward(self, input, &HeadLabels::labels(labels), opts.into())
    }
}
