//! Fine-tuning data and metrics: readers for classification files (GLUE
//! TSV / CSV / JSONL), CoNLL NER files and SQuAD JSON; the word-piece
//! label alignment and SQuAD windows of transformers' example scripts; and
//! the metrics those tasks are reported with.

pub mod classification;
pub mod conll;
pub mod labels;
pub mod metrics;
pub mod squad;

pub use classification::{
    BadRow, ClassificationData, ClassificationExample, Columns, FileFormat, LabelKind, LabelValue,
    ReadOptions,
};
pub use conll::{
    iob1_to_iob2, ner_label_set, AlignedSentence, ConllOptions, NerAligner, NerData, NerSentence,
    IGNORE_INDEX,
};
pub use labels::LabelSet;
pub use metrics::{EntityScores, Prf, SquadScores};
pub use squad::{
    postprocess, FeatureOptions, PostprocessOptions, SquadAnswer, SquadData, SquadExample,
    SquadFeature, SquadFeaturizer, SquadPrediction,
};
