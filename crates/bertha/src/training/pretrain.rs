//! The pre-training loop: masked LM (+ next-sentence prediction) on a
//! packed corpus with AdamW, a warmup schedule, clipping, accumulation,
//! held-out evaluation and atomic checkpoints that resume exactly.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Module, Tensor, D};
use rand::seq::SliceRandom;

use super::checkpoint::{Checkpoint, CheckpointParts, TrainerState};
use super::data::{Corpus, Example};
use super::masking::{Masker, IGNORE};
use super::optim::{AdamW, AdamWConfig, GradAccumulator};
use super::params::ParamStore;
use super::rng_for;
use super::schedule::LrSchedule;
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::Weights;
use crate::model::{
    cross_entropy_with_ignore, seed_dropout, BertForMaskedLM, BertForPreTraining, BertHead,
    BertInput, BertModel, ForwardOptions,
};

/// Purposes of the per-step generators.
const SHUFFLE: u64 = 1;
const MASK: u64 = 2;
const DROPOUT: u64 = 3;
const EVAL_MASK: u64 = 4;

#[derive(Debug, Clone, serde::Serialize)]
pub struct PretrainOptions {
    pub batch_size: usize,
    pub grad_accum: usize,
    pub total_steps: u64,
    pub warmup_steps: u64,
    pub schedule: super::ScheduleKind,
    pub lr: f64,
    #[serde(skip)]
    pub adamw: AdamWConfig,
    pub weight_decay: f64,
    pub seed: u64,
    pub nsp: bool,
    /// Evaluate the held-out set every N steps (and at the end).
    pub eval_every: Option<u64>,
    /// Write `checkpoint-N` every N steps (and at the end).
    pub save_every: Option<u64>,
    pub out: PathBuf,
}

/// One optimiser step's figures (a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    pub loss: f64,
    pub mlm_loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsp_loss: Option<f64>,
    pub mlm_accuracy: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

/// A held-out evaluation (also a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalMetrics {
    pub step: u64,
    pub eval_mlm_loss: f64,
    pub eval_perplexity: f64,
    pub eval_mlm_accuracy: f64,
}

/// What the loop reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    Step(StepMetrics),
    Eval(EvalMetrics),
    Saved(PathBuf),
}

enum Heads {
    Mlm(BertForMaskedLM),
    PreTraining(BertForPreTraining),
}

impl Heads {
    fn bert(&self) -> &BertModel {
        match self {
            Heads::Mlm(m) => m.bert(),
            Heads::PreTraining(m) => m.bert(),
        }
    }

    fn predictions(&self) -> &crate::model::BertLMPredictionHead {
        match self {
            Heads::Mlm(m) => m.predictions(),
            Heads::PreTraining(m) => m.predictions(),
        }
    }
}

/// Sums over one batch, before averaging.
#[derive(Debug, Default, Clone, Copy)]
struct BatchFigures {
    mlm_loss: f64,
    nsp_loss: Option<f64>,
    masked: usize,
    correct: usize,
    tokens: usize,
}

pub struct Pretrainer {
    config: BertConfig,
    heads: Heads,
    params: ParamStore,
    optim: AdamW,
    schedule: LrSchedule,
    masker: Masker,
    train: Corpus,
    eval: Corpus,
    opts: PretrainOptions,
    pad_id: u32,
    tokenizer_source: PathBuf,
    device: Device,
    step: u64,
    history: Vec<StepMetrics>,
    evals: Vec<EvalMetrics>,
    /// The current epoch's reading order, drawn once per epoch.
    order: std::cell::RefCell<(u64, Vec<usize>)>,
}

impl Pretrainer {
    /// A model for `config` with the MLM head (and NSP with `opts.nsp`),
    /// initialised from `init` when given (continued pre-training), else
    /// freshly from the seed.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mut config: BertConfig,
        init: Option<Weights>,
        masker: Masker,
        train: Corpus,
        eval: Corpus,
        opts: PretrainOptions,
        pad_id: u32,
        tokenizer_source: &Path,
    ) -> Result<Self> {
        if train.is_empty() {
            return Err(Error::Input("the training corpus gave no sequences".into()));
        }
        if opts.batch_size == 0 || opts.grad_accum == 0 {
            return Err(Error::Input(
                "--batch-size and --grad-accum must be at least 1".into(),
            ));
        }
        if opts.batch_size * opts.grad_accum > train.len() {
            return Err(Error::Input(format!(
                "a step needs {} sequences (--batch-size × --grad-accum) but the corpus gave {}",
                opts.batch_size * opts.grad_accum,
                train.len()
            )));
        }
        if opts.nsp && !config.add_pooling_layer {
            return Err(Error::Input(
                "--nsp needs a pooler, but the config has add_pooling_layer false".into(),
            ));
        }
        let device = Device::Cpu;
        config.architectures = vec![if opts.nsp {
            "BertForPreTraining".into()
        } else {
            "BertForMaskedLM".into()
        }];
        let prefix = format!("{}.", config.family.prefix());
        let (mut params, vb) = ParamStore::builder(init, &prefix, opts.seed, &device);
        let heads = if opts.nsp {
            Heads::PreTraining(BertForPreTraining::load(vb, config.clone())?)
        } else {
            Heads::Mlm(BertForMaskedLM::load(vb, config.clone())?)
        };
        params.freeze()?;
        let schedule = LrSchedule {
            peak: opts.lr,
            warmup: opts.warmup_steps,
            total: opts.total_steps,
            kind: opts.schedule,
        };
        let optim = AdamW::new(AdamWConfig {
            weight_decay: opts.weight_decay,
            ..opts.adamw
        });
        Ok(Self {
            config,
            heads,
            params,
            optim,
            schedule,
            masker,
            train,
            eval,
            opts,
            pad_id,
            tokenizer_source: tokenizer_source.to_path_buf(),
            device,
            step: 0,
            history: Vec::new(),
            evals: Vec::new(),
            order: std::cell::RefCell::new((u64::MAX, Vec::new())),
        })
    }

    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Continues from a checkpoint written by this loop.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let ck = Checkpoint::load(dir)?;
        self.params
            .load(&ck.model, &ck.dir.join(super::checkpoint::MODEL_FILE))?;
        self.optim.load_state(ck.state.step, &ck.optimizer)?;
        if ck.state.seed != self.opts.seed {
            tracing::warn!(
                "resuming a run seeded {} with --seed {}: the data order and masks will differ",
                ck.state.seed,
                self.opts.seed
            );
        }
        self.step = ck.state.step;
        // Metrics after the checkpoint belong to the abandoned run.
        let metrics = self.opts.out.join("metrics.jsonl");
        (self.history, self.evals) = super::checkpoint::rewind_metrics(&metrics, self.step)?;
        Ok(())
    }

    /// The examples of micro-batch `index` (counted over the whole run):
    /// each epoch reads the corpus in its own seeded order.
    fn micro_batch(&self, index: u64) -> Vec<&Example> {
        let bs = self.opts.batch_size;
        let per_epoch = (self.train.len() / bs) as u64;
        let epoch = index / per_epoch;
        let within = (index % per_epoch) as usize;
        let mut cached = self.order.borrow_mut();
        if cached.0 != epoch {
            let mut order: Vec<usize> = (0..self.train.len()).collect();
            order.shuffle(&mut rng_for(self.opts.seed, SHUFFLE, epoch));
            *cached = (epoch, order);
        }
        cached.1[within * bs..(within + 1) * bs]
            .iter()
            .map(|&i| &self.train.examples[i])
            .collect()
    }

    /// Masks, runs and scores one batch; the loss tensor is the batch's
    /// mean MLM loss (+ NSP loss).
    fn run_batch(
        &self,
        batch: &[&Example],
        mask_rng_of: impl Fn(usize) -> rand::rngs::StdRng,
        train: bool,
    ) -> Result<(Option<Tensor>, BatchFigures)> {
        let mut ids = Vec::with_capacity(batch.len());
        let mut types = Vec::with_capacity(batch.len());
        let mut labels: Vec<Vec<i64>> = Vec::with_capacity(batch.len());
        for (i, ex) in batch.iter().enumerate() {
            let masked = self.masker.mask(&ex.input_ids, &mut mask_rng_of(i));
            ids.push(masked.input_ids);
            types.push(ex.token_type_ids.clone());
            labels.push(masked.labels);
        }
        let t = ids.iter().map(Vec::len).max().unwrap_or(0);
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let input = BertInput::from_ids(&ids, &types, self.pad_id, &self.device)?;
        let out = self.heads.bert().forward(
            &input,
            ForwardOptions {
                train,
                ..ForwardOptions::default()
            },
        )?;
        // Only masked positions go through the vocabulary-sized decoder:
        // the same loss as transformers' (mean over masked tokens) at a
        // fraction of the cost.
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (b, l) in labels.iter().enumerate() {
            for (j, &y) in l.iter().enumerate() {
                if y != IGNORE {
                    rows.push((b * t + j) as u32);
                    targets.push(y);
                }
            }
        }
        let mut fig = BatchFigures {
            masked: rows.len(),
            tokens,
            ..BatchFigures::default()
        };
        let mut loss: Option<Tensor> = None;
        if !rows.is_empty() {
            let d = self.config.hidden_size;
            let hidden = out.last_hidden_state.reshape((batch.len() * t, d))?;
            let idx = Tensor::from_vec(rows, fig.masked, &self.device)?;
            let picked = hidden.index_select(&idx, 0)?;
            let logits = self.heads.predictions().forward(&picked)?;
            let mlm = cross_entropy_with_ignore(&logits, &targets, IGNORE, "labels")?;
            fig.mlm_loss = mlm.to_scalar::<f32>()? as f64;
            let pred = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            fig.correct = pred
                .iter()
                .zip(&targets)
                .filter(|(p, y)| i64::from(**p) == **y)
                .count();
            loss = Some(mlm);
        }
        if let Heads::PreTraining(m) = &self.heads {
            let nsp_labels: Vec<i64> = batch
                .iter()
                .map(|e| e.next_sentence_label.map_or(IGNORE, i64::from))
                .collect();
            let pooled = out
                .pooler_output
                .as_ref()
                .ok_or_else(|| Error::Input("NSP needs the pooler output".into()))?;
            let logits = m.seq_relationship().forward(pooled)?;
            let nsp =
                cross_entropy_with_ignore(&logits, &nsp_labels, IGNORE, "next_sentence_label")?;
            fig.nsp_loss = Some(nsp.to_scalar::<f32>()? as f64);
            loss = Some(match loss {
                Some(l) => l.add(&nsp)?,
                None => nsp,
            });
        }
        Ok((loss, fig))
    }

    /// Mean MLM loss, perplexity and accuracy on the held-out set, with
    /// the same masks at every evaluation.
    pub fn evaluate(&self) -> Result<Option<EvalMetrics>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let (mut loss_sum, mut masked, mut correct) = (0.0, 0usize, 0usize);
        let refs: Vec<&Example> = self.eval.examples.iter().collect();
        for (c, chunk) in refs.chunks(self.opts.batch_size).enumerate() {
            let base = c * self.opts.batch_size;
            let (_, fig) = self.run_batch(
                chunk,
                |i| rng_for(self.opts.seed, EVAL_MASK, (base + i) as u64),
                false,
            )?;
            loss_sum += fig.mlm_loss * fig.masked as f64;
            masked += fig.masked;
            correct += fig.correct;
        }
        let loss = loss_sum / masked.max(1) as f64;
        Ok(Some(EvalMetrics {
            step: self.step,
            eval_mlm_loss: loss,
            eval_perplexity: loss.exp(),
            eval_mlm_accuracy: correct as f64 / masked.max(1) as f64,
        }))
    }

    /// Runs until `total_steps`, reporting every step, evaluation and
    /// checkpoint to `on_event`; writes `metrics.jsonl`, `loss.png`, the
    /// checkpoints and finally the model files into `out`.
    pub fn run(&mut self, on_event: impl FnMut(&Event)) -> Result<()> {
        self.run_until(self.opts.total_steps, on_event)
    }

    /// [`Pretrainer::run`], stopping after step `stop` (the model files
    /// are written only when the run reaches its last step).
    pub fn run_until(&mut self, stop: u64, mut on_event: impl FnMut(&Event)) -> Result<()> {
        let stop = stop.min(self.opts.total_steps);
        let out = self.opts.out.clone();
        std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
        let metrics_path = out.join("metrics.jsonl");
        let mut metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .map_err(|e| Error::io(&metrics_path, e))?;
        let started = Instant::now();
        while self.step < stop {
            let t0 = Instant::now();
            let mut acc = GradAccumulator::default();
            let mut figs = Vec::with_capacity(self.opts.grad_accum);
            for k in 0..self.opts.grad_accum {
                let micro = self.step * self.opts.grad_accum as u64 + k as u64;
                let batch = self.micro_batch(micro);
                seed_dropout(rng_seed(self.opts.seed, DROPOUT, micro));
                let (loss, fig) = self.run_batch(
                    &batch,
                    |i| rng_for(self.opts.seed, MASK, micro * 1_000_003 + i as u64),
                    true,
                )?;
                let total = fig.mlm_loss + fig.nsp_loss.unwrap_or(0.0);
                if !total.is_finite() {
                    return Err(Error::Input(format!(
                        "the loss is {total} at step {}: stopping; the last good checkpoint is the newest checkpoint-N in {}",
                        self.step + 1,
                        out.display()
                    )));
                }
                if let Some(loss) = loss {
                    acc.add(&self.params, &loss.backward()?)?;
                }
                figs.push(fig);
            }
            let lr = self.schedule.lr(self.step);
            let grad_norm = if acc.is_empty() {
                0.0
            } else {
                self.optim.step(&self.params, acc, lr)?
            };
            self.step += 1;
            let n = figs.len() as f64;
            let mlm_loss = figs.iter().map(|f| f.mlm_loss).sum::<f64>() / n;
            let nsp_loss = self
                .opts
                .nsp
                .then(|| figs.iter().filter_map(|f| f.nsp_loss).sum::<f64>() / n);
            let masked: usize = figs.iter().map(|f| f.masked).sum();
            let correct: usize = figs.iter().map(|f| f.correct).sum();
            let tokens: usize = figs.iter().map(|f| f.tokens).sum();
            let m = StepMetrics {
                step: self.step,
                loss: mlm_loss + nsp_loss.unwrap_or(0.0),
                mlm_loss,
                nsp_loss,
                mlm_accuracy: correct as f64 / masked.max(1) as f64,
                lr,
                grad_norm,
                tokens_per_s: tokens as f64 / t0.elapsed().as_secs_f64(),
                elapsed_s: started.elapsed().as_secs_f64(),
            };
            append_line(&mut metrics, &metrics_path, &m)?;
            on_event(&Event::Step(m.clone()));
            self.history.push(m);
            let last = self.step == self.opts.total_steps;
            if last
                || self
                    .opts
                    .eval_every
                    .is_some_and(|e| self.step.is_multiple_of(e))
            {
                if let Some(e) = self.evaluate()? {
                    append_line(&mut metrics, &metrics_path, &e)?;
                    on_event(&Event::Eval(e.clone()));
                    self.evals.push(e);
                }
            }
            if last
                || self
                    .opts
                    .save_every
                    .is_some_and(|s| self.step.is_multiple_of(s))
            {
                let dir = out.join(format!("checkpoint-{}", self.step));
                self.save_checkpoint(&dir)?;
                self.plot(&out)?;
                on_event(&Event::Saved(dir));
            }
        }
        if self.step == self.opts.total_steps {
            Checkpoint::save_model_files(&out, &self.parts(None))?;
            self.plot(&out)?;
        }
        Ok(())
    }

    fn parts<'a>(&'a self, state: Option<&'a TrainerState>) -> CheckpointParts<'a> {
        CheckpointParts {
            config: &self.config,
            params: &self.params,
            optimizer: state.map(|_| &self.optim),
            state,
            tokenizer_source: &self.tokenizer_source,
        }
    }

    /// Writes a resumable checkpoint of the current state.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let state = TrainerState {
            step: self.step,
            total_steps: self.opts.total_steps,
            seed: self.opts.seed,
            options: serde_json::to_value(&self.opts).unwrap_or_default(),
            last_loss: self.history.last().map(|m| m.loss),
        };
        Checkpoint::save(dir, &self.parts(Some(&state)))
    }

    /// `loss.png`: training loss per step and held-out loss.
    #[cfg(feature = "show")]
    fn plot(&self, out: &Path) -> Result<()> {
        let train: Vec<(f64, f64)> = self
            .history
            .iter()
            .map(|m| (m.step as f64, m.mlm_loss))
            .collect();
        let eval: Vec<(f64, f64)> = self
            .evals
            .iter()
            .map(|e| (e.step as f64, e.eval_mlm_loss))
            .collect();
        crate::show::curve::plot_loss(
            &out.join("loss.png"),
            "MLM loss",
            "train MLM loss",
            train,
            "held-out MLM loss",
            eval,
        )
    }

    #[cfg(not(feature = "show"))]
    fn plot(&self, _: &Path) -> Result<()> {
        Ok(())
    }
}

fn rng_seed(seed: u64, purpose: u64, step: u64) -> u64 {
    use rand::Rng;
    rng_for(seed, purpose, step).random()
}

fn append_line(file: &mut std::fs::File, path: &Path, value: &impl serde::Serialize) -> Result<()> {
    use std::io::Write;
    let line = serde_json::to_string(value)
        .map_err(|e| Error::Input(format!("serialising metrics: {e}")))?;
    writeln!(file, "{line}").map_err(|e| Error::io(path, e))
}
