//! What users do with an encoder: one module per task.

pub mod attention;
pub mod classify;
pub mod embed;
pub mod fill_mask;
pub mod finetuned;
pub mod negatives;
pub mod ner;
pub mod nsp;
mod pipeline;
mod precision;
pub mod qa;
pub mod rerank;
mod side_by_side;

pub use attention::{AttentionMaps, AttentionModel};
pub use classify::{Classifier, LabelScore, ScoreFunction};
pub use embed::{
    cosine_similarity_matrix, EmbedOptions, Embedder, EncodeOptions, Prompt, TokenEmbeddings,
};
pub use fill_mask::{FillMask, MaskPrediction};
pub use finetuned::{
    ChoicePrediction, ClassPrediction, Evaluation, FinetunedModel, InferenceOptions, Predictions,
    TRAINING_ARGS_FILE,
};
pub use negatives::{mine_hard_negatives, Mined, MiningOptions, Sampling};
pub use ner::{Aggregation, Entity, TokenClassifier};
pub use nsp::{NextSentence, NextSentenceScore};
pub use precision::PipelineOptions;
pub use qa::{Answer, QaBounds, QaOptions, QuestionAnswerer};
pub use rerank::{Activation, CrossEncoder, CrossEncoderOptions, Ranked};
