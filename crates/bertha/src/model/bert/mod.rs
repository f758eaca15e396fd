//! Generic BERT, one struct per Hugging Face module (`embeddings`,
//! `encoder.layer.N.attention.self`, ...), as transformers'
//! `modeling_bert.py`. Nothing here names a family: a family changes
//! tensor names through the `load_*` constructors and plugs its own
//! attention scores in through [`ScoreBias`] and [`PassContext`].

mod attention;
mod embeddings;
mod encoder;
mod layer;
mod model;
mod pooler;

pub use attention::{BertAttention, BertSelfAttention, LayerPass, ScoreBias, ScoreInput};
pub use embeddings::{roberta_position_ids, BertEmbeddings, EmbeddingLayout, PositionIds};
pub use encoder::{BertEncoder, EncoderOutput, LayerStack, PassContext};
pub use layer::{BertIntermediate, BertLayer, BertOutputBlock};
pub(crate) use model::read_model_dir;
pub use model::{BertInput, BertModel, BertOutput, ForwardOptions};
pub use pooler::BertPooler;
