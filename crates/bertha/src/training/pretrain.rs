//! The pre-training objective: masked LM (+ next-sentence prediction) on a
//! packed corpus, masked afresh at every step, the vocabulary-sized
//! decoder run on masked positions only; scored by held-out MLM loss,
//! perplexity and accuracy with the same masks at every evaluation.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor, D};

use super::distributed::{deals, ProcessGroup};
use super::optim::UpdateSink;
use super::run_dir::Fingerprint;
use super::trainer::{
    target_shares, Chart, Gradients, LoopOptions, LossPart, MainMetric, MeanLoss, MicroStep,
    ModelSetup, Objective, Scores, Slice, Streams, Tally, Trainer,
};
use crate::data::{Example, Masker, Sequences};
use crate::error::{Error, Result};
use crate::fast::train::{Compute, MlmBatch, MlmBuffers, MlmHead, WeightPacks};
use crate::model::{
    BertForTask, BertInput, ForwardOptions, HeadKind, HeadLabels, HeadOptions, TaskOutput,
    IGNORE_INDEX,
};
use crate::rng::rng_for;

/// Purposes of the masking generators (data order and dropout: 1 and 3).
const MASK: u64 = 2;
const EVAL_MASK: u64 = 4;

/// A pre-training run.
pub type Pretrainer = Trainer<Pretraining>;

/// A pre-training run's options: the loop's, and whether NSP is trained.
/// (The CLI reads full windows only, `drop_last`, and evaluates by steps.)
#[derive(Debug, Clone, serde::Serialize)]
pub struct PretrainOptions {
    /// Also train next-sentence prediction on sentence pairs.
    pub nsp: bool,
    #[serde(flatten)]
    pub train: LoopOptions,
}

/// Sums over one batch, before averaging.
#[derive(Debug, Default, Clone, Copy)]
pub struct MlmTally {
    /// The MLM loss over the masked tokens.
    mlm: MeanLoss,
    correct: f64,
    /// The NSP loss over the labelled pairs.
    nsp: MeanLoss,
}

impl Tally for MlmTally {
    fn sums(&self) -> Vec<f64> {
        vec![
            self.mlm.sum,
            self.mlm.count,
            self.correct,
            self.nsp.sum,
            self.nsp.count,
        ]
    }

    fn from_sums(s: &[f64]) -> Self {
        Self {
            mlm: MeanLoss::from_sums(&s[..2]),
            correct: s[2],
            nsp: MeanLoss::from_sums(&s[3..5]),
        }
    }
}

/// Masked-LM (+NSP) pre-training.
pub struct Pretraining {
    /// `BertForMaskedLM`, or `BertForPreTraining` with NSP.
    model: BertForTask,
    masker: Masker,
    eval_masker: Masker,
    train: Sequences,
    eval: Sequences,
    opts: PretrainOptions,
    pad_id: u32,
    device: Device,
    /// Whether training steps run on the fast path, and its products.
    fast: bool,
    compute: Compute,
    /// The fast path's largest buffers, kept from step to step.
    kept: std::sync::Mutex<MlmBuffers>,
    /// The bf16 panels of the largest weights, which the optimizer writes
    /// (made at the first bf16 fast step).
    packs: std::sync::OnceLock<WeightPacks>,
}

/// What pre-training reads: the packed corpus, its held-out part, how
/// tokens are masked and the padding id.
pub struct PretrainData {
    pub train: Sequences,
    pub eval: Sequences,
    pub masker: Masker,
    /// How held-out sequences are masked; `None`: as `masker` does. A
    /// fixed scoring masker (80/10/10) makes runs trained with different
    /// corruption splits comparable.
    pub eval_masker: Option<Masker>,
    pub pad_id: u32,
}

impl Pretrainer {
    /// `model.config` with the MLM head (and NSP with `opts.nsp`),
    /// initialised from `model.init` when given (continued pre-training),
    /// else freshly from the seed.
    pub fn new(model: ModelSetup, data: PretrainData, opts: PretrainOptions) -> Result<Self> {
        let ModelSetup {
            mut config,
            init,
            tokenizer_source,
        } = model;
        let PretrainData {
            train,
            eval,
            masker,
            eval_masker,
            pad_id,
        } = data;
        let eval_masker = eval_masker.unwrap_or_else(|| masker.clone());
        if train.is_empty() {
            return Err(Error::Input("the training corpus gave no sequences".into()));
        }
        let positions = config.max_sequence_length();
        let longest = (0..train.len()).map(|i| train.length(i)).max();
        if let Some(n) = longest.filter(|&n| n > positions) {
            return Err(Error::option(
                "seq_len",
                format!(
                    "{n}: longer than the model's {positions} positions (max_position_embeddings)"
                ),
            ));
        }
        if opts.nsp && !config.add_pooling_layer {
            return Err(Error::option(
                "nsp",
                "needs a pooler, but the config has add_pooling_layer false",
            ));
        }
        // The family's class name (`ModernBertForMaskedLM`).
        let head = if opts.nsp {
            HeadKind::PreTraining
        } else {
            HeadKind::MaskedLM
        };
        config.architectures = vec![head.class_name(&config.family)];
        let setup = ModelSetup {
            config: config.clone(),
            init,
            tokenizer_source,
        };
        Trainer::build(setup, opts.train.clone(), |vb| {
            let kind = if opts.nsp {
                HeadKind::PreTraining
            } else {
                HeadKind::MaskedLM
            };
            let model = BertForTask::load(vb, config.clone(), kind)?;
            let engine = opts.train.engine;
            let fast = engine.tries_fast() && MlmHead::of(&model)?.is_some();
            let uncovered = format!("`{}` models as configured", config.model_type);
            if !fast && engine.tries_fast() {
                engine.fallback(&uncovered)?;
            }
            let compute = opts.train.precision;
            if compute != Compute::F32 && !fast {
                return Err(Error::option(
                    "precision",
                    format!("{compute:?} trains on the fast path only, which does not run {uncovered} with engine {engine:?}"),
                ));
            }
            Ok(Pretraining {
                fast,
                compute: compute.on_this_cpu(),
                model,
                masker,
                eval_masker,
                train,
                eval,
                opts,
                pad_id,
                device: Device::Cpu,
                kept: Default::default(),
                packs: Default::default(),
            })
        })
    }

    /// Mean MLM loss, perplexity and accuracy on the held-out set.
    pub fn evaluate(&self) -> Result<Option<super::EvalMetrics>> {
        self.evaluate_metrics()
    }
}

/// A batch's masked inputs and their MLM labels.
struct Masked {
    ids: Vec<Vec<u32>>,
    types: Vec<Vec<u32>>,
    labels: Vec<Vec<i64>>,
}

impl Pretraining {
    /// Masks each row with its own generator: as training does, or as
    /// held-out scoring does.
    fn mask(
        &self,
        batch: &[&Example],
        mask_rng_of: impl Fn(usize) -> rand::rngs::StdRng,
        train: bool,
    ) -> Masked {
        let masker = if train {
            &self.masker
        } else {
            &self.eval_masker
        };
        let mut m = Masked {
            ids: Vec::with_capacity(batch.len()),
            types: Vec::with_capacity(batch.len()),
            labels: Vec::with_capacity(batch.len()),
        };
        for (i, ex) in batch.iter().enumerate() {
            let masked = masker.mask(&ex.input_ids, &mut mask_rng_of(i));
            m.ids.push(masked.input_ids);
            m.types.push(ex.token_type_ids.clone());
            m.labels.push(masked.labels);
        }
        m
    }

    /// A training micro-batch on the fast path. The loss terms' weights
    /// (this process's share of the micro-batch's masked tokens and pairs)
    /// need the counts of every process first, so every process takes part
    /// even with no rows.
    fn train_batch_fast(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<MlmTally>> {
        let (micro, first) = (slice.micro, slice.first);
        let owned: Vec<_> = batch.iter().map(|&i| self.train.example(i)).collect();
        let examples: Vec<&Example> = owned.iter().map(|e| e.as_ref()).collect();
        let seed = self.opts.train.seed;
        let Masked { ids, types, labels } = self.mask(
            &examples,
            |i| rng_for(seed, MASK, micro * 1_000_003 + (first + i) as u64),
            true,
        );
        let next_sentence = (self.model.kind() == HeadKind::PreTraining).then(|| {
            examples
                .iter()
                .map(|e| e.next_sentence_label.map_or(IGNORE_INDEX, i64::from))
                .collect::<Vec<_>>()
        });
        let masked = labels
            .iter()
            .flatten()
            .filter(|&&y| y != IGNORE_INDEX)
            .count();
        let pairs = next_sentence
            .as_ref()
            .map_or(0, |n| n.iter().filter(|&&y| y != IGNORE_INDEX).count());
        let tokens = ids.iter().map(Vec::len).sum();
        let shares = match target_shares(&[masked, pairs], batch.len(), tokens, slice.group)? {
            Ok(shares) => shares,
            Err(done) => return Ok(done),
        };
        let mut head = MlmHead::of(&self.model)?
            .ok_or_else(|| {
                Error::Input("internal: the fast path no longer covers the model".into())
            })?
            .with_compute(self.compute);
        if self.compute == Compute::Bf16 {
            let packs = self
                .packs
                .get_or_init(|| WeightPacks::of(head.packed_weights()));
            head = head.with_packs(packs);
        }
        let batch = MlmBatch {
            sequences: ids
                .iter()
                .zip(&types)
                .map(|(i, t)| (&i[..], &t[..]))
                .collect(),
            labels: labels.iter().map(|l| &l[..]).collect(),
            next_sentence,
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let out = head.step_keeping(&batch, [shares[0], shares[1]], true, &mut kept)?;
        drop(kept);
        let tally = MlmTally {
            mlm: MeanLoss::of(out.mlm_loss, out.masked),
            correct: out.correct as f64,
            nsp: MeanLoss::of(out.nsp_loss, out.pairs),
        };
        Ok(MicroStep {
            loss: tally.mlm.mean() + tally.nsp.mean(),
            gradients: Gradients::Computed(out.gradients),
            tokens,
            tally,
        })
    }

    /// Masks, runs and scores one batch; the loss terms are the batch's
    /// mean MLM loss over its masked tokens (and mean NSP loss over its
    /// pairs).
    fn run_batch(
        &self,
        batch: &[&Example],
        mask_rng_of: impl Fn(usize) -> rand::rngs::StdRng,
        train: bool,
    ) -> Result<(Vec<LossPart>, MlmTally)> {
        let Masked { ids, types, labels } = self.mask(batch, mask_rng_of, train);
        let t = ids.iter().map(Vec::len).max().unwrap_or(0);
        let input = BertInput::from_ids(&ids, &types, self.pad_id, &self.device)?;
        // [B, T] labels, -100 on padding; the targets in the batch-major
        // order of the head's labelled rows.
        let mut flat = vec![IGNORE_INDEX; batch.len() * t];
        for (b, l) in labels.iter().enumerate() {
            flat[b * t..b * t + l.len()].copy_from_slice(l);
        }
        let targets: Vec<i64> = flat
            .iter()
            .copied()
            .filter(|&y| y != IGNORE_INDEX)
            .collect();
        let mlm_labels = Tensor::from_vec(flat, (batch.len(), t), &self.device)?;
        let nsp_labels = match self.model.kind() {
            HeadKind::PreTraining => {
                let nsp: Vec<i64> = batch
                    .iter()
                    .map(|e| e.next_sentence_label.map_or(IGNORE_INDEX, i64::from))
                    .collect();
                Some(Tensor::from_vec(nsp, batch.len(), &self.device)?)
            }
            _ => None,
        };
        let head_labels = HeadLabels {
            labels: Some(&mlm_labels),
            next_sentence_label: nsp_labels.as_ref(),
            ..HeadLabels::default()
        };
        // Only masked positions go through the vocabulary-sized decoder:
        // the same loss as transformers' (mean over masked tokens) at a
        // fraction of the cost.
        let opts = HeadOptions {
            forward: ForwardOptions {
                train,
                ..ForwardOptions::default()
            },
            labelled_rows_only: true,
        };
        let (mlm_loss, nsp_loss, logits) = match self.model.forward(&input, &head_labels, opts)? {
            TaskOutput::PreTraining(o) => (o.mlm_loss, o.nsp_loss, o.prediction_logits),
            TaskOutput::Logits(o) => (o.loss, None, o.logits),
            TaskOutput::QuestionAnswering(_) => {
                return Err(Error::Input(
                    "internal: pre-training runs an MLM head".into(),
                ))
            }
        };
        let masked = targets.len();
        let pairs = nsp_labels.as_ref().map_or(0, |_| {
            batch
                .iter()
                .filter(|e| e.next_sentence_label.is_some())
                .count()
        });
        let mut tally = MlmTally::default();
        let mut parts = Vec::with_capacity(2);
        if let Some(mlm) = mlm_loss.filter(|_| masked > 0) {
            tally.mlm = MeanLoss::of(f64::from(mlm.to_scalar::<f32>()?), masked);
            let pred = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            tally.correct = pred
                .iter()
                .zip(&targets)
                .filter(|(p, y)| i64::from(**p) == **y)
                .count() as f64;
            parts.push(LossPart::new(mlm, masked));
        }
        if let Some(nsp) = nsp_loss.filter(|_| pairs > 0) {
            tally.nsp = MeanLoss::of(f64::from(nsp.to_scalar::<f32>()?), pairs);
            parts.push(LossPart::new(nsp, pairs));
        }
        Ok((parts, tally))
    }
}

impl Objective for Pretraining {
    type Tally = MlmTally;
    const STREAMS: Streams = Streams::new(3);

    fn input_lengths(&self) -> Vec<usize> {
        (0..self.train.len())
            .map(|i| self.train.length(i))
            .collect()
    }

    fn main_metric(&self) -> MainMetric {
        MainMetric {
            name: "eval_mlm_loss",
            greater_is_better: false,
        }
    }

    fn chart(&self) -> Chart {
        Chart {
            title: "MLM loss".into(),
            train_label: "train MLM loss".into(),
            eval_label: "held-out MLM loss".into(),
            train_figure: Some("mlm_loss"),
            scores_title: None,
        }
    }

    fn train_batch(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<MlmTally>> {
        if self.fast {
            return self.train_batch_fast(batch, slice);
        }
        let (micro, first) = (slice.micro, slice.first);
        if batch.is_empty() {
            return Ok(MicroStep::empty());
        }
        let owned: Vec<_> = batch.iter().map(|&i| self.train.example(i)).collect();
        let examples: Vec<&Example> = owned.iter().map(|e| e.as_ref()).collect();
        let seed = self.opts.train.seed;
        // Each row's masks from its place in the whole micro-batch.
        let (parts, tally) = self.run_batch(
            &examples,
            |i| rng_for(seed, MASK, micro * 1_000_003 + (first + i) as u64),
            true,
        )?;
        Ok(MicroStep {
            loss: tally.mlm.mean() + tally.nsp.mean(),
            gradients: if parts.is_empty() {
                Gradients::None
            } else {
                Gradients::Loss(parts)
            },
            tokens: examples.iter().map(|e| e.input_ids.len()).sum(),
            tally,
        })
    }

    fn step_figures(&self, tallies: &[MlmTally]) -> (f64, BTreeMap<String, f64>) {
        let n = tallies.len().max(1) as f64;
        let mlm_loss = tallies.iter().map(|f| f.mlm.mean()).sum::<f64>() / n;
        let nsp_loss = self
            .opts
            .nsp
            .then(|| tallies.iter().map(|f| f.nsp.mean()).sum::<f64>() / n);
        let masked: f64 = tallies.iter().map(|f| f.mlm.count).sum();
        let correct: f64 = tallies.iter().map(|f| f.correct).sum();
        let mut figures = BTreeMap::from([
            ("mlm_loss".to_string(), mlm_loss),
            ("mlm_accuracy".to_string(), correct / masked.max(1.0)),
        ]);
        if let Some(nsp) = nsp_loss {
            figures.insert("nsp_loss".into(), nsp);
        }
        (mlm_loss + nsp_loss.unwrap_or(0.0), figures)
    }

    /// Mean MLM loss, perplexity and accuracy on the held-out set, with
    /// the same masks at every evaluation (whichever process runs a chunk).
    fn evaluate(&self, group: &dyn ProcessGroup) -> Result<Option<Scores>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let (mut loss_sum, mut masked, mut correct) = (0.0, 0usize, 0usize);
        let indices: Vec<usize> = (0..self.eval.len()).collect();
        for (c, rows) in indices.chunks(self.opts.train.batch_size).enumerate() {
            if !deals(c, group.rank(), group.size()) {
                continue;
            }
            let base = c * self.opts.train.batch_size;
            let owned: Vec<_> = rows.iter().map(|&i| self.eval.example(i)).collect();
            let chunk: Vec<&Example> = owned.iter().map(|e| e.as_ref()).collect();
            let (_, fig) = self.run_batch(
                &chunk,
                |i| rng_for(self.opts.train.seed, EVAL_MASK, (base + i) as u64),
                false,
            )?;
            loss_sum += fig.mlm.sum;
            masked += fig.mlm.count as usize;
            correct += fig.correct as usize;
        }
        let mut sums = [loss_sum, masked as f64, correct as f64];
        group.sum_f64(&mut sums)?;
        let [loss_sum, masked, correct] = sums;
        let (masked, correct) = (masked as usize, correct as usize);
        let loss = loss_sum / masked.max(1) as f64;
        Ok(Some(Scores {
            loss,
            scores: BTreeMap::from([
                ("eval_mlm_loss".to_string(), loss),
                ("eval_perplexity".to_string(), loss.exp()),
                (
                    "eval_mlm_accuracy".to_string(),
                    correct as f64 / masked.max(1) as f64,
                ),
            ]),
        }))
    }

    fn data_fingerprint(&self) -> Fingerprint {
        let mut f = Fingerprint::default();
        self.train.identify(&mut |v| f.add([v]));
        f
    }

    fn options_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.opts).unwrap_or_default()
    }

    fn update_sink(&self) -> Option<&dyn UpdateSink> {
        self.packs.get().map(|p| p as &dyn UpdateSink)
    }
}
