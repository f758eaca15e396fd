//! Task heads on top of [`BertModel`], one struct per transformers class
//! (`BertForMaskedLM`, `BertForSequenceClassification`, ...), loaded from
//! the same checkpoint names, with the same training losses.
//!
//! Each head loads from a `VarBuilder` rooted at the checkpoint root (the
//! encoder under `bert.`, or at the root for checkpoints saved from a bare
//! `BertModel`). [`BertHead::from_dir`] finds the weights of a model folder
//! and either insists that the head's tensors are there (a clear error
//! naming the head and the missing tensor otherwise) or, with
//! [`HeadInit::Fresh`], initialises missing head tensors like transformers
//! (normal(0, `initializer_range`) weights, zero biases) for fine-tuning.

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Module, Result as CResult, Shape, Tensor, D};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use super::bert::{BertInput, BertModel, ForwardOptions};
use super::nn::{activate, Dense, Dropout, LayerNorm};
use crate::config::{Activation, BertConfig, Family, ProblemType};
use crate::error::{Error, Result};
use crate::io::weights::{strip_backtrace, SeededInit, Weights};

/// transformers' `ignore_index` for token-level labels.
pub const IGNORE_INDEX: i64 = -100;

/// The head classes, by their transformers names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeadKind {
    PreTraining,
    MaskedLM,
    NextSentencePrediction,
    SequenceClassification,
    TokenClassification,
    QuestionAnswering,
    MultipleChoice,
}

impl HeadKind {
    pub const ALL: [HeadKind; 7] = [
        HeadKind::PreTraining,
        HeadKind::MaskedLM,
        HeadKind::NextSentencePrediction,
        HeadKind::SequenceClassification,
        HeadKind::TokenClassification,
        HeadKind::QuestionAnswering,
        HeadKind::MultipleChoice,
    ];

    /// The class name in `config.json`'s `architectures`.
    pub fn architecture(self) -> &'static str {
        match self {
            Self::PreTraining => "BertForPreTraining",
            Self::MaskedLM => "BertForMaskedLM",
            Self::NextSentencePrediction => "BertForNextSentencePrediction",
            Self::SequenceClassification => "BertForSequenceClassification",
            Self::TokenClassification => "BertForTokenClassification",
            Self::QuestionAnswering => "BertForQuestionAnswering",
            Self::MultipleChoice => "BertForMultipleChoice",
        }
    }

    pub fn from_architecture(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.architecture() == name)
    }

    /// Whether the head reads the base model's pooler output (and so
    /// needs the pooler): BERT's and ALBERT's classifiers do; RoBERTa,
    /// DistilBERT and DeBERTa classify from their own head on the first
    /// token.
    pub fn uses_pooler(self) -> bool {
        self.uses_pooler_in(&Family::Bert)
    }

    pub fn uses_pooler_in(self, family: &Family) -> bool {
        match self {
            Self::PreTraining | Self::NextSentencePrediction => true,
            Self::SequenceClassification => {
                matches!(family, Family::Bert | Family::Albert(_))
            }
            Self::MultipleChoice => {
                matches!(family, Family::Bert | Family::Albert(_) | Family::Roberta)
            }
            _ => false,
        }
    }

    /// Whether bertha has this head for this family member.
    pub fn supported_by(self, family: &Family) -> bool {
        match self {
            Self::PreTraining | Self::NextSentencePrediction => family.is_bert(),
            Self::MultipleChoice => {
                matches!(family, Family::Bert | Family::Albert(_) | Family::Roberta)
            }
            _ => true,
        }
    }

    /// transformers' class name for this head in `family`
    /// (`RobertaForMaskedLM`).
    pub fn class_name(self, family: &Family) -> String {
        let arch = self.architecture();
        format!(
            "{}{}",
            family.class_prefix(),
            arch.strip_prefix("Bert").unwrap_or(arch)
        )
    }

    /// The head of a class name of any family member.
    pub fn from_any_architecture(name: &str) -> Option<Self> {
        ["Bert", "Roberta", "DistilBert", "Albert", "DebertaV2"]
            .iter()
            .find_map(|p| {
                let rest = name.strip_prefix(p)?;
                Self::ALL
                    .into_iter()
                    .find(|k| k.architecture().strip_prefix("Bert") == Some(rest))
            })
    }

    /// The tensors (relative to the checkpoint root) that the head itself
    /// owns; `base` is the encoder's prefix (`"bert."` or `""`).
    fn head_tensors(self, base: &str, config: &BertConfig) -> Vec<String> {
        let family = &config.family;
        let m = MlmNames::of(config);
        let mlm: Vec<String> = [m.dense, m.norm]
            .iter()
            .flat_map(|n| {
                ["weight", "bias"]
                    .iter()
                    .map(move |w| format!("{}{n}.{w}", m.root))
            })
            .collect();
        let nsp = ["cls.seq_relationship.weight", "cls.seq_relationship.bias"];
        let classifier = ["classifier.weight", "classifier.bias"];
        let mut names: Vec<String> = match self {
            Self::PreTraining => mlm
                .into_iter()
                .chain(nsp.iter().map(|s| s.to_string()))
                .collect(),
            Self::MaskedLM => mlm,
            Self::NextSentencePrediction => nsp.iter().map(|s| s.to_string()).collect(),
            Self::SequenceClassification => match family {
                Family::Roberta => vec![
                    "classifier.dense.weight".into(),
                    "classifier.out_proj.weight".into(),
                ],
                Family::DistilBert => {
                    vec!["pre_classifier.weight".into(), "classifier.weight".into()]
                }
                Family::DebertaV2(_) => {
                    vec!["pooler.dense.weight".into(), "classifier.weight".into()]
                }
                _ => classifier.iter().map(|s| s.to_string()).collect(),
            },
            Self::TokenClassification | Self::MultipleChoice => {
                classifier.iter().map(|s| s.to_string()).collect()
            }
            Self::QuestionAnswering => vec!["qa_outputs.weight".into(), "qa_outputs.bias".into()],
        };
        if self.uses_pooler_in(family) {
            names.push(format!("{base}pooler.dense.weight"));
            names.push(format!("{base}pooler.dense.bias"));
        }
        names
    }

    /// Name prefixes a fresh initialisation may fill in.
    fn fresh_prefixes(self, base: &str, config: &BertConfig) -> Vec<String> {
        let mut p: Vec<String> = [
            "cls.",
            "classifier.",
            "qa_outputs.",
            "lm_head.",
            "lm_predictions.",
            "predictions.",
            "vocab_transform.",
            "vocab_layer_norm.",
            "vocab_projector.",
            "pre_classifier.",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if matches!(config.family, Family::DebertaV2(_)) {
            p.push("pooler.".into());
        }
        if self.uses_pooler_in(&config.family) {
            p.push(format!("{base}pooler."));
        }
        p
    }
}

/// Where a family keeps its MLM head: `{root}{dense}`, `{root}{norm}`,
/// `{root}{decoder}` and the output bias `{root}{bias}`.
struct MlmNames {
    root: &'static str,
    dense: &'static str,
    norm: &'static str,
    decoder: &'static str,
    bias: &'static str,
    act: Activation,
    /// The width the head maps to before the decoder (ALBERT: embedding_size).
    width: usize,
    eps: f64,
}

impl MlmNames {
    fn of(config: &BertConfig) -> Self {
        let bert = Self {
            root: "cls.predictions.",
            dense: "transform.dense",
            norm: "transform.LayerNorm",
            decoder: "decoder",
            bias: "bias",
            act: config.hidden_act,
            width: config.hidden_size,
            eps: config.layer_norm_eps,
        };
        match &config.family {
            Family::Bert => bert,
            Family::DebertaV2(o) if o.legacy => bert,
            Family::DebertaV2(_) => Self {
                root: "lm_predictions.lm_head.",
                dense: "dense",
                norm: "LayerNorm",
                ..bert
            },
            Family::Roberta => Self {
                root: "lm_head.",
                dense: "dense",
                norm: "layer_norm",
                // RobertaLMHead applies the exact GELU whatever hidden_act says.
                act: Activation::Gelu,
                ..bert
            },
            Family::DistilBert => Self {
                root: "",
                dense: "vocab_transform",
                norm: "vocab_layer_norm",
                decoder: "vocab_projector",
                bias: "vocab_projector.bias",
                eps: 1e-12,
                ..bert
            },
            Family::Albert(a) => Self {
                root: "predictions.",
                dense: "dense",
                norm: "LayerNorm",
                width: a.embedding_size,
                ..bert
            },
        }
    }
}

impl std::fmt::Display for HeadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.architecture())
    }
}

/// What to do when a checkpoint lacks the head's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadInit {
    /// The head must be in the checkpoint: a missing tensor is an error.
    #[default]
    FromCheckpoint,
    /// Head tensors missing from the checkpoint (and the pooler, for heads
    /// that use it) are initialised like transformers: normal(0,
    /// `initializer_range`) weights, zero biases, unit LayerNorm, drawn
    /// from a generator seeded with `seed`. Encoder tensors must still be
    /// present.
    Fresh { seed: u64 },
}

/// A `VarBuilder` backend: the checkpoint's tensors, with head tensors it
/// lacks drawn fresh (and remembered) when allowed.
struct HeadBackend {
    weights: Weights,
    fresh: Option<(SeededInit, Vec<String>)>,
    initialised: Arc<Mutex<Vec<String>>>,
}

impl HeadBackend {
    fn may_init(&self, name: &str) -> Option<&SeededInit> {
        let (init, prefixes) = self.fresh.as_ref()?;
        prefixes
            .iter()
            .any(|p| name.starts_with(p.as_str()))
            .then_some(init)
    }
}

impl SimpleBackend for HeadBackend {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> CResult<Tensor> {
        if !self.weights.contains(name) {
            if let Some(init) = self.may_init(name) {
                if let Ok(mut v) = self.initialised.lock() {
                    v.push(name.to_string());
                }
                return init.get(s, name, h, dtype, dev);
            }
        }
        self.weights.get(s, name, h, dtype, dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> CResult<Tensor> {
        self.weights.get_unchecked(name, dtype, dev)
    }

    /// Only what the checkpoint really holds (so that a tied decoder is
    /// tied, not drawn fresh).
    fn contains_tensor(&self, name: &str) -> bool {
        self.weights.contains(name)
    }
}

/// Every head: how it loads and what it is called.
pub trait BertHead: Sized {
    const KIND: HeadKind;

    /// Loads the head and its encoder: `base` is rooted at the encoder
    /// (`bert.` in transformers' layout), `root` at the checkpoint root
    /// (where `cls.`, `classifier.` and `qa_outputs.` live).
    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self>;

    /// Loads from a `VarBuilder` in transformers' layout (encoder under
    /// `bert.`), e.g. a `VarMap` for training.
    fn load(vb: VarBuilder, config: BertConfig) -> CResult<Self> {
        Self::load_parts(vb.pp(config.family.prefix()), vb, config)
    }

    /// Loads `config.json` and the weights of a model folder.
    fn from_dir(dir: &Path, init: HeadInit, device: &Device) -> Result<Self> {
        let (config, weights) = read_dir(dir)?;
        Self::from_weights(weights, config, init, device)
    }

    /// Loads from named tensors, with or without the `bert.` prefix.
    fn from_weights(
        weights: Weights,
        config: BertConfig,
        init: HeadInit,
        device: &Device,
    ) -> Result<Self> {
        let (base, root, fresh) = head_var_builders(weights, &config, Self::KIND, init, device)?;
        let origin = base.1.clone();
        let head = Self::load_parts(base.0, root, config).map_err(|e| Error::Weights {
            path: origin.clone(),
            reason: strip_backtrace(&e),
        })?;
        let fresh = fresh.lock().map(|v| v.clone()).unwrap_or_default();
        if !fresh.is_empty() {
            tracing::warn!(
                "{}: newly initialised {} tensors (train before use): {}",
                origin.display(),
                Self::KIND,
                fresh.join(", ")
            );
        }
        Ok(head)
    }
}

fn read_dir(dir: &Path) -> Result<(BertConfig, Weights)> {
    if !dir.is_dir() {
        return Err(Error::ModelDir {
            path: dir.to_path_buf(),
            reason: "no such directory".into(),
        });
    }
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(Error::ModelDir {
            path: dir.to_path_buf(),
            reason: "config.json is missing".into(),
        });
    }
    let config = BertConfig::from_file(&config_path)?;
    let weights = Weights::from_model_dir(dir)?;
    Ok((config, weights))
}

type Fresh = Arc<Mutex<Vec<String>>>;

/// Checks the head against the checkpoint and builds (encoder, root)
/// builders over it.
fn head_var_builders(
    weights: Weights,
    config: &BertConfig,
    kind: HeadKind,
    init: HeadInit,
    device: &Device,
) -> Result<(
    (VarBuilder<'static>, std::path::PathBuf),
    VarBuilder<'static>,
    Fresh,
)> {
    let origin = weights.origin().to_path_buf();
    let prefix = weights
        .base_prefix(config.family.prefix())
        .ok_or_else(|| Error::Weights {
            path: origin.clone(),
            reason: format!(
                "missing tensor `embeddings.word_embeddings.weight` (also looked for `{}.embeddings.word_embeddings.weight`)",
                config.family.prefix()
            ),
        })?;
    if !kind.supported_by(&config.family) {
        return Err(Error::config(
            &origin,
            "model_type",
            format!(
                "bertha has no {} head for `{}` models",
                kind.class_name(&config.family),
                config.model_type
            ),
        ));
    }
    if kind.uses_pooler_in(&config.family) && !config.add_pooling_layer {
        return Err(Error::config(
            &origin,
            "add_pooling_layer",
            format!("{kind} reads the pooler output, but the config has no pooler"),
        ));
    }
    if !config.architectures.is_empty()
        && !config
            .architectures
            .iter()
            .any(|a| *a == kind.class_name(&config.family))
    {
        tracing::debug!(
            "{}: loading {kind} from a checkpoint saved as {:?}",
            origin.display(),
            config.architectures
        );
    }
    let fresh = match init {
        HeadInit::FromCheckpoint => {
            if let Some(missing) = kind
                .head_tensors(&prefix, config)
                .into_iter()
                .find(|n| !weights.contains(n))
            {
                let saved_as = if config.architectures.is_empty() {
                    "no `architectures` in config.json".to_string()
                } else {
                    format!("saved as {}", config.architectures.join(", "))
                };
                let kind = kind.class_name(&config.family);
                return Err(Error::Weights {
                    path: origin,
                    reason: format!(
                        "the checkpoint has no {kind} head: missing tensor `{missing}` ({saved_as}). \
                         Use a checkpoint fine-tuned for this task, or initialise the head fresh to train it"
                    ),
                });
            }
            None
        }
        HeadInit::Fresh { seed } => {
            Some((SeededInit::new(seed), kind.fresh_prefixes(&prefix, config)))
        }
    };
    let initialised: Fresh = Arc::default();
    let backend = HeadBackend {
        weights,
        fresh,
        initialised: initialised.clone(),
    };
    let root = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
    let base = if prefix.is_empty() {
        root.clone()
    } else {
        root.pp(prefix.trim_end_matches('.'))
    };
    Ok(((base, origin), root, initialised))
}

/// The outputs every head shares with `BertModel`.
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

/// `BertForPreTraining`'s outputs.
#[derive(Debug, Clone)]
pub struct PreTrainingOutput {
    pub loss: Option<Tensor>,
    /// [B, T, V]
    pub prediction_logits: Tensor,
    /// [B, 2]
    pub seq_relationship_logits: Tensor,
    pub hidden_states: Option<Vec<Tensor>>,
    pub attentions: Option<Vec<Tensor>>,
}

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

/// `cls.predictions`: dense → activation → LayerNorm → decoder (tied to
/// the word embeddings unless the checkpoint has its own) + bias.
#[derive(Debug, Clone)]
pub struct BertLMPredictionHead {
    dense: Dense,
    act: Activation,
    layer_norm: LayerNorm,
    decoder: Dense,
}

impl BertLMPredictionHead {
    /// `vb` is rooted at `cls.predictions`; `word_embeddings` [V, D] is the
    /// encoder's matrix, used when the decoder is tied.
    pub fn load(vb: VarBuilder, config: &BertConfig, word_embeddings: &Tensor) -> CResult<Self> {
        let names = MlmNames::of(&BertConfig {
            family: Family::Bert,
            ..config.clone()
        });
        Self::load_named(vb, &names, config, word_embeddings)
    }

    /// The family's MLM head (`cls.predictions`, `lm_head`, `vocab_*`,
    /// `predictions`), `root` at the checkpoint root.
    pub fn load_for(
        root: VarBuilder,
        config: &BertConfig,
        word_embeddings: &Tensor,
    ) -> CResult<Self> {
        let names = MlmNames::of(config);
        let vb = match names.root.trim_end_matches('.') {
            "" => root,
            r => root.pp(r),
        };
        Self::load_named(vb, &names, config, word_embeddings)
    }

    fn load_named(
        vb: VarBuilder,
        names: &MlmNames,
        config: &BertConfig,
        word_embeddings: &Tensor,
    ) -> CResult<Self> {
        let (d, v, e) = (config.hidden_size, config.vocab_size, names.width);
        let std = config.initializer_range;
        let dense = Dense::load(vb.pp(names.dense), d, e, std)?;
        let layer_norm = LayerNorm::load(vb.pp(names.norm), e, names.eps)?;
        let decoder_weight = format!("{}.weight", names.decoder);
        let weight = if vb.contains_tensor(&decoder_weight) || !config.tie_word_embeddings {
            vb.pp(names.decoder).get_with_hints(
                (v, e),
                "weight",
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            )?
        } else {
            word_embeddings.clone()
        };
        // The bias is `{root}bias` (tied to `decoder.bias`); some old
        // checkpoints carry only the latter.
        let decoder_bias = format!("{}.bias", names.decoder);
        let bias = if !vb.contains_tensor(names.bias) && vb.contains_tensor(&decoder_bias) {
            vb.get_with_hints(v, &decoder_bias, Init::Const(0.0))?
        } else {
            vb.get_with_hints(v, names.bias, Init::Const(0.0))?
        };
        Ok(Self {
            dense,
            act: names.act,
            layer_norm,
            decoder: Dense::new(weight, Some(bias)),
        })
    }

    /// [B, T, D] → [B, T, V]
    pub fn forward(&self, hidden: &Tensor) -> CResult<Tensor> {
        let x = activate(&self.dense.forward(hidden)?, self.act)?;
        let x = self.layer_norm.forward(&x)?;
        self.decoder.forward(&x)
    }

    /// The decoder matrix [V, D] (the word embeddings when tied).
    pub fn decoder_weight(&self) -> &Tensor {
        self.decoder.weight()
    }
}

fn pooled(out: &super::bert::BertOutput) -> Result<&Tensor> {
    out.pooler_output
        .as_ref()
        .ok_or_else(|| Error::Input("this head needs the pooler, which the model lacks".into()))
}

fn load_bert(base: VarBuilder, config: BertConfig, kind: HeadKind) -> CResult<BertModel> {
    if !kind.supported_by(&config.family) {
        candle_core::bail!(
            "bertha has no {} head for `{}` models",
            kind.class_name(&config.family),
            config.model_type
        );
    }
    let pooler = kind.uses_pooler_in(&config.family);
    if pooler && !config.add_pooling_layer {
        candle_core::bail!(
            "{kind} reads the pooler output, but the config has add_pooling_layer false"
        );
    }
    BertModel::load(base, config, pooler)
}

fn classifier_dropout(config: &BertConfig) -> Dropout {
    Dropout::new(
        config
            .classifier_dropout
            .unwrap_or(config.hidden_dropout_prob),
    )
}

/// `BertForPreTraining`: masked-LM and next-sentence heads.
#[derive(Debug, Clone)]
pub struct BertForPreTraining {
    bert: BertModel,
    predictions: BertLMPredictionHead,
    seq_relationship: Dense,
}

impl BertHead for BertForPreTraining {
    const KIND: HeadKind = HeadKind::PreTraining;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let bert = load_bert(base, config.clone(), Self::KIND)?;
        let predictions = BertLMPredictionHead::load(
            root.pp("cls").pp("predictions"),
            &config,
            bert.embeddings().word_embeddings(),
        )?;
        let seq_relationship = Dense::load(
            root.pp("cls").pp("seq_relationship"),
            config.hidden_size,
            2,
            config.initializer_range,
        )?;
        Ok(Self {
            bert,
            predictions,
            seq_relationship,
        })
    }
}

impl BertForPreTraining {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    pub fn predictions(&self) -> &BertLMPredictionHead {
        &self.predictions
    }

    /// The NSP classifier on the pooled output, [B, D] → [B, 2].
    pub fn seq_relationship(&self) -> &Dense {
        &self.seq_relationship
    }

    /// `labels` [B, T] (token ids, -100 where not masked) and
    /// `next_sentence_label` [B] (0: B follows A, 1: random B): the loss is
    /// the sum of both cross-entropies, computed when both are given.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        next_sentence_label: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<PreTrainingOutput> {
        let out = self.bert.forward(input, opts)?;
        let prediction_logits = self.predictions.forward(&out.last_hidden_state)?;
        let seq_relationship_logits = self.seq_relationship.forward(pooled(&out)?)?;
        let loss = match (labels, next_sentence_label) {
            (Some(l), Some(n)) => {
                let mlm = token_cross_entropy(&prediction_logits, l, "labels")?;
                let nsp = cross_entropy_with_ignore(
                    &seq_relationship_logits,
                    &label_values(n, "next_sentence_label")?,
                    IGNORE_INDEX,
                    "next_sentence_label",
                )?;
                Some((mlm + nsp)?)
            }
            _ => None,
        };
        Ok(PreTrainingOutput {
            loss,
            prediction_logits,
            seq_relationship_logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

/// `BertForMaskedLM`.
#[derive(Debug, Clone)]
pub struct BertForMaskedLM {
    bert: BertModel,
    predictions: BertLMPredictionHead,
}

impl BertHead for BertForMaskedLM {
    const KIND: HeadKind = HeadKind::MaskedLM;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let bert = load_bert(base, config.clone(), Self::KIND)?;
        let predictions =
            BertLMPredictionHead::load_for(root, &config, bert.embeddings().word_embeddings())?;
        Ok(Self { bert, predictions })
    }
}

impl BertForMaskedLM {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    pub fn predictions(&self) -> &BertLMPredictionHead {
        &self.predictions
    }

    /// `labels` [B, T]: the token to predict, -100 where nothing is.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts)?;
        let logits = self.predictions.forward(&out.last_hidden_state)?;
        let loss = labels
            .map(|l| token_cross_entropy(&logits, l, "labels"))
            .transpose()?;
        Ok(HeadOutput {
            loss,
            logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

/// `BertForNextSentencePrediction`.
#[derive(Debug, Clone)]
pub struct BertForNextSentencePrediction {
    bert: BertModel,
    seq_relationship: Dense,
}

impl BertHead for BertForNextSentencePrediction {
    const KIND: HeadKind = HeadKind::NextSentencePrediction;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let seq_relationship = Dense::load(
            root.pp("cls").pp("seq_relationship"),
            config.hidden_size,
            2,
            config.initializer_range,
        )?;
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            seq_relationship,
        })
    }
}

impl BertForNextSentencePrediction {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    /// `labels` [B]: 0 when B follows A, 1 when B is random. Logits [B, 2].
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts)?;
        let logits = self.seq_relationship.forward(pooled(&out)?)?;
        let loss = labels
            .map(|l| {
                cross_entropy_with_ignore(
                    &logits,
                    &label_values(l, "labels")?,
                    IGNORE_INDEX,
                    "labels",
                )
            })
            .transpose()?;
        Ok(HeadOutput {
            loss,
            logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

/// `BertForSequenceClassification`: pooler → dropout → classifier.
#[derive(Debug, Clone)]
pub struct BertForSequenceClassification {
    bert: BertModel,
    dropout: Dropout,
    classifier: Dense,
    num_labels: usize,
}

impl BertHead for BertForSequenceClassification {
    const KIND: HeadKind = HeadKind::SequenceClassification;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let num_labels = config.num_labels();
        let classifier = Dense::load(
            root.pp("classifier"),
            config.hidden_size,
            num_labels,
            config.initializer_range,
        )?;
        let dropout = classifier_dropout(&config);
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            dropout,
            classifier,
            num_labels,
        })
    }
}

impl BertForSequenceClassification {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    pub fn config(&self) -> &BertConfig {
        self.bert.config()
    }

    pub fn num_labels(&self) -> usize {
        self.num_labels
    }

    /// The loss transformers would use for these labels: the config's
    /// `problem_type`, else regression for one label, single-label
    /// classification for integer labels and multi-label otherwise.
    pub fn problem_type(&self, labels: &Tensor) -> ProblemType {
        match self.config().problem_type {
            Some(p) => p,
            None if self.num_labels == 1 => ProblemType::Regression,
            None if matches!(labels.dtype(), DType::U8 | DType::U32 | DType::I64) => {
                ProblemType::SingleLabelClassification
            }
            None => ProblemType::MultiLabelClassification,
        }
    }

    /// `labels`: [B] class ids (single-label), [B, num_labels] 0/1 floats
    /// (multi-label) or [B] / [B, num_labels] floats (regression).
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts)?;
        let x = self.dropout.forward(pooled(&out)?, opts.train)?;
        let logits = self.classifier.forward(&x)?;
        let loss = match labels {
            None => None,
            Some(l) => Some(match self.problem_type(l) {
                ProblemType::SingleLabelClassification => cross_entropy_with_ignore(
                    &logits,
                    &label_values(l, "labels")?,
                    IGNORE_INDEX,
                    "labels",
                )?,
                ProblemType::MultiLabelClassification => {
                    bce_with_logits(&logits, &float_labels(l, logits.dims(), "labels")?)?
                }
                ProblemType::Regression => {
                    let target = if self.num_labels == 1 {
                        float_labels(l, &[logits.dim(0)?], "labels")?.unsqueeze(1)?
                    } else {
                        float_labels(l, logits.dims(), "labels")?
                    };
                    (&logits - &target)?.sqr()?.mean_all()?
                }
            }),
        };
        Ok(HeadOutput {
            loss,
            logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

/// `BertForTokenClassification`: dropout → classifier on every token.
#[derive(Debug, Clone)]
pub struct BertForTokenClassification {
    bert: BertModel,
    dropout: Dropout,
    classifier: Dense,
    num_labels: usize,
}

impl BertHead for BertForTokenClassification {
    const KIND: HeadKind = HeadKind::TokenClassification;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let num_labels = config.num_labels();
        let classifier = Dense::load(
            root.pp("classifier"),
            config.hidden_size,
            num_labels,
            config.initializer_range,
        )?;
        let dropout = classifier_dropout(&config);
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            dropout,
            classifier,
            num_labels,
        })
    }
}

impl BertForTokenClassification {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    pub fn config(&self) -> &BertConfig {
        self.bert.config()
    }

    pub fn num_labels(&self) -> usize {
        self.num_labels
    }

    /// `labels` [B, T]: class ids, -100 where a token has none.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<HeadOutput> {
        let out = self.bert.forward(input, opts)?;
        let x = self.dropout.forward(&out.last_hidden_state, opts.train)?;
        let logits = self.classifier.forward(&x)?;
        let loss = labels
            .map(|l| token_cross_entropy(&logits, l, "labels"))
            .transpose()?;
        Ok(HeadOutput {
            loss,
            logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
    }
}

/// `BertForQuestionAnswering`: `qa_outputs` → start and end logits.
#[derive(Debug, Clone)]
pub struct BertForQuestionAnswering {
    bert: BertModel,
    qa_outputs: Dense,
}

impl BertHead for BertForQuestionAnswering {
    const KIND: HeadKind = HeadKind::QuestionAnswering;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let qa_outputs = Dense::load(
            root.pp("qa_outputs"),
            config.hidden_size,
            2,
            config.initializer_range,
        )?;
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self { bert, qa_outputs })
    }
}

impl BertForQuestionAnswering {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    /// `start_positions` / `end_positions` [B]: token indices of the answer.
    /// As in transformers, positions outside the sequence are clamped to
    /// its length and then ignored; the loss is (start CE + end CE) / 2.
    pub fn forward(
        &self,
        input: &BertInput,
        start_positions: Option<&Tensor>,
        end_positions: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<QuestionAnsweringOutput> {
        let out = self.bert.forward(input, opts)?;
        let logits = self.qa_outputs.forward(&out.last_hidden_state)?;
        let start_logits = logits.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
        let end_logits = logits.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
        let loss = match (start_positions, end_positions) {
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

/// `BertForMultipleChoice`: each (context, choice) pair through the
/// encoder, pooler → dropout → a one-output classifier, scores [B, C].
#[derive(Debug, Clone)]
pub struct BertForMultipleChoice {
    bert: BertModel,
    dropout: Dropout,
    classifier: Dense,
}

impl BertHead for BertForMultipleChoice {
    const KIND: HeadKind = HeadKind::MultipleChoice;

    fn load_parts(base: VarBuilder, root: VarBuilder, config: BertConfig) -> CResult<Self> {
        let classifier = Dense::load(
            root.pp("classifier"),
            config.hidden_size,
            1,
            config.initializer_range,
        )?;
        let dropout = classifier_dropout(&config);
        let bert = load_bert(base, config, Self::KIND)?;
        Ok(Self {
            bert,
            dropout,
            classifier,
        })
    }
}

impl BertForMultipleChoice {
    pub fn bert(&self) -> &BertModel {
        &self.bert
    }

    /// `input` tensors are [B, C, T] (C choices per example); `labels` [B]
    /// the index of the right choice.
    pub fn forward(
        &self,
        input: &BertInput,
        labels: Option<&Tensor>,
        opts: ForwardOptions,
    ) -> Result<HeadOutput> {
        let (b, c, t) = input.input_ids.dims3().map_err(|_| {
            Error::Input(format!(
                "multiple choice needs input_ids of shape [batch, choices, seq], got {:?}",
                input.input_ids.dims()
            ))
        })?;
        let flat = |x: &Tensor| x.reshape((b * c, t));
        let flat_input = BertInput {
            input_ids: flat(&input.input_ids)?,
            token_type_ids: input.token_type_ids.as_ref().map(flat).transpose()?,
            attention_mask: input.attention_mask.as_ref().map(flat).transpose()?,
        };
        let out = self.bert.forward(&flat_input, opts)?;
        let x = self.dropout.forward(pooled(&out)?, opts.train)?;
        let logits = self.classifier.forward(&x)?.reshape((b, c))?;
        let loss = labels
            .map(|l| {
                cross_entropy_with_ignore(
                    &logits,
                    &label_values(l, "labels")?,
                    IGNORE_INDEX,
                    "labels",
                )
            })
            .transpose()?;
        Ok(HeadOutput {
            loss,
            logits,
            hidden_states: out.hidden_states,
            attentions: out.attentions,
        })
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
        device: &Device,
    ) -> Result<Self> {
        let (config, weights) = read_dir(dir)?;
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
        device: &Device,
    ) -> Result<Self> {
        Ok(match kind {
            HeadKind::PreTraining => {
                Self::PreTraining(BertHead::from_weights(weights, config, init, device)?)
            }
            HeadKind::MaskedLM => {
                Self::MaskedLM(BertHead::from_weights(weights, config, init, device)?)
            }
            HeadKind::NextSentencePrediction => {
                Self::NextSentencePrediction(BertHead::from_weights(weights, config, init, device)?)
            }
            HeadKind::SequenceClassification => {
                Self::SequenceClassification(BertHead::from_weights(weights, config, init, device)?)
            }
            HeadKind::TokenClassification => {
                Self::TokenClassification(BertHead::from_weights(weights, config, init, device)?)
            }
            HeadKind::QuestionAnswering => {
                Self::QuestionAnswering(BertHead::from_weights(weights, config, init, device)?)
            }
            HeadKind::MultipleChoice => {
                Self::MultipleChoice(BertHead::from_weights(weights, config, init, device)?)
            }
        })
    }

    pub fn kind(&self) -> HeadKind {
        match self {
            Self::PreTraining(_) => HeadKind::PreTraining,
            Self::MaskedLM(_) => HeadKind::MaskedLM,
            Self::NextSentencePrediction(_) => HeadKind::NextSentencePrediction,
            Self::SequenceClassification(_) => HeadKind::SequenceClassification,
            Self::TokenClassification(_) => HeadKind::TokenClassification,
            Self::QuestionAnswering(_) => HeadKind::QuestionAnswering,
            Self::MultipleChoice(_) => HeadKind::MultipleChoice,
        }
    }

    pub fn bert(&self) -> &BertModel {
        match self {
            Self::PreTraining(m) => m.bert(),
            Self::MaskedLM(m) => m.bert(),
            Self::NextSentencePrediction(m) => m.bert(),
            Self::SequenceClassification(m) => m.bert(),
            Self::TokenClassification(m) => m.bert(),
            Self::QuestionAnswering(m) => m.bert(),
            Self::MultipleChoice(m) => m.bert(),
        }
    }
}

// ---------------------------------------------------------------- losses

/// Integer labels as i64 (they may be any integer or float dtype).
fn label_values(labels: &Tensor, what: &str) -> Result<Vec<i64>> {
    let v = labels
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    v.into_iter()
        .enumerate()
        .map(|(i, x)| {
            if x.fract() != 0.0 || !x.is_finite() {
                Err(Error::Input(format!(
                    "{what}: label {x} at position {i} is not a class id"
                )))
            } else {
                Ok(x as i64)
            }
        })
        .collect()
}

fn float_labels(labels: &Tensor, shape: &[usize], what: &str) -> Result<Tensor> {
    if labels.elem_count() != shape.iter().product::<usize>() {
        return Err(Error::Input(format!(
            "{what}: expected {shape:?} values, got a tensor of shape {:?}",
            labels.dims()
        )));
    }
    Ok(labels.to_dtype(DType::F32)?.reshape(shape)?)
}

/// CE over [B, T, C] logits and [B, T] labels, -100 ignored.
fn token_cross_entropy(logits: &Tensor, labels: &Tensor, what: &str) -> Result<Tensor> {
    let c = logits.dim(D::Minus1)?;
    let rows = logits.elem_count() / c.max(1);
    if labels.elem_count() != rows {
        return Err(Error::Input(format!(
            "{what}: expected {:?} labels, got a tensor of shape {:?}",
            &logits.dims()[..logits.rank() - 1],
            labels.dims()
        )));
    }
    cross_entropy_with_ignore(
        &logits.reshape((rows, c))?,
        &label_values(labels, what)?,
        IGNORE_INDEX,
        what,
    )
}

/// Mean cross-entropy of `logits` [N, C] against class ids, skipping rows
/// labelled `ignore` (PyTorch's `CrossEntropyLoss(ignore_index=...)`).
/// Built from ops with a backward pass. A batch where every row is
/// ignored gives 0 (PyTorch gives NaN), so training can go on.
pub fn cross_entropy_with_ignore(
    logits: &Tensor,
    labels: &[i64],
    ignore: i64,
    what: &str,
) -> Result<Tensor> {
    let (n, c) = logits.dims2()?;
    if labels.len() != n {
        return Err(Error::Input(format!(
            "{what}: expected {n} labels, got {}",
            labels.len()
        )));
    }
    let mut targets = Vec::with_capacity(n);
    let mut keep = Vec::with_capacity(n);
    for (i, &l) in labels.iter().enumerate() {
        if l == ignore {
            targets.push(0u32);
            keep.push(0f32);
        } else if (0..c as i64).contains(&l) {
            targets.push(l as u32);
            keep.push(1f32);
        } else {
            return Err(Error::Input(format!(
                "{what}: label {l} at position {i} is not a class id in 0..{c} (use {ignore} to ignore a position)"
            )));
        }
    }
    let count = keep.iter().filter(|&&k| k > 0.0).count();
    let dev = logits.device();
    let targets = Tensor::from_vec(targets, (n, 1), dev)?;
    let keep = Tensor::from_vec(keep, n, dev)?;
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = log_probs.gather(&targets, 1)?.squeeze(1)?;
    let total = (picked * keep)?.sum_all()?;
    Ok((total.neg()? / count.max(1) as f64)?)
}

/// Mean binary cross-entropy with logits (PyTorch's `BCEWithLogitsLoss`):
/// max(x, 0) - x·y + log(1 + exp(-|x|)).
pub fn bce_with_logits(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let pos = logits.relu()?;
    let xy = (logits * targets)?;
    let softplus = (logits.abs()?.neg()?.exp()? + 1.0)?.log()?;
    Ok(((pos - xy)? + softplus)?.mean_all()?)
}
