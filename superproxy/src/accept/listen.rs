//! The accept loop: the listeners, a trusted balancer's PROXY protocol
//! header read first, then each connection through the per-source pre-auth
//! bound ([`PreAuth`]) and the connection cap to its [`ConnectionHandler`],
//! on a task of its own, in its listener's protocol; over the cap, a `503`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::gate::{Gate, ProxyProtocol};
use super::pre_auth::{Admission, PreAuth};
use super::proxy_protocol;
use super::ticket::{ConnectionTicket, Issuer};
use crate::error::{ErrorKind, ProxyError};

/// Serves the connections the acceptor admits, one call per connection; the
/// futures it returns are spawned, each on a task of its own. The acceptor
/// knows nothing of the protocols spoken on them.
pub(crate) trait ConnectionHandler {
    /// A connection on the HTTP proxy listener.
    fn proxy(
        &self,
        stream: TcpStream,
        ticket: ConnectionTicket,
    ) -> impl Future<Output = ()> + Send + 'static;
    /// A connection on the SOCKS5 listener.
    fn socks(
        &self,
        stream: TcpStream,
        ticket: ConnectionTicket,
    ) -> impl Future<Output = ()> + Send + 'static;
    /// A connection on the HTTPS proxy listener, its TLS handshake done.
    fn tls(
        &self,
        stream: tokio_rustls::server::TlsStream<TcpStream>,
        ticket: ConnectionTicket,
    ) -> impl Future<Output = ()> + Send + 'static;
}

/// The client listeners of one superproxy.
pub(crate) struct Listeners {
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

/// Accepts on both listeners until `stop` resolves, then drops them, so new
/// connections are refused instead of waiting in the backlog.
pub(crate) async fn run<H: ConnectionHandler + Clone + Send + 'static>(
    listeners: Listeners,
    handler: &H,
    gate: &Gate,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    // Cancelled when the listeners close: connections still waiting for a
    // pre-auth slot are closed then (never read, they lose nothing).
    let closing = CancellationToken::new();
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
        let Some(issuer) = gate.issuer() else {
            continue;
        };
        let arrival = Arrival {
            door,
            stream,
            peer,
            cut: gate.cut_all.child_token(),
            issuer,
            accepted: Instant::now(),
        };
        if !gate.proxy_protocol.trusts(peer) {
            admit(
                handler,
                &gate.pre_auth,
                arrival,
                tls_acceptor(&listeners),
                &closing,
            );
            continue;
        }
        // A balancer's connection: its header first, on a task of its own
        // (the accept loop never waits on a peer), and only then the
        // per-source bound, for the client the header names.
        let handler = handler.clone();
        let pre_auth = gate.pre_auth.clone();
        let trusted = gate.proxy_protocol.clone();
        let tls = match door {
            Door::Tls => tls_acceptor(&listeners).cloned(),
            Door::Proxy | Door::Socks => None,
        };
        let closing = closing.clone();
        tokio::spawn(async move {
            if let Some(arrival) = read_proxy_header(arrival, &trusted, &closing).await {
                admit(&handler, &pre_auth, arrival, tls.as_ref(), &closing);
            }
        });
    }
    closing.cancel();
    drop(listeners);
}

/// A connection just accepted, with what it needs to be admitted.
struct Arrival {
    door: Door,
    stream: TcpStream,
    /// The client's address (the balancer's header's, once read).
    peer: SocketAddr,
    cut: CancellationToken,
    issuer: Issuer,
    /// Its pre-auth deadline counts from here, the header read included.
    accepted: Instant,
}

/// Reads a trusted peer's PROXY protocol header; the arrival with the
/// client's address, or `None` when the connection was closed for a missing
/// or malformed header (or the listeners closed, or a drain cut it).
async fn read_proxy_header(
    mut arrival: Arrival,
    trusted: &ProxyProtocol,
    closing: &CancellationToken,
) -> Option<Arrival> {
    let read = tokio::select! {
        read = proxy_protocol::read(&mut arrival.stream, trusted.timeout) => read,
        () = arrival.cut.cancelled() => return None,
        () = closing.cancelled() => return None,
    };
    match read {
        Ok(header) => {
            crate::metrics::proxy_protocol(match header {
                proxy_protocol::Header::Proxied { .. } => "proxied",
                proxy_protocol::Header::Local => "local",
            });
            arrival.peer = header.client(arrival.peer);
            Some(arrival)
        }
        Err(e) => {
            crate::metrics::proxy_protocol(match e {
                proxy_protocol::ReadError::Malformed(_) => "malformed",
                proxy_protocol::ReadError::Timeout(_) => "timeout",
                proxy_protocol::ReadError::Io(_) => "closed",
            });
            // Closed unanswered: whatever answer we gave would reach the
            // balancer, which has no use for it.
            tracing::debug!(peer = %arrival.peer, error = %e, "connection from a trusted balancer without a valid PROXY protocol header; closed");
            None
        }
    }
}

/// The per-source bound for an arrival: served now, left waiting for a slot
/// of its address, or closed.
fn admit<H: ConnectionHandler + Clone + Send + 'static>(
    handler: &H,
    pre_auth: &Arc<PreAuth>,
    arrival: Arrival,
    tls: Option<&tokio_rustls::TlsAcceptor>,
    closing: &CancellationToken,
) {
    let Arrival {
        door,
        stream,
        peer,
        cut,
        issuer,
        accepted,
    } = arrival;
    // The per-source bound first: a flood from one address is closed,
    // or left waiting, without taking a connection slot.
    match pre_auth.admit(peer, &cut, accepted) {
        Admission::Slot(slot) => match issuer.ticket(peer, cut, slot) {
            Some(ticket) => serve(handler, door, stream, ticket, tls),
            None => {
                tokio::spawn(over_limit(stream, door));
            }
        },
        Admission::Wait(waiting) => {
            let handler = handler.clone();
            let tls = match door {
                Door::Tls => tls.cloned(),
                Door::Proxy | Door::Socks => None,
            };
            let closing = closing.clone();
            tokio::spawn(async move {
                // Nothing is read off the connection before it has its
                // slot; its deadline runs from accept all the same.
                let Some(slot) = waiting.slot(&cut, &closing).await else {
                    return;
                };
                match issuer.ticket(peer, cut, slot) {
                    // On a task of its own: this one stays as small as
                    // a waiter, which is all it was.
                    Some(ticket) => serve(&handler, door, stream, ticket, tls.as_ref()),
                    None => over_limit(stream, door).await,
                }
            });
        }
        Admission::Refused(limit) => {
            // Closed at once, unanswered: answering would cost the
            // flooding address more of our time than its connection.
            metrics::counter!("proxynet_limit_refusals_total", "limit" => limit).increment(1);
            drop(stream);
        }
    }
}

fn tls_acceptor(listeners: &Listeners) -> Option<&tokio_rustls::TlsAcceptor> {
    listeners.tls.as_ref().map(|(_, acceptor)| acceptor)
}

/// Serves a connection that has its ticket, on a task of its own, in the
/// protocol of the listener it came in on.
fn serve<H: ConnectionHandler + Clone + Send + 'static>(
    handler: &H,
    door: Door,
    stream: TcpStream,
    ticket: ConnectionTicket,
    tls: Option<&tokio_rustls::TlsAcceptor>,
) {
    match door {
        Door::Socks => {
            tokio::spawn(handler.socks(stream, ticket));
        }
        Door::Proxy => {
            tokio::spawn(handler.proxy(stream, ticket));
        }
        Door::Tls => {
            let Some(acceptor) = tls.cloned() else {
                return;
            };
            let handler = handler.clone();
            let peer = ticket.peer();
            tokio::spawn(async move {
                // The pre-auth deadline bounds the handshake too.
                let handshake = tokio::select! {
                    done = acceptor.accept(stream) => Some(done),
                    () = ticket.cut().cancelled() => None,
                };
                match handshake {
                    Some(Ok(tls)) => handler.tls(tls, ticket).await,
                    Some(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    None => {
                        tracing::debug!(%peer, "TLS handshake not done before the pre-auth deadline")
                    }
                }
            });
        }
    }
}

/// A connection over `max_connections`: counted, and answered where an
/// answer can be read (over TLS a plain-text one would be noise: closed).
async fn over_limit(stream: TcpStream, door: Door) {
    metrics::counter!("proxynet_limit_refusals_total", "limit" => "connections").increment(1);
    if !matches!(door, Door::Tls) {
        refuse_over_limit(stream, matches!(door, Door::Socks)).await;
    }
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
