//! One error type for the library: every variant names the file, field or
//! input at fault, so a user can act on the message without a backtrace.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A model folder lacks what a checkpoint needs.
    #[error("{path} is not a usable model folder: {reason}")]
    ModelDir { path: PathBuf, reason: String },

    /// A configuration file parsed but holds a value we cannot honour.
    #[error("{path}: field `{field}`: {reason}")]
    Config {
        path: PathBuf,
        field: String,
        reason: String,
    },

    /// A file is not valid JSON (or not the JSON we expect).
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// Weights are missing, malformed or of the wrong shape.
    #[error("weights {path}: {reason}")]
    Weights { path: PathBuf, reason: String },

    /// The tokenizer could not be built or failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Training stopped: a loss, gradient norm or weight that must be
    /// finite is not. `last_good` is the newest checkpoint written before,
    /// if any (all checkpoints hold finite weights).
    #[error("the {what} is {value} at step {step}: stopping; {}", resume_hint(.last_good))]
    Diverged {
        what: &'static str,
        value: f64,
        step: u64,
        last_good: Option<PathBuf>,
    },

    /// User input that cannot be processed (names the input).
    #[error("{0}")]
    Input(String),

    /// An option of a library call holds a value we cannot honour; `name`
    /// is the option's field name (`batch_size`), never a CLI flag: the
    /// message reads `{name} {reason}`, and the CLI shows the flag that
    /// sets the option in place of the name.
    #[error("{name} {reason}")]
    Option { name: String, reason: String },

    /// The processes of a data-parallel run disagree or cannot go on;
    /// names the process (rank) and what differs.
    #[error("data-parallel run: {0}")]
    Distributed(String),

    /// A value could not be written as JSON (metrics, training state, a
    /// config); `what` names it.
    #[error("serialising {what}: {source}")]
    Serialise {
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// A tensor operation failed; a shape bug or an unsupported device.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
}

fn resume_hint(last_good: &Option<PathBuf>) -> String {
    match last_good {
        Some(p) => format!("the last good checkpoint is {}", p.display()),
        None => "no checkpoint was written before it".into(),
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// [`Error::Option`]: `reason` reads after the name ("must be at
    /// least 1").
    pub fn option(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Option {
            name: name.into(),
            reason: reason.into(),
        }
    }

    /// [`Error::Serialise`] of the value `what` names.
    pub fn serialise(what: impl std::fmt::Display, source: serde_json::Error) -> Self {
        Error::Serialise {
            what: what.to_string(),
            source,
        }
    }

    pub(crate) fn config(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Config {
            path: path.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}
