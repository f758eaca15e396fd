//! The classifier head's routes: `/predict` (a text or a pair scored per
//! label) and `/rerank` ((query, text) pairs ranked), with the scoring
//! that gRPC's `Predict` and `Rerank` share.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use bertha::tasks::{Classifier, LabelScore, ScoreFunction};
use serde::{Deserialize, Serialize};

use super::{
    admit, blocking, check_batch, head_missing, AppResult, Body, OneOrMany, Shared,
    TruncationDirection,
};
use crate::error::ApiError;
use crate::state::AppState;

/// TEI's predict input: a text, a pair `[a, b]`, or a batch of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Sequence {
    Single(String),
    Pair(String, String),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PredictInput {
    Single(Sequence),
    Batch(Vec<Sequence>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    inputs: PredictInput,
    #[serde(default)]
    raw_scores: bool,
    /// false (TEI's default): an input over the model's limit is a 413;
    /// true: it is cut from the right.
    #[serde(default)]
    truncate: bool,
    /// What huggingface_hub's `text_classification` sends (always, `{}`
    /// when empty): the text-classification pipeline's options. Its answer
    /// to one input is then a list of one list, as the Inference API's.
    parameters: Option<PredictParameters>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictParameters {
    top_k: Option<usize>,
    function_to_apply: Option<ScoreFunction>,
}

impl PredictRequest {
    /// The score function (`raw_scores`, else `function_to_apply`, else
    /// the model's) and how many labels to keep; both ways of asking for
    /// a function at once is refused.
    fn scoring(&self, model_default: ScoreFunction) -> AppResult<(ScoreFunction, Option<usize>)> {
        let p = self.parameters.as_ref();
        let asked = p.and_then(|p| p.function_to_apply);
        let function = match (self.raw_scores, asked) {
            (true, Some(_)) => {
                return Err(ApiError::validation(
                    "give either `raw_scores` or `parameters.function_to_apply`, not both",
                ))
            }
            (true, None) => ScoreFunction::None,
            (false, f) => f.unwrap_or(model_default),
        };
        let top_k = p.and_then(|p| p.top_k);
        if top_k == Some(0) {
            return Err(ApiError::validation(
                "`parameters.top_k` must be at least 1",
            ));
        }
        Ok((function, top_k))
    }
}

/// The scores of each text or (text, pair), best first (the `top_k` best
/// when given). `truncation`: `None` refuses an input longer than the model
/// takes (a 413); the classifier cuts from the right, so `Left` is refused
/// for an input that would be cut.
pub(crate) async fn classify(
    state: &AppState,
    classifier: Arc<Classifier>,
    seqs: Vec<(String, Option<String>)>,
    top_k: Option<usize>,
    function: ScoreFunction,
    truncation: Option<TruncationDirection>,
) -> AppResult<Vec<Vec<LabelScore>>> {
    blocking(state, move || {
        if truncation != Some(TruncationDirection::Right) {
            let inputs = seqs.iter().map(|(a, b)| (a.as_str(), b.as_deref()));
            fits(&classifier, inputs, truncation)?;
        }
        let inputs: Vec<(&str, Option<&str>)> = seqs
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_deref()))
            .collect();
        classifier
            .classify_many(&inputs, top_k, function)
            .map_err(ApiError::from)
    })
    .await
}

/// Refuses inputs the classifier would cut, unless `truncation` is
/// `Right` (see [`classify`]).
fn fits<'a>(
    classifier: &Classifier,
    inputs: impl Iterator<Item = (&'a str, Option<&'a str>)>,
    truncation: Option<TruncationDirection>,
) -> AppResult<()> {
    let tok = classifier.tokenizer();
    for (i, (a, b)) in inputs.enumerate() {
        let e = match b {
            Some(b) => tok.encode_pair(a, b)?,
            None => tok.encode(a)?,
        };
        if !e.truncated {
            continue;
        }
        let max = tok.max_length();
        return Err(match truncation {
            None => ApiError::too_long(format!(
                "Input validation error: `inputs[{i}]` must have at most {max} tokens; set \
                 `truncate` to true to cut it"
            )),
            Some(_) => ApiError::validation(format!(
                "`inputs[{i}]` is over {max} tokens, and this classifier cuts long inputs from \
                 the right only: use truncation direction Right"
            )),
        });
    }
    Ok(())
}

/// `POST /predict` → `[{score, label}]`, or a list of those for a batch.
pub async fn predict(
    State(state): Shared,
    Body(req): Body<PredictRequest>,
) -> AppResult<Json<OneOrMany<Vec<LabelScore>>>> {
    let _permit = admit(&state)?;
    let classifier = state
        .classifier()
        .map_err(|e| head_missing("classify", e))?;
    let (function, top_k) = req.scoring(classifier.function())?;
    // With `parameters` (the Inference API's protocol, as huggingface_hub
    // speaks it) one input gets the pipeline's shape too: a list of lists.
    let nested = req.parameters.is_some();
    let (seqs, batch) = match req.inputs {
        PredictInput::Single(s) => (vec![s], false),
        PredictInput::Batch(v) => (v, true),
    };
    check_batch(&state, seqs.len())?;
    let seqs = seqs
        .into_iter()
        .map(|s| match s {
            Sequence::Single(t) => (t, None),
            Sequence::Pair(a, b) => (a, Some(b)),
        })
        .collect();
    // An over-long input is cut only when asked (`truncate`), as on /embed:
    // scoring the cut text unasked answered for another input.
    let truncation = req.truncate.then_some(TruncationDirection::Right);
    let results = classify(&state, classifier, seqs, top_k, function, truncation).await?;
    Ok(Json(if batch || nested {
        OneOrMany::Many(results)
    } else {
        OneOrMany::One(results.into_iter().next().expect("one input"))
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    query: String,
    texts: Vec<String>,
    #[serde(default)]
    return_text: bool,
    #[serde(default)]
    raw_scores: bool,
    /// As /predict's.
    #[serde(default)]
    truncate: bool,
}

/// `POST /rerank` → `[{index, score, text?}]`, best first: a
/// sequence-classification checkpoint scores each (query, text) pair.
/// Single-output models give sigmoid(logit); several labels give the
/// probability of the last label (the "relevant" class).
#[derive(Debug, Serialize)]
pub struct Rank {
    pub index: usize,
    pub score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

pub async fn rerank(
    State(state): Shared,
    Body(req): Body<RerankRequest>,
) -> AppResult<Json<Vec<Rank>>> {
    let _permit = admit(&state)?;
    check_batch(&state, req.texts.len())?;
    let classifier = state.classifier().map_err(|e| head_missing("rerank", e))?;
    let function = if req.raw_scores {
        ScoreFunction::None
    } else {
        classifier.function()
    };
    let RerankRequest {
        query,
        texts,
        return_text,
        truncate,
        ..
    } = req;
    let pairs = texts.into_iter().map(|t| (query.clone(), t)).collect();
    // As /predict: cut only when asked.
    let truncation = truncate.then_some(TruncationDirection::Right);
    let ranked = rank(&state, classifier, pairs, return_text, function, truncation).await?;
    Ok(Json(ranked))
}

/// Scores each (query, text) pair (its index in `pairs`), best first; the
/// text comes back when `return_text`. `truncation` as [`classify`].
pub(crate) async fn rank(
    state: &AppState,
    classifier: Arc<Classifier>,
    pairs: Vec<(String, String)>,
    return_text: bool,
    function: ScoreFunction,
    truncation: Option<TruncationDirection>,
) -> AppResult<Vec<Rank>> {
    blocking(state, move || {
        if truncation != Some(TruncationDirection::Right) {
            let inputs = pairs.iter().map(|(q, t)| (q.as_str(), Some(t.as_str())));
            fits(&classifier, inputs, truncation)?;
        }
        let labels = classifier.labels();
        let relevant = labels.last().cloned().unwrap_or_default();
        let inputs: Vec<(&str, Option<&str>)> = pairs
            .iter()
            .map(|(q, t)| (q.as_str(), Some(t.as_str())))
            .collect();
        let all_scores = classifier.classify_many(&inputs, None, function)?;
        let mut ranked = Vec::with_capacity(pairs.len());
        for (i, ((_, t), scores)) in pairs.into_iter().zip(all_scores).enumerate() {
            let score = scores
                .iter()
                .find(|s| s.label == relevant)
                .map(|s| s.score)
                .unwrap_or(f32::NAN);
            ranked.push(Rank {
                index: i,
                score,
                text: return_text.then_some(t),
            });
        }
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(ranked)
    })
    .await
}
