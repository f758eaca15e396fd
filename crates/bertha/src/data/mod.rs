//! Training and evaluation data: pre-training corpora (packing, masking,
//! WordPiece vocabularies) and the fine-tuning readers for classification
//! files (GLUE TSV / CSV / JSONL), CoNLL NER files and SQuAD JSON, with
//! the word-piece label alignment and SQuAD windows of transformers'
//! example scripts, and the task inputs built from them; and
//! sentence-embedding pairs (texts with hard negatives, scored pairs, STS
//! Benchmark originals) with their STS / retrieval evaluation; and
//! reranking data (labelled pairs, tuples, lists); and multiple-choice
//! data (SWAG's columns).

pub mod choices;
pub mod classification;
pub mod conll;
pub mod corpus;
pub mod corpus_read;
pub mod labels;
pub mod masking;
pub mod packing;
pub mod pairs;
pub mod prepare;
pub mod prepared;
pub mod rerank;
pub mod squad;
pub mod task_data;
pub mod vocab;

pub use choices::{ChoiceData, ChoiceExample};
pub use classification::{
    BadRow, ClassificationData, ClassificationExample, Columns, FileFormat, LabelKind, LabelValue,
    ReadOptions,
};
pub use conll::{
    iob1_to_iob2, ner_label_set, AlignedSentence, ConllOptions, NerAligner, NerData, NerSentence,
};
pub use corpus::{Corpus, CorpusOptions, Example, Sequences};
pub use labels::LabelSet;
pub use masking::{MaskSplit, Masker};
pub use pairs::{EmbeddingData, EmbeddingEval, PairColumns, PairLayout, PairOptions};
pub use prepare::{prepare_corpus, PrepareOptions};
pub use prepared::PreparedCorpus;
pub use rerank::{RerankData, RerankGroup, RerankLayout};
pub use squad::{
    postprocess, FeatureOptions, PostprocessOptions, SquadAnswer, SquadData, SquadExample,
    SquadFeature, SquadFeaturizer, SquadPrediction,
};
pub use task_data::{DataOptions, Target, Task, TaskData, TaskInput, TaskInputBuilder, TaskInputs};
