//! `/tokenize` and `/decode`: the tokenizer's view of a text and the text
//! of token ids, shared with gRPC's `Tokenize` service.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{admit, blocking, check_batch, AppResult, Body, Inputs, Shared};
use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    inputs: Inputs,
    #[serde(default = "yes")]
    add_special_tokens: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub special: bool,
    /// Character offsets into the input; `null` for special tokens.
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

/// TEI's bound on a text /tokenize takes: this many characters per token
/// of `max_input_length`.
const CHARS_PER_TOKEN: usize = 250;

/// `POST /tokenize` → `[[{id, text, special, start, stop}]]`: every token,
/// never truncated (as TEI: the route shows what the tokenizer does, and a
/// text over `max_input_length` tokens is for /embed to refuse); a text
/// over TEI's character bound is a 413.
pub async fn tokenize_route(
    State(state): Shared,
    Body(req): Body<TokenizeRequest>,
) -> AppResult<Json<Vec<Vec<SimpleToken>>>> {
    let texts = req.inputs.into_vec();
    check_batch(&state, texts.len())?;
    Ok(Json(
        simple_tokens(&state, texts, req.add_special_tokens).await?,
    ))
}

/// Every token of each text, never truncated; a text over TEI's character
/// bound is a 413.
pub(crate) async fn simple_tokens(
    state: &Arc<AppState>,
    texts: Vec<String>,
    add_special_tokens: bool,
) -> AppResult<Vec<Vec<SimpleToken>>> {
    let limit = state.max_input_length() * CHARS_PER_TOKEN;
    for (i, t) in texts.iter().enumerate() {
        let chars = t.chars().count();
        if chars > limit {
            return Err(ApiError::too_long(format!(
                "`inputs[{i}]` must have less than {limit} characters. Given: {chars}"
            )));
        }
    }
    let st = state.clone();
    tokio::task::spawn_blocking(move || -> AppResult<Vec<Vec<SimpleToken>>> {
        let inner = &st.untruncated;
        texts
            .iter()
            .map(|t| {
                let e = inner
                    .encode_char_offsets(t.as_str(), add_special_tokens)
                    .map_err(|e| ApiError::validation(e.to_string()))?;
                Ok(e.get_ids()
                    .iter()
                    .zip(e.get_tokens())
                    .zip(e.get_offsets())
                    .zip(e.get_special_tokens_mask())
                    .map(|(((id, text), (s, end)), special)| SimpleToken {
                        id: *id,
                        text: text.clone(),
                        special: *special == 1,
                        start: (*special == 0).then_some(*s),
                        stop: (*special == 0).then_some(*end),
                    })
                    .collect())
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::backend(e.to_string()))?
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Ids {
    One(Vec<u32>),
    Many(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeRequest {
    ids: Ids,
    #[serde(default = "yes")]
    skip_special_tokens: bool,
}

/// `POST /decode` → `[String]`
pub async fn decode(
    State(state): Shared,
    Body(req): Body<DecodeRequest>,
) -> AppResult<Json<Vec<String>>> {
    let _permit = admit(&state)?;
    let lists = match req.ids {
        Ids::One(v) => vec![v],
        Ids::Many(v) => v,
    };
    // As every batch route: at most --max-client-batch-size lists (10,000
    // lists ran past a minute), decoded off the async runtime (they held
    // /health up).
    check_batch(&state, lists.len())?;
    let skip = req.skip_special_tokens;
    let st = state.clone();
    let out = blocking(&state, move || {
        lists
            .iter()
            .map(|ids| decode_ids(&st, ids, skip))
            .collect::<AppResult<_>>()
    })
    .await?;
    Ok(Json(out))
}

/// The text of token `ids`; an id outside the vocabulary is a 422.
pub(crate) fn decode_ids(
    state: &AppState,
    ids: &[u32],
    skip_special_tokens: bool,
) -> AppResult<String> {
    let vocab = state.embedder.tokenizer().vocab_size();
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(ApiError::validation(format!(
            "id {bad} is outside the vocabulary ({vocab})"
        )));
    }
    Ok(state
        .embedder
        .tokenizer()
        .decode(ids, skip_special_tokens)?)
}
