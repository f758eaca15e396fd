//! The BERT encoder, one struct per Hugging Face module, each loaded from
//! the checkpoint names transformers uses (`embeddings.word_embeddings`,
//! `encoder.layer.N.attention.self.query`, ...).

mod attention;
mod bert;
mod embeddings;
mod encoder;
mod heads;
mod layer;
mod nn;
mod packed;
mod pooler;

pub use attention::{BertAttention, BertSelfAttention};
pub use bert::{BertInput, BertModel, BertOutput, ForwardOptions};
pub use embeddings::BertEmbeddings;
pub use encoder::BertEncoder;
pub use heads::{
    bce_with_logits, cross_entropy_with_ignore, BertForMaskedLM, BertForMultipleChoice,
    BertForNextSentencePrediction, BertForPreTraining, BertForQuestionAnswering,
    BertForSequenceClassification, BertForTask, BertForTokenClassification, BertHead,
    BertLMPredictionHead, HeadInit, HeadKind, HeadOutput, PreTrainingOutput,
    QuestionAnsweringOutput, IGNORE_INDEX,
};
pub use layer::{BertIntermediate, BertLayer, BertOutputBlock};
pub use nn::{Dense, Dropout, LayerNorm};
pub use packed::{PackedBert, PackedStates};
pub use pooler::BertPooler;
