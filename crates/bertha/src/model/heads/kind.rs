//! The head classes by their transformers names, and what each needs
//! from a checkpoint.

use crate::config::{BertConfig, Family};
use crate::model::family::layout;

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
    /// ELECTRA's discriminator (`ElectraForPreTraining`).
    ReplacedTokenDetection,
}

impl HeadKind {
    pub const ALL: [HeadKind; 8] = [
        HeadKind::PreTraining,
        HeadKind::MaskedLM,
        HeadKind::NextSentencePrediction,
        HeadKind::SequenceClassification,
        HeadKind::TokenClassification,
        HeadKind::QuestionAnswering,
        HeadKind::MultipleChoice,
        HeadKind::ReplacedTokenDetection,
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
            // ELECTRA's own: its `ForPreTraining` is not BERT's.
            Self::ReplacedTokenDetection => "ElectraForPreTraining",
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
            Self::SequenceClassification => layout(family).classifier_reads_pooler(),
            Self::MultipleChoice => {
                let l = layout(family);
                l.has_multiple_choice() && l.multiple_choice_reads_pooler()
            }
            _ => false,
        }
    }

    /// Whether bertha has this head for this family member.
    pub fn supported_by(self, family: &Family) -> bool {
        match self {
            Self::ReplacedTokenDetection => matches!(family, Family::Electra(_)),
            Self::PreTraining | Self::NextSentencePrediction => layout(family).has_next_sentence(),
            Self::MultipleChoice => layout(family).has_multiple_choice(),
            _ => true,
        }
    }

    /// transformers' class name for this head in `family`
    /// (`RobertaForMaskedLM`).
    pub fn class_name(self, family: &Family) -> String {
        let arch = self.architecture();
        if self == Self::ReplacedTokenDetection {
            return arch.to_string();
        }
        format!(
            "{}{}",
            family.class_prefix(),
            arch.strip_prefix("Bert").unwrap_or(arch)
        )
    }

    /// The head of a class name of any family member.
    pub fn from_any_architecture(name: &str) -> Option<Self> {
        if name == Self::ReplacedTokenDetection.architecture() {
            return Some(Self::ReplacedTokenDetection);
        }
        [
            "Bert",
            "Roberta",
            "DistilBert",
            "Albert",
            "DebertaV2",
            "Electra",
            "ModernBert",
        ]
        .iter()
        .find_map(|p| {
            let rest = name.strip_prefix(p)?;
            Self::ALL
                .into_iter()
                .find(|k| k.architecture().strip_prefix("Bert") == Some(rest))
        })
    }

    /// The first tensor of this head (or of the pooler it reads) that
    /// `weights` lack, by its checkpoint name; `None` when the checkpoint
    /// has the head. What loading with [`super::HeadInit::FromCheckpoint`]
    /// checks, for callers that explain a missing head in their own words.
    pub fn missing_tensor(
        self,
        weights: &crate::io::weights::Weights,
        config: &BertConfig,
    ) -> Option<String> {
        let base = weights
            .base_prefix(config.family.prefix())
            .unwrap_or_default();
        self.head_tensors(&base, config)
            .into_iter()
            .find(|n| !weights.contains(n))
    }

    /// The tensors (relative to the checkpoint root) that the head itself
    /// owns; `base` is the encoder's prefix (`"bert."` or `""`).
    pub(super) fn head_tensors(self, base: &str, config: &BertConfig) -> Vec<String> {
        let family = &config.family;
        let m = layout(family).mlm_names(config);
        let mlm: Vec<String> = [(m.dense, m.biases.dense), (m.norm, m.biases.norm)]
            .iter()
            .flat_map(|&(n, bias)| {
                let parts: &[&str] = if bias {
                    &["weight", "bias"]
                } else {
                    &["weight"]
                };
                parts.iter().map(move |w| format!("{}{n}.{w}", m.root))
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
            Self::SequenceClassification => layout(family)
                .sequence_classifier()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Self::TokenClassification => classifier.iter().map(|s| s.to_string()).collect(),
            Self::MultipleChoice => {
                // ELECTRA's `sequence_summary` layer, when it has one.
                let summary = config
                    .sequence_summary(std::path::Path::new("config.json"))
                    .is_ok_and(|s| s.is_some_and(|s| s.projection));
                let summary = summary.then_some([
                    "sequence_summary.summary.weight",
                    "sequence_summary.summary.bias",
                ]);
                summary
                    .into_iter()
                    .flatten()
                    .chain(classifier)
                    .map(|s| s.to_string())
                    .collect()
            }
            Self::QuestionAnswering => {
                let name = layout(family).qa_outputs();
                vec![format!("{name}.weight"), format!("{name}.bias")]
            }
            Self::ReplacedTokenDetection => ["dense", "dense_prediction"]
                .iter()
                .flat_map(|n| {
                    ["weight", "bias"]
                        .iter()
                        .map(move |w| format!("discriminator_predictions.{n}.{w}"))
                })
                .collect(),
        };
        if self.uses_pooler_in(family) {
            let dense = layout(family).pooler_dense();
            names.push(format!("{base}{dense}.weight"));
            names.push(format!("{base}{dense}.bias"));
        }
        names
    }

    /// Whether a checkpoint saved as head `saved` holds tensors under this
    /// head's names that mean something else: a sequence classifier's
    /// `classifier.weight` is not a token classifier's, though the names
    /// are the same. Loading this head from it would give answers from
    /// the wrong weights. `ForPreTraining` holds the MLM and NSP heads
    /// themselves, so these agree with it.
    pub(super) fn conflicts_with(self, saved: HeadKind, base: &str, config: &BertConfig) -> bool {
        use HeadKind::{MaskedLM, NextSentencePrediction, PreTraining};
        let same_module = self == saved
            || matches!(
                (self, saved),
                (PreTraining, MaskedLM | NextSentencePrediction)
                    | (MaskedLM | NextSentencePrediction, PreTraining)
            );
        if same_module {
            return false;
        }
        // The pooler is the encoder's, shared by every head that reads it.
        let own = |k: HeadKind| {
            let mut names = k.head_tensors(base, config);
            names.retain(|n| !n.contains("pooler."));
            names
        };
        let theirs = own(saved);
        own(self).iter().any(|n| theirs.contains(n))
    }

    /// Name prefixes a fresh initialisation may fill in.
    pub(super) fn fresh_prefixes(self, base: &str, config: &BertConfig) -> Vec<String> {
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
        p.extend(
            layout(&config.family)
                .fresh_prefixes()
                .iter()
                .map(|s| s.to_string()),
        );
        if self.uses_pooler_in(&config.family) {
            p.push(format!("{base}pooler."));
        }
        p
    }
}

impl std::fmt::Display for HeadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.architecture())
    }
}
