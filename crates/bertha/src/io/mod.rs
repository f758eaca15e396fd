//! Everything read from disk: model folders ([`ModelDir`]), their weights
//! and tokenizer, and the user's texts and tables.

pub mod model_dir;
pub mod quantized;
pub mod st_folder;
pub mod texts;
pub mod tokenizer;
pub mod weights;

pub use model_dir::ModelDir;
pub use st_folder::SentenceTransformerSpec;
