//! Training: the data, masking, parameters, optimiser, schedule, loop and
//! checkpoints of MLM (+NSP) pre-training, and the fine-tuning loop of the
//! task heads (classification, NER, QA) on the same engine.
//!
//! Every random draw (initialisation, data order, masks, dropout) comes
//! from a generator seeded by `(seed, step)`, so a run resumed from a
//! checkpoint repeats the losses of an uninterrupted one exactly.

pub mod checkpoint;
pub mod data;
pub mod finetune;
pub mod masking;
pub mod optim;
pub mod params;
pub mod presets;
pub mod pretrain;
pub mod schedule;
pub mod vocab;

pub use checkpoint::{Checkpoint, TrainerState};
pub use data::{Corpus, CorpusOptions, Example};
pub use finetune::{
    DataOptions, Evaluation, FinetuneOptions, FinetunedModel, Finetuner, InferenceOptions,
    Predictions, Task, TaskData,
};
pub use masking::{MaskSplit, Masker};
pub use optim::{AdamW, AdamWConfig};
pub use params::ParamStore;
pub use presets::Preset;
pub use pretrain::{PretrainOptions, Pretrainer, StepMetrics};
pub use schedule::{LrSchedule, ScheduleKind};

use rand::rngs::StdRng;
use rand::SeedableRng;

/// A generator for one purpose at one step: the same `(seed, purpose,
/// step)` always gives the same stream, whatever happened before.
pub fn rng_for(seed: u64, purpose: u64, step: u64) -> StdRng {
    let mut x = seed
        ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ step.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    // splitmix64 finaliser: nearby inputs give unrelated seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    StdRng::seed_from_u64(x ^ (x >> 31))
}
