//! What every handler shares: the model, its optional task heads, limits
//! and metrics.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bertha::tasks::{
    AttentionModel, Classifier, FillMask, PipelineOptions, QuestionAnswerer, TokenClassifier,
};
use bertha::{Device, EmbedOptions, Embedder, Pooling, Tokenizer};
use tokio::sync::Semaphore;

use crate::batcher::Batcher;
use crate::connections::ConnectionLimits;
use crate::metrics::Metrics;
use crate::work::TaskSlots;

/// `--max-qa-windows`' default: a context of about 120,000 tokens (some
/// 500 KB of English) at the default stride; a few seconds of a small
/// model's CPU time.
pub const DEFAULT_MAX_QA_WINDOWS: usize = 512;

/// Server settings (the `bertha serve` flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub model_dir: PathBuf,
    /// Name reported by `/info` and OpenAI's `model` field.
    pub model_id: String,
    pub pooling: Option<Pooling>,
    pub max_batch_tokens: usize,
    pub max_concurrent_requests: usize,
    pub max_client_batch_size: usize,
    /// Longest input in tokens (default: the model's own limit).
    pub max_input_length: Option<usize>,
    /// Largest request body in bytes.
    pub payload_limit: usize,
    pub api_key: Option<String>,
    /// TEI's `TASK=sentence-similarity`: `POST /` and `/invocations` of an
    /// embedding model answer `/similarity` instead of `/embed`.
    pub similarity_root: bool,
    /// Open connections and their timeouts.
    pub connections: ConnectionLimits,
    /// Number format of the embedding model's multiplies (`/info`'s
    /// `model_dtype` says what runs).
    pub precision: bertha::fast::Precision,
    /// int8 calibration texts, one per line (default: built-in).
    pub calibration: Option<PathBuf>,
    /// Most windows one `/qa` context may be cut into (each a model pass
    /// over up to 384 tokens); more is refused before any model work.
    pub max_qa_windows: usize,
}

impl ServerConfig {
    pub fn new(model_dir: impl Into<PathBuf>) -> Self {
        let model_dir = model_dir.into();
        let model_id = model_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bertha".into());
        Self {
            model_dir,
            model_id,
            pooling: None,
            max_batch_tokens: 16384,
            max_concurrent_requests: 512,
            max_client_batch_size: 32,
            max_input_length: None,
            payload_limit: 2_000_000,
            api_key: None,
            similarity_root: false,
            connections: ConnectionLimits::default(),
            precision: Default::default(),
            calibration: None,
            max_qa_windows: DEFAULT_MAX_QA_WINDOWS,
        }
    }
}

impl ServerConfig {
    /// Refuses server settings that cannot serve, before a model is read
    /// (so the error is not taken for the model's): an empty API key (it
    /// is most often an unset shell variable, `--api-key "$KEY"`, and
    /// serving with it would answer 401 to every client, while treating
    /// it as no key would open a server its operator meant to protect),
    /// and zero limits.
    pub fn check(&self) -> bertha::Result<()> {
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(bertha::Error::option(
                "api_key",
                "is empty (set by the flag or by BERTHA_API_KEY): give a key, or leave both \
                 unset to serve without one",
            ));
        }
        self.check_limits()
    }

    /// Refuses limits that would leave the server unable to serve.
    fn check_limits(&self) -> bertha::Result<()> {
        let c = &self.connections;
        if c.max_connections == 0 {
            return Err(bertha::Error::option(
                "max_connections",
                "must be at least 1",
            ));
        }
        for (name, t) in [
            ("header_read_timeout", c.header_read_timeout),
            ("keep_alive_timeout", c.keep_alive_timeout),
        ] {
            if t.is_zero() {
                return Err(bertha::Error::option(name, "must be longer than 0 s"));
            }
        }
        Ok(())
    }
}

/// What the loaded checkpoint is, as TEI tells it from `config.json`: it
/// picks what `POST /` and `/invocations` do and `/info`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Any encoder: `/embed`.
    Embedding,
    /// A sequence classifier with several labels: `/predict`.
    Classifier,
    /// A sequence classifier with one output (a cross-encoder): `/rerank`.
    Reranker,
}

impl ModelKind {
    pub fn of(config: &bertha::BertConfig) -> Self {
        let classifies = config
            .architectures
            .iter()
            .any(|a| a.ends_with("ForSequenceClassification"));
        match (classifies, config.num_labels()) {
            (false, _) => Self::Embedding,
            (true, 1) => Self::Reranker,
            (true, _) => Self::Classifier,
        }
    }
}

/// A task head loaded on first use; `Err` keeps the reason it is absent.
type Lazy<T> = OnceLock<Result<Arc<T>, String>>;

pub struct AppState {
    pub config: ServerConfig,
    pub embedder: Arc<Embedder>,
    /// The same tokenizer, truncating from the left.
    pub left_tokenizer: Tokenizer,
    /// The same tokenizer, never truncating (`/tokenize`).
    pub untruncated: tokenizers::Tokenizer,
    pub normalize_default: bool,
    /// Picks the task of `POST /` (TEI's default route).
    pub kind: ModelKind,
    /// When the model was loaded (OpenAI's `created`, Unix seconds).
    pub created: u64,
    pub batcher: Batcher,
    pub limit: Arc<Semaphore>,
    /// The task routes' model work, a few at a time.
    pub task_slots: TaskSlots,
    pub metrics: Arc<Metrics>,
    classifier: Lazy<Classifier>,
    fill_mask: Lazy<FillMask>,
    ner: Lazy<TokenClassifier>,
    qa: Lazy<QuestionAnswerer>,
    /// The embedder's encoder and tokenizer, returning attention maps.
    attention: OnceLock<AttentionModel>,
}

impl AppState {
    /// Loads the model and starts the batcher, after
    /// [`ServerConfig::check`].
    pub fn load(config: ServerConfig) -> bertha::Result<Arc<Self>> {
        config.check()?;
        let dir = &config.model_dir;
        // Requests choose normalisation themselves, so the embedder never
        // normalises; the folder's own choice becomes the default.
        let spec = bertha::SentenceTransformerSpec::from_dir(dir)?;
        let opts = EmbedOptions {
            pooling: config.pooling,
            normalize: Some(false),
            max_length: config.max_input_length,
            precision: config.precision,
            calibration: config.calibration.clone(),
        };
        let mut embedder = Embedder::from_dir(dir, &Device::Cpu, &opts)?;
        embedder.set_max_batch_tokens(config.max_batch_tokens);
        let embedder = Arc::new(embedder);
        let mut left_tokenizer = embedder.tokenizer().clone();
        left_tokenizer.set_truncate_left(true)?;
        let mut untruncated = embedder.tokenizer().inner().clone();
        untruncated
            .with_truncation(None)
            .map_err(|e| bertha::Error::Tokenizer(e.to_string()))?;
        let metrics = Arc::new(Metrics::new());
        let batcher = Batcher::start(embedder.clone(), config.max_batch_tokens, metrics.clone());
        Ok(Arc::new(Self {
            limit: Arc::new(Semaphore::new(config.max_concurrent_requests.max(1))),
            task_slots: TaskSlots::new(crate::work::default_slots()),
            normalize_default: spec.map(|s| s.normalize).unwrap_or(true),
            kind: ModelKind::of(embedder.model().config()),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            config,
            embedder,
            left_tokenizer,
            untruncated,
            batcher,
            metrics,
            classifier: OnceLock::new(),
            fill_mask: OnceLock::new(),
            ner: OnceLock::new(),
            qa: OnceLock::new(),
            attention: OnceLock::new(),
        }))
    }

    pub fn max_input_length(&self) -> usize {
        self.embedder.tokenizer().max_length()
    }

    /// The sequence classifier (its score function is chosen per call).
    pub fn classifier(&self) -> Result<Arc<Classifier>, String> {
        self.pipeline(&self.classifier, Classifier::from_dir_with)
    }

    pub fn fill_mask(&self) -> Result<Arc<FillMask>, String> {
        self.pipeline(&self.fill_mask, FillMask::from_dir_with)
    }

    pub fn ner(&self) -> Result<Arc<TokenClassifier>, String> {
        self.pipeline(&self.ner, TokenClassifier::from_dir_with)
    }

    pub fn qa(&self) -> Result<Arc<QuestionAnswerer>, String> {
        self.pipeline(&self.qa, QuestionAnswerer::from_dir_with)
    }

    /// A pipeline of the model folder at the server's precision, loaded
    /// on first use.
    fn pipeline<T>(
        &self,
        cell: &Lazy<T>,
        f: fn(&Path, &Device, &PipelineOptions) -> bertha::Result<T>,
    ) -> Result<Arc<T>, String> {
        let opts = PipelineOptions {
            precision: self.config.precision,
            ..Default::default()
        };
        cell.get_or_init(|| {
            f(&self.config.model_dir, &Device::Cpu, &opts)
                .map(Arc::new)
                .map_err(|e| {
                    tracing::info!("{}: {e}", self.config.model_id);
                    crate::error::without_paths(&e)
                })
        })
        .clone()
    }

    /// The attention task over the already loaded encoder (no second copy
    /// of the weights is read).
    pub fn attention(&self) -> &AttentionModel {
        self.attention.get_or_init(|| {
            AttentionModel::new(
                self.embedder.model().clone(),
                self.embedder.tokenizer().clone(),
            )
        })
    }
}
