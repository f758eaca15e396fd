//! Training: one loop ([`Trainer`]) for every [`Objective`] — MLM (+NSP)
//! and ELECTRA pre-training, classification / NER / QA fine-tuning, sentence-
//! embedding training and cross-encoder (reranker) training — with its
//! plan (steps, warmup, data order), parameters, AdamW, schedule, metrics
//! and checkpoints.
//!
//! Every random draw (initialisation, data order, masks, dropout) comes
//! from a generator seeded by `(seed, purpose, step)` ([`crate::rng`]), so a
//! run resumed from a checkpoint repeats the losses of an uninterrupted one
//! exactly.

pub mod checkpoint;
pub mod distributed;
pub mod electra;
pub mod embedding;
pub mod embedding_loss;
pub mod finetune;
pub mod log;
pub mod loop_options;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod objective;
pub mod optim;
pub mod params;
pub mod plan;
pub mod presets;
pub mod pretrain;
pub mod rerank;
pub mod rerank_loss;
pub mod run_dir;
pub mod schedule;
pub mod trainer;

pub use checkpoint::{Checkpoint, TrainerState};
pub use distributed::{Compression, ProcessGroup, SingleProcess};
pub use electra::{ElectraPretrainer, ElectraRunOptions, ElectraTraining};
pub use embedding::{EmbeddingOptions, EmbeddingTrainer, EmbeddingTraining};
pub use embedding_loss::{EmbeddingLoss, LossKind};
pub use finetune::{FinetuneOptions, Finetuner, Finetuning};
pub use log::{EvalMetrics, Event, StepMetrics};
pub use optim::{AdamW, AdamWConfig};
pub use params::ParamStore;
pub use plan::{RunLength, TrainPlan, Warmup};
pub use presets::Preset;
pub use pretrain::{PretrainData, PretrainOptions, Pretrainer, Pretraining};
pub use rerank::{RerankOptions, RerankTrainer, RerankTraining};
pub use rerank_loss::RerankLoss;
pub use schedule::{LrSchedule, ScheduleKind};
pub use trainer::{
    Engine, GradientHook, Gradients, LoopOptions, LossPart, MainMetric, MeanLoss, MicroStep,
    ModelSetup, Objective, Scores, Slice, Tally, Trainer, EVAL_RESULTS_FILE,
};
