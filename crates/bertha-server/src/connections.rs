//! The accept loop, with the connection hygiene `axum::serve` lacks: a
//! cap on open connections, a header-read timeout, an idle keep-alive
//! timeout, and a graceful shutdown that finishes in-flight requests.
//!
//! - At `max_connections` the loop stops accepting: further clients wait in
//!   the kernel's listen queue (no file descriptor is spent on them) until
//!   a connection closes, and a warning is logged.
//! - `header_read_timeout`: once a request's first byte arrives, its whole
//!   head must follow within this time (slowloris clients trickle a header
//!   byte by byte to hold connections forever).
//! - `keep_alive_timeout`: a connection with no request in flight that
//!   moves no byte either way for this long is closed (idle keep-alive
//!   sockets, and clients that connect and say nothing).
//!
//! hyper's own `header_read_timeout` is not used: its clock also runs while
//! a kept-alive connection waits for its next request, so it would close
//! every idle connection at the header timeout and the two limits could
//! not be set apart.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service as _;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How many connections the server holds and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; more wait in the listen queue.
    pub max_connections: usize,
    /// Time from a request's first byte to the end of its head.
    pub header_read_timeout: Duration,
    /// Time a connection may sit idle, with no request in flight.
    pub keep_alive_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// 30 s for a request head (hyper's default), 60 s idle (nginx keeps
    /// 75 s; client pools mostly expire sooner, so they close first), and
    /// 10,000 connections, lowered to fit the process's open-file limit.
    fn default() -> Self {
        Self {
            max_connections: fitting_file_limit(10_000),
            header_read_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(60),
        }
    }
}

/// File descriptors kept for everything but client connections (the
/// listener, the runtime, files the model reads, logs).
const RESERVED_FILES: u64 = 64;

/// `wanted`, or fewer when the open-file limit would run out first (the
/// failure the limit exists to prevent: accept failing with EMFILE and
/// every request timing out).
pub fn fitting_file_limit(wanted: usize) -> usize {
    match open_file_limit() {
        Some(files) => wanted.min(files.saturating_sub(RESERVED_FILES).max(1) as usize),
        None => wanted,
    }
}

#[cfg(unix)]
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    // `rlim_t` is u64 on Linux but not on every target.
    #[allow(clippy::unnecessary_cast)]
    let current = limit.rlim_cur as u64;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(current)
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<u64> {
    None
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for
/// open connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Slots::new(limits, "connection");
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    while let Some((stream, slot)) = slots.accept(&listener, &mut shutdown).await {
        tokio::spawn(connection(
            stream,
            app.clone(),
            limits,
            graceful.watcher(),
            slot,
        ));
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The `--max-connections` slots of one listener.
pub(crate) struct Slots {
    slots: Arc<Semaphore>,
    max: usize,
    /// What the limit-reached warning calls the connections.
    what: &'static str,
}

impl Slots {
    pub(crate) fn new(limits: ConnectionLimits, what: &'static str) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(
                limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
            )),
            max: limits.max_connections,
            what,
        }
    }

    /// The next connection and the slot it holds until it closes; `None`
    /// once `stop` resolves first. With every slot taken it logs a warning
    /// and waits (new clients wait in the listen queue, costing no file
    /// descriptor); a failed accept is retried ([`accept_failed`]).
    pub(crate) async fn accept(
        &self,
        listener: &TcpListener,
        stop: impl Future<Output = ()>,
    ) -> Option<(TcpStream, OwnedSemaphorePermit)> {
        let mut stop = std::pin::pin!(stop);
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                tracing::warn!(
                    max_connections = self.max,
                    "{} limit reached: new connections wait in the listen queue until one \
                     closes (--max-connections)",
                    self.what
                );
                tokio::select! {
                    slot = self.slots.clone().acquire_owned() => slot.ok()?,
                    _ = &mut stop => return None,
                }
            }
        };
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => return Some((stream, slot)),
                    Err(e) => accept_failed(e).await,
                },
                _ = &mut stop => return None,
            }
        }
    }
}

/// A failed `accept`: a client that gave up before we took it is nothing
/// to report; anything else (out of file descriptors, of memory) is
/// logged and retried after a pause instead of spinning.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused
    ) {
        return;
    }
    tracing::error!("accepting a connection failed: {e}; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// One client connection, holding its `slot` until it closes.
async fn connection(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    watcher: Watcher,
    _slot: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let app = TowerToHyperService::new(app);
    let busy = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let request = busy.begin();
        let response = app.call(req);
        async move {
            let response = response.await;
            drop(request);
            response
        }
    });
    let conn = http1::Builder::new().serve_connection(io, service);
    tokio::select! {
        done = watcher.watch(conn) => {
            if let Err(e) = done {
                tracing::debug!("connection closed: {e}");
            }
        }
        why = activity.expired(&limits) => tracing::debug!("closing a connection: {why}"),
    }
}

/// When a connection last moved a byte, whether a request head is being
/// read, and how many of its requests are being answered.
struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last byte read or written.
    last: AtomicU64,
    /// 1 + milliseconds after `start` of the first byte read since the last
    /// request began; 0 when none was.
    head_since: AtomicU64,
    in_flight: AtomicUsize,
    /// Wakes the watchdog when a head starts (it may be asleep until the
    /// idle deadline).
    head_started: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            head_started: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn wrote(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }

    /// Bytes read with no request in flight start the next request's head.
    fn read(&self) {
        let now = self.now();
        self.last.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self
                .head_since
                .compare_exchange(0, now + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.head_started.notify_one();
        }
    }

    /// hyper parsed a head and handed the request over.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Resolves, saying why, once a head has taken longer than the
    /// header-read timeout or the connection has been idle for the
    /// keep-alive timeout.
    async fn expired(&self, limits: &ConnectionLimits) -> &'static str {
        let ms = |d: Duration| d.as_millis() as u64;
        loop {
            let (deadline, why) = match self.head_since.load(Ordering::Relaxed) {
                _ if self.in_flight.load(Ordering::Relaxed) > 0 => (None, ""),
                0 => (
                    Some(self.last.load(Ordering::Relaxed) + ms(limits.keep_alive_timeout)),
                    "idle for the keep-alive timeout",
                ),
                since => (
                    Some(since - 1 + ms(limits.header_read_timeout)),
                    "request head not received within the header-read timeout",
                ),
            };
            let now = self.now();
            let wait = match deadline {
                Some(at) if now >= at => return why,
                Some(at) => at - now,
                // Busy: look again later.
                None => ms(limits.header_read_timeout.min(limits.keep_alive_timeout)),
            };
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait.max(1))) => {}
                _ = self.head_started.notified() => {}
            }
        }
    }
}

/// A request being answered; its end counts as activity.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.wrote();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The socket, noting every byte read or written in its [`Activity`].
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
