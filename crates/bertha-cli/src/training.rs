//! What the training commands (`pretrain`, `finetune`) share: resuming a
//! run, its progress bar, a line per evaluation, save, best model and early
//! stop, and the closing line. Each command only words its own figures.

use std::path::{Path, PathBuf};

use anyhow::Result;
use bertha::training::checkpoint::Checkpoint;
use bertha::training::{EvalMetrics, Event, Objective, StepMetrics, Trainer};

/// What a training command does with its output folder.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Continue a run from a checkpoint folder (or the newest checkpoint-N
    /// of an output folder), with the same data and options.
    #[arg(long)]
    pub resume: Option<PathBuf>,

    /// Replace the metrics, checkpoints and best/ of another run in --out
    /// (a fresh run refuses such a folder).
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,

    /// With --resume: what this run may change from the checkpoint's run
    /// (option names such as lr,steps,batch_size; data; config); any other
    /// change is refused.
    #[arg(long, value_delimiter = ',', value_name = "NAMES", requires = "resume")]
    pub allow_changes: Vec<String>,
}

/// How one training command words its events.
pub struct Wording {
    /// The bar's message after a step.
    pub step: fn(&StepMetrics) -> String,
    /// The line for an evaluation.
    pub eval: fn(&EvalMetrics) -> String,
    /// The line for a new best model (saved to `best/`).
    pub best: fn(&EvalMetrics) -> String,
    /// What early stopping waited for in vain, e.g. `better dev score`.
    pub no_better: &'static str,
}

/// Continues `trainer` from `from` (a checkpoint folder, or the newest
/// checkpoint-N of an output folder) when given, and says so.
pub fn resume<O: Objective>(trainer: &mut Trainer<O>, from: Option<&Path>) -> Result<()> {
    if let Some(dir) = from {
        let ck = Checkpoint::find(dir)?;
        trainer.resume(&ck)?;
        eprintln!("resumed from {} at step {}", ck.display(), trainer.step());
    }
    Ok(())
}

/// Runs `trainer` to its last step behind a progress bar, printing its
/// events as `wording` says.
pub fn run<O: Objective>(trainer: &mut Trainer<O>, wording: &Wording) -> Result<()> {
    let bar = training_bar(trainer.total_steps(), trainer.step());
    trainer.run(|event| match event {
        Event::Step(m) => {
            bar.set_position(m.step);
            bar.set_message((wording.step)(m));
        }
        Event::Eval(e) => bar.println((wording.eval)(e)),
        Event::Best(e) => bar.println((wording.best)(e)),
        Event::Saved(dir) => bar.println(format!("saved {}", dir.display())),
        Event::EarlyStop { step, best_step } => bar.println(format!(
            "early stop at step {step}: no {} since step {best_step}",
            wording.no_better
        )),
    })?;
    bar.finish_and_clear();
    Ok(())
}

/// The line for a dev evaluation: its loss and every score.
pub fn eval_line(e: &EvalMetrics) -> String {
    format!(
        "step {} (epoch {:.2}): dev loss {:.4}, {}",
        e.step,
        e.epoch,
        e.eval_loss,
        e.scores
            .iter()
            .map(|(k, v)| format!("{k} {v:.4}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The line for a new best model.
pub fn best_line(e: &EvalMetrics) -> String {
    format!(
        "step {}: best {} so far ({:.4}), saved to best/",
        e.step,
        e.metric,
        e.main()
    )
}

/// The closing line: where the model and its metrics are.
pub fn report_done(out: &Path) {
    eprintln!(
        "done: model in {}, metrics in {}",
        out.display(),
        out.join("metrics.jsonl").display()
    );
}

/// The progress bar of a training run: `total` steps, `at` done (a
/// resumed run starts part-way), the step's figures as its message.
fn training_bar(total: u64, at: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_position(at);
    bar
}
