//! HTTP/2 to the proxy, on the HTTPS listener when the client's ALPN says
//! `h2`: every stream is one request — a `CONNECT` tunnel (RFC 9113 §8.5)
//! or an absolute-URI request — served by the same code as HTTP/1.1 and so
//! by the one pipeline (its own exit, limits, meter, access-log line, and an
//! error status with `Proxy-Status` on the stream alone).
//!
//! What HTTP/2 adds is a connection many streams share, so it carries its
//! own bounds against a hostile client:
//! - concurrent streams per connection ([`MAX_STREAMS`], advertised in
//!   SETTINGS; each open tunnel also counts against its user's concurrency
//!   limit, like a tunnel on its own connection);
//! - the request header list ([`MAX_HEADER_LIST`]; beyond it h2 answers 431
//!   on that stream);
//! - per-stream flow control with a connection window large enough for
//!   every stream's window, so a stalled tunnel holds its own window and
//!   never the connection's ([`STREAM_WINDOW`]);
//! - rapid reset (CVE-2023-44487), in two layers: h2 answers a client
//!   that resets more than [`MAX_PENDING_ACCEPT_RESETS`] streams before we
//!   have taken them with GOAWAY `ENHANCE_YOUR_CALM`; streams cancelled
//!   after we took them but before their answer draw on a [`ResetBudget`],
//!   and a connection that spends it is closed.
//!
//! Each stream gets its own ticket ([`ConnectionTicket::stream`]): revoking
//! one stream's user cuts that stream, not the other users' streams.

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accept::ConnectionTicket;
use crate::ingress::IngressLimits;
use crate::pipeline::Pipeline;

/// Streams one client connection may have open at once.
pub(crate) const MAX_STREAMS: u32 = 100;
/// Largest request header list (HPACK-decoded size, RFC 9113 §6.5.2).
pub(crate) const MAX_HEADER_LIST: u32 = 64 * 1024;
/// What each stream may have in flight towards us before we read it, and
/// what we buffer for it towards the client: a stalled stream holds at most
/// both (a connection of [`MAX_STREAMS`] stalled streams: 25 MiB).
pub(crate) const STREAM_WINDOW: u32 = 128 * 1024;
const STREAM_SEND_BUFFER: usize = 128 * 1024;
/// Streams cancelled before their answer that a connection may spend at once…
const RESET_BURST: u32 = 128;
/// …and how many more it earns back per second.
const RESETS_PER_SECOND: u32 = 16;
/// Streams h2 itself lets the client reset before we have seen them.
const MAX_PENDING_ACCEPT_RESETS: usize = 64;

/// Serves one HTTP/2 client connection until it ends, is cut, or spends
/// its reset budget.
pub(crate) async fn serve_connection<IO>(
    pipeline: Arc<Pipeline>,
    limits: IngressLimits,
    stream: IO,
    ticket: ConnectionTicket,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let resets = Arc::new(ResetBudget::new());
    let identity = super::forward::ConnectionIdentity::default();
    let service = {
        let (resets, ticket) = (resets.clone(), ticket.clone());
        service_fn(move |req| {
            let watch = resets.watch();
            let handled = super::handle(
                pipeline.clone(),
                limits.tunnel,
                None,
                ticket.stream(),
                identity.clone(),
                req,
            );
            async move {
                let response = handled.await;
                watch.answered();
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(STREAM_WINDOW.saturating_mul(MAX_STREAMS))
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_send_buf_size(STREAM_SEND_BUFFER)
        // A client that stops answering PINGs is gone; its tunnels with it.
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .auto_date_header(false);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(peer = %ticket.peer(), error = %e, "HTTP/2 client connection ended with an error");
                }
                return;
            }
            () = ticket.cut().cancelled() => {
                tracing::debug!(peer = %ticket.peer(), "HTTP/2 client connection cut");
                return;
            }
            () = resets.spent.cancelled() => {
                crate::metrics::h2_connection_closed("rapid_reset");
                tracing::info!(peer = %ticket.peer(), "HTTP/2 client cancelled too many streams before their answer; connection closed");
                return;
            }
            // Like an HTTP/1.1 connection between requests: one with no
            // stream for the header-read timeout gives its slot back
            // (GOAWAY; PINGs alone do not keep it).
            () = idle(&ticket, limits.header_read_timeout), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves once the connection has had no stream for at least `timeout`
/// (checked every `timeout`, so within two).
async fn idle(ticket: &ConnectionTicket, timeout: Duration) {
    let mut quiet_checks = 0;
    loop {
        tokio::time::sleep(timeout).await;
        if ticket.open_streams() == 0 {
            quiet_checks += 1;
            if quiet_checks >= 2 {
                return;
            }
        } else {
            quiet_checks = 0;
        }
    }
}

/// A token bucket of streams the client may cancel before they are
/// answered; cancelled when spent.
pub(crate) struct ResetBudget {
    state: Mutex<(u32, Instant)>,
    spent: CancellationToken,
}

impl ResetBudget {
    fn new() -> Self {
        Self {
            state: Mutex::new((RESET_BURST, Instant::now())),
            spent: CancellationToken::new(),
        }
    }

    /// Watches one stream: dropped before [`StreamWatch::answered`] (hyper
    /// drops a stream's future when the client resets it), it costs a token.
    fn watch(self: &Arc<Self>) -> StreamWatch {
        StreamWatch {
            budget: Some(self.clone()),
        }
    }

    fn charge(&self) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let (tokens, last) = &mut *state;
        let now = Instant::now();
        let earned =
            (now.duration_since(*last).as_millis() as u64 * RESETS_PER_SECOND as u64 / 1000) as u32;
        if earned > 0 {
            *tokens = tokens.saturating_add(earned).min(RESET_BURST);
            *last = now;
        }
        if *tokens == 0 {
            self.spent.cancel();
        } else {
            *tokens -= 1;
        }
    }
}

/// See [`ResetBudget::watch`].
struct StreamWatch {
    budget: Option<Arc<ResetBudget>>,
}

impl StreamWatch {
    fn answered(mut self) {
        self.budget = None;
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.charge();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_reset_budget_allows_a_burst_then_its_rate() {
        let budget = Arc::new(ResetBudget::new());
        for _ in 0..RESET_BURST {
            drop(budget.watch());
        }
        assert!(!budget.spent.is_cancelled(), "the burst is allowed");
        budget.watch().answered();
        assert!(
            !budget.spent.is_cancelled(),
            "answered streams cost nothing"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..RESETS_PER_SECOND {
            drop(budget.watch());
        }
        assert!(!budget.spent.is_cancelled(), "a second earns its rate back");
        drop(budget.watch());
        assert!(
            budget.spent.is_cancelled(),
            "beyond it the connection closes"
        );
    }
}
