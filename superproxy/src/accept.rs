//! Accepting client connections: the connection limit, the drain guard, and
//! the [`ConnectionTicket`] that every connection — and every tunnel born on
//! it — holds for as long as it lives.
//!
//! A ticket owns one of `max_connections` permits, keeps the drain counter up
//! (shutdown waits for every ticket to be gone) and carries the connection's
//! cut token (revoking a user, a consent or a drain deadline cancels it and the
//! connection ends). Tickets are shared, not moved: a CONNECT tunnel spliced
//! after hyper has finished with the connection still holds it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::error::{ErrorKind, ProxyError};
use crate::ingress;
use crate::pipeline::Pipeline;

/// What a client connection holds while it, or a tunnel on it, lives.
#[derive(Clone)]
pub struct ConnectionTicket(Arc<TicketInner>);

struct TicketInner {
    peer: SocketAddr,
    _counted: OpenConnection,
    cut: CancellationToken,
    _permit: OwnedSemaphorePermit,
    _alive: mpsc::Sender<()>,
}

impl ConnectionTicket {
    pub fn peer(&self) -> SocketAddr {
        self.0.peer
    }

    /// Cancelled when the connection must end now (revocation, drain deadline).
    pub fn cut(&self) -> &CancellationToken {
        &self.0.cut
    }
}

/// Keeps the open-connections gauge right however a ticket ends.
struct OpenConnection;

impl OpenConnection {
    fn new() -> Self {
        crate::metrics::connections_open(1.0);
        Self
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        crate::metrics::connections_open(-1.0);
    }
}

/// The client listeners of one superproxy.
pub struct Listeners {
    /// HTTP proxy (SOCKS5 is recognised there too).
    pub proxy: TcpListener,
    pub socks: TcpListener,
    /// HTTPS proxy, when configured.
    pub tls: Option<(TcpListener, tokio_rustls::TlsAcceptor)>,
}

/// Which listener a connection came in on.
#[derive(Clone, Copy)]
enum Door {
    Proxy,
    Socks,
    Tls,
}

async fn accept_tls(
    tls: &Option<(TcpListener, tokio_rustls::TlsAcceptor)>,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    match tls {
        Some((listener, _)) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Connection permits and the drain counter.
pub struct Gate {
    permits: Arc<Semaphore>,
    alive: Option<mpsc::Sender<()>>,
    all_done: mpsc::Receiver<()>,
    cut_all: CancellationToken,
}

impl Gate {
    pub fn new(max_connections: usize) -> Self {
        let (alive, all_done) = mpsc::channel(1);
        Self {
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            alive: Some(alive),
            all_done,
            cut_all: CancellationToken::new(),
        }
    }

    fn ticket(&self, peer: SocketAddr) -> Option<ConnectionTicket> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let alive = self.alive.clone()?;
        Some(ConnectionTicket(Arc::new(TicketInner {
            peer,
            _counted: OpenConnection::new(),
            cut: self.cut_all.child_token(),
            _permit: permit,
            _alive: alive,
        })))
    }

    /// Connections (and tunnels) still open.
    pub fn open(&self, max_connections: usize) -> usize {
        max_connections.max(1) - self.permits.available_permits()
    }

    /// Waits until every ticket is gone, at most `deadline`; true if they are.
    pub async fn wait_idle(&mut self, deadline: Duration) -> bool {
        self.alive = None;
        tokio::time::timeout(deadline, self.all_done.recv())
            .await
            .is_ok()
    }

    /// Ends every open connection and tunnel now.
    pub fn cut_all(&self) {
        self.cut_all.cancel();
    }
}

/// Accepts on both listeners until `stop` resolves, then drops them, so new
/// connections are refused instead of waiting in the backlog.
pub async fn run(
    listeners: Listeners,
    pipeline: Arc<Pipeline>,
    gate: &Gate,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let (accepted, door) = tokio::select! {
            () = &mut stop => break,
            accepted = listeners.proxy.accept() => (accepted, Door::Proxy),
            accepted = listeners.socks.accept() => (accepted, Door::Socks),
            accepted = accept_tls(&listeners.tls) => (accepted, Door::Tls),
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Usually EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Some(ticket) = gate.ticket(peer) else {
            metrics::counter!("proxynet_limit_refusals_total", "limit" => "connections")
                .increment(1);
            // Over TLS a plain-text answer would be noise: just close.
            if !matches!(door, Door::Tls) {
                tokio::spawn(refuse_over_limit(stream, matches!(door, Door::Socks)));
            }
            continue;
        };
        let pipeline = pipeline.clone();
        let acceptor = listeners.tls.as_ref().map(|(_, a)| a.clone());
        tokio::spawn(async move {
            match door {
                Door::Socks => ingress::socks5::serve_connection(pipeline, stream, ticket).await,
                Door::Proxy => ingress::serve_any(pipeline, stream, ticket).await,
                Door::Tls => {
                    let Some(acceptor) = acceptor else { return };
                    let _ = stream.set_nodelay(true);
                    let handshake = tokio::time::timeout(
                        pipeline.config.header_read_timeout(),
                        acceptor.accept(stream),
                    )
                    .await;
                    match handshake {
                        Ok(Ok(tls)) => ingress::http::serve_connection(pipeline, tls, ticket).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listeners);
}

/// Answers a connection over the limit: an HTTP 503 with `Proxy-Status` and
/// `Retry-After` (SOCKS clients, which speak first with 0x05, are closed).
async fn refuse_over_limit(mut stream: TcpStream, socks_only: bool) {
    if !socks_only {
        let mut first = [0u8; 1];
        let peeked = tokio::time::timeout(Duration::from_secs(1), stream.peek(&mut first)).await;
        if matches!(peeked, Ok(Ok(1))) && first[0] != 0x05 {
            let error = ProxyError::new(
                ErrorKind::ConnectionLimit,
                "too many connections; try again shortly",
            );
            let _ = stream.write_all(&error.to_wire()).await;
        }
    }
    let _ = stream.shutdown().await;
}
