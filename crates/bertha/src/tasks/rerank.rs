//! Cross-encoders (rerankers), as sentence-transformers' `CrossEncoder`:
//! a sequence-classification model reads a (query, document) pair together
//! and gives it a score; `rank` orders documents by it.
//!
//! The score's activation is the folder's, found where sentence-
//! transformers looks: `config_sentence_transformers.json`'s
//! `activation_fn` (version 4 on), else `config.json`'s
//! `sentence_transformers.activation_fn`, else its older
//! `sbert_ce_default_activation_function`; without any, sigmoid for one
//! label and the raw logits for more.

use std::path::Path;

use candle_core::Device;
use serde_json::Value;

use super::classify::ScoreFunction;
use super::pipeline::{self, sigmoid, softmax, PipelineHead};
use super::precision::HeadEncoder;
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;
use crate::model::{BertForSequenceClassification, BertHead};

/// What turns a pair's logits into its score (sentence-transformers'
/// `activation_fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Sigmoid,
    /// The raw logits (`torch.nn.Identity`).
    Identity,
    Tanh,
    /// Over the labels of one pair.
    Softmax,
}

impl Activation {
    /// The torch class path sentence-transformers writes for it.
    pub fn torch_path(self) -> &'static str {
        match self {
            Self::Sigmoid => "torch.nn.modules.activation.Sigmoid",
            Self::Identity => "torch.nn.modules.linear.Identity",
            Self::Tanh => "torch.nn.modules.activation.Tanh",
            Self::Softmax => "torch.nn.modules.activation.Softmax",
        }
    }

    /// The activation a torch class path names (`None`: one we do not
    /// know, which sentence-transformers would only load with remote
    /// code).
    pub fn from_torch_path(path: &str) -> Option<Self> {
        let class = path.rsplit('.').next()?;
        let known = path.starts_with("torch.");
        match class {
            "Sigmoid" if known => Some(Self::Sigmoid),
            "Identity" if known => Some(Self::Identity),
            "Tanh" if known => Some(Self::Tanh),
            "Softmax" if known => Some(Self::Softmax),
            _ => None,
        }
    }

    /// sentence-transformers' default: sigmoid for one label, else none.
    pub fn default_for(num_labels: usize) -> Self {
        if num_labels == 1 {
            Self::Sigmoid
        } else {
            Self::Identity
        }
    }

    /// Applies the activation to one pair's logits.
    pub fn apply(self, logits: &[f32]) -> Vec<f32> {
        match self {
            Self::Sigmoid => logits.iter().map(|&x| sigmoid(x)).collect(),
            Self::Identity => logits.to_vec(),
            Self::Tanh => logits.iter().map(|x| x.tanh()).collect(),
            Self::Softmax => softmax(logits),
        }
    }

    /// The activation a folder names, as sentence-transformers resolves it
    /// (see the module's documentation), else the default for its labels.
    pub fn of_folder(dir: &Path, config: &BertConfig) -> Result<Self> {
        let default = Self::default_for(config.num_labels());
        Ok(Self::named_in(dir, default)?.unwrap_or(default))
    }

    /// The activation a folder names, if it names one. An unknown class is
    /// warned about and `default` used, as sentence-transformers does
    /// without `trust_remote_code`.
    pub fn named_in(dir: &Path, default: Self) -> Result<Option<Self>> {
        let named = |file: &Path, v: Option<&Value>, field: &str| -> Result<Option<Self>> {
            let Some(v) = v.filter(|v| !v.is_null()) else {
                return Ok(None);
            };
            let Some(path) = v.as_str() else {
                return Err(Error::config(file, field, "expected a torch class path"));
            };
            Ok(Some(Self::from_torch_path(path).unwrap_or_else(|| {
                tracing::warn!(
                    "{}: {field} `{path}` is not a torch activation bertha knows: using {default:?}",
                    file.display()
                );
                default
            })))
        };
        let st = dir.join("config_sentence_transformers.json");
        if st.is_file() {
            let v = read_json(&st)?;
            if let Some(a) = named(&st, v.get("activation_fn"), "activation_fn")? {
                return Ok(Some(a));
            }
        }
        let cfg = dir.join("config.json");
        if cfg.is_file() {
            let v = read_json(&cfg)?;
            let nested = v
                .get("sentence_transformers")
                .and_then(|s| s.get("activation_fn"));
            if let Some(a) = named(&cfg, nested, "sentence_transformers.activation_fn")? {
                return Ok(Some(a));
            }
            let old = v.get("sbert_ce_default_activation_function");
            return named(&cfg, old, "sbert_ce_default_activation_function");
        }
        Ok(None)
    }

    /// The text-classification score function that applies it.
    pub fn score_function(self) -> ScoreFunction {
        match self {
            Self::Sigmoid => ScoreFunction::Sigmoid,
            Self::Identity => ScoreFunction::None,
            Self::Tanh => ScoreFunction::Tanh,
            Self::Softmax => ScoreFunction::Softmax,
        }
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// How a cross-encoder is loaded and run.
#[derive(Debug, Clone, Copy)]
pub struct CrossEncoderOptions {
    /// The encoder's number format. fp32 runs on the packed fast path
    /// where it takes the model (the candle modules elsewhere).
    pub precision: Precision,
    /// Tokens per pair, special tokens included (`None`: the folder's,
    /// else the model's limit). Longer pairs are cut, the longer text
    /// first, as sentence-transformers does.
    pub max_length: Option<usize>,
    /// Pairs per forward pass (pairs of similar length go together).
    pub batch_size: usize,
    /// Run fp32 on the packed fast path where it takes the model (`false`:
    /// the candle modules, exactly).
    pub fast_f32: bool,
}

impl Default for CrossEncoderOptions {
    fn default() -> Self {
        Self {
            precision: Precision::F32,
            max_length: None,
            batch_size: 32,
            fast_f32: true,
        }
    }
}

/// A document's place in a ranking.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Ranked {
    /// Its index in the documents given.
    pub corpus_id: usize,
    pub score: f32,
}

/// A reranker: scores (query, document) pairs.
pub struct CrossEncoder {
    model: PipelineHead<BertForSequenceClassification>,
    tokenizer: Tokenizer,
    activation: Activation,
    batch_size: usize,
}

impl CrossEncoder {
    /// Loads a sentence-transformers CrossEncoder folder, or any folder
    /// with a sequence-classification head.
    pub fn from_dir(dir: &Path, device: &Device, opts: &CrossEncoderOptions) -> Result<Self> {
        let (head, tokenizer) =
            pipeline::load_head::<BertForSequenceClassification>(dir, device, opts.max_length)?;
        let activation = Activation::of_folder(dir, head_config(&head))?;
        Self::new(head, tokenizer, activation, opts)
    }

    /// A cross-encoder over a model in memory (its weights as they are
    /// now: the fast path packs a copy); `opts.max_length` is the
    /// tokenizer's.
    pub fn new(
        model: BertForSequenceClassification,
        tokenizer: Tokenizer,
        activation: Activation,
        opts: &CrossEncoderOptions,
    ) -> Result<Self> {
        let encoder = match opts.fast_f32 {
            true => HeadEncoder::fast(BertHead::bert(&model), &tokenizer, opts.precision)?,
            false => HeadEncoder::new(BertHead::bert(&model), &tokenizer, opts.precision)?,
        };
        Ok(Self {
            model: PipelineHead::with_encoder(model, encoder),
            tokenizer,
            activation,
            batch_size: opts.batch_size.max(1),
        })
    }

    pub fn num_labels(&self) -> usize {
        self.config().num_labels()
    }

    pub fn config(&self) -> &BertConfig {
        head_config(self.model.head())
    }

    pub fn activation(&self) -> Activation {
        self.activation
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn precision(&self) -> Precision {
        self.model.precision()
    }

    /// The logits of each pair (`num_labels` each), in the pairs' order.
    /// Pairs are tokenized together (`[CLS] query [SEP] document [SEP]`
    /// with token types) and cut to the length limit.
    pub fn logits<Q: AsRef<str>, D: AsRef<str>>(&self, pairs: &[(Q, D)]) -> Result<Vec<Vec<f32>>> {
        for (i, (q, d)) in pairs.iter().enumerate() {
            if q.as_ref().is_empty() && d.as_ref().is_empty() {
                return Err(Error::Input(format!("pair {i}: both texts are empty")));
            }
        }
        let texts: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(q, d)| (q.as_ref(), d.as_ref()))
            .collect();
        let encs = self.tokenizer.encode_pair_batch(&texts)?;
        let pad = self.tokenizer.pad_id();
        let seqs: Vec<(&[u32], &[u32])> = encs
            .iter()
            .map(|e| (&e.input_ids[..], &e.token_type_ids[..]))
            .collect();
        self.model.many_logits(&seqs, self.batch_size, pad)
    }

    /// Each pair's scores: its logits through the folder's activation
    /// (sentence-transformers' `predict`).
    pub fn predict<Q: AsRef<str>, D: AsRef<str>>(&self, pairs: &[(Q, D)]) -> Result<Vec<Vec<f32>>> {
        Ok(self
            .logits(pairs)?
            .iter()
            .map(|l| self.activation.apply(l))
            .collect())
    }

    /// One relevance score per pair: the score of a one-label model, or of
    /// the last label (the "relevant" class) of a model with more.
    pub fn scores<Q: AsRef<str>, D: AsRef<str>>(&self, pairs: &[(Q, D)]) -> Result<Vec<f32>> {
        Ok(self
            .predict(pairs)?
            .into_iter()
            .map(|s| s.last().copied().unwrap_or(f32::NAN))
            .collect())
    }

    /// The documents ordered by their score with `query`, best first (ties
    /// keep the documents' order); at most `top_k` of them.
    pub fn rank<D: AsRef<str>>(
        &self,
        query: &str,
        documents: &[D],
        top_k: Option<usize>,
    ) -> Result<Vec<Ranked>> {
        let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query, d.as_ref())).collect();
        let scores = self.scores(&pairs)?;
        Ok(rank_scores(&scores, top_k))
    }
}

/// Indices of `scores`, best first, ties in their given order; at most
/// `top_k`.
pub fn rank_scores(scores: &[f32], top_k: Option<usize>) -> Vec<Ranked> {
    let mut ranked: Vec<Ranked> = scores
        .iter()
        .enumerate()
        .map(|(corpus_id, &score)| Ranked { corpus_id, score })
        .collect();
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
    ranked.truncate(top_k.unwrap_or(ranked.len()));
    ranked
}

fn head_config(head: &BertForSequenceClassification) -> &BertConfig {
    head.config()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_paths_name_activations() {
        for a in [
            Activation::Sigmoid,
            Activation::Identity,
            Activation::Tanh,
            Activation::Softmax,
        ] {
            assert_eq!(Activation::from_torch_path(a.torch_path()), Some(a));
        }
        assert_eq!(
            Activation::from_torch_path("torch.nn.Sigmoid"),
            Some(Activation::Sigmoid)
        );
        assert_eq!(Activation::from_torch_path("mypkg.Sigmoid"), None);
        assert_eq!(Activation::from_torch_path("torch.nn.GELU"), None);
    }

    #[test]
    fn ranking_is_best_first_and_stable() {
        let r = rank_scores(&[0.1, 0.9, 0.5, 0.9], Some(3));
        let ids: Vec<usize> = r.iter().map(|r| r.corpus_id).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert!(rank_scores(&[], None).is_empty());
    }

    #[test]
    fn activations_apply_per_pair() {
        let l = [0.0f32, 2.0];
        assert_eq!(Activation::Identity.apply(&l), l.to_vec());
        assert_eq!(Activation::Sigmoid.apply(&[0.0]), vec![0.5]);
        let s = Activation::Softmax.apply(&l);
        assert!((s[0] + s[1] - 1.0).abs() < 1e-6 && s[1] > s[0]);
        assert!((Activation::Tanh.apply(&[1.0])[0] - 1f32.tanh()).abs() < 1e-7);
    }
}
