//! The BERT encoder, one struct per Hugging Face module, each loaded from
//! the checkpoint names transformers uses (`embeddings.word_embeddings`,
//! `encoder.layer.N.attention.self.query`, ...).

mod albert;
mod attention;
mod bert;
mod deberta_v2;
mod distilbert;
mod embeddings;
mod encoder;
mod heads;
mod layer;
mod nn;
pub mod ops;
mod pooler;

pub use attention::{BertAttention, BertSelfAttention};
pub use bert::{BertInput, BertModel, BertOutput, ForwardOptions};
pub use deberta_v2::{log_bucket_position, relative_positions, RelativeContext};
pub use embeddings::{roberta_position_ids, BertEmbeddings, PositionIds};
pub use encoder::BertEncoder;
pub use heads::{
    bce_with_logits, cross_entropy_with_ignore, BertForMaskedLM, BertForMultipleChoice,
    BertForNextSentencePrediction, BertForPreTraining, BertForQuestionAnswering,
    BertForSequenceClassification, BertForTask, BertForTokenClassification, BertHead,
    BertLMPredictionHead, HeadInit, HeadKind, HeadOutput, PreTrainingOutput,
    QuestionAnsweringOutput, IGNORE_INDEX,
};
pub use layer::{BertIntermediate, BertLayer, BertOutputBlock};
pub use nn::{seed_dropout, Dense, Dropout, LayerNorm};
pub use pooler::BertPooler;
