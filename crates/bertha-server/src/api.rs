//! Route handlers. Request and response bodies follow TEI's where TEI has
//! the route, OpenAI's for `/v1/embeddings`, and transformers' pipelines
//! for the routes beyond TEI (`/fill-mask`, `/ner`, `/qa`, `/attention`);
//! OpenAI's routes are in [`crate::openai`].

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bertha::tasks::{
    Aggregation, Answer, Classifier, Entity, LabelScore, MaskPrediction, QaBounds, QaOptions,
    ScoreFunction,
};
use bertha::{EncodeOptions, Encoded};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use crate::batcher::{Output, Want};
use crate::error::ApiError;
use crate::object::Object;
use crate::served::Served;
use crate::state::{AppState, ModelKind};
use crate::work::StopOnDrop;

pub(crate) type AppResult<T> = Result<T, ApiError>;

/// One item, or a list when the request was a batch. Responses are typed
/// (not `serde_json::Value`) so f32 numbers print in their shortest form.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}
pub(crate) type Shared = State<Arc<AppState>>;

/// `Json` of a JSON object (never an array or a scalar: [`Object`]) whose
/// rejections are 422s naming the field, in TEI's error shape. The body
/// must arrive within the header-read timeout (a 408 otherwise), so a
/// client trickling it cannot hold its connection forever.
pub struct Body<T>(pub T);

/// The state a [`Body`] is read under: it knows how long a body may take.
pub trait BodyTimeout {
    fn body_timeout(&self) -> std::time::Duration;
}

impl BodyTimeout for Arc<AppState> {
    fn body_timeout(&self) -> std::time::Duration {
        self.config.connections.header_read_timeout
    }
}

impl BodyTimeout for Arc<Served> {
    fn body_timeout(&self) -> std::time::Duration {
        self.default_model().config.connections.header_read_timeout
    }
}

impl<T, S> FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: BodyTimeout + Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = state.body_timeout();
        let read = Json::<Object<T>>::from_request(req, state);
        let Ok(read) = tokio::time::timeout(limit, read).await else {
            return Err(ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                error_type: "Validation",
                message: format!(
                    "the request body did not arrive within {} s (--header-read-timeout)",
                    limit.as_secs_f64()
                ),
            });
        };
        match read {
            Ok(Json(Object(v))) => Ok(Body(v)),
            Err(JsonRejection::MissingJsonContentType(e)) => Err(ApiError {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                error_type: "Validation",
                message: e.body_text(),
            }),
            Err(JsonRejection::BytesRejection(e)) => Err(ApiError {
                status: e.status(),
                error_type: "Validation",
                message: e.body_text(),
            }),
            Err(e) => Err(ApiError::validation(e.body_text())),
        }
    }
}

/// One string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Inputs {
    One(String),
    Many(Vec<String>),
}

impl Inputs {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            Inputs::One(s) => vec![s],
            Inputs::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub enum TruncationDirection {
    Left,
    #[default]
    Right,
}

/// Holds a slot of `--max-concurrent-requests`; refuses at once when none
/// is free.
pub(crate) fn admit(state: &AppState) -> AppResult<OwnedSemaphorePermit> {
    state
        .limit
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::overloaded())
}

pub(crate) fn check_batch(state: &AppState, n: usize) -> AppResult<()> {
    if n == 0 {
        return Err(ApiError::validation("`inputs` cannot be empty"));
    }
    let max = state.config.max_client_batch_size;
    if n > max {
        return Err(ApiError::validation(format!(
            "batch size {n} > maximum allowed batch size {max}"
        )));
    }
    Ok(())
}

/// Tokenizes off the async runtime; over-long inputs are a 413 unless
/// the request asked for truncation.
async fn tokenize(
    state: &Arc<AppState>,
    texts: Vec<String>,
    truncate: bool,
    direction: TruncationDirection,
) -> AppResult<Vec<Encoded>> {
    let st = state.clone();
    let encodings = tokio::task::spawn_blocking(move || {
        let tok = match direction {
            TruncationDirection::Right => st.embedder.tokenizer(),
            TruncationDirection::Left => &st.left_tokenizer,
        };
        tok.encode_batch(&texts)
    })
    .await
    .map_err(|e| ApiError::backend(e.to_string()))??;
    if !truncate {
        if let Some(i) = encodings.iter().position(|e| e.truncated) {
            return Err(ApiError::too_long(format!(
                "Input validation error: `inputs[{i}]` must have at most {} tokens; set `truncate` to true to cut it",
                state.max_input_length()
            )));
        }
    }
    Ok(encodings)
}

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

/// `GET /models/NAME/health`: 200 once a forward pass succeeds.
pub async fn health(State(state): Shared) -> Response {
    if answers(&state).await {
        StatusCode::OK.into_response()
    } else {
        unhealthy(&state.config.model_id)
    }
}

/// `GET /health`: 200 once every served model answers a forward pass.
pub async fn health_all(State(served): State<Arc<Served>>) -> Response {
    for m in served.models() {
        if !answers(m).await {
            return unhealthy(&m.config.model_id);
        }
    }
    StatusCode::OK.into_response()
}

async fn answers(state: &AppState) -> bool {
    match state.embedder.tokenizer().encode("") {
        Ok(e) => state.batcher.run(vec![e], Want::Pooled).await.is_ok(),
        Err(_) => false,
    }
}

fn unhealthy(model: &str) -> Response {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        error_type: "Unhealthy",
        message: format!("the model `{model}` is not answering"),
    }
    .into_response()
}

/// `GET /models/NAME/info`: TEI's `/info` of one model.
pub async fn info(State(state): Shared) -> Json<Value> {
    Json(model_info(&state))
}

/// `GET /info`: TEI's `/info` of the default model, and under `models`
/// that of every model served (the default first).
pub async fn info_all(State(served): State<Arc<Served>>) -> Json<Value> {
    let mut info = model_info(served.default_model());
    info["models"] = served.models().iter().map(|m| model_info(m)).collect();
    Json(info)
}

/// TEI's `model_dtype`: the number format the embedding model's
/// multiplies run in (bf16 on a CPU without it runs, and says, fp32).
pub(crate) fn model_dtype(state: &AppState) -> &'static str {
    match state.embedder.precision() {
        bertha::fast::Precision::F32 => "float32",
        bertha::fast::Precision::Bf16 => "bfloat16",
        bertha::fast::Precision::Int8 => "int8",
    }
}

fn model_info(state: &AppState) -> Value {
    let c = &state.config;
    let cfg = state.embedder.model().config();
    let labels = || {
        let id2label: serde_json::Map<String, Value> = (0..cfg.num_labels())
            .map(|i| (i.to_string(), cfg.label_name(i).into()))
            .collect();
        let label2id: serde_json::Map<String, Value> = (0..cfg.num_labels())
            .map(|i| (cfg.label_name(i), i.into()))
            .collect();
        json!({ "id2label": id2label, "label2id": label2id })
    };
    let model_type = match state.kind {
        ModelKind::Embedding => {
            json!({ "embedding": { "pooling": state.embedder.pooling().name() } })
        }
        ModelKind::Classifier => json!({ "classifier": labels() }),
        ModelKind::Reranker => json!({ "reranker": labels() }),
    };
    json!({
        "model_id": c.model_id,
        "model_sha": null,
        "model_dtype": model_dtype(state),
        // bertha's own: the CPU kernels that run (BERTHA_ISA lowers them).
        "isa": bertha::fast::cpu::describe(),
        "model_type": model_type,
        "architectures": cfg.architectures,
        "hidden_size": cfg.hidden_size,
        "max_concurrent_requests": c.max_concurrent_requests,
        "max_input_length": state.max_input_length(),
        "max_batch_tokens": c.max_batch_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": c.max_client_batch_size,
        "prompts": state.embedder.prompts(),
        "default_prompt_name": state.embedder.default_prompt_name(),
        "tokenization_workers": rayon_threads(),
        "version": env!("CARGO_PKG_VERSION"),
    })
}

pub(crate) fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// `GET /metrics` (Prometheus text format).
pub(crate) fn metrics_text(text: String) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}

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
        seqs.iter()
            .map(|(a, b)| classifier.classify_with(a, b.as_deref(), top_k, function))
            .collect::<bertha::Result<Vec<_>>>()
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

fn head_missing(what: &str, reason: String) -> ApiError {
    ApiError::not_supported(format!("this model cannot {what}: {reason}"))
}

/// Runs the task pipelines' model work off the async runtime, a few at a
/// time ([`crate::work`]).
async fn blocking<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce() -> AppResult<T> + Send + 'static,
) -> AppResult<T> {
    state.task_slots.run(f).await
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
        let mut ranked = Vec::with_capacity(pairs.len());
        for (i, (query, t)) in pairs.into_iter().enumerate() {
            let scores = classifier.classify_with(&query, Some(&t), None, function)?;
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FillMaskRequest {
    inputs: String,
    #[serde(default = "five")]
    top_k: usize,
}

fn five() -> usize {
    5
}

/// `POST /fill-mask` → per mask, the `top_k` candidates (transformers'
/// fill-mask fields: score, token, token_str, sequence).
pub async fn fill_mask(
    State(state): Shared,
    Body(req): Body<FillMaskRequest>,
) -> AppResult<Json<Vec<Vec<MaskPrediction>>>> {
    let _permit = admit(&state)?;
    let fm = state
        .fill_mask()
        .map_err(|e| head_missing("fill masks", e))?;
    let out = blocking(&state, move || {
        fm.fill(&req.inputs, req.top_k).map_err(ApiError::from)
    })
    .await?;
    Ok(Json(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NerRequest {
    inputs: String,
    #[serde(default)]
    aggregation_strategy: Option<String>,
}

/// `POST /ner` → entities (transformers' token-classification fields).
pub async fn ner(
    State(state): Shared,
    Body(req): Body<NerRequest>,
) -> AppResult<Json<Vec<Entity>>> {
    let _permit = admit(&state)?;
    let tc = state.ner().map_err(|e| head_missing("tag entities", e))?;
    let agg: Aggregation = req
        .aggregation_strategy
        .as_deref()
        .unwrap_or("simple")
        .parse()
        .map_err(|e: bertha::Error| ApiError::validation(e.to_string()))?;
    let out = blocking(&state, move || {
        tc.entities(&req.inputs, agg).map_err(ApiError::from)
    })
    .await?;
    Ok(Json(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QaRequest {
    question: String,
    context: String,
    #[serde(default = "one")]
    top_k: usize,
    #[serde(default = "fifteen")]
    max_answer_len: usize,
    doc_stride: Option<usize>,
}

fn one() -> usize {
    1
}

fn fifteen() -> usize {
    15
}

/// Most answers one /qa request may ask for: the answers kept while a long
/// context is read grow with it, and so does the response.
const MAX_QA_TOP_K: usize = 1000;

/// `POST /qa` → `{answer, score, start, end}` (a list when `top_k` > 1).
pub async fn qa(
    State(state): Shared,
    Body(req): Body<QaRequest>,
) -> AppResult<Json<OneOrMany<Answer>>> {
    let _permit = admit(&state)?;
    if req.top_k > MAX_QA_TOP_K {
        return Err(ApiError::validation(format!(
            "`top_k` must be at most {MAX_QA_TOP_K}; given {}",
            req.top_k
        )));
    }
    let model = state
        .qa()
        .map_err(|e| head_missing("answer questions", e))?;
    let opts = QaOptions {
        top_k: req.top_k,
        max_answer_len: req.max_answer_len,
        doc_stride: req.doc_stride,
        max_seq_len: None,
    };
    // A long context with a small stride is many windows: at most
    // --max-qa-windows, and the work stops when the client goes.
    let gone = StopOnDrop::new();
    let bounds = QaBounds {
        max_windows: state.config.max_qa_windows,
        stop: Some(Box::new(gone.stopped())),
    };
    let answers = blocking(&state, move || {
        model
            .answer_within(&req.question, &req.context, &opts, &bounds)
            .map_err(ApiError::from)
    })
    .await?;
    drop(gone);
    Ok(Json(if req.top_k == 1 && answers.len() == 1 {
        OneOrMany::One(answers.into_iter().next().expect("one answer"))
    } else {
        OneOrMany::Many(answers)
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionRequest {
    inputs: String,
    layer: Option<usize>,
    head: Option<usize>,
    /// As /embed: an over-long input is a 413 unless this is set.
    #[serde(default)]
    truncate: bool,
}

/// `POST /attention` → `{tokens, layers, heads, attentions}`: attention
/// probabilities `[layer][head][query][key]` (or one layer / head).
#[derive(Debug, Serialize)]
pub struct AttentionResponse {
    tokens: Vec<String>,
    layers: usize,
    heads: usize,
    /// `[layer][head][query][key]`, only the requested layer / head if any.
    attentions: Vec<Vec<Vec<Vec<f32>>>>,
    /// Whether the input lost tokens to `truncate`.
    truncated: bool,
}

pub async fn attention(
    State(state): Shared,
    Body(req): Body<AttentionRequest>,
) -> AppResult<Json<AttentionResponse>> {
    let _permit = admit(&state)?;
    let e = tokenize(
        &state,
        vec![req.inputs],
        req.truncate,
        TruncationDirection::Right,
    )
    .await?
    .pop()
    .ok_or_else(|| ApiError::backend("the tokenizer answered with no encoding"))?;
    let truncated = e.truncated;
    let st = state.clone();
    let out = blocking(&state, move || {
        let maps = st
            .attention()
            .attend_ids(&e.input_ids, Some(&e.token_type_ids), e.tokens)?;
        let (n_layers, n_heads) = (
            maps.num_layers(),
            st.embedder.model().config().num_attention_heads,
        );
        let pick = |i: usize, max: usize, what: &str| -> AppResult<()> {
            (i < max).then_some(()).ok_or_else(|| {
                ApiError::validation(format!("{what} {i} is out of range (0..{max})"))
            })
        };
        if let Some(l) = req.layer {
            pick(l, n_layers, "layer")?;
        }
        if let Some(h) = req.head {
            pick(h, n_heads, "head")?;
        }
        let attentions = maps
            .attentions
            .into_iter()
            .enumerate()
            .filter(|(l, _)| req.layer.is_none_or(|x| x == *l))
            .map(|(_, heads)| {
                heads
                    .into_iter()
                    .enumerate()
                    .filter(|(h, _)| req.head.is_none_or(|x| x == *h))
                    .map(|(_, m)| m)
                    .collect()
            })
            .collect();
        Ok(AttentionResponse {
            tokens: maps.tokens,
            layers: n_layers,
            heads: n_heads,
            attentions,
            truncated,
        })
    })
    .await?;
    Ok(Json(out))
}
