//! The answer to one message of each kind, whether it came as a unary
//! call or in a stream: through the same functions of [`crate::api`] as
//! the HTTP routes.

use std::time::Instant;

use tonic::Status;

use super::convert::{classifier, direction, metadata, predictions, score_function, u32_of};
use super::{pb, Tei};
use crate::api;
use crate::error::ApiError;

impl Tei {
    pub(super) async fn embed_one(
        &self,
        req: pb::EmbedRequest,
    ) -> Result<pb::EmbedResponse, Status> {
        let start = Instant::now();
        let dir = direction(req.truncation_direction)?;
        let chars = req.inputs.chars().count();
        // As `/embed`: the folder's Normalize module decides when the
        // request does not (TEI: true).
        let norm = req.normalize.unwrap_or(self.state.normalize_default);
        let dimensions = req.dimensions.map(|d| d as usize);
        let call = api::tei_call(req.prompt_name, dimensions);
        let (mut rows, tokens) = api::pooled(
            &self.state,
            vec![req.inputs],
            &call,
            req.truncate,
            dir,
            norm,
        )
        .await?;
        let embeddings = rows
            .pop()
            .ok_or_else(|| ApiError::backend("the model answered with no vector"))?;
        Ok(pb::EmbedResponse {
            embeddings,
            metadata: metadata(chars, tokens, start),
        })
    }

    pub(super) async fn embed_all_one(
        &self,
        req: pb::EmbedAllRequest,
    ) -> Result<pb::EmbedAllResponse, Status> {
        let start = Instant::now();
        let dir = direction(req.truncation_direction)?;
        let chars = req.inputs.chars().count();
        let call = api::tei_call(req.prompt_name, None);
        let (mut rows, tokens) = api::token_vectors(
            &self.state,
            vec![req.inputs],
            &call,
            req.truncate,
            dir,
            false,
        )
        .await?;
        let vectors = rows
            .pop()
            .ok_or_else(|| ApiError::backend("the model answered with no vectors"))?;
        Ok(pb::EmbedAllResponse {
            token_embeddings: vectors
                .into_iter()
                .map(|embeddings| pb::TokenEmbedding { embeddings })
                .collect(),
            metadata: metadata(chars, tokens, start),
        })
    }

    /// EmbedSparse, as `/embed_sparse`: a SPLADE model's non-zero entries
    /// in index order (no normalisation); other models are refused as TEI
    /// refuses them (its 424 is `FailedPrecondition` here).
    pub(super) async fn embed_sparse_one(
        &self,
        req: pb::EmbedSparseRequest,
    ) -> Result<pb::EmbedSparseResponse, Status> {
        let start = Instant::now();
        let dir = direction(req.truncation_direction)?;
        let chars = req.inputs.chars().count();
        let (mut vectors, tokens) = crate::sparse::sparse_vectors(
            &self.state,
            vec![req.inputs],
            req.prompt_name,
            req.truncate,
            dir,
        )
        .await?;
        let vector = vectors
            .pop()
            .ok_or_else(|| ApiError::backend("the model answered with no vector"))?;
        Ok(pb::EmbedSparseResponse {
            sparse_embeddings: vector
                .0
                .into_iter()
                .map(|v| pb::SparseValue {
                    index: v.index,
                    value: v.value,
                })
                .collect(),
            metadata: metadata(chars, tokens, start),
        })
    }

    pub(super) async fn predict_one(
        &self,
        (text, pair): (String, Option<String>),
        truncate: bool,
        truncation_direction: i32,
        raw_scores: bool,
    ) -> Result<pb::PredictResponse, Status> {
        let start = Instant::now();
        let dir = direction(truncation_direction)?;
        let classifier = classifier(&self.state, "classify")?;
        let function = score_function(&classifier, raw_scores);
        let chars = text.chars().count() + pair.as_deref().map_or(0, |p| p.chars().count());
        let seqs = vec![(text, pair)];
        let mut scores = api::classify(
            &self.state,
            classifier,
            seqs,
            None,
            function,
            truncate.then_some(dir),
        )
        .await?;
        let scores = scores
            .pop()
            .ok_or_else(|| ApiError::backend("the classifier answered with no scores"))?;
        Ok(pb::PredictResponse {
            predictions: predictions(scores),
            metadata: metadata(chars, 0, start),
        })
    }

    pub(super) async fn tokenize_one(
        &self,
        req: pb::EncodeRequest,
    ) -> Result<pb::EncodeResponse, Status> {
        // As TEI: the named prompt, else the folder's default one, comes
        // first, and the offsets are into the prompted text.
        let call = api::tei_call(req.prompt_name, None);
        let text = match self.state.embedder.prompt(&call).map_err(ApiError::from)? {
            Some(p) => format!("{}{}", p.text, req.inputs),
            None => req.inputs,
        };
        let tokens = api::simple_tokens(&self.state, vec![text], req.add_special_tokens)
            .await?
            .pop()
            .unwrap_or_default();
        Ok(pb::EncodeResponse {
            tokens: tokens
                .into_iter()
                .map(|t| pb::SimpleToken {
                    id: t.id,
                    text: t.text,
                    special: t.special,
                    start: t.start.map(u32_of),
                    stop: t.stop.map(u32_of),
                })
                .collect(),
        })
    }

    pub(super) fn decode_one(&self, req: pb::DecodeRequest) -> Result<pb::DecodeResponse, Status> {
        let text = api::decode_ids(&self.state, &req.ids, req.skip_special_tokens)?;
        Ok(pb::DecodeResponse { text })
    }
}
