//! Sentence-embedding training: a bi-encoder, as sentence-transformers
//! trains one. Every text column of a batch (anchor, positive,
//! negatives…, or the two sentences of a scored pair) is encoded by the
//! same model and pooled as the folder says; a contrastive or regression
//! loss ([`EmbeddingLoss`]) compares the vectors. The dev set is scored by
//! STS (Spearman of cosine against gold scores) or by retrieval (each
//! anchor's positive among all positives). The saved model is a
//! sentence-transformers folder.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;

use super::embedding_loss::{EmbeddingLoss, LossKind};
use super::finetune::FinetuneOptions;
use super::log::write_json;
use super::run_dir::Fingerprint;
use super::trainer::{
    Chart, Gradients, LossPart, MainMetric, MeanLoss, MicroStep, ModelSetup, Objective, Scores,
    Streams, Trainer,
};
use crate::config::BertConfig;
use crate::data::{EmbeddingData, EmbeddingEval, PairLayout};
use crate::error::{Error, Result};
use crate::io::st_folder::SentenceTransformerSpec;
use crate::io::tokenizer::Tokenizer;
use crate::io::weights::Weights;
use crate::io::ModelDir;
use crate::model::{seed_dropout, BertInput, BertModel, ForwardOptions};
use crate::pooling::{self, Pooling};
use crate::rng::seed_for;
use crate::tasks::embed::Embedder;
use crate::tasks::finetuned::TRAINING_ARGS_FILE;

/// A sentence-embedding training run.
pub type EmbeddingTrainer = Trainer<EmbeddingTraining>;

/// The prompt name of a row's first column (anchor, sentence1) and of the
/// others (positive, negatives, sentence2), as E5 / BGE name them.
pub const QUERY_PROMPT: &str = "query";
pub const DOCUMENT_PROMPT: &str = "document";

/// Options of a run: the loop's (shared with fine-tuning) and the
/// embedding model's.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EmbeddingOptions {
    pub loss: EmbeddingLoss,
    /// cached-mnrl: texts per encoder pass (bounds activation memory).
    pub mini_batch_size: usize,
    /// Pooling and normalisation (`None`: the folder's, else mean and
    /// none).
    pub pooling: Option<Pooling>,
    pub normalize: Option<bool>,
    /// Prompts prepended to texts: by column name, or `query` (the first
    /// column) / `document` (the others). Saved in the output folder.
    pub prompts: BTreeMap<String, String>,
    /// Never put two rows sharing a text in one batch
    /// (sentence-transformers' `no_duplicates` sampler). `None`: on for the
    /// in-batch-negative losses, off for scored pairs.
    pub no_duplicates: Option<bool>,
    /// Epochs, rate, batch sizes, schedule, checkpoints, output folder.
    pub train: FinetuneOptions,
}

impl EmbeddingOptions {
    pub fn new(loss: EmbeddingLoss, train: FinetuneOptions) -> Self {
        Self {
            loss,
            mini_batch_size: 32,
            pooling: None,
            normalize: None,
            prompts: BTreeMap::new(),
            no_duplicates: None,
            train,
        }
    }

    fn no_duplicates(&self) -> bool {
        self.no_duplicates.unwrap_or(!self.loss.kind.needs_scores())
    }

    /// The prompt of column `j` named `name`.
    fn prompt(&self, j: usize, name: &str) -> &str {
        let role = if j == 0 {
            QUERY_PROMPT
        } else {
            DOCUMENT_PROMPT
        };
        self.prompts
            .get(name)
            .or_else(|| self.prompts.get(role))
            .map_or("", String::as_str)
    }
}

/// Pairs or scored pairs, tokenized once, prompts included.
struct EncodedRows {
    data: EmbeddingData,
    /// The same rows with each column's prompt prepended (what is encoded).
    prompted: EmbeddingData,
    /// [column][row] token ids.
    ids: Vec<Vec<Vec<u32>>>,
}

impl EncodedRows {
    fn new(data: EmbeddingData, tokenizer: &Tokenizer, opts: &EmbeddingOptions) -> Result<Self> {
        let mut prompted = data.clone();
        for (j, name) in data.columns.iter().enumerate() {
            let prompt = opts.prompt(j, name);
            if !prompt.is_empty() {
                for row in &mut prompted.rows {
                    row[j] = format!("{prompt}{}", row[j]);
                }
            }
        }
        let ids = (0..data.columns.len())
            .map(|j| {
                let column: Vec<&str> = prompted.column(j).collect();
                let enc = tokenizer.encode_batch(&column)?;
                Ok(enc.into_iter().map(|e| e.input_ids).collect())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            data,
            prompted,
            ids,
        })
    }

    fn len(&self) -> usize {
        self.data.rows.len()
    }

    fn columns(&self) -> usize {
        self.ids.len()
    }

    /// Gold scores of `rows`, [n].
    fn scores(&self, rows: &[usize], device: &Device) -> Result<Option<Tensor>> {
        let Some(s) = &self.data.scores else {
            return Ok(None);
        };
        let picked: Vec<f32> = rows.iter().map(|&i| s[i]).collect();
        Ok(Some(Tensor::from_vec(picked, rows.len(), device)?))
    }
}

/// The held-out set: STS pairs or retrieval pairs.
struct DevSet {
    rows: EncodedRows,
}

/// Training a sentence encoder with one of the embedding losses.
pub struct EmbeddingTraining {
    model: BertModel,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    train: EncodedRows,
    dev: Option<DevSet>,
    opts: EmbeddingOptions,
    /// The trainable tensors (GradCache keeps only their gradients).
    params: Vec<Tensor>,
    device: Device,
}

impl EmbeddingTrainer {
    /// Prepares a run from a model folder (a sentence-transformers folder
    /// or a plain checkpoint) and training / dev data.
    pub fn new(
        model_dir: &Path,
        train: EmbeddingData,
        dev: Option<EmbeddingData>,
        opts: EmbeddingOptions,
    ) -> Result<Self> {
        let dir = ModelDir::open(model_dir)?;
        let (mut config, weights) = dir.config_and_weights()?;
        let spec = SentenceTransformerSpec::from_dir(model_dir)?;
        let tokenizer = dir.model_tokenizer(&config, opts.train.max_length)?;
        let pooling = opts
            .pooling
            .or(spec.as_ref().map(|s| s.pooling))
            .unwrap_or(Pooling::Mean);
        let normalize = opts
            .normalize
            .unwrap_or_else(|| spec.as_ref().is_some_and(|s| s.normalize));
        let weights = encoder_at_root(weights, config.family.prefix())?;
        config.architectures = vec!["BertModel".into()];
        Self::from_parts(
            config,
            weights,
            tokenizer,
            model_dir,
            (pooling, normalize),
            train,
            dev,
            opts,
        )
    }

    /// A run from parts: `weights` at the root (a bare encoder).
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        config: BertConfig,
        weights: Weights,
        tokenizer: Tokenizer,
        tokenizer_source: &Path,
        (pooling, normalize): (Pooling, bool),
        train: EmbeddingData,
        dev: Option<EmbeddingData>,
        opts: EmbeddingOptions,
    ) -> Result<Self> {
        if matches!(pooling, Pooling::None | Pooling::Pooler) {
            return Err(Error::option(
                "pooling",
                format!(
                    "`{}` cannot train a sentence embedding (use mean, cls, max or mean_sqrt_len)",
                    pooling.name()
                ),
            ));
        }
        if opts.mini_batch_size == 0 {
            return Err(Error::option("mini_batch_size", "must be at least 1"));
        }
        if opts.train.max_length > config.max_sequence_length() {
            return Err(Error::option(
                "max_length",
                format!(
                    "{} is longer than the model's limit of {} tokens",
                    opts.train.max_length,
                    config.max_sequence_length()
                ),
            ));
        }
        opts.loss
            .validate(config.hidden_size, train.columns.len())?;
        check_layout(&train, &opts.loss)?;
        if opts.train.early_stop.is_some() && dev.is_none() {
            return Err(Error::option("early_stop", "needs a dev set to watch"));
        }
        let mut train = train;
        if let Some(n) = opts.train.max_train {
            if n == 0 {
                return Err(Error::option("max_train", "must be at least 1"));
            }
            subsample(&mut train, n, opts.train.seed);
        }
        let train = EncodedRows::new(train, &tokenizer, &opts)?;
        let dev = dev
            .map(|d| EncodedRows::new(d, &tokenizer, &opts).map(|rows| DevSet { rows }))
            .transpose()?;
        let setup = ModelSetup {
            config: config.clone(),
            init: Some(weights),
            tokenizer_source: tokenizer_source.to_path_buf(),
        };
        let origin = tokenizer_source.to_path_buf();
        let loop_options = opts.train.loop_options();
        let mut trainer = Trainer::build(setup, loop_options, |vb| {
            let model = BertModel::load(vb, config.clone(), false).map_err(|e| Error::Weights {
                path: origin,
                reason: crate::io::weights::strip_backtrace(&e),
            })?;
            Ok(EmbeddingTraining {
                model,
                tokenizer,
                pooling,
                normalize,
                train,
                dev,
                opts,
                params: Vec::new(),
                device: Device::Cpu,
            })
        })?;
        let params = trainer
            .params()
            .vars()
            .map(|(_, v)| v.as_tensor().clone())
            .collect();
        trainer.objective_mut().params = params;
        Ok(trainer)
    }

    /// The current model's dev scores (`None` without a dev set).
    pub fn evaluate_dev(&self) -> Result<Option<Scores>> {
        self.objective().evaluate()
    }

    /// The loss and its gradients on training rows `rows`, dropout as the
    /// config says, by parameter name: what one micro-batch contributes.
    pub fn loss_and_gradients(&self, rows: &[usize]) -> Result<(f64, HashMap<String, Tensor>)> {
        seed_dropout(
            seed_for(
                self.loop_options().seed,
                EmbeddingTraining::STREAMS.dropout,
                0,
            ),
            0,
        );
        let out = self.objective().train_batch(rows, 0, 0)?;
        let grads = match out.gradients {
            // One term, the whole batch's.
            Gradients::Loss(parts) => match parts.into_iter().next() {
                Some(p) => p.mean.backward()?,
                None => GradStore::default(),
            },
            Gradients::Computed(g) => g,
            Gradients::None => GradStore::default(),
        };
        let named = self
            .params()
            .vars()
            .filter_map(|(n, v)| Some((n.to_string(), grads.get(v.as_tensor())?.clone())))
            .collect();
        Ok((out.loss, named))
    }
}

impl EmbeddingTraining {
    /// Sentence vectors [n, D] of `rows` of column `j` (dropout when
    /// `train`), differentiable.
    fn encode(&self, data: &EncodedRows, j: usize, rows: &[usize], train: bool) -> Result<Tensor> {
        let ids: Vec<Vec<u32>> = rows.iter().map(|&i| data.ids[j][i].clone()).collect();
        let types: Vec<Vec<u32>> = ids.iter().map(|s| vec![0; s.len()]).collect();
        let input = BertInput::from_ids(&ids, &types, self.tokenizer.pad_id(), &self.device)?;
        let out = self.model.forward(
            &input,
            ForwardOptions {
                train,
                ..ForwardOptions::default()
            },
        )?;
        let mask = input
            .attention_mask
            .as_ref()
            .ok_or_else(|| Error::Input("no attention mask".into()))?;
        let pooled = pooling::pool(&out.last_hidden_state, mask, self.pooling, None)?;
        Ok(if self.normalize {
            pooling::normalize(&pooled)?
        } else {
            pooled
        })
    }

    fn tokens(data: &EncodedRows, rows: &[usize]) -> usize {
        data.ids
            .iter()
            .map(|col| rows.iter().map(|&i| col[i].len()).sum::<usize>())
            .sum()
    }

    /// The loss of `rows` with one forward pass per column.
    fn batch_loss(&self, data: &EncodedRows, rows: &[usize], train: bool) -> Result<Tensor> {
        let reps = (0..data.columns())
            .map(|j| self.encode(data, j, rows, train))
            .collect::<Result<Vec<_>>>()?;
        let scores = data.scores(rows, &self.device)?;
        Ok(self.opts.loss.compute(&reps, scores.as_ref())?)
    }

    /// GradCache (Gao et al., 2021), as sentence-transformers'
    /// CachedMultipleNegativesRankingLoss: embed every column in
    /// mini-batches without keeping activations, take the loss and its
    /// gradient with respect to the embeddings, then run each mini-batch
    /// again (same dropout) and backpropagate that gradient into the
    /// encoder. Loss and gradients equal the uncached loss's for the same
    /// dropout masks; memory is one mini-batch's activations.
    fn cached_loss(&self, rows: &[usize], micro: u64) -> Result<(f64, GradStore)> {
        let chunks: Vec<&[usize]> = rows.chunks(self.opts.mini_batch_size).collect();
        let columns = self.train.columns();
        let seed = |j: usize, k: usize| {
            seed_for(
                self.opts.train.seed,
                GRAD_CACHE_STREAM,
                (micro * columns as u64 + j as u64) * chunks.len() as u64 + k as u64,
            )
        };
        // 1. Embeddings without their graphs.
        let mut reps = Vec::with_capacity(columns);
        for j in 0..columns {
            let mut parts = Vec::with_capacity(chunks.len());
            for (k, chunk) in chunks.iter().enumerate() {
                seed_dropout(seed(j, k), 0);
                parts.push(self.encode(&self.train, j, chunk, true)?.detach());
            }
            reps.push(Var::from_tensor(&Tensor::cat(&parts, 0)?)?);
        }
        // 2. The loss and d loss / d embedding.
        let tensors: Vec<Tensor> = reps.iter().map(|v| v.as_tensor().clone()).collect();
        let scores = self.train.scores(rows, &self.device)?;
        let loss = self.opts.loss.compute(&tensors, scores.as_ref())?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        let rep_grads = loss.backward()?;
        // 3. Each mini-batch again, its embedding gradient pushed through.
        let mut total = GradStore::default();
        for (j, rep) in tensors.iter().enumerate() {
            let grad = rep_grads.get(rep).cloned().unwrap_or(rep.zeros_like()?);
            let mut start = 0;
            for (k, chunk) in chunks.iter().enumerate() {
                seed_dropout(seed(j, k), 0);
                let emb = self.encode(&self.train, j, chunk, true)?;
                let g = grad.narrow(0, start, chunk.len())?;
                start += chunk.len();
                let surrogate = (emb * g)?.sum_all()?;
                let store = surrogate.backward()?;
                let mut kept = GradStore::default();
                for p in &self.params {
                    if let Some(g) = store.get(p) {
                        kept.insert(p, g.clone());
                    }
                }
                total.extend(kept)?;
            }
        }
        Ok((value, total))
    }

    fn dev_scores(&self, dev: &DevSet) -> Result<Scores> {
        let rows = &dev.rows;
        let embedder = Embedder::new(
            self.model.clone(),
            self.tokenizer.clone(),
            self.pooling,
            true,
        )?;
        let bs = self.opts.train.eval_batch_size;
        let scores = rows
            .prompted
            .evaluate(EmbeddingEval::for_layout(rows.data.layout), |texts| {
                embedder.embed(texts, bs, &mut |_| {})
            })?;
        let loss = if check_layout(&rows.data, &self.opts.loss).is_ok() {
            let mut sum = 0.0;
            let mut n = 0usize;
            let all: Vec<usize> = (0..rows.len()).collect();
            for chunk in all.chunks(self.opts.train.batch_size) {
                let l = self.batch_loss(rows, chunk, false)?;
                sum += f64::from(l.to_scalar::<f32>()?) * chunk.len() as f64;
                n += chunk.len();
            }
            sum / n.max(1) as f64
        } else {
            f64::NAN
        };
        Ok(Scores { loss, scores })
    }

    /// The sentence-transformers modules of the saved model.
    fn spec(&self) -> SentenceTransformerSpec {
        let mut spec = SentenceTransformerSpec::new(self.pooling, self.normalize);
        spec.max_seq_length = Some(self.opts.train.max_length);
        spec.prompts = self.opts.prompts.clone();
        spec.similarity_fn_name = Some("cosine".into());
        spec
    }
}

/// The purpose of GradCache's per-mini-batch dropout seeds.
const GRAD_CACHE_STREAM: u64 = 23;

impl Objective for EmbeddingTraining {
    /// The micro-batch's loss (over its rows).
    type Tally = MeanLoss;
    const STREAMS: Streams = Streams::new(22);

    fn input_lengths(&self) -> Vec<usize> {
        (0..self.train.len())
            .map(|i| self.train.ids.iter().map(|c| c[i].len()).sum())
            .collect()
    }

    fn main_metric(&self) -> MainMetric {
        let layout = self
            .dev
            .as_ref()
            .map_or(PairLayout::Scored, |d| d.rows.data.layout);
        MainMetric {
            name: EmbeddingEval::for_layout(layout).main_metric(),
            greater_is_better: true,
        }
    }

    fn chart(&self) -> Chart {
        let scores = match self.dev.as_ref().map(|d| d.rows.data.layout) {
            Some(PairLayout::Texts) => "retrieval dev scores",
            _ => "STS dev scores",
        };
        Chart {
            title: format!("{} loss", self.opts.loss.kind),
            train_label: "train loss".into(),
            eval_label: "dev loss".into(),
            train_figure: None,
            scores_title: Some(scores.into()),
        }
    }

    fn train_batch(
        &self,
        batch: &[usize],
        micro: u64,
        _first: usize,
    ) -> Result<MicroStep<MeanLoss>> {
        let tokens = Self::tokens(&self.train, batch);
        if self.opts.loss.kind == LossKind::CachedMnrl {
            let (loss, grads) = self.cached_loss(batch, micro)?;
            return Ok(MicroStep {
                loss,
                gradients: Gradients::Computed(grads),
                tokens,
                tally: MeanLoss::of(loss, batch.len()),
            });
        }
        let loss = self.batch_loss(&self.train, batch, true)?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        Ok(MicroStep {
            loss: value,
            gradients: Gradients::Loss(vec![LossPart::new(loss, batch.len())]),
            tokens,
            tally: MeanLoss::of(value, batch.len()),
        })
    }

    fn step_figures(&self, tallies: &[MeanLoss]) -> (f64, BTreeMap<String, f64>) {
        (MeanLoss::step_mean(tallies), BTreeMap::new())
    }

    /// In-batch losses need every row of the batch (sentence-transformers
    /// gathers them across devices): not built yet, so one process only.
    fn data_parallel(&self) -> bool {
        false
    }

    fn evaluate(&self) -> Result<Option<Scores>> {
        self.dev.as_ref().map(|d| self.dev_scores(d)).transpose()
    }

    fn options_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.opts).unwrap_or_default()
    }

    fn data_fingerprint(&self) -> Fingerprint {
        let mut f = Fingerprint::default();
        for col in &self.train.ids {
            for ids in col {
                f.add(ids.iter().map(|&t| i64::from(t)));
            }
        }
        if let Some(s) = &self.train.data.scores {
            f.add(s.iter().map(|v| i64::from(v.to_bits())));
        }
        f
    }

    fn batch_keys(&self) -> Option<Vec<Vec<u64>>> {
        if !self.opts.no_duplicates() {
            return None;
        }
        Some(
            self.train
                .data
                .rows
                .iter()
                .map(|r| r.iter().map(|t| text_key(t)).collect())
                .collect(),
        )
    }

    fn write_extras(&self, dir: &Path) -> Result<()> {
        self.spec().write(dir, self.model.config().hidden_size)?;
        write_json(&dir.join(TRAINING_ARGS_FILE), &self.opts)
    }
}

/// Keeps `n` rows drawn with `seed` (in file order), as `--max-train` does
/// for the other tasks.
fn subsample(data: &mut EmbeddingData, n: usize, seed: u64) {
    use rand::seq::SliceRandom;
    if n >= data.rows.len() {
        return;
    }
    let mut picked: Vec<usize> = (0..data.rows.len()).collect();
    picked.shuffle(&mut crate::rng::rng_for(seed, SUBSAMPLE_STREAM, 0));
    picked.truncate(n);
    picked.sort_unstable();
    let take = |v: &[usize]| picked.iter().map(|&i| v[i]).collect::<Vec<_>>();
    if data.lines.len() == data.rows.len() {
        data.lines = take(&data.lines);
    }
    data.rows = picked
        .iter()
        .map(|&i| std::mem::take(&mut data.rows[i]))
        .collect();
    if let Some(s) = &data.scores {
        data.scores = Some(picked.iter().map(|&i| s[i]).collect());
    }
}

/// The purpose of `--max-train`'s draw.
const SUBSAMPLE_STREAM: u64 = 24;

fn text_key(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Refuses data whose layout the loss cannot learn from.
fn check_layout(data: &EmbeddingData, loss: &EmbeddingLoss) -> Result<()> {
    let scored = data.layout == PairLayout::Scored;
    if loss.kind.needs_scores() != scored {
        let has = if scored {
            "scored pairs (sentence1, sentence2, score)"
        } else {
            "text columns without scores (anchor, positive, …)"
        };
        let wants = if loss.kind.needs_scores() {
            "scored pairs"
        } else {
            "anchor / positive (/ negative) columns"
        };
        return Err(Error::Input(format!(
            "{}: holds {has}, but the {} loss trains on {wants}",
            data.path.display(),
            loss.kind
        )));
    }
    Ok(())
}

/// The checkpoint's encoder tensors at the root (the layout
/// sentence-transformers and `BertModel` save): a head checkpoint's
/// `bert.` prefix is dropped with the head.
fn encoder_at_root(weights: Weights, prefix: &str) -> Result<Weights> {
    let origin = weights.origin().to_path_buf();
    let base = weights.base_prefix(prefix).ok_or_else(|| Error::Weights {
        path: origin.clone(),
        reason: "missing tensor `embeddings.word_embeddings.weight`".into(),
    })?;
    if base.is_empty() {
        return Ok(weights);
    }
    let names: Vec<String> = weights
        .names()
        .filter(|n| n.starts_with(&base))
        .map(str::to_string)
        .collect();
    let mut tensors = HashMap::with_capacity(names.len());
    for n in names {
        let t = weights
            .get_unchecked(&n, DType::F32, &Device::Cpu)
            .map_err(|e| Error::Weights {
                path: origin.clone(),
                reason: crate::io::weights::strip_backtrace(&e),
            })?;
        tensors.insert(n[base.len()..].to_string(), t);
    }
    Ok(Weights::from_tensors(tensors, origin))
}
