//! The accept loop of `taskbroker serve` (issue 14): a cap on open
//! connections, and deadlines on the wire, so that slow or silent clients
//! cannot hold the process's file descriptors.
//!
//! `axum::serve` offers neither, and hyper's own `header_read_timeout`
//! also runs while a keep-alive connection waits for its next request, so
//! it cannot be longer than the idle timeout. Each connection here has a
//! [`Phase`], moved on by the bytes it reads and by its requests in
//! flight, and a watchdog that drops the connection when the phase's
//! deadline passes:
//! - a new connection must send a whole request head within the header
//!   timeout of being accepted;
//! - a kept-alive connection may wait the idle timeout for its next
//!   request, whose head is then due within the header timeout of its
//!   first byte;
//! - a request in flight (up to the last byte of its response, an SSE
//!   stream included) has no deadline here: its body has one in the
//!   handler, its response none.
//!
//! When the broker ends a connection after answering (a refusal that left
//! the body unread: 413, 408, 401, 431 and the like, or the 503 of a
//! connection beyond the cap), it does not close the socket at once: the
//! client may still be writing the body it was refused, and a close with
//! unread data makes the kernel reset the connection, so a client that
//! sends its whole body before reading (most libraries without `Expect:
//! 100-continue`) sees a broken pipe instead of the answer. Like Apache's
//! and nginx's lingering close, [`linger`] shuts the sending side (the
//! client reads the answer, then end of stream) and reads and throws away
//! what still comes, up to [`Linger::bytes`] within [`Linger::time`]; then
//! the socket is closed whatever the client does. Connections closed by a
//! deadline above do not linger: their clients are silent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a connection may keep the broker waiting.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// From accept (or a reused connection's first byte) to the end of the
    /// request head.
    pub header: Duration,
    /// A kept-alive connection with no request in flight.
    pub idle: Duration,
}

/// How much of what a client still sends after the broker's last answer
/// is read and thrown away before the socket is closed (see the module's
/// docs).
#[derive(Debug, Clone, Copy)]
pub struct Linger {
    /// From the answer's end to the close, at most.
    pub time: Duration,
    /// Bytes read and thrown away, at most; beyond, the socket is closed
    /// (reset) at once.
    pub bytes: u64,
}

/// Answer of a connection beyond the cap: a JSON-RPC error, as the
/// handler's refusals.
fn refusal() -> Bytes {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32000,
            "message": "Service Unavailable: too many connections (--max-connections); retry",
        },
    })
    .to_string();
    Bytes::from(format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ))
}

/// How often at most a refusal is logged as a warning (the others: debug).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Serve `router` on `listener` until `stopping`, then wait for the open
/// connections to finish their requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: u32,
    deadlines: Deadlines,
    linger: Linger,
    stopping: CancellationToken,
) {
    // One permit per open connection: refusing needs no lock, and the
    // drain at shutdown is taking them all back.
    let permits = Arc::new(Semaphore::new(max_connections as usize));
    let refusals = Arc::new(Semaphore::new(crate::defaults::LINGERING_REFUSALS));
    let refusal = refusal();
    let mut last_warning: Option<Instant> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            () = stopping.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Refused at once, not queued: a queue would hold the
            // descriptor the cap is there to save. A few linger, so that
            // their clients read the 503 rather than a reset.
            match refusals.clone().try_acquire_owned() {
                Ok(held) => {
                    tokio::spawn(refuse(tcp, refusal.clone(), linger, stopping.clone(), held));
                }
                Err(_) => {
                    let _ = tcp.try_write(&refusal);
                }
            }
            if last_warning.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
                last_warning = Some(Instant::now());
                tracing::warn!(%peer, max_connections, "connection refused: too many connections (--max-connections)");
            } else {
                tracing::debug!(%peer, "connection refused: too many connections");
            }
            continue;
        };
        // Small SSE events must not wait for delayed ACKs (Nagle): ~40 ms
        // each on a reused connection.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        tokio::spawn(connection(
            tcp,
            peer,
            router.clone(),
            Limits { deadlines, linger },
            stopping.clone(),
            permit,
        ));
    }
    drop(listener);
    let _ = permits.acquire_many(max_connections).await;
}

/// Answer a connection beyond the cap with 503, then linger.
async fn refuse(
    mut tcp: TcpStream,
    refusal: Bytes,
    limits: Linger,
    stopping: CancellationToken,
    _held: OwnedSemaphorePermit,
) {
    match tokio::time::timeout(limits.time, tcp.write_all(&refusal)).await {
        Ok(Ok(())) => linger(tcp, limits, &stopping).await,
        Ok(Err(e)) => tracing::debug!(error = %e, "503 not sent"),
        Err(_) => tracing::debug!("503 not sent within the linger time"),
    }
}

/// Close `tcp` after the broker's last answer: shut the sending side, then
/// read and throw away what the client still sends until it closes its
/// side, [`Linger::bytes`] have come, [`Linger::time`] has passed, or the
/// broker stops (see the module's docs).
async fn linger(mut tcp: TcpStream, limits: Linger, stopping: &CancellationToken) {
    if tcp.shutdown().await.is_err() {
        return;
    }
    let deadline = Instant::now() + limits.time;
    let mut thrown: u64 = 0;
    loop {
        let ready = tokio::select! {
            () = stopping.cancelled() => return,
            ready = tokio::time::timeout_at(deadline, tcp.readable()) => ready,
        };
        match ready {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::debug!(thrown, "lingering connection closed: --linger-time passed");
                return;
            }
        }
        // On the stack between waits, so that thousands of lingering
        // connections hold no buffers; 16 reads at most before the next
        // wait, which lets other tasks run.
        let mut buf = [0u8; 16 * 1024];
        for _ in 0..16 {
            match tcp.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => thrown += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return,
            }
            if thrown > limits.bytes {
                tracing::debug!(
                    thrown,
                    "lingering connection reset: it sent more than --linger-bytes"
                );
                return;
            }
        }
    }
}

/// What one connection is held to.
#[derive(Debug, Clone, Copy)]
struct Limits {
    deadlines: Deadlines,
    linger: Linger,
}

/// Errors of one connection (the peer left before accept) are skipped;
/// others (out of descriptors, say) are logged and retried a second later,
/// as `axum::serve` does.
async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Serve one connection until it closes, its deadline passes, or shutdown
/// has let its request in flight finish.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    stopping: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let (phase, phases) = watch::channel(Phase::Waiting {
        since: Instant::now(),
        fresh: true,
    });
    let phase = Arc::new(phase);
    let io = TokioIo::new(Watched {
        tcp,
        phase: phase.clone(),
    });
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        // Handlers read the client's address as with axum::serve.
        request.extensions_mut().insert(ConnectInfo(peer));
        let busy = Busy::enter(phase.clone());
        let router = router.clone();
        // Boxed: a connection that gives its socket back (to linger) needs
        // a service future that is Unpin.
        Box::pin(async move {
            let response = router.oneshot(request).await?;
            Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _busy: busy })))
        })
    });
    // hyper's header timer stays off: it would also close kept-alive
    // connections after the header timeout (see the module's docs).
    let mut conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service);
    let mut expired = pin!(expired(phases, limits.deadlines));
    let mut draining = false;
    let answered = loop {
        if stopping.is_cancelled() && !draining {
            // No new request; the one in flight finishes.
            draining = true;
            Pin::new(&mut conn).graceful_shutdown();
        }
        tokio::select! {
            // Without shutdown: the socket comes back to linger.
            result = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                break true;
            }
            why = expired.as_mut() => {
                tracing::debug!(%peer, why, "connection closed");
                break false;
            }
            () = stopping.cancelled(), if !draining => {}
        }
    };
    if answered {
        let tcp = conn.into_parts().io.into_inner().tcp;
        linger(tcp, limits.linger, &stopping).await;
    }
}

/// Where a connection is, for its deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in flight, and no byte of the next one since `since`;
    /// `fresh` on a connection that has not yet sent a request.
    Waiting { since: Instant, fresh: bool },
    /// Part of a request head has arrived; the rest is due within the
    /// header timeout of `since`.
    Head { since: Instant },
    /// Requests whose responses are not yet wholly sent.
    Busy(usize),
}

/// The reason a connection's deadline passed, once it has.
async fn expired(mut phases: watch::Receiver<Phase>, deadlines: Deadlines) -> &'static str {
    loop {
        let phase = *phases.borrow_and_update();
        let deadline = match phase {
            Phase::Busy(_) => None,
            Phase::Waiting { since, fresh: true } | Phase::Head { since } => {
                Some((since + deadlines.header, "header timeout"))
            }
            Phase::Waiting { since, .. } => Some((since + deadlines.idle, "idle timeout")),
        };
        let sleep = async {
            match deadline {
                Some((at, why)) => {
                    tokio::time::sleep_until(at).await;
                    why
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            changed = phases.changed() => {
                if changed.is_err() {
                    // The connection is gone.
                    return std::future::pending().await;
                }
            }
            why = sleep => return why,
        }
    }
}

/// A request in flight, from its parsed head to its response's last byte
/// (or the response's drop, when the client leaves).
struct Busy(Arc<watch::Sender<Phase>>);

impl Busy {
    fn enter(phase: Arc<watch::Sender<Phase>>) -> Self {
        phase.send_modify(|p| {
            *p = match *p {
                Phase::Busy(n) => Phase::Busy(n + 1),
                _ => Phase::Busy(1),
            }
        });
        Self(phase)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|p| {
            *p = match *p {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                _ => Phase::Waiting {
                    since: Instant::now(),
                    fresh: false,
                },
            }
        });
    }
}

/// A response body that keeps its request [`Busy`] until hyper drops it.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling its [`Phase`] when a request's first byte arrives.
struct Watched {
    tcp: TcpStream,
    phase: Arc<watch::Sender<Phase>>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.phase.send_if_modified(|p| match *p {
                // A new connection's head is due from accept, so that a
                // byte at a time cannot restart its clock.
                Phase::Waiting { since, fresh: true } => {
                    *p = Phase::Head { since };
                    true
                }
                Phase::Waiting { fresh: false, .. } => {
                    *p = Phase::Head {
                        since: Instant::now(),
                    };
                    true
                }
                Phase::Head { .. } | Phase::Busy(_) => false,
            });
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
