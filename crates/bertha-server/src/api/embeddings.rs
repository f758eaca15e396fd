//! The embedding routes: `/embed` (pooled vectors), `/embed_all` (every
//! token's vector) and `/similarity`, with the prompting, pooling and
//! token-vector steps that OpenAI's route and gRPC's `Embed` share.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use bertha::{EncodeOptions, Encoded};
use serde::Deserialize;

use super::{admit, check_batch, tokenize, AppResult, Body, Inputs, Shared, TruncationDirection};
use crate::batcher::{Output, Want};
use crate::error::ApiError;
use crate::state::AppState;

fn normalize(v: &mut [f32]) {
    bertha::pooling::normalize_in_place(v);
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedRequest {
    inputs: Inputs,
    normalize: Option<bool>,
    #[serde(default)]
    truncate: bool,
    #[serde(default)]
    truncation_direction: TruncationDirection,
    /// One of the folder's prompts (TEI's field).
    prompt_name: Option<String>,
    /// Matryoshka: keep the first `dimensions` values (`/embed` only).
    dimensions: Option<usize>,
}

/// A request's prompt name and dimensions (TEI's fields: it has no prompt
/// given as text).
pub(crate) fn tei_call(prompt_name: Option<String>, dimensions: Option<usize>) -> EncodeOptions {
    EncodeOptions {
        prompt_name,
        prompt: None,
        dimensions,
    }
}

/// Prepends the request's prompt (named, else the folder's default) to
/// `texts` and tokenizes them; also gives the first token pooling takes.
pub(crate) async fn prompted(
    state: &Arc<AppState>,
    texts: Vec<String>,
    call: &EncodeOptions,
    truncate: bool,
    dir: TruncationDirection,
) -> AppResult<(Vec<Encoded>, usize)> {
    state.embedder.check_dimensions(call.dimensions)?;
    let (texts, start) = match state.embedder.prompt(call)? {
        Some(p) => {
            let texts = texts.iter().map(|t| format!("{}{t}", p.text)).collect();
            (texts, p.pool_start)
        }
        None => (texts, 0),
    };
    let encodings = tokenize(state, texts, truncate, dir).await?;
    // Cutting from the left eats the prompt first: its tokens are no
    // longer the first `start`.
    if start > 0 && dir == TruncationDirection::Left && encodings.iter().any(|e| e.truncated) {
        return Err(ApiError::validation(
            "this model leaves the prompt out of its pooling (include_prompt false), which \
             truncation_direction Left would cut: use Right",
        ));
    }
    Ok((encodings, start))
}

/// One pooled vector per text, with the request's prompt and dimensions,
/// normalised when `norm`; also the tokens used.
pub(crate) async fn pooled(
    state: &Arc<AppState>,
    texts: Vec<String>,
    call: &EncodeOptions,
    truncate: bool,
    dir: TruncationDirection,
    norm: bool,
) -> AppResult<(Vec<Vec<f32>>, usize)> {
    let (encodings, start) = prompted(state, texts, call, truncate, dir).await?;
    let tokens = encodings.iter().map(Encoded::len).sum();
    let out = state
        .batcher
        .run_from(encodings, start, Want::Pooled)
        .await?;
    let Output::Pooled(mut rows) = out else {
        return Err(ApiError::backend("the batcher answered with token vectors"));
    };
    for r in &mut rows {
        if let Some(d) = call.dimensions {
            r.truncate(d);
        }
        if norm {
            normalize(r);
        }
    }
    Ok((rows, tokens))
}

/// `POST /embed` → `[[f32]]`
pub async fn embed(
    State(state): Shared,
    Body(req): Body<EmbedRequest>,
) -> AppResult<Json<Vec<Vec<f32>>>> {
    let _permit = admit(&state)?;
    let texts = req.inputs.into_vec();
    check_batch(&state, texts.len())?;
    crate::sparse::check_embed_normalize(&state, req.normalize)?;
    let norm = req.normalize.unwrap_or(state.normalize_default);
    let call = tei_call(req.prompt_name, req.dimensions);
    let (rows, _) = pooled(
        &state,
        texts,
        &call,
        req.truncate,
        req.truncation_direction,
        norm,
    )
    .await?;
    Ok(Json(rows))
}

/// `POST /embed_all` → `[[[f32]]]`: every token's vector.
pub async fn embed_all(
    State(state): Shared,
    Body(req): Body<EmbedRequest>,
) -> AppResult<Json<Vec<Vec<Vec<f32>>>>> {
    let _permit = admit(&state)?;
    let texts = req.inputs.into_vec();
    check_batch(&state, texts.len())?;
    crate::sparse::refuse_on_splade(&state, "embed_all")?;
    if req.dimensions.is_some() {
        return Err(ApiError::validation(
            "`dimensions` applies to pooled vectors (/embed), not to /embed_all",
        ));
    }
    let call = tei_call(req.prompt_name, None);
    let norm = req.normalize.unwrap_or(false);
    let (rows, _) = token_vectors(
        &state,
        texts,
        &call,
        req.truncate,
        req.truncation_direction,
        norm,
    )
    .await?;
    Ok(Json(rows))
}

/// Every token's vector of each text (the prompt's tokens included),
/// normalised when `norm`; also the tokens used.
pub(crate) async fn token_vectors(
    state: &Arc<AppState>,
    texts: Vec<String>,
    call: &EncodeOptions,
    truncate: bool,
    dir: TruncationDirection,
    norm: bool,
) -> AppResult<(Vec<Vec<Vec<f32>>>, usize)> {
    let (encodings, _) = prompted(state, texts, call, truncate, dir).await?;
    let tokens = encodings.iter().map(Encoded::len).sum();
    let out = state.batcher.run(encodings, Want::Tokens).await?;
    let Output::Tokens(rows) = out else {
        return Err(ApiError::backend(
            "the batcher answered with pooled vectors",
        ));
    };
    let rows = rows
        .into_iter()
        .map(|mut t| {
            if norm {
                t.embeddings.iter_mut().for_each(|v| normalize(v));
            }
            t.embeddings
        })
        .collect();
    Ok((rows, tokens))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarityInputs {
    source_sentence: String,
    sentences: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarityRequest {
    #[serde(deserialize_with = "crate::object::object")]
    inputs: SimilarityInputs,
    /// Where TEI (and huggingface_hub's `sentence_similarity`) put the
    /// options; the same options at the top level are also taken.
    parameters: Option<SimilarityParameters>,
    truncate: Option<bool>,
    truncation_direction: Option<TruncationDirection>,
    prompt_name: Option<String>,
    dimensions: Option<usize>,
}

/// The options of a `/similarity` call; `dimensions` is ours (Matryoshka).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarityParameters {
    truncate: Option<bool>,
    truncation_direction: Option<TruncationDirection>,
    prompt_name: Option<String>,
    dimensions: Option<usize>,
}

impl SimilarityRequest {
    /// The top-level options and `parameters` as one; an option set in
    /// both places is refused rather than one silently winning.
    fn options(&mut self) -> AppResult<SimilarityParameters> {
        let top = SimilarityParameters {
            truncate: self.truncate.take(),
            truncation_direction: self.truncation_direction.take(),
            prompt_name: self.prompt_name.take(),
            dimensions: self.dimensions.take(),
        };
        let Some(p) = self.parameters.take() else {
            return Ok(top);
        };
        fn one<T>(name: &str, a: Option<T>, b: Option<T>) -> AppResult<Option<T>> {
            match (a, b) {
                (Some(_), Some(_)) => Err(ApiError::validation(format!(
                    "`{name}` is given both at the top level and in `parameters`: give it once"
                ))),
                (a, b) => Ok(a.or(b)),
            }
        }
        Ok(SimilarityParameters {
            truncate: one("truncate", top.truncate, p.truncate)?,
            truncation_direction: one(
                "truncation_direction",
                top.truncation_direction,
                p.truncation_direction,
            )?,
            prompt_name: one("prompt_name", top.prompt_name, p.prompt_name)?,
            dimensions: one("dimensions", top.dimensions, p.dimensions)?,
        })
    }
}

/// `POST /similarity` → cosine similarity of `source_sentence` to each of
/// `sentences`.
pub async fn similarity(
    State(state): Shared,
    Body(mut req): Body<SimilarityRequest>,
) -> AppResult<Json<Vec<f32>>> {
    let _permit = admit(&state)?;
    let opts = req.options()?;
    let SimilarityInputs {
        source_sentence,
        sentences,
    } = req.inputs;
    check_batch(&state, sentences.len() + 1)?;
    let mut texts = vec![source_sentence];
    texts.extend(sentences);
    let call = tei_call(opts.prompt_name, opts.dimensions);
    let (rows, _) = pooled(
        &state,
        texts,
        &call,
        opts.truncate.unwrap_or(false),
        opts.truncation_direction.unwrap_or_default(),
        true,
    )
    .await?;
    let (source, others) = rows.split_first().expect("at least one row");
    Ok(Json(
        others
            .iter()
            .map(|o| o.iter().zip(source).map(|(a, b)| a * b).sum())
            .collect(),
    ))
}
