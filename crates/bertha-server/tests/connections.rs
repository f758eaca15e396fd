//! Connection hygiene: slowloris heads and trickled bodies are cut off by
//! the header-read timeout, idle connections by the keep-alive timeout,
//! connections past `max_connections` wait until one closes (with a log
//! line), and errors reach the server's log.

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bertha_server::ServerConfig;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::{minilm, Server};

/// Everything the server logs in this test binary.
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(sink.clone()))
            .init();
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged() -> String {
    String::from_utf8_lossy(&log().lock().unwrap()).into_owned()
}

/// A server with these timeouts (seconds) and connection limit.
async fn server(header: f64, idle: f64, max_connections: usize) -> Server {
    log();
    let mut config = ServerConfig::new(minilm());
    config.connections.header_read_timeout = Duration::from_secs_f64(header);
    config.connections.keep_alive_timeout = Duration::from_secs_f64(idle);
    config.connections.max_connections = max_connections;
    Server::start(config).await
}

async fn connect(server: &Server) -> TcpStream {
    TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection (or `limit` passes);
/// returns what it sent and when it closed, if it did.
async fn until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into(), None),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&got).into(), Some(start.elapsed()))
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

/// A client trickling its header a line at a time (each line well inside
/// the keep-alive timeout) is dropped once the head has taken longer than
/// the header-read timeout; one that sends its head at once is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_is_cut_off() {
    let server = server(1.0, 30.0, 100).await;
    let mut slow = connect(&server).await;
    // Silent first, so the server is waiting on its idle deadline when the
    // head starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    slow.write_all(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut closed = None;
    for i in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if slow
            .write_all(format!("X-Pad-{i}: x\r\n").as_bytes())
            .await
            .is_err()
        {
            closed = Some(start.elapsed());
            break;
        }
        let mut probe = [0u8; 1];
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await {
            assert!(!matches!(r, Ok(n) if n > 0), "the server answered a head");
            closed = Some(start.elapsed());
            break;
        }
    }
    let closed = closed.expect("the slow head was never cut off");
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(5),
        "{closed:?}"
    );

    let mut quick = connect(&server).await;
    quick.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 64];
    let n = quick.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    server.stop().await;
}

/// A body that does not arrive within the header-read timeout is a 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_times_out() {
    let server = server(1.0, 30.0, 100).await;
    let mut slow = connect(&server).await;
    slow.write_all(
        b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"inputs\"",
    )
    .await
    .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf))
        .await
        .expect("no answer to a stalled body")
        .unwrap();
    let reply = String::from_utf8_lossy(&buf[..n]);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("header-read-timeout"), "{reply}");
    assert!(start.elapsed() >= Duration::from_millis(900));
    server.stop().await;
}

/// A kept-alive connection that goes quiet after its response, and one
/// that never says anything, are closed after the keep-alive timeout; the
/// header-read timeout (long here) plays no part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    let server = server(30.0, 1.0, 100).await;
    let mut used = connect(&server).await;
    used.write_all(HEALTH).await.unwrap();
    let mut silent = connect(&server).await;
    let (reply, closed) = until_closed(&mut used, Duration::from_secs(10)).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let closed = closed.expect("the idle connection stayed open");
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(5),
        "{closed:?}"
    );
    let (said, closed) = until_closed(&mut silent, Duration::from_secs(10)).await;
    assert_eq!(said, "");
    assert!(closed.is_some(), "the silent connection stayed open");
    server.stop().await;
}

/// With `max_connections` 2 held by two idle clients, a third waits
/// (unanswered, not refused) and a warning is logged; once one of the two
/// leaves, the third is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_wait_for_a_free_slot() {
    let server = server(30.0, 30.0, 2).await;
    let mut first = connect(&server).await;
    first.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 512];
    assert!(first.read(&mut buf).await.unwrap() > 0);
    let _second = connect(&server).await;
    let mut third = connect(&server).await;
    third.write_all(HEALTH).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(700), third.read(&mut buf)).await;
    assert!(waited.is_err(), "the third connection was served at once");
    assert!(
        logged().contains("connection limit reached"),
        "{}",
        logged()
    );
    drop(first);
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("the third connection was never served")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    server.stop().await;
}

/// Client errors are logged at info, server errors at error, each with
/// its status and message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_reach_the_server_log() {
    use axum::response::IntoResponse;
    let server = server(30.0, 30.0, 100).await;
    let (status, _) = server
        .post(
            "/embed",
            json!({ "inputs": "hi", "normalise-typo-for-the-log": true }),
        )
        .await;
    assert_eq!(status, 422);
    let line = logged()
        .lines()
        .find(|l| l.contains("normalise-typo-for-the-log"))
        .map(str::to_string)
        .expect("the 422 is not in the log");
    assert!(
        line.contains("INFO") && line.contains("status=422"),
        "{line}"
    );

    let response =
        bertha_server::error::ApiError::backend("model exploded for the log test\n  0: backtrace")
            .into_response();
    assert_eq!(response.status(), 500);
    // The whole message goes to the log, backtrace included, then the
    // fields.
    let log = logged();
    let at = log
        .find("ERROR bertha_server::error: model exploded for the log test")
        .expect("the 500 is not in the log");
    let entry: String = log[at..].lines().take(2).collect::<Vec<_>>().join("\n");
    assert!(
        entry.contains("0: backtrace") && entry.contains("status=500"),
        "{entry}"
    );
    server.stop().await;
}
