//! The BERT encoder, one struct per Hugging Face module, each loaded from
//! the checkpoint names transformers uses (`embeddings.word_embeddings`,
//! `encoder.layer.N.attention.self.query`, ...).
//!
//! [`bert`](self) is the generic model and names no family; `family` holds
//! one file per family member (its tensor names, layers and head names)
//! and the one dispatch on [`Family`](crate::Family); `heads` the task
//! heads behind [`BertHead`]. Imports run one way: heads → family → bert.

mod bert;
pub mod electra_pretraining;
pub(crate) mod family;
mod heads;
mod nn;
pub mod ops;

pub use bert::{
    roberta_position_ids, BertAttention, BertEmbeddings, BertEncoder, BertInput, BertIntermediate,
    BertLayer, BertModel, BertOutput, BertOutputBlock, BertPooler, BertSelfAttention,
    EmbeddingLayout, EncoderOutput, ForwardOptions, LayerPass, LayerStack, PassContext,
    PositionIds, ScoreBias, ScoreInput,
};
pub use family::{log_bucket_position, relative_positions, RelativeContext};
pub use heads::{
    bce_with_logits, cross_entropy_with_ignore, replaced_token_loss, BertForMaskedLM,
    BertForMultipleChoice, BertForNextSentencePrediction, BertForPreTraining,
    BertForQuestionAnswering, BertForSequenceClassification, BertForTask,
    BertForTokenClassification, BertHead, BertLMPredictionHead, DiscriminatorModule,
    ElectraForPreTraining, Head, HeadInit, HeadKind, HeadLabels, HeadModule, HeadOptions,
    HeadOutput, HeadPass, HeadSource, MaskedLmModule, MultipleChoiceModule, NextSentenceModule,
    PreTrainingModule, PreTrainingOutput, QuestionAnsweringModule, QuestionAnsweringOutput,
    SequenceClassificationModule, TaskOutput, TokenClassificationModule, IGNORE_INDEX,
};
pub(crate) use nn::DropoutMask;
pub use nn::{seed_dropout, seed_dropout_rows, BatchRows, Dense, Dropout, LayerNorm};
