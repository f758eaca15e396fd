//! Sentence-embedding training: a bi-encoder, as sentence-transformers
//! trains one. Every text column of a batch (anchor, positive,
//! negatives…, or the two sentences of a scored pair) is encoded by the
//! same model and pooled as the folder says; a contrastive or regression
//! loss ([`EmbeddingLoss`]) compares the vectors. The dev set is scored by
//! STS (Spearman of cosine against gold scores) or by retrieval (each
//! anchor's positive among all positives). The saved model is a
//! sentence-transformers folder.
//!
//! Data-parallel, each process encodes its rows of the batch and the
//! embeddings are gathered (sentence-transformers' `gather_across_devices`):
//! every process computes the whole batch's loss, but backpropagates only
//! through its own rows, so the processes' gradients sum to one process's
//! on the whole batch.

mod encoded;
mod fast;

use encoded::EncodedRows;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;

use super::distributed::{deals, shard, ProcessGroup};
use super::embedding_loss::{EmbeddingLoss, LossKind};
use super::finetune::FinetuneOptions;
use super::log::write_json;
use super::run_dir::Fingerprint;
use super::trainer::{
    Chart, Gradients, MainMetric, MeanLoss, MicroStep, ModelSetup, Objective, Scores, Slice,
    Streams, Trainer,
};
use crate::config::BertConfig;
use crate::data::{EmbeddingData, EmbeddingEval, PairLayout};
use crate::error::{Error, Result};
use crate::fast::train::Compute;
use crate::io::st_folder::SentenceTransformerSpec;
use crate::io::tokenizer::Tokenizer;
use crate::io::weights::Weights;
use crate::io::ModelDir;
use crate::model::{
    seed_dropout, seed_dropout_rows, BatchRows, BertInput, BertModel, ForwardOptions,
};
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
    /// Whether steps run on the fast engine (`fast.rs`; a data-parallel
    /// process with no rows of a micro-batch takes part in its gathers on
    /// candle).
    fast: bool,
    compute: Compute,
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
        if matches!(pooling, Pooling::None | Pooling::Pooler | Pooling::Splade) {
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
            let engine = opts.train.engine;
            let fast = fast::decide(engine, fast::not_covered(&model)?)?;
            if opts.train.precision != Compute::F32 && !fast {
                return Err(Error::option(
                    "precision",
                    format!(
                        "{:?} trains on the fast engine only, which this run does not take",
                        opts.train.precision
                    ),
                ));
            }
            let compute = opts.train.precision.on_this_cpu();
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
                fast,
                compute,
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

    /// Whether training steps run on the fast engine (a data-parallel
    /// run's, on the processes attached, run on candle under `--engine
    /// auto`).
    pub fn on_fast_path(&self) -> bool {
        self.objective().fast && self.group().size() == 1
    }

    /// The current model's dev scores (`None` without a dev set).
    pub fn evaluate_dev(&self) -> Result<Option<Scores>> {
        self.objective().evaluate(self.group())
    }
}

impl EmbeddingTraining {
    /// Sentence vectors [n, D] of `rows` of column `j` (dropout when
    /// `train`), differentiable.
    fn encode(&self, data: &EncodedRows, j: usize, rows: &[usize], train: bool) -> Result<Tensor> {
        self.encode_padded(data, j, rows, train, 0)
    }

    /// As [`Self::encode`], padded to at least `pad_to` tokens.
    fn encode_padded(
        &self,
        data: &EncodedRows,
        j: usize,
        rows: &[usize],
        train: bool,
        pad_to: usize,
    ) -> Result<Tensor> {
        let ids: Vec<Vec<u32>> = rows.iter().map(|&i| data.ids[j][i].clone()).collect();
        let types: Vec<Vec<u32>> = ids.iter().map(|s| vec![0; s.len()]).collect();
        let pad = self.tokenizer.pad_id();
        let input = BertInput::padded_to(&ids, &types, pad, pad_to, &self.device)?;
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

    /// Seeds the dropout of column `j` of micro-batch `micro` (of `batch`
    /// rows) for a pass over rows starting at row `first_row` of the
    /// micro-batch: each row's masks depend on the column and its place in
    /// the micro-batch alone, whichever process or mini-batch encodes it.
    /// One stream per micro-batch, column `j`'s rows keyed from `j ·
    /// batch`: the masks of every column's rows are those of one pass over
    /// the columns laid end to end, which is what the fast engine runs.
    fn seed_column(&self, micro: u64, j: usize, first_row: usize, batch: usize) {
        seed_dropout(
            seed_for(self.opts.train.seed, COLUMN_STREAM, micro),
            (j * batch + first_row) as u64,
        );
    }

    /// Seeds the dropout of one pass over every column's rows of `slice`
    /// (`len` of them from row `slice.first`), packed column after column:
    /// pass row `j · len + i` draws the masks of micro-batch row `j · B +
    /// first + i`, where [`Self::seed_column`] puts column `j`'s row
    /// `first + i`.
    fn seed_packed_columns(&self, slice: &Slice, len: usize) {
        seed_dropout_rows(
            seed_for(self.opts.train.seed, COLUMN_STREAM, slice.micro),
            BatchRows::blocks(
                slice.first as u64,
                len as u64,
                slice.micro_batch.len() as u64,
            ),
        );
    }

    /// The whole micro-batch's embeddings of one column, [B, D]: this
    /// process's rows (`local`, with their graph) between the other
    /// processes' (values only), in row order.
    fn gather_rows(&self, local: Option<Tensor>, group: &dyn ProcessGroup) -> Result<Tensor> {
        let dim = self.model.config().hidden_size;
        if group.size() == 1 {
            return Ok(match local {
                Some(t) => t,
                None => Tensor::zeros((0, dim), DType::F32, &self.device)?,
            });
        }
        let mine = match &local {
            Some(t) => t.flatten_all()?.to_vec1::<f32>()?,
            None => Vec::new(),
        };
        let mut parts = Vec::with_capacity(group.size());
        for (r, values) in group.gather_f32(&mine)?.into_iter().enumerate() {
            if r == group.rank() {
                parts.extend(local.clone());
            } else if !values.is_empty() {
                let n = values.len() / dim;
                parts.push(Tensor::from_vec(values, (n, dim), &self.device)?);
            }
        }
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// The loss of the whole micro-batch, whose rows `rows` (from row
    /// `first`) are this process's, and its gradient through them.
    fn gathered_loss(&self, rows: &[usize], slice: &Slice) -> Result<(f64, GradStore)> {
        let (micro, first, group) = (slice.micro, slice.first, slice.group);
        let mut reps = Vec::with_capacity(self.train.columns());
        for j in 0..self.train.columns() {
            // Padded as one process pads the whole micro-batch's column, so
            // each row's numbers do not depend on the slice it is in.
            let longest = slice
                .micro_batch
                .iter()
                .map(|&i| self.train.ids[j][i].len())
                .max()
                .unwrap_or(0);
            let local = if rows.is_empty() {
                None
            } else {
                self.seed_column(micro, j, first, slice.micro_batch.len());
                Some(self.encode_padded(&self.train, j, rows, true, longest)?)
            };
            reps.push(self.gather_rows(local, group)?);
        }
        let scores = self.train.gathered_scores(rows, group, &self.device)?;
        let loss = self.opts.loss.compute(&reps, scores.as_ref())?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        Ok((value, self.kept(loss.backward()?)?))
    }

    /// The parameters' gradients of `store` (dropping the activations').
    fn kept(&self, store: GradStore) -> Result<GradStore> {
        let mut kept = GradStore::default();
        for p in &self.params {
            if let Some(g) = store.get(p) {
                kept.insert(p, g.clone());
            }
        }
        Ok(kept)
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
    /// gradient with respect to the embeddings (data-parallel: of the whole
    /// micro-batch, gathered), then run each mini-batch again (same
    /// dropout) and backpropagate that gradient into the encoder. Loss and
    /// gradients equal the uncached loss's (the same masks: they depend on
    /// the row, not on the mini-batch); memory is one mini-batch's
    /// activations.
    fn cached_loss(&self, rows: &[usize], slice: &Slice) -> Result<(f64, GradStore)> {
        let (micro, first, group) = (slice.micro, slice.first, slice.group);
        let batch = slice.micro_batch.len();
        let mini = self.opts.mini_batch_size;
        // 1. Embeddings without their graphs.
        let mut reps = Vec::with_capacity(self.train.columns());
        for j in 0..self.train.columns() {
            let mut parts = Vec::new();
            for (k, chunk) in rows.chunks(mini).enumerate() {
                self.seed_column(micro, j, first + k * mini, batch);
                parts.push(self.encode(&self.train, j, chunk, true)?.detach());
            }
            let local = (!parts.is_empty())
                .then(|| Tensor::cat(&parts, 0))
                .transpose()?;
            reps.push(Var::from_tensor(&self.gather_rows(local, group)?)?);
        }
        // 2. The loss and d loss / d embedding.
        let tensors: Vec<Tensor> = reps.iter().map(|v| v.as_tensor().clone()).collect();
        let scores = self.train.gathered_scores(rows, group, &self.device)?;
        let loss = self.opts.loss.compute(&tensors, scores.as_ref())?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        let rep_grads = loss.backward()?;
        // 3. This process's mini-batches again, their embedding gradients
        // pushed through.
        let mut total = GradStore::default();
        for (j, rep) in tensors.iter().enumerate() {
            let grad = rep_grads.get(rep).cloned().unwrap_or(rep.zeros_like()?);
            for (k, chunk) in rows.chunks(mini).enumerate() {
                self.seed_column(micro, j, first + k * mini, batch);
                let emb = self.encode(&self.train, j, chunk, true)?;
                let g = grad.narrow(0, first + k * mini, chunk.len())?;
                let surrogate = (emb * g)?.sum_all()?;
                total.extend(self.kept(surrogate.backward()?)?)?;
            }
        }
        Ok((value, total))
    }

    /// Dev scores and loss; data-parallel, each process embeds its share
    /// of every column and runs its share of the loss batches.
    fn dev_scores(&self, dev: &DevSet, group: &dyn ProcessGroup) -> Result<Scores> {
        let rows = &dev.rows;
        let embedder = Embedder::new(
            self.model.clone(),
            self.tokenizer.clone(),
            self.pooling,
            true,
        )?;
        let bs = self.opts.train.eval_batch_size;
        let (rank, size) = (group.rank(), group.size());
        let scores =
            rows.prompted
                .evaluate(EmbeddingEval::for_layout(rows.data.layout), |texts| {
                    let part = &texts[shard(texts.len(), rank, size)];
                    let mine = if part.is_empty() {
                        Vec::new()
                    } else {
                        embedder.embed(part, bs, &mut |_| {})?
                    };
                    if size == 1 {
                        return Ok(mine);
                    }
                    let dim = self.model.config().hidden_size;
                    let all = group.gather_f32(&mine.concat())?;
                    Ok(all
                        .iter()
                        .flat_map(|v| v.chunks(dim).map(<[f32]>::to_vec))
                        .collect())
                })?;
        let loss = if check_layout(&rows.data, &self.opts.loss).is_ok() {
            let mut sums = [0.0, 0.0];
            let all: Vec<usize> = (0..rows.len()).collect();
            for (c, chunk) in all.chunks(self.opts.train.batch_size).enumerate() {
                if !deals(c, rank, size) {
                    continue;
                }
                let l = self.batch_loss(rows, chunk, false)?;
                sums[0] += f64::from(l.to_scalar::<f32>()?) * chunk.len() as f64;
                sums[1] += chunk.len() as f64;
            }
            group.sum_f64(&mut sums)?;
            sums[0] / sums[1].max(1.0)
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

/// The purpose of the per-column dropout seeds.
const COLUMN_STREAM: u64 = 23;

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

    fn train_batch(&self, batch: &[usize], slice: &Slice) -> Result<MicroStep<MeanLoss>> {
        // Every process computes the whole micro-batch's loss (gathered),
        // weighted by its rows in the step's figures: their sum over the
        // processes is the loss × B.
        let (loss, grads) = if self.fast_slice(batch) {
            self.fast_loss(batch, slice)?
        } else if self.opts.loss.kind == LossKind::CachedMnrl {
            self.cached_loss(batch, slice)?
        } else {
            self.gathered_loss(batch, slice)?
        };
        Ok(MicroStep {
            loss,
            gradients: Gradients::Computed(grads),
            tokens: Self::tokens(&self.train, batch),
            tally: MeanLoss::of(loss, batch.len()),
        })
    }

    fn step_figures(&self, tallies: &[MeanLoss]) -> (f64, BTreeMap<String, f64>) {
        (MeanLoss::step_mean(tallies), BTreeMap::new())
    }

    fn evaluate(&self, group: &dyn ProcessGroup) -> Result<Option<Scores>> {
        self.dev
            .as_ref()
            .map(|d| self.dev_scores(d, group))
            .transpose()
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
