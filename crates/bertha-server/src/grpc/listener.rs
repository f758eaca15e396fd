//! The gRPC port's connections: accepted for tonic within
//! `--max-connections`, each holding its slot while it is open.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::connections::{ConnectionLimits, Slots};

/// Accepts connections for tonic, at most `max_connections` open at once,
/// until tonic stops listening. A failed accept (out of file descriptors)
/// is logged and retried, where tonic's own listener would stop serving.
pub(super) async fn accept(
    listener: TcpListener,
    limits: ConnectionLimits,
    tx: mpsc::Sender<io::Result<Slotted>>,
) {
    let slots = Slots::new(limits, "gRPC connection");
    while let Some((stream, slot)) = slots.accept(&listener, tx.closed()).await {
        let _ = stream.set_nodelay(true);
        if tx
            .send(Ok(Slotted {
                stream,
                _slot: slot,
            }))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A client connection holding its slot of `--max-connections`.
pub(super) struct Slotted {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Slotted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Slotted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Slotted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
