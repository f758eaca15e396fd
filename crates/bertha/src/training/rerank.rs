//! Cross-encoder (reranker) training, as sentence-transformers'
//! `CrossEncoderTrainer` does it: a sequence-classification model with one
//! output reads each (query, document) pair and a ranking loss
//! ([`RerankLoss`]) compares the scores of a batch. The training unit
//! depends on the loss: a labelled pair (`bce`), a query with its positive
//! and hard negatives (`mnrl`, which also scores each query against every
//! other document of the micro-batch), or a query's labelled list
//! (`lambda`, `listnet`). The dev set is scored by reranking its lists
//! (MRR@10, NDCG@10, MAP). The saved model is a sentence-transformers
//! CrossEncoder folder.
//!
//! Both engines run it: the candle modules, and the fast path, where the
//! micro-batch's pairs are packed end to end and the loss's gradient on
//! the logits starts the fused backward pass.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use serde_json::json;

use super::distributed::ProcessGroup;
use super::finetune::{validate, without_head, FinetuneOptions};
use super::log::write_json;
use super::rerank_loss::{GroupScores, LossSum, RerankLoss};
use super::run_dir::Fingerprint;
use super::trainer::{
    target_shares, Chart, Gradients, LossPart, MainMetric, MeanLoss, MicroStep, ModelSetup,
    Objective, Scores, Slice, Streams, Trainer,
};
use crate::config::BertConfig;
use crate::data::{RerankData, RerankGroup, RerankLayout};
use crate::error::{Error, Result};
use crate::fast::train::{Compute, CustomLoss, FinetuneHead, HeadBatch, HeadTargets};
use crate::io::tokenizer::Tokenizer;
use crate::io::ModelDir;
use crate::metrics::{ranking_scores, RANKING_MAIN_METRIC};
use crate::model::{BertForTask, BertInput, ForwardOptions, HeadKind, HeadLabels, TaskOutput};
use crate::tasks::finetuned::TRAINING_ARGS_FILE;
use crate::tasks::rerank::{Activation, CrossEncoder, CrossEncoderOptions};

/// A reranker training run.
pub type RerankTrainer = Trainer<RerankTraining>;

/// The head's tensors (`classifier.weight`, `classifier.bias`).
const HEAD_PREFIX: &str = "classifier.";

/// Options of a run: the loss, and the loop's (shared with fine-tuning).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RerankOptions {
    pub loss: RerankLoss,
    pub train: FinetuneOptions,
}

/// A (query, document) pair as model input: ids and token types.
type Pair = (Vec<u32>, Vec<u32>);

/// A micro-batch's pairs, unit by unit, with their labels.
struct BatchPairs {
    groups: Vec<Vec<Pair>>,
    labels: Vec<Vec<f32>>,
}

/// Candidate lists scored by a cross-encoder.
pub struct ScoredLists {
    /// Each list's relevance labels.
    pub labels: Vec<Vec<f32>>,
    /// Each list's logits.
    pub scores: Vec<Vec<f32>>,
    /// The loss over the lists (see [`score_lists`]).
    pub loss: f64,
}

/// The objective of [`RerankTrainer`].
pub struct RerankTraining {
    model: BertForTask,
    tokenizer: Tokenizer,
    /// The training units, with their pairs encoded.
    units: Vec<RerankGroup>,
    pairs: Vec<Vec<Pair>>,
    dev: Option<Vec<RerankGroup>>,
    opts: RerankOptions,
    fast: bool,
    compute: Compute,
}

impl RerankTrainer {
    /// Prepares a run from a model folder (any encoder checkpoint: a fresh
    /// one-output head is drawn from the seed; or a cross-encoder with one
    /// output, whose head is kept) and training / dev files.
    pub fn new(
        model_dir: &Path,
        train: &Path,
        dev: Option<&Path>,
        opts: RerankOptions,
    ) -> Result<Self> {
        let dir = ModelDir::open(model_dir)?;
        let config = dir.config()?;
        let tokenizer = dir.tokenizer(opts.train.max_length)?;
        let weights = dir.weights()?;
        let is_ranker =
            config.architectures.iter().any(|a| {
                HeadKind::from_any_architecture(a) == Some(HeadKind::SequenceClassification)
            }) && config.num_labels() == 1;
        let has_head = weights.names().any(|n| n.starts_with(HEAD_PREFIX));
        let weights = if has_head && !is_ranker {
            tracing::warn!(
                "{}: its classifier is not a one-output ranking head: training a fresh one",
                model_dir.display()
            );
            without_head(weights, HEAD_PREFIX)?
        } else {
            weights
        };
        let config = ranker_config(config);
        let train = RerankData::read(train)?;
        let dev = dev.map(RerankData::read).transpose()?;
        let setup = ModelSetup {
            config,
            init: Some(weights),
            tokenizer_source: model_dir.to_path_buf(),
        };
        Self::from_parts(setup, &tokenizer, &train, dev.as_ref(), opts)
    }

    /// A run from parts: `setup.config` must be a one-output sequence
    /// classifier.
    pub fn from_parts(
        setup: ModelSetup,
        tokenizer: &Tokenizer,
        train: &RerankData,
        dev: Option<&RerankData>,
        opts: RerankOptions,
    ) -> Result<Self> {
        let config = setup.config.clone();
        validate(
            &opts.train,
            &config,
            &setup.tokenizer_source.join("config.json"),
        )?;
        if config.num_labels() != 1 {
            return Err(Error::Input(format!(
                "a reranker has one output, the config {}",
                config.num_labels()
            )));
        }
        let mut units = training_units(train, &opts.loss)?;
        if let Some(n) = opts.train.max_train {
            subsample(&mut units, n, opts.train.seed);
        }
        let pairs = encode_units(tokenizer, &units)?;
        let dev = dev.map(RerankData::to_lists);
        let origin = setup.tokenizer_source.clone();
        let tokenizer = tokenizer.clone();
        Trainer::build(setup, opts.train.loop_options(), |vb| {
            let model = BertForTask::load(vb, config.clone(), HeadKind::SequenceClassification)
                .map_err(|e| match e {
                    Error::Tensor(e) => Error::Weights {
                        path: origin,
                        reason: crate::io::weights::strip_backtrace(&e),
                    },
                    other => other,
                })?;
            let engine = opts.train.engine;
            let fast = engine.tries_fast() && FinetuneHead::of(&model)?.is_some();
            if !fast && engine.tries_fast() {
                engine.fallback(&format!(
                    "rerankers on `{}` models as configured",
                    config.model_type
                ))?;
            }
            if opts.train.precision != Compute::F32 && !fast {
                return Err(Error::option(
                    "precision",
                    format!(
                        "{:?} trains on the fast path only, which this run does not take",
                        opts.train.precision
                    ),
                ));
            }
            let compute = opts.train.precision.on_this_cpu();
            Ok(RerankTraining {
                model,
                tokenizer,
                units,
                pairs,
                dev,
                opts,
                fast,
                compute,
            })
        })
    }

    /// Whether training steps run on the fast path.
    pub fn on_fast_path(&self) -> bool {
        self.objective().fast
    }

    /// The training units (pairs, tuples or lists, by loss).
    pub fn train_units(&self) -> usize {
        self.objective().units.len()
    }

    /// Scores of the dev lists with the current weights.
    pub fn evaluate_dev(&self) -> Result<Option<Scores>> {
        self.objective().evaluate(self.group())
    }
}

impl RerankTraining {
    /// Each unit's pairs (with in-batch documents for `mnrl`) and labels.
    fn batch_pairs(&self, batch: &[usize], slice: &Slice) -> Result<BatchPairs> {
        let mut groups = Vec::with_capacity(batch.len());
        let mut labels = Vec::with_capacity(batch.len());
        for &u in batch {
            let mut pairs = self.pairs[u].clone();
            let mut y = self.units[u].labels.clone();
            if self.opts.loss.in_batch_negatives() {
                let query = self.units[u].query.as_str();
                let others: Vec<(&str, &str)> = slice
                    .micro_batch
                    .iter()
                    .filter(|&&v| v != u)
                    .flat_map(|&v| self.units[v].documents.iter().map(|d| (query, d.as_str())))
                    .collect();
                for e in self.tokenizer.encode_pair_batch(&others)? {
                    pairs.push((e.input_ids, e.token_type_ids));
                    y.push(0.0);
                }
            }
            groups.push(pairs);
            labels.push(y);
        }
        Ok(BatchPairs { groups, labels })
    }

    /// The loss sum of the groups' `logits` (flat, group after group).
    fn loss_sum(&self, logits: &[f32], labels: &[Vec<f32>]) -> Result<LossSum> {
        let mut scores = Vec::with_capacity(labels.len());
        let mut at = 0;
        for y in labels {
            let n = y.len();
            let part = logits
                .get(at..at + n)
                .ok_or_else(|| Error::Input("internal: fewer logits than documents".to_string()))?;
            scores.push(GroupScores {
                logits: part,
                labels: y,
            });
            at += n;
        }
        self.opts.loss.sum(&scores)
    }

    /// The candle modules' forward pass and the loss as a [`LossPart`]
    /// whose value is the mean loss and whose gradient is the loss's.
    fn candle_loss(
        &self,
        groups: &[Vec<Pair>],
        labels: &[Vec<f32>],
        count: usize,
        train: bool,
    ) -> Result<(f64, LossPart)> {
        let flat: Vec<&Pair> = groups.iter().flatten().collect();
        let ids: Vec<Vec<u32>> = flat.iter().map(|p| p.0.clone()).collect();
        let types: Vec<Vec<u32>> = flat.iter().map(|p| p.1.clone()).collect();
        let input = BertInput::padded_to(&ids, &types, self.tokenizer.pad_id(), 0, &Device::Cpu)?;
        let opts = ForwardOptions {
            train,
            ..ForwardOptions::default()
        };
        let TaskOutput::Logits(out) =
            self.model
                .forward(&input, &HeadLabels::default(), opts.into())?
        else {
            return Err(Error::Input(
                "internal: a reranker's head gives logits".into(),
            ));
        };
        let logits = out.logits.flatten_all()?;
        let values = logits.to_vec1::<f32>()?;
        let sum = self.loss_sum(&values, labels)?;
        if sum.count != count {
            return Err(Error::Input("internal: loss terms miscounted".into()));
        }
        let mean = sum.mean();
        // mean + Σ gᵢ·(xᵢ − x̄ᵢ): the value is the mean, the gradient g.
        let g: Vec<f32> = sum
            .grads
            .iter()
            .flatten()
            .map(|&g| (g / count.max(1) as f64) as f32)
            .collect();
        let g = Tensor::from_vec(g, values.len(), &Device::Cpu)?;
        let dot = (logits.clone() * &g)?.sum_all()?;
        let offset = f64::from(dot.to_scalar::<f32>()?);
        let part = dot.affine(1.0, mean - offset)?;
        Ok((mean, LossPart::new(part, count)))
    }

    /// The fast path's forward and backward: the mean loss and the
    /// gradients of `weight` times it.
    fn fast_step(
        &self,
        groups: &[Vec<Pair>],
        labels: &[Vec<f32>],
        weight: f64,
        train: bool,
    ) -> Result<(f64, GradStore)> {
        let head = FinetuneHead::of(&self.model)?
            .ok_or_else(|| {
                Error::Input("internal: the fast path no longer covers the model".into())
            })?
            .with_compute(self.compute);
        let loss = |logits: &[f32]| -> Result<(f64, usize, Vec<f64>)> {
            let sum = self.loss_sum(logits, labels)?;
            let n = sum.count.max(1) as f64;
            let grad = sum.grads.iter().flatten().map(|g| g / n).collect();
            Ok((sum.mean(), sum.count, grad))
        };
        let custom: &CustomLoss = &loss;
        let batch = HeadBatch {
            sequences: groups
                .iter()
                .flatten()
                .map(|(ids, types)| (&ids[..], &types[..]))
                .collect(),
            targets: HeadTargets::Custom(custom),
            pad_to: 0,
        };
        let out = head.step(&batch, weight, train)?;
        Ok((out.loss, out.gradients))
    }

    /// The dev lists' ranking scores with the current weights.
    fn dev_scores(&self, dev: &[RerankGroup]) -> Result<Scores> {
        let BertForTask::SequenceClassification(model) = &self.model else {
            return Err(Error::Input(
                "internal: a reranker is a sequence classifier".into(),
            ));
        };
        let opts = CrossEncoderOptions {
            batch_size: self.opts.train.eval_batch_size,
            ..CrossEncoderOptions::default()
        };
        let ce = CrossEncoder::new(
            model.clone(),
            self.tokenizer.clone(),
            Activation::Sigmoid,
            &opts,
        )?;
        let scored = score_lists(&ce, dev, &self.opts.loss)?;
        Ok(Scores {
            loss: scored.loss,
            scores: ranking_scores(&scored.labels, &scored.scores)?,
        })
    }
}

/// Each list's labels and logits under `ce`, and `loss` over the lists
/// (`mnrl`: each list alone, its best-labelled document as the positive).
pub fn score_lists(
    ce: &CrossEncoder,
    lists: &[RerankGroup],
    loss: &RerankLoss,
) -> Result<ScoredLists> {
    let pairs: Vec<(&str, &str)> = lists
        .iter()
        .flat_map(|g| g.documents.iter().map(|d| (g.query.as_str(), d.as_str())))
        .collect();
    // The relevance logit: the only one, or the last label's.
    let flat: Vec<f32> = ce
        .logits(&pairs)?
        .into_iter()
        .map(|l| l.last().copied().unwrap_or(f32::NAN))
        .collect();
    let mut scores = Vec::with_capacity(lists.len());
    let mut at = 0;
    for g in lists {
        scores.push(flat[at..at + g.documents.len()].to_vec());
        at += g.documents.len();
    }
    let labels: Vec<Vec<f32>> = lists.iter().map(|g| g.labels.clone()).collect();
    let (mut sum, mut count) = (0.0, 0);
    for (x, y) in scores.iter().zip(&labels) {
        let (x, y) = match loss {
            RerankLoss::Mnrl { .. } => {
                let Some(best) = (0..y.len()).max_by(|&a, &b| y[a].total_cmp(&y[b])) else {
                    continue;
                };
                let mut x = x.clone();
                x.swap(0, best);
                (x, y.clone())
            }
            _ => (x.clone(), y.clone()),
        };
        let s = loss.sum(&[GroupScores {
            logits: &x,
            labels: &y,
        }])?;
        sum += s.sum;
        count += s.count;
    }
    let loss = if count > 0 { sum / count as f64 } else { 0.0 };
    Ok(ScoredLists {
        labels,
        scores,
        loss,
    })
}

/// The loss's terms in a batch: known from the labels alone.
fn term_count(loss: &RerankLoss, labels: &[Vec<f32>]) -> usize {
    match loss {
        RerankLoss::Bce { .. } => labels.iter().map(Vec::len).sum(),
        RerankLoss::Mnrl { .. } | RerankLoss::ListNet => labels.len(),
        RerankLoss::Lambda => labels
            .iter()
            .map(|y| {
                y.iter()
                    .map(|a| y.iter().filter(|&b| a > b).count())
                    .sum::<usize>()
            })
            .sum(),
    }
}

/// The units a loss trains on: pairs (`bce`), tuples (`mnrl`), lists.
fn training_units(data: &RerankData, loss: &RerankLoss) -> Result<Vec<RerankGroup>> {
    Ok(match loss {
        RerankLoss::Bce { .. } => data.to_pairs(),
        RerankLoss::Mnrl { .. } => {
            if data.layout != RerankLayout::Tuples {
                return Err(Error::option(
                    "loss",
                    format!(
                        "mnrl trains on (query, positive, negative…) rows; {} holds {:?}",
                        data.path.display(),
                        data.layout
                    ),
                ));
            }
            data.groups.clone()
        }
        RerankLoss::Lambda | RerankLoss::ListNet => data.to_lists(),
    })
}

fn encode_units(tokenizer: &Tokenizer, units: &[RerankGroup]) -> Result<Vec<Vec<Pair>>> {
    let texts: Vec<(&str, &str)> = units
        .iter()
        .flat_map(|g| g.documents.iter().map(|d| (g.query.as_str(), d.as_str())))
        .collect();
    let mut encs = tokenizer.encode_pair_batch(&texts)?.into_iter();
    Ok(units
        .iter()
        .map(|g| {
            (&mut encs)
                .take(g.documents.len())
                .map(|e| (e.input_ids, e.token_type_ids))
                .collect()
        })
        .collect())
}

/// Keeps `n` units drawn with `seed`, in file order.
fn subsample(units: &mut Vec<RerankGroup>, n: usize, seed: u64) {
    use rand::seq::SliceRandom;
    if n >= units.len() {
        return;
    }
    let mut picked: Vec<usize> = (0..units.len()).collect();
    picked.shuffle(&mut crate::rng::rng_for(seed, SUBSAMPLE_STREAM, 0));
    picked.truncate(n);
    picked.sort_unstable();
    *units = picked.into_iter().map(|i| units[i].clone()).collect();
}

/// The purpose of `--max-train`'s draw.
const SUBSAMPLE_STREAM: u64 = 31;

impl Objective for RerankTraining {
    type Tally = MeanLoss;
    const STREAMS: Streams = Streams::new(32);

    fn input_lengths(&self) -> Vec<usize> {
        self.pairs
            .iter()
            .map(|g| g.iter().map(|p| p.0.len()).sum())
            .collect()
    }

    fn main_metric(&self) -> MainMetric {
        MainMetric {
            name: RANKING_MAIN_METRIC,
            greater_is_better: true,
        }
    }

    fn chart(&self) -> Chart {
        Chart {
            title: format!("reranker {} loss", self.opts.loss.name()),
            train_label: "train loss".into(),
            eval_label: "dev loss".into(),
            train_figure: None,
            scores_title: Some("reranking dev scores".into()),
        }
    }

    fn train_batch(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<MeanLoss>> {
        let BatchPairs { groups, labels } = self.batch_pairs(batch, slice)?;
        let tokens = groups.iter().flatten().map(|p| p.0.len()).sum();
        let count = term_count(&self.opts.loss, &labels);
        if self.fast {
            let share = match target_shares(&[count], batch.len(), tokens, slice.group)? {
                Ok(shares) => shares[0],
                Err(done) => return Ok(done),
            };
            let (loss, grads) = self.fast_step(&groups, &labels, share, true)?;
            return Ok(MicroStep {
                loss,
                gradients: Gradients::Computed(grads),
                tokens,
                tally: MeanLoss::of(loss, count),
            });
        }
        if count == 0 {
            return Ok(MicroStep {
                tokens,
                ..MicroStep::empty()
            });
        }
        let (loss, part) = self.candle_loss(&groups, &labels, count, true)?;
        Ok(MicroStep {
            loss,
            gradients: Gradients::Loss(vec![part]),
            tokens,
            tally: MeanLoss::of(loss, count),
        })
    }

    fn step_figures(&self, tallies: &[MeanLoss]) -> (f64, BTreeMap<String, f64>) {
        (MeanLoss::step_mean(tallies), BTreeMap::new())
    }

    fn evaluate(&self, _group: &dyn ProcessGroup) -> Result<Option<Scores>> {
        // Every process scores the whole dev set (it gets the same scores).
        self.dev.as_deref().map(|d| self.dev_scores(d)).transpose()
    }

    fn options_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.opts).unwrap_or_default()
    }

    fn data_fingerprint(&self) -> Fingerprint {
        let mut f = Fingerprint::default();
        for (pairs, unit) in self.pairs.iter().zip(&self.units) {
            for (ids, _) in pairs {
                f.add(ids.iter().map(|&t| i64::from(t)));
            }
            f.add(unit.labels.iter().map(|v| i64::from(v.to_bits())));
        }
        f
    }

    fn write_extras(&self, dir: &Path) -> Result<()> {
        write_cross_encoder_files(dir, self.opts.train.max_length, Activation::Sigmoid)?;
        write_json(&dir.join(TRAINING_ARGS_FILE), &self.opts)
    }
}

/// Writes the sentence-transformers 6 CrossEncoder files of a folder whose
/// weights, `config.json` and tokenizer are written by the caller, as
/// sentence-transformers 6.2 saves them; `modules.json`, which makes it a
/// sentence-transformers folder, comes last.
pub fn write_cross_encoder_files(
    dir: &Path,
    max_length: usize,
    activation: Activation,
) -> Result<()> {
    write_json(
        &dir.join("sentence_bert_config.json"),
        &json!({
            "transformer_task": "sequence-classification",
            "modality_config": {
                "text": {"method": "forward", "method_output_name": "logits"}
            },
            "module_output_name": "scores",
            "max_seq_length": max_length,
        }),
    )?;
    write_json(
        &dir.join("config_sentence_transformers.json"),
        &json!({
            "__version__": {"sentence_transformers": "6.2.0", "bertha": env!("CARGO_PKG_VERSION")},
            "activation_fn": activation.torch_path(),
            "default_prompt_name": null,
            "model_type": "CrossEncoder",
            "prompts": {},
        }),
    )?;
    write_json(
        &dir.join("modules.json"),
        &json!([{
            "idx": 0,
            "name": "0",
            "path": "",
            "type": "sentence_transformers.base.modules.transformer.Transformer",
        }]),
    )
}

/// The labels of `config` a reranker needs, for callers building one.
pub fn ranker_config(mut config: BertConfig) -> BertConfig {
    config.architectures = vec![HeadKind::SequenceClassification.class_name(&config.family)];
    config.id2label = BTreeMap::from([(0, "LABEL_0".to_string())]);
    config.problem_type = None;
    config
}
