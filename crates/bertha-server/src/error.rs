//! Errors as TEI sends them: a status code and
//! `{"error": "...", "error_type": "..."}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub error_type: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn validation(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            error_type: "Validation",
            message: message.into(),
        }
    }

    pub fn too_long(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            error_type: "Validation",
            message: message.into(),
        }
    }

    pub fn overloaded() -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            error_type: "Overloaded",
            message: "Model is overloaded".into(),
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            error_type: "Unauthorized",
            message: "Unauthorized: missing or wrong API key".into(),
        }
    }

    pub fn backend(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error_type: "Backend",
            message: message.into(),
        }
    }

    pub fn not_supported(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error_type: "Validation",
            message: message.into(),
        }
    }
}

impl ApiError {
    /// Logs the error in full: server errors as errors, the rest at info.
    pub(crate) fn log(&self) {
        let status = self.status.as_u16();
        if self.status.is_server_error() {
            tracing::error!(status, error_type = self.error_type, "{}", self.message);
        } else {
            tracing::info!(status, error_type = self.error_type, "{}", self.message);
        }
    }
}

impl From<bertha::Error> for ApiError {
    fn from(e: bertha::Error) -> Self {
        match e {
            bertha::Error::Input(m) | bertha::Error::Tokenizer(m) => Self::validation(m),
            e @ bertha::Error::Option { .. } => Self::validation(e.to_string()),
            other => Self::backend(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    /// Logs the error in full, and sends the client its first line only:
    /// what follows (a backtrace, with the server's source paths) is for
    /// the operator.
    fn into_response(self) -> Response {
        self.log();
        let message = public_message(&self.message);
        let body = Json(json!({ "error": message, "error_type": self.error_type }));
        (self.status, body).into_response()
    }
}

/// The first line of `message`: a backtrace (candle appends one on its
/// own lines when `RUST_BACKTRACE` is set) stays in the log.
pub(crate) fn public_message(message: &str) -> &str {
    message.lines().next().unwrap_or_default()
}

/// `e` as a client may read it: the reason, without the server's paths
/// (the full error goes to the log). A file is named by its name alone.
pub fn without_paths(e: &bertha::Error) -> String {
    let name = |p: &std::path::Path| {
        p.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    };
    match e {
        bertha::Error::Weights { reason, .. } | bertha::Error::ModelDir { reason, .. } => {
            reason.clone()
        }
        bertha::Error::Config {
            path,
            field,
            reason,
        } => format!("{}: field `{field}`: {reason}", name(path)),
        bertha::Error::Io { path, source } => format!("cannot read {}: {source}", name(path)),
        bertha::Error::Json { path, source } => format!("{}: invalid JSON: {source}", name(path)),
        other => other.to_string(),
    }
}
