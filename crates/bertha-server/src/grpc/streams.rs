//! A stream's messages answered in their order, a few at a time.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use super::{Answers, Tei};

impl Tei {
    /// Answers each message of `requests` with `answer`, in their order,
    /// up to `--max-client-batch-size` at once (the batcher packs them);
    /// with `permits`, each holds a slot of `--max-concurrent-requests`
    /// while it runs, waiting for one. The first error ends the stream; a
    /// client that goes away cancels the work still queued.
    pub(super) fn in_order<Req, Res, F, Fut>(
        &self,
        request: Request<Streaming<Req>>,
        permits: bool,
        answer: F,
    ) -> Answers<Res>
    where
        Req: Send + 'static,
        Res: Send + 'static,
        F: Fn(Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Res, Status>> + Send + 'static,
    {
        let mut requests = request.into_inner();
        let in_flight = self.state.config.max_client_batch_size.max(1);
        let limit = permits.then(|| self.state.limit.clone());
        let (order_tx, mut order_rx) =
            mpsc::channel::<oneshot::Receiver<Result<Res, Status>>>(in_flight);
        let (tx, rx) = mpsc::channel(in_flight);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = requests.message() => next,
                    _ = order_tx.closed() => return,
                };
                let (done_tx, done_rx) = oneshot::channel();
                let ended = match next {
                    Ok(Some(req)) => {
                        let permit = match &limit {
                            Some(limit) => tokio::select! {
                                permit = limit.clone().acquire_owned() => permit.ok(),
                                _ = order_tx.closed() => return,
                            },
                            None => None,
                        };
                        let work = answer(req);
                        tokio::spawn(async move {
                            let mut done_tx = done_tx;
                            tokio::select! {
                                result = work => {
                                    let _ = done_tx.send(result);
                                }
                                _ = done_tx.closed() => {}
                            }
                            drop(permit);
                        });
                        false
                    }
                    Ok(None) => return,
                    Err(status) => {
                        let _ = done_tx.send(Err(status));
                        true
                    }
                };
                if order_tx.send(done_rx).await.is_err() || ended {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(done) = order_rx.recv().await {
                let result = done
                    .await
                    .unwrap_or_else(|_| Err(Status::internal("a stream's answer was lost")));
                let failed = result.is_err();
                if tx.send(result).await.is_err() || failed {
                    return;
                }
            }
        });
        ReceiverStream::new(rx)
    }
}
