//! Helpers of the fine-tuning tests (`tests/finetune.rs` and
//! `tests/finetune_loop.rs`): short runs of the tiny checkpoints on a few
//! examples written to a temporary folder. Their `SENTIMENT` is six
//! examples of two of the checkpoint's three labels (`runs::SENTIMENT`
//! adds a neutral one).

use std::path::{Path, PathBuf};

use bertha::data::{DataOptions, Task};
use bertha::training::{Event, FinetuneOptions, Finetuner, StepMetrics};
use bertha::Tensor;

pub fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

/// A short, fast run: the tiny models take 64 tokens at most.
pub fn options(out: &Path) -> FinetuneOptions {
    FinetuneOptions {
        epochs: 10.0,
        lr: 5e-3,
        batch_size: 2,
        eval_batch_size: 64,
        max_length: 32,
        doc_stride: 8,
        warmup_ratio: 0.1,
        weight_decay: 0.01,
        seed: 0,
        out: out.to_path_buf(),
        ..FinetuneOptions::default()
    }
}

/// A run of `task` on `model` trained and scored on `data` (the same file).
pub fn trainer(task: Task, model: &Path, data: &Path, opts: FinetuneOptions) -> Finetuner {
    Finetuner::new(task, model, data, Some(data), &DataOptions::default(), opts).unwrap()
}

pub fn run(t: &mut Finetuner) -> (Vec<StepMetrics>, Vec<Event>) {
    let mut steps = Vec::new();
    let mut events = Vec::new();
    t.run(|e| {
        if let Event::Step(m) = e {
            steps.push(m.clone());
        } else {
            events.push(e.clone());
        }
    })
    .unwrap();
    (steps, events)
}

pub fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

pub const SENTIMENT: &str = "sentence\tlabel\n\
    the album was very good\tpositive\n\
    i love this great song\tpositive\n\
    the best film of the year\tpositive\n\
    a bad and dark story\tnegative\n\
    the game was lost again\tnegative\n\
    nothing was good about the war\tnegative\n";
