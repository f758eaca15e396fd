//! The values of the common `config.json` keys that are names:
//! `hidden_act`, `problem_type`, and bertha's `norm_position`.

/// The feed-forward non-linearity (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact, erf-based GELU.
    Gelu,
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    /// `relu`.
    Relu,
    /// `tanh`: not a `hidden_act` bertha reads, but RoBERTa's
    /// classification head (`classifier.dense` → tanh).
    Tanh,
}

impl Activation {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Some(Self::GeluTanh),
            "relu" => Some(Self::Relu),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Gelu => "gelu",
            Self::GeluTanh => "gelu_new",
            Self::Relu => "relu",
            Self::Tanh => "tanh",
        }
    }
}

/// How a sequence-classification head computes its loss (`problem_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemType {
    /// One label per text: cross-entropy over softmax.
    SingleLabelClassification,
    /// Any number of labels per text: binary cross-entropy over sigmoids.
    MultiLabelClassification,
    /// Real-valued targets: mean squared error.
    Regression,
}

impl ProblemType {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "single_label_classification" => Some(Self::SingleLabelClassification),
            "multi_label_classification" => Some(Self::MultiLabelClassification),
            "regression" => Some(Self::Regression),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::SingleLabelClassification => "single_label_classification",
            Self::MultiLabelClassification => "multi_label_classification",
            Self::Regression => "regression",
        }
    }
}

/// Where each block's LayerNorm sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPosition {
    /// BERT: `x = LN(x + sublayer(x))`.
    Post,
    /// The seed's mini BERT: `x = x + sublayer(LN(x))`.
    Pre,
}
