//! Between bertha's types and the proto's: errors to status codes (as TEI
//! maps them), truncation directions, metadata, predictions and ranks.

use std::sync::Arc;
use std::time::Instant;

use bertha::tasks::{Classifier, LabelScore, ScoreFunction};
use tonic::{Code, Status};

use super::pb;
use crate::api::{self, TruncationDirection};
use crate::error::{public_message, ApiError};
use crate::state::AppState;

/// TEI's mapping of its error types to status codes.
impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        e.log();
        let code = match e.error_type {
            "Overloaded" => Code::ResourceExhausted,
            "Unauthorized" => Code::Unauthenticated,
            "Unhealthy" => Code::Unavailable,
            "NotFound" => Code::NotFound,
            // TEI answers its backend's (the model's) errors so.
            "Backend" => Code::FailedPrecondition,
            _ => Code::InvalidArgument,
        };
        Status::new(code, public_message(&e.message))
    }
}

pub(super) fn direction(value: i32) -> Result<TruncationDirection, Status> {
    match pb::TruncationDirection::try_from(value) {
        Ok(pb::TruncationDirection::Right) => Ok(TruncationDirection::Right),
        Ok(pb::TruncationDirection::Left) => Ok(TruncationDirection::Left),
        Err(_) => Err(Status::invalid_argument(format!(
            "`truncation_direction` {value} is unknown (0: TRUNCATION_DIRECTION_RIGHT, 1: \
             TRUNCATION_DIRECTION_LEFT)"
        ))),
    }
}

pub(super) fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What TEI's `Metadata` carries that bertha measures: the characters and
/// tokens (0 where the classifier does the tokenizing) and the time taken.
pub(super) fn metadata(chars: usize, tokens: usize, start: Instant) -> Option<pb::Metadata> {
    Some(pb::Metadata {
        compute_chars: u32_of(chars),
        compute_tokens: u32_of(tokens),
        total_time_ns: u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
        ..Default::default()
    })
}

/// The classifier head, or `FailedPrecondition` (TEI's answer to a model
/// of the wrong type) naming why there is none.
pub(super) fn classifier(state: &AppState, what: &str) -> Result<Arc<Classifier>, Status> {
    state.classifier().map_err(|reason| {
        let message = format!("this model cannot {what}: {}", public_message(&reason));
        tracing::info!("{message}");
        Status::failed_precondition(message)
    })
}

pub(super) fn score_function(classifier: &Classifier, raw_scores: bool) -> ScoreFunction {
    if raw_scores {
        ScoreFunction::None
    } else {
        classifier.function()
    }
}

pub(super) fn predictions(scores: Vec<LabelScore>) -> Vec<pb::Prediction> {
    scores
        .into_iter()
        .map(|s| pb::Prediction {
            score: s.score,
            label: s.label,
        })
        .collect()
}

pub(super) fn ranks(ranked: Vec<api::Rank>) -> Vec<pb::Rank> {
    ranked
        .into_iter()
        .map(|r| pb::Rank {
            index: u32_of(r.index),
            text: r.text,
            score: r.score,
        })
        .collect()
}

/// PredictPair's `inputs`: one text, or a pair.
pub(super) fn pair(inputs: Vec<String>) -> Result<(String, Option<String>), Status> {
    let n = inputs.len();
    let mut it = inputs.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(a), b, None) => Ok((a, b)),
        _ => Err(Status::invalid_argument(format!(
            "`inputs` must have a single or two elements. Given: {n}"
        ))),
    }
}
