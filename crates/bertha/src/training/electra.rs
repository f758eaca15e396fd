//! ELECTRA's replaced-token-detection pre-training (Clark et al., 2020): a
//! small generator learns masked LM; the masked positions are filled with
//! samples from its softmax; the discriminator learns, at every attended
//! position, whether the token is the original. The loss is
//! `generator MLM loss + disc_weight × discriminator loss`, and no
//! gradient flows through the sampling (the samples are token ids).
//!
//! The discriminator is the run's model (`ElectraForPreTraining`, saved
//! at the output's root); the generator shares its embeddings and is
//! saved beside it as an `ElectraForMaskedLM` folder, `generator/`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor, D};
use rand::Rng;
use rayon::prelude::*;

use super::checkpoint::{save_safetensors, write_atomic};
use super::distributed::{deals, ProcessGroup};
use super::pretrain::PretrainData;
use super::run_dir::Fingerprint;
use super::trainer::{
    Chart, Gradients, LoopOptions, LossPart, MainMetric, MeanLoss, MicroStep, ModelSetup,
    Objective, Scores, Slice, Streams, Tally, Trainer,
};
use crate::config::{BertConfig, ElectraOptions, Family};
use crate::data::{Example, Masker, Sequences};
use crate::error::{Error, Result};
use crate::fast::train::{Compute, MlmBuffers, WeightPacks};
use crate::model::electra_pretraining::{check_pair, ElectraPretraining, GENERATOR_PREFIX};
use crate::model::{BertInput, ForwardOptions, HeadKind, HeadOptions, IGNORE_INDEX};
use crate::rng::rng_for;
use crate::training::optim::UpdateSink;

mod fast;

/// Purposes of the generators (data order and dropout: 1 and 3).
const MASK: u64 = 2;
const EVAL_MASK: u64 = 4;
const SAMPLE: u64 = 5;
const EVAL_SAMPLE: u64 = 6;

/// The folder, inside a saved model, that holds the generator.
pub const GENERATOR_DIR: &str = "generator";

/// An ELECTRA pre-training run.
pub type ElectraPretrainer = Trainer<ElectraTraining>;

/// An ELECTRA run's options.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ElectraRunOptions {
    /// The discriminator loss's weight in the total (the paper's λ = 50).
    pub disc_weight: f64,
    #[serde(flatten)]
    pub train: LoopOptions,
}

/// The generator's config for a discriminator: `size` × its hidden width,
/// heads and feed-forward width (at least one head), the same depth, and
/// everything the shared embeddings hold unchanged, as the ELECTRA code's
/// `generator_hidden_size` multiplier does.
pub fn generator_config(discriminator: &BertConfig, size: f64) -> Result<BertConfig> {
    if !(size > 0.0 && size <= 1.0) {
        return Err(Error::option(
            "generator_size",
            format!("{size}: must lie in (0, 1] (a fraction of the discriminator's width)"),
        ));
    }
    let scale = |n: usize| ((n as f64 * size).round() as usize).max(1);
    let heads = scale(discriminator.num_attention_heads);
    let hidden = scale(discriminator.hidden_size);
    if hidden % heads != 0 {
        return Err(Error::option(
            "generator_size",
            format!("{size} gives a hidden size of {hidden}, not a multiple of its {heads} heads"),
        ));
    }
    Ok(BertConfig {
        hidden_size: hidden,
        num_attention_heads: heads,
        intermediate_size: scale(discriminator.intermediate_size),
        architectures: vec!["ElectraForMaskedLM".into()],
        id2label: Default::default(),
        ..discriminator.clone()
    })
}

/// A BERT-shaped config as an ELECTRA discriminator of the same shape:
/// embeddings as wide as the hidden states (so no projection), no pooler.
pub fn as_electra(config: &BertConfig) -> BertConfig {
    if matches!(config.family, Family::Electra(_)) {
        return config.clone();
    }
    BertConfig {
        model_type: "electra".into(),
        family: Family::Electra(ElectraOptions {
            embedding_size: config.embedding_size(),
            summary: Default::default(),
        }),
        add_pooling_layer: false,
        ..config.clone()
    }
}

/// Sums over one batch, before averaging.
#[derive(Debug, Default, Clone, Copy)]
pub struct ElectraTally {
    /// The generator's loss over the masked tokens, and its hits.
    generator: MeanLoss,
    generator_correct: f64,
    /// The discriminator's loss over the attended tokens, and its hits.
    discriminator: MeanLoss,
    discriminator_correct: f64,
    /// Masked positions whose sample differs from the original.
    replaced: f64,
}

impl Tally for ElectraTally {
    fn sums(&self) -> Vec<f64> {
        vec![
            self.generator.sum,
            self.generator.count,
            self.generator_correct,
            self.discriminator.sum,
            self.discriminator.count,
            self.discriminator_correct,
            self.replaced,
        ]
    }

    fn from_sums(s: &[f64]) -> Self {
        Self {
            generator: MeanLoss::from_sums(&s[..2]),
            generator_correct: s[2],
            discriminator: MeanLoss::from_sums(&s[3..5]),
            discriminator_correct: s[5],
            replaced: s[6],
        }
    }
}

/// ELECTRA pre-training: the pair, the corpus and the masking.
pub struct ElectraTraining {
    pair: ElectraPretraining,
    /// Whether training steps run on the fast path, and its products.
    fast: bool,
    compute: Compute,
    /// The generator's MLM logits and their gradient, kept from step to
    /// step (fast path).
    kept: std::sync::Mutex<MlmBuffers>,
    /// Both models' bf16 weight panels, written by the optimizer (made at
    /// the first bf16 fast step).
    packs: std::sync::OnceLock<WeightPacks>,
    generator_config: BertConfig,
    masker: Masker,
    eval_masker: Masker,
    train: Sequences,
    eval: Sequences,
    opts: ElectraRunOptions,
    pad_id: u32,
    device: Device,
}

impl ElectraPretrainer {
    /// The discriminator `model.config` and the generator `generator`
    /// (see [`generator_config`]), initialised from `model.init` when given
    /// (a previous ELECTRA run's folder: both models), else from the seed.
    pub fn new(
        model: ModelSetup,
        generator: BertConfig,
        data: PretrainData,
        opts: ElectraRunOptions,
    ) -> Result<Self> {
        let ModelSetup {
            mut config,
            init,
            tokenizer_source,
        } = model;
        check_pair(&config, &generator)?;
        if !(opts.disc_weight.is_finite() && opts.disc_weight > 0.0) {
            return Err(Error::option(
                "disc_weight",
                format!("{}: must be a positive number", opts.disc_weight),
            ));
        }
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
        if let Some(n) = (0..train.len())
            .map(|i| train.length(i))
            .max()
            .filter(|&n| n > positions)
        {
            return Err(Error::option(
                "seq_len",
                format!(
                    "{n}: longer than the model's {positions} positions (max_position_embeddings)"
                ),
            ));
        }
        config.architectures = vec![HeadKind::ReplacedTokenDetection.architecture().into()];
        let setup = ModelSetup {
            config: config.clone(),
            init,
            tokenizer_source,
        };
        Trainer::build(setup, opts.train.clone(), |vb| {
            let pair = ElectraPretraining::load(vb, config.clone(), generator.clone())?;
            let engine = opts.train.engine;
            let fast = engine.tries_fast() && fast::covers(&pair)?;
            let uncovered =
                "this ELECTRA pair (both models must be BERT-shaped ELECTRA encoders on the CPU)";
            if !fast && engine.tries_fast() {
                engine.fallback(uncovered)?;
            }
            let compute = opts.train.precision;
            if compute != Compute::F32 && !fast {
                return Err(Error::option(
                    "precision",
                    format!("{compute:?} trains on the fast path only, which does not run {uncovered} with engine {engine:?}"),
                ));
            }
            Ok(ElectraTraining {
                pair,
                fast,
                compute: compute.on_this_cpu(),
                kept: Default::default(),
                packs: Default::default(),
                generator_config: generator,
                masker,
                eval_masker,
                train,
                eval,
                opts,
                pad_id,
                device: Device::Cpu,
            })
        })
    }
}

/// The generator's draws of one batch: each row draws from its own
/// generator, seeded by its place in the whole micro-batch, so the same
/// tokens come out however many processes share it (and on either
/// engine). Rows draw in parallel (a softmax over the vocabulary per
/// masked token is ~10 % of a `mini` step), each row's positions in order.
struct Draws {
    seed: u64,
    purpose: u64,
    base: u64,
}

impl Draws {
    /// Fills each target `(row, position, original)` of `corrupted` with a
    /// draw from its row of `logits` (`[targets, vocab]`, in the targets'
    /// order: rows ascending); returns how many differ from the original.
    fn fill(
        &self,
        targets: &[(usize, usize, i64)],
        logits: &[f32],
        corrupted: &mut [Vec<u32>],
    ) -> usize {
        let vocab = logits.len() / targets.len().max(1);
        let mut runs = Vec::new();
        for (k, &(b, _, _)) in targets.iter().enumerate() {
            match runs.last_mut() {
                Some((row, _, end)) if *row == b => *end = k + 1,
                _ => runs.push((b, k, k + 1)),
            }
        }
        let drawn: Vec<Vec<u32>> = runs
            .par_iter()
            .map(|&(b, start, end)| {
                let mut rng = rng_for(self.seed, self.purpose, self.base + b as u64);
                let mut probs = vec![0f32; vocab];
                (start..end)
                    .map(|k| {
                        probs.copy_from_slice(&logits[k * vocab..(k + 1) * vocab]);
                        sample_softmax(&mut probs, &mut rng)
                    })
                    .collect()
            })
            .collect();
        let mut replaced = 0;
        for (&(b, p, y), d) in targets.iter().zip(drawn.into_iter().flatten()) {
            corrupted[b][p] = d;
            replaced += usize::from(i64::from(d) != y);
        }
        replaced
    }
}

/// Draws one id from the softmax of `row` (logits over the vocabulary,
/// turned into probabilities in place). The probabilities are the
/// vectorised f32 softmax of the fast kernels (a libm f64 `exp` per
/// vocabulary entry and masked token took 7.7 % of an ELECTRA `mini` step's
/// CPU time; this takes 2.5 %); the inverse CDF is walked in f64. Every instruction set computes the same
/// bits, so the draws do not depend on the CPU.
fn sample_softmax(row: &mut [f32], rng: &mut impl Rng) -> u32 {
    crate::model::ops::softmax_rows(row, row.len());
    let total: f64 = row.iter().map(|&p| f64::from(p)).sum();
    let mut u = rng.random::<f64>() * total;
    for (i, &p) in row.iter().enumerate() {
        u -= f64::from(p);
        if u < 0.0 {
            return i as u32;
        }
    }
    // Rounding left a sliver past the last probability: the last positive one.
    row.iter().rposition(|&p| p > 0.0).unwrap_or(0) as u32
}

/// A batch's inputs for the generator: masked ids, their labels (the
/// original at masked positions, -100 elsewhere) and the token types.
struct Masked {
    ids: Vec<Vec<u32>>,
    labels: Vec<Vec<i64>>,
    types: Vec<Vec<u32>>,
}

impl ElectraTraining {
    /// The generator and the discriminator being trained.
    pub fn pair(&self) -> &ElectraPretraining {
        &self.pair
    }

    /// Whether training steps run on the fast engine.
    pub fn on_fast_path(&self) -> bool {
        self.fast
    }

    /// Masks each row with its own generator, keyed `(purpose, base +
    /// row)`: as training does, or as held-out scoring does.
    fn mask(&self, batch: &[&Example], (purpose, base): (u64, u64), train: bool) -> Masked {
        let masker = if train {
            &self.masker
        } else {
            &self.eval_masker
        };
        let seed = self.opts.train.seed;
        let mut m = Masked {
            ids: Vec::with_capacity(batch.len()),
            labels: Vec::with_capacity(batch.len()),
            types: Vec::with_capacity(batch.len()),
        };
        for (i, ex) in batch.iter().enumerate() {
            let masked = masker.mask(&ex.input_ids, &mut rng_for(seed, purpose, base + i as u64));
            m.ids.push(masked.input_ids);
            m.labels.push(masked.labels);
            m.types.push(ex.token_type_ids.clone());
        }
        m
    }

    /// Masks, samples and scores one batch: the loss parts (generator mean
    /// over masked tokens; weighted discriminator mean over attended
    /// tokens) and the tallies.
    fn run_batch(
        &self,
        batch: &[&Example],
        rngs: (u64, u64, u64),
        train: bool,
    ) -> Result<(Vec<LossPart>, ElectraTally)> {
        let (mask_purpose, sample_purpose, base) = rngs;
        let seed = self.opts.train.seed;
        let Masked {
            ids: masked_ids,
            labels,
            types,
        } = self.mask(batch, (mask_purpose, base), train);
        let t = masked_ids.iter().map(Vec::len).max().unwrap_or(0);
        let tokens: usize = masked_ids.iter().map(Vec::len).sum();
        let mut flat = vec![IGNORE_INDEX; batch.len() * t];
        for (b, l) in labels.iter().enumerate() {
            flat[b * t..b * t + l.len()].copy_from_slice(l);
        }
        let targets = masked_targets(&labels);
        let mut tally = ElectraTally::default();
        let opts = HeadOptions {
            forward: ForwardOptions {
                train,
                ..ForwardOptions::default()
            },
            labelled_rows_only: true,
        };
        let mut parts = Vec::with_capacity(2);
        // The corrupted input: the originals, with each masked position
        // filled by a draw from the generator's softmax there.
        let mut corrupted: Vec<Vec<u32>> = batch.iter().map(|e| e.input_ids.clone()).collect();
        if !targets.is_empty() {
            let masked = BertInput::from_ids(&masked_ids, &types, self.pad_id, &self.device)?;
            let gen_labels = Tensor::from_vec(flat, (batch.len(), t), &self.device)?;
            let (logits, gen_loss) = self.pair.generator_pass(&masked, &gen_labels, opts)?;
            let rows = logits.detach().flatten_all()?.to_vec1::<f32>()?;
            let draws = Draws {
                seed,
                purpose: sample_purpose,
                base,
            };
            tally.replaced = draws.fill(&targets, &rows, &mut corrupted) as f64;
            let pred = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            tally.generator_correct = pred
                .iter()
                .zip(&targets)
                .filter(|(p, (_, _, y))| i64::from(**p) == *y)
                .count() as f64;
            tally.generator = MeanLoss::of(f64::from(gen_loss.to_scalar::<f32>()?), targets.len());
            parts.push(LossPart::new(gen_loss, targets.len()));
        }
        // Labels: 1 where the token differs from the original (a sample
        // equal to the original counts as original); padding is masked.
        let mut disc_labels = vec![0i64; batch.len() * t];
        for (b, (row, ex)) in corrupted.iter().zip(batch).enumerate() {
            for (p, (c, o)) in row.iter().zip(&ex.input_ids).enumerate() {
                disc_labels[b * t + p] = i64::from(c != o);
            }
        }
        let input = BertInput::from_ids(&corrupted, &types, self.pad_id, &self.device)?;
        let disc_label_tensor =
            Tensor::from_vec(disc_labels.clone(), (batch.len(), t), &self.device)?;
        let (logits, disc_loss) = self
            .pair
            .discriminator_pass(&input, &disc_label_tensor, opts)?;
        let logits = logits.detach().to_vec2::<f32>()?;
        for (b, row) in corrupted.iter().enumerate() {
            for p in 0..row.len() {
                let said_replaced = logits[b][p] > 0.0;
                if said_replaced == (disc_labels[b * t + p] == 1) {
                    tally.discriminator_correct += 1.0;
                }
            }
        }
        tally.discriminator = MeanLoss::of(f64::from(disc_loss.to_scalar::<f32>()?), tokens);
        parts.push(LossPart::new(
            disc_loss.affine(self.opts.disc_weight, 0.0)?,
            tokens,
        ));
        Ok((parts, tally))
    }

    /// The total of a tally's means, as the loss is made.
    fn total(&self, t: &ElectraTally) -> f64 {
        t.generator.mean() + self.opts.disc_weight * t.discriminator.mean()
    }
}

impl Objective for ElectraTraining {
    type Tally = ElectraTally;
    const STREAMS: Streams = Streams::new(3);

    fn input_lengths(&self) -> Vec<usize> {
        (0..self.train.len())
            .map(|i| self.train.length(i))
            .collect()
    }

    fn main_metric(&self) -> MainMetric {
        MainMetric {
            name: "eval_total_loss",
            greater_is_better: false,
        }
    }

    fn chart(&self) -> Chart {
        Chart {
            title: "ELECTRA loss (generator + weight × discriminator)".into(),
            train_label: "train loss".into(),
            eval_label: "held-out loss".into(),
            train_figure: None,
            scores_title: None,
        }
    }

    fn train_batch(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<ElectraTally>> {
        if batch.is_empty() {
            return Ok(MicroStep::empty());
        }
        if self.fast {
            return self.train_batch_fast(batch, slice);
        }
        let owned: Vec<_> = batch.iter().map(|&i| self.train.example(i)).collect();
        let examples: Vec<&Example> = owned.iter().map(|e| e.as_ref()).collect();
        let base = row_base(slice);
        let (parts, tally) = self.run_batch(&examples, (MASK, SAMPLE, base), true)?;
        Ok(MicroStep {
            loss: self.total(&tally),
            gradients: Gradients::Loss(parts),
            tokens: examples.iter().map(|e| e.input_ids.len()).sum(),
            tally,
        })
    }

    fn step_figures(&self, tallies: &[ElectraTally]) -> (f64, BTreeMap<String, f64>) {
        let n = tallies.len().max(1) as f64;
        let mean = |f: &dyn Fn(&ElectraTally) -> f64| tallies.iter().map(f).sum::<f64>() / n;
        let generator_loss = mean(&|t| t.generator.mean());
        let discriminator_loss = mean(&|t| t.discriminator.mean());
        let sum = |f: &dyn Fn(&ElectraTally) -> f64| tallies.iter().map(f).sum::<f64>();
        let masked = sum(&|t| t.generator.count).max(1.0);
        let tokens = sum(&|t| t.discriminator.count).max(1.0);
        let loss = generator_loss + self.opts.disc_weight * discriminator_loss;
        let figures = BTreeMap::from([
            ("generator_loss".to_string(), generator_loss),
            ("discriminator_loss".to_string(), discriminator_loss),
            (
                "mlm_accuracy".to_string(),
                sum(&|t| t.generator_correct) / masked,
            ),
            (
                "discriminator_accuracy".to_string(),
                sum(&|t| t.discriminator_correct) / tokens,
            ),
            (
                "replaced_fraction".to_string(),
                sum(&|t| t.replaced) / masked,
            ),
        ]);
        (loss, figures)
    }

    /// The held-out loss and its parts, with the same masks and samples at
    /// every evaluation (whichever process runs a chunk).
    fn evaluate(&self, group: &dyn ProcessGroup) -> Result<Option<Scores>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let mut sums = [0f64; 7];
        let indices: Vec<usize> = (0..self.eval.len()).collect();
        let size = self.opts.train.batch_size;
        for (c, rows) in indices.chunks(size).enumerate() {
            if !deals(c, group.rank(), group.size()) {
                continue;
            }
            let owned: Vec<_> = rows.iter().map(|&i| self.eval.example(i)).collect();
            let chunk: Vec<&Example> = owned.iter().map(|e| e.as_ref()).collect();
            let base = (c * size) as u64;
            let (_, t) = self.run_batch(&chunk, (EVAL_MASK, EVAL_SAMPLE, base), false)?;
            for (s, v) in sums.iter_mut().zip(t.sums()) {
                *s += v;
            }
        }
        group.sum_f64(&mut sums)?;
        let t = ElectraTally::from_sums(&sums);
        let loss = self.total(&t);
        let masked = t.generator.count.max(1.0);
        let tokens = t.discriminator.count.max(1.0);
        Ok(Some(Scores {
            loss,
            scores: BTreeMap::from([
                ("eval_total_loss".to_string(), loss),
                ("eval_generator_loss".to_string(), t.generator.mean()),
                (
                    "eval_discriminator_loss".to_string(),
                    t.discriminator.mean(),
                ),
                (
                    "eval_mlm_accuracy".to_string(),
                    t.generator_correct / masked,
                ),
                (
                    "eval_discriminator_accuracy".to_string(),
                    t.discriminator_correct / tokens,
                ),
                ("eval_replaced_fraction".to_string(), t.replaced / masked),
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

    /// `generator/`: the generator as an `ElectraForMaskedLM` folder (its
    /// own tensors and the shared embeddings, from the model file just
    /// written), with the tokenizer files.
    fn write_extras(&self, dir: &Path) -> Result<()> {
        write_generator(dir, &self.generator_config)
    }

    fn update_sink(&self) -> Option<&dyn UpdateSink> {
        self.packs.get().map(|p| p as &dyn UpdateSink)
    }
}

/// The masked positions `(row, position, original)` of a batch's labels,
/// row by row: the order of the generator's logits rows.
fn masked_targets(labels: &[Vec<i64>]) -> Vec<(usize, usize, i64)> {
    labels
        .iter()
        .enumerate()
        .flat_map(|(b, l)| {
            l.iter()
                .enumerate()
                .filter(|(_, &y)| y != IGNORE_INDEX)
                .map(move |(p, &y)| (b, p, y))
        })
        .collect()
}

/// The key of a training slice's first row, from its place in the whole
/// micro-batch (each row's mask and draws are keyed by it).
fn row_base(slice: &Slice) -> u64 {
    slice.micro * 1_000_003 + slice.first as u64
}

/// Writes `dir/generator/` from `dir/model.safetensors` (which holds the
/// generator under `generator.`) and the generator's config.
pub fn write_generator(dir: &Path, generator: &BertConfig) -> Result<()> {
    let model = dir.join(super::checkpoint::MODEL_FILE);
    let all = candle_core::safetensors::load(&model, &Device::Cpu).map_err(|e| Error::Weights {
        path: model.clone(),
        reason: e.to_string(),
    })?;
    let shared = "electra.embeddings.";
    let tensors: HashMap<String, Tensor> = all
        .into_iter()
        .filter_map(|(name, t)| match name.strip_prefix(GENERATOR_PREFIX) {
            Some(own) => Some((own.to_string(), t)),
            None => name.starts_with(shared).then_some((name, t)),
        })
        .collect();
    let out = dir.join(GENERATOR_DIR);
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    let text = serde_json::to_string_pretty(&generator.to_json())
        .map_err(|e| Error::Input(format!("serialising the generator's config.json: {e}")))?;
    write_atomic(&out.join("config.json"), text.as_bytes())?;
    save_safetensors(&out.join(super::checkpoint::MODEL_FILE), &tensors)?;
    for name in [
        "vocab.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        let from = dir.join(name);
        if from.is_file() {
            let bytes = std::fs::read(&from).map_err(|e| Error::io(&from, e))?;
            write_atomic(&out.join(name), &bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draws follow the softmax: over 60,000 draws from logits
    /// (0, ln 2, ln 3, -100) each share is within 4 standard deviations of
    /// 1/6, 2/6, 3/6, and the last id (p ≈ 4e-44) never comes.
    #[test]
    fn draws_follow_the_softmax_of_the_logits() {
        let logits = [0.0, 2f32.ln(), 3f32.ln(), -100.0];
        let mut rng = rng_for(7, SAMPLE, 0);
        let mut counts = [0usize; 4];
        let n = 60_000;
        for _ in 0..n {
            let mut row = logits;
            counts[sample_softmax(&mut row, &mut rng) as usize] += 1;
        }
        for (i, p) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].into_iter().enumerate() {
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let got = counts[i] as f64;
            assert!((got - n as f64 * p).abs() < 4.0 * sd, "{counts:?}");
        }
        assert_eq!(counts[3], 0);
        // One logit far above the rest: always that id.
        let mut row = [-5.0, 40.0, 0.0, 1.0];
        assert_eq!(sample_softmax(&mut row, &mut rng), 1);
    }
}
