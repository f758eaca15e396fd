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

    /// Data-parallel runs (MPI): seconds a process waits for the others in a
    /// collective (steps, evaluation and checkpoints included) before the
    /// whole job is stopped as stalled.
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    pub dist_timeout: u64,

    /// Data-parallel runs: gradients on the wire as `bf16` (half the bytes;
    /// sums rounded to bf16) or `none` (fp32, exact up to summation order).
    #[arg(long, default_value = "none", value_name = "none|bf16")]
    pub grad_compression: bertha::training::Compression,
}

/// The processes of this run: those of the MPI job it was started in
/// (`mpirun -np N`, `srun`; an MPI build), or this one alone.
pub struct Processes {
    #[cfg(feature = "mpi")]
    mpi: Option<std::rc::Rc<bertha::training::mpi::MpiGroup>>,
    compression: bertha::training::Compression,
}

impl Processes {
    /// Joins the MPI job this program runs in (an MPI build started by a
    /// launcher with more than one process); else this process alone.
    pub fn start(args: &RunArgs) -> Result<Self> {
        #[cfg(feature = "mpi")]
        {
            use bertha::training::ProcessGroup;
            let timeout = std::time::Duration::from_secs(args.dist_timeout.max(1));
            let group = bertha::training::mpi::MpiGroup::init(timeout)?;
            if group.size() > 1 {
                if group.rank() == 0 {
                    eprintln!(
                        "data-parallel: {}; each takes its share of every batch",
                        group.describe()
                    );
                }
                return Ok(Self {
                    mpi: Some(std::rc::Rc::new(group)),
                    compression: args.grad_compression,
                });
            }
            Ok(Self {
                mpi: None,
                compression: args.grad_compression,
            })
        }
        #[cfg(not(feature = "mpi"))]
        Ok(Self {
            compression: args.grad_compression,
        })
    }

    /// This process's number (0 prints and writes).
    pub fn rank(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.mpi {
            use bertha::training::ProcessGroup;
            return g.rank();
        }
        0
    }

    /// How many processes train together.
    pub fn size(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.mpi {
            use bertha::training::ProcessGroup;
            return g.size();
        }
        1
    }

    /// Makes `trainer` train over these processes (nothing for one).
    pub fn attach<O: Objective>(&self, trainer: &mut Trainer<O>) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.mpi {
            trainer.set_process_group(g.clone())?;
        }
        trainer.set_gradient_compression(self.compression);
        Ok(())
    }

    /// `result`; in a data-parallel run an error is printed, naming this
    /// process, and ends every process of the job (none waits for this one).
    pub fn settle<T>(&self, result: Result<T>) -> Result<T> {
        #[cfg(feature = "mpi")]
        if let (Err(e), Some(g)) = (&result, &self.mpi) {
            use bertha::training::ProcessGroup;
            // One write, then a moment for the launcher to forward it
            // before the abort ends every process (when all fail together,
            // process 0's message is the one to read: the others wait longer).
            let line = format!("error: process {}: {}\n", g.rank(), crate::render_error(e));
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            let pause = if g.rank() == 0 { 300 } else { 1500 };
            std::thread::sleep(std::time::Duration::from_millis(pause));
            g.abort(1);
        }
        result
    }
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

/// The wording of `finetune`'s runs, whatever the task.
pub const FINETUNE_WORDING: Wording = Wording {
    step: finetune_step_line,
    eval: eval_line,
    best: best_line,
    no_better: "better dev score",
};

fn finetune_step_line(m: &StepMetrics) -> String {
    format!(
        "epoch {:.2} loss {:.4} lr {:.2e} {:.0} tok/s",
        m.epoch, m.loss, m.lr, m.tokens_per_s
    )
}

/// Continues `trainer` from `from` (a checkpoint folder, or the newest
/// checkpoint-N of an output folder) when given, and says so.
pub fn resume<O: Objective>(trainer: &mut Trainer<O>, from: Option<&Path>) -> Result<()> {
    if let Some(dir) = from {
        let ck = Checkpoint::find(dir)?;
        trainer.resume(&ck)?;
        if trainer.rank() == 0 {
            eprintln!("resumed from {} at step {}", ck.display(), trainer.step());
        }
    }
    Ok(())
}

/// Runs `trainer` to its last step behind a progress bar, printing its
/// events as `wording` says.
pub fn run<O: Objective>(trainer: &mut Trainer<O>, wording: &Wording) -> Result<()> {
    let bar = if trainer.rank() == 0 {
        training_bar(trainer.total_steps(), trainer.step())
    } else {
        indicatif::ProgressBar::hidden()
    };
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
