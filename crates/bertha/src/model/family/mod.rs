//! The members of the BERT family, one file each: what a family changes
//! in the generic BERT of [`super::bert`] — its tensor names, its layer
//! loader, its embeddings' layout and its head names — as one [`Layout`].
//! [`layout`] is the one dispatch on [`Family`]: a new family is a file
//! here and one arm there.

mod albert;
mod deberta_v2;
mod distilbert;
mod electra;
pub(crate) mod modernbert;
mod roberta;

use candle_core::Result;
use candle_nn::VarBuilder;

pub use self::deberta_v2::{log_bucket_position, relative_positions, RelativeContext};
pub use self::modernbert::PredictionHead;
use super::bert::{BertEmbeddings, BertEncoder, BertModel, BertPooler, EmbeddingLayout};
use crate::config::{Activation, BertConfig, Family};

/// What a family changes in the generic BERT (BERT's own choices are the
/// defaults).
pub(crate) trait Layout {
    /// How the embeddings are laid out.
    fn embeddings(&self, _cfg: &BertConfig) -> EmbeddingLayout {
        EmbeddingLayout::default()
    }

    /// The embeddings, `vb` rooted at the base model: BERT's under
    /// [`Layout::embeddings`], unless the family loads its own.
    fn load_embeddings(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEmbeddings> {
        BertEmbeddings::load_with(vb.pp("embeddings"), cfg, self.embeddings(cfg))
    }

    /// The encoder, `vb` rooted at the base model.
    fn load_encoder(&self, vb: VarBuilder, cfg: &BertConfig) -> Result<BertEncoder> {
        BertEncoder::load(vb.pp("encoder"), cfg)
    }

    /// Where the MLM head keeps its tensors.
    fn mlm_names(&self, cfg: &BertConfig) -> MlmNames {
        MlmNames::bert(cfg)
    }

    /// The tensors that make the sequence-classification head.
    fn sequence_classifier(&self) -> [&'static str; 2] {
        ["classifier.weight", "classifier.bias"]
    }

    /// Where BERT's pooler keeps its dense layer (`pooler.dense`; ALBERT
    /// names the layer `pooler` itself).
    fn pooler_dense(&self) -> &'static str {
        "pooler.dense"
    }

    /// Whether the sequence classifier reads the pooler output (else the
    /// family's own head on the first token).
    fn classifier_reads_pooler(&self) -> bool {
        true
    }

    /// The family's own sentence head between the first token and the
    /// sequence classifier, when it has one instead of BERT's pooler.
    fn first_token_head(&self, _cfg: &BertConfig) -> Option<FirstTokenHead> {
        None
    }

    /// Whether transformers has the family's multiple-choice head.
    fn has_multiple_choice(&self) -> bool {
        true
    }

    /// Whether the multiple-choice classifier reads the pooler output
    /// (else [`Layout::multiple_choice_head`]).
    fn multiple_choice_reads_pooler(&self) -> bool {
        true
    }

    /// The family's sentence head under its multiple-choice classifier,
    /// when it is not BERT's pooler (DistilBERT's and DeBERTa's are their
    /// sequence classifier's first-token heads).
    fn multiple_choice_head(&self, _cfg: &BertConfig) -> Option<FirstTokenHead> {
        None
    }

    /// The rate of the dropout before the QA head's output layer (none in
    /// BERT's QA head).
    fn qa_dropout(&self, _cfg: &BertConfig) -> f64 {
        0.0
    }

    /// The QA head's output layer (start and end logits), from the
    /// checkpoint root.
    fn qa_outputs(&self) -> &'static str {
        "qa_outputs"
    }

    /// Whether the family has BERT's pre-training and NSP heads.
    fn has_next_sentence(&self) -> bool {
        false
    }

    /// A module every classifier runs before its dropout and output
    /// layer (ModernBERT's `head`), `root` at the checkpoint root.
    fn classifier_head(
        &self,
        _root: &VarBuilder,
        _cfg: &BertConfig,
    ) -> Result<Option<PredictionHead>> {
        Ok(None)
    }

    /// Head tensor prefixes, besides the common ones, that a fresh head
    /// may initialise.
    fn fresh_prefixes(&self) -> &'static [&'static str] {
        &[]
    }
}

/// The family's [`Layout`].
pub(crate) fn layout(family: &Family) -> Box<dyn Layout + '_> {
    match family {
        Family::Bert => Box::new(Bert),
        Family::Roberta => Box::new(roberta::Roberta),
        Family::DistilBert(o) => Box::new(distilbert::DistilBert(o)),
        Family::Albert(o) => Box::new(albert::Albert(o)),
        Family::DebertaV2(o) => Box::new(deberta_v2::DebertaV2(o)),
        Family::Electra(o) => Box::new(electra::Electra(o)),
        Family::ModernBert(o) => Box::new(modernbert::ModernBert(o)),
    }
}

/// BERT itself: every default.
struct Bert;

impl Layout for Bert {
    fn has_next_sentence(&self) -> bool {
        true
    }
}

/// A family's sentence head on the first token, before the classifier:
/// dropout → `{dense}` → activation, then the classifier block (dropout →
/// `{out}`), as RoBERTa's, DistilBERT's, DeBERTa's and ELECTRA's
/// classification heads are.
pub(crate) struct FirstTokenHead {
    /// The hidden-to-hidden layer.
    pub(crate) dense: &'static str,
    pub(crate) act: Activation,
    /// The rate of the dropout before `dense`: `None` for the
    /// classifier's own rate (RoBERTa, ELECTRA), 0 for none (DistilBERT).
    pub(crate) dropout: Option<f64>,
    /// The layer giving the logits.
    pub(crate) out: &'static str,
}

/// Where a family keeps its MLM head: `{root}{dense}`, `{root}{norm}`,
/// `{root}{decoder}` and the output bias `{root}{bias}`.
pub(crate) struct MlmNames {
    pub(crate) root: &'static str,
    pub(crate) dense: &'static str,
    pub(crate) norm: &'static str,
    pub(crate) decoder: &'static str,
    pub(crate) bias: &'static str,
    pub(crate) act: Activation,
    /// The width the head maps to before the decoder (ALBERT: embedding_size).
    pub(crate) width: usize,
    pub(crate) eps: f64,
    pub(crate) biases: MlmBiases,
}

/// Which of the MLM head's layers have a bias (all but ModernBERT's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MlmBiases {
    pub(crate) dense: bool,
    pub(crate) norm: bool,
    pub(crate) decoder: bool,
}

impl MlmNames {
    /// BERT's `cls.predictions`.
    pub(crate) fn bert(config: &BertConfig) -> Self {
        Self {
            root: "cls.predictions.",
            dense: "transform.dense",
            norm: "transform.LayerNorm",
            decoder: "decoder",
            bias: "bias",
            act: config.hidden_act,
            width: config.hidden_size,
            eps: config.layer_norm_eps,
            biases: MlmBiases {
                dense: true,
                norm: true,
                decoder: true,
            },
        }
    }
}

impl BertModel {
    /// Loads from any `VarBuilder` rooted at the base model, in the
    /// config's family layout.
    pub fn load(vb: VarBuilder, config: BertConfig, with_pooler: bool) -> Result<Self> {
        let (embeddings, encoder) = {
            let family = layout(&config.family);
            (
                family.load_embeddings(vb.clone(), &config)?,
                family.load_encoder(vb.clone(), &config)?,
            )
        };
        let pooler = if with_pooler && config.add_pooling_layer {
            let dense = layout(&config.family).pooler_dense();
            Some(BertPooler::load(vb.pp(dense), &config)?)
        } else {
            None
        };
        Ok(Self {
            embeddings,
            encoder,
            pooler,
            device: vb.device().clone(),
            config,
        })
    }
}
