//! The generated service traits (`Info`, `Embed`, `Predict`, `Rerank`,
//! `Tokenize`) implemented for [`Tei`]: admission, then the answer of
//! `messages` for a unary call or `streams` for a stream.

use std::time::Instant;

use bertha::tasks::ScoreFunction;
use tonic::{Request, Response, Status, Streaming};

use super::convert::{classifier, direction, metadata, pair, ranks, score_function, u32_of};
use super::pb::embed_server::Embed;
use super::pb::info_server::Info;
use super::pb::predict_server::Predict;
use super::pb::rerank_server::Rerank;
use super::pb::tokenize_server::Tokenize;
use super::{pb, Answers, Reply, Tei};
use crate::api;
use crate::state::ModelKind;

#[tonic::async_trait]
impl Info for Tei {
    async fn info(&self, _req: Request<pb::InfoRequest>) -> Reply<pb::InfoResponse> {
        let state = &self.state;
        let c = &state.config;
        let model_type = match state.kind {
            ModelKind::Embedding => pb::ModelType::Embedding,
            ModelKind::Classifier => pb::ModelType::Classifier,
            ModelKind::Reranker => pb::ModelType::Reranker,
        };
        Ok(Response::new(pb::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            sha: None,
            docker_label: None,
            model_id: c.model_id.clone(),
            model_sha: None,
            model_dtype: api::model_dtype(state).into(),
            model_type: model_type.into(),
            max_concurrent_requests: u32_of(c.max_concurrent_requests),
            max_input_length: u32_of(state.max_input_length()),
            max_batch_tokens: u32_of(c.max_batch_tokens),
            max_batch_requests: None,
            max_client_batch_size: u32_of(c.max_client_batch_size),
            tokenization_workers: u32_of(api::rayon_threads()),
        }))
    }
}

#[tonic::async_trait]
impl Embed for Tei {
    async fn embed(&self, req: Request<pb::EmbedRequest>) -> Reply<pb::EmbedResponse> {
        let _permit = api::admit(&self.state)?;
        Ok(Response::new(self.embed_one(req.into_inner()).await?))
    }

    type EmbedStreamStream = Answers<pb::EmbedResponse>;

    async fn embed_stream(
        &self,
        req: Request<Streaming<pb::EmbedRequest>>,
    ) -> Reply<Self::EmbedStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, true, move |r| {
            let tei = tei.clone();
            async move { tei.embed_one(r).await }
        })))
    }

    async fn embed_sparse(
        &self,
        req: Request<pb::EmbedSparseRequest>,
    ) -> Reply<pb::EmbedSparseResponse> {
        let _permit = api::admit(&self.state)?;
        Ok(Response::new(
            self.embed_sparse_one(req.into_inner()).await?,
        ))
    }

    type EmbedSparseStreamStream = Answers<pb::EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        req: Request<Streaming<pb::EmbedSparseRequest>>,
    ) -> Reply<Self::EmbedSparseStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, true, move |r| {
            let tei = tei.clone();
            async move { tei.embed_sparse_one(r).await }
        })))
    }

    async fn embed_all(&self, req: Request<pb::EmbedAllRequest>) -> Reply<pb::EmbedAllResponse> {
        let _permit = api::admit(&self.state)?;
        Ok(Response::new(self.embed_all_one(req.into_inner()).await?))
    }

    type EmbedAllStreamStream = Answers<pb::EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        req: Request<Streaming<pb::EmbedAllRequest>>,
    ) -> Reply<Self::EmbedAllStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, true, move |r| {
            let tei = tei.clone();
            async move { tei.embed_all_one(r).await }
        })))
    }
}

#[tonic::async_trait]
impl Predict for Tei {
    async fn predict(&self, req: Request<pb::PredictRequest>) -> Reply<pb::PredictResponse> {
        let _permit = api::admit(&self.state)?;
        let r = req.into_inner();
        let input = (r.inputs, None);
        let answer = self
            .predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
            .await?;
        Ok(Response::new(answer))
    }

    async fn predict_pair(
        &self,
        req: Request<pb::PredictPairRequest>,
    ) -> Reply<pb::PredictResponse> {
        let r = req.into_inner();
        let input = pair(r.inputs)?;
        let _permit = api::admit(&self.state)?;
        let answer = self
            .predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
            .await?;
        Ok(Response::new(answer))
    }

    type PredictStreamStream = Answers<pb::PredictResponse>;

    async fn predict_stream(
        &self,
        req: Request<Streaming<pb::PredictRequest>>,
    ) -> Reply<Self::PredictStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(
            req,
            true,
            move |r: pb::PredictRequest| {
                let tei = tei.clone();
                async move {
                    let input = (r.inputs, None);
                    tei.predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
                        .await
                }
            },
        )))
    }

    type PredictPairStreamStream = Answers<pb::PredictResponse>;

    async fn predict_pair_stream(
        &self,
        req: Request<Streaming<pb::PredictPairRequest>>,
    ) -> Reply<Self::PredictPairStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(
            req,
            true,
            move |r: pb::PredictPairRequest| {
                let tei = tei.clone();
                async move {
                    let input = pair(r.inputs)?;
                    tei.predict_one(input, r.truncate, r.truncation_direction, r.raw_scores)
                        .await
                }
            },
        )))
    }
}

#[tonic::async_trait]
impl Rerank for Tei {
    async fn rerank(&self, req: Request<pb::RerankRequest>) -> Reply<pb::RerankResponse> {
        let _permit = api::admit(&self.state)?;
        let start = Instant::now();
        let r = req.into_inner();
        if r.texts.is_empty() {
            return Err(Status::invalid_argument("`texts` cannot be empty"));
        }
        api::check_batch(&self.state, r.texts.len())?;
        let dir = direction(r.truncation_direction)?;
        let classifier = classifier(&self.state, "rerank")?;
        let function = score_function(&classifier, r.raw_scores);
        let query_chars = r.query.chars().count();
        let chars = r
            .texts
            .iter()
            .map(|t| query_chars + t.chars().count())
            .sum();
        let pairs = r.texts.into_iter().map(|t| (r.query.clone(), t)).collect();
        let truncation = r.truncate.then_some(dir);
        let ranked = api::rank(
            &self.state,
            classifier,
            pairs,
            r.return_text,
            function,
            truncation,
        )
        .await?;
        Ok(Response::new(pb::RerankResponse {
            ranks: ranks(ranked),
            metadata: metadata(chars, 0, start),
        }))
    }

    /// (query, text) pairs streamed in, one ranking out; `raw_scores` and
    /// `return_text` are the first message's (as TEI), and a stream takes
    /// at most `--max-client-batch-size` pairs, as a Rerank call.
    async fn rerank_stream(
        &self,
        req: Request<Streaming<pb::RerankStreamRequest>>,
    ) -> Reply<pb::RerankResponse> {
        let _permit = api::admit(&self.state)?;
        let start = Instant::now();
        let classifier = classifier(&self.state, "rerank")?;
        let mut requests = req.into_inner();
        let mut first: Option<(ScoreFunction, bool)> = None;
        let (mut ranked, mut chars) = (Vec::new(), 0);
        while let Some(r) = requests.message().await? {
            api::check_batch(&self.state, ranked.len() + 1)?;
            let (function, return_text) = *first
                .get_or_insert_with(|| (score_function(&classifier, r.raw_scores), r.return_text));
            let dir = direction(r.truncation_direction)?;
            chars += r.query.chars().count() + r.text.chars().count();
            let truncation = r.truncate.then_some(dir);
            let pairs = vec![(r.query, r.text)];
            let one = api::rank(
                &self.state,
                classifier.clone(),
                pairs,
                return_text,
                function,
                truncation,
            )
            .await?;
            let index = ranked.len();
            ranked.extend(one.into_iter().map(|rank| api::Rank { index, ..rank }));
        }
        if ranked.is_empty() {
            return Err(Status::invalid_argument(
                "the stream sent no (query, text) pair",
            ));
        }
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(Response::new(pb::RerankResponse {
            ranks: ranks(ranked),
            metadata: metadata(chars, 0, start),
        }))
    }
}

#[tonic::async_trait]
impl Tokenize for Tei {
    async fn tokenize(&self, req: Request<pb::EncodeRequest>) -> Reply<pb::EncodeResponse> {
        Ok(Response::new(self.tokenize_one(req.into_inner()).await?))
    }

    type TokenizeStreamStream = Answers<pb::EncodeResponse>;

    async fn tokenize_stream(
        &self,
        req: Request<Streaming<pb::EncodeRequest>>,
    ) -> Reply<Self::TokenizeStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, false, move |r| {
            let tei = tei.clone();
            async move { tei.tokenize_one(r).await }
        })))
    }

    async fn decode(&self, req: Request<pb::DecodeRequest>) -> Reply<pb::DecodeResponse> {
        Ok(Response::new(self.decode_one(req.into_inner())?))
    }

    type DecodeStreamStream = Answers<pb::DecodeResponse>;

    async fn decode_stream(
        &self,
        req: Request<Streaming<pb::DecodeRequest>>,
    ) -> Reply<Self::DecodeStreamStream> {
        let tei = self.clone();
        Ok(Response::new(self.in_order(req, false, move |r| {
            let tei = tei.clone();
            async move { tei.decode_one(r) }
        })))
    }
}
