//! Accepting client connections: the connection limit, the drain guard, and
//! the [`ConnectionTicket`] that every connection — and every tunnel born on
//! it — holds for as long as it lives.
//!
//! A ticket owns one of `max_connections` permits, keeps the drain counter up
//! (shutdown waits for every ticket to be gone) and carries the connection's
//! cut token (revoking a user, a consent or a drain deadline cancels it and the
//! connection ends). Tickets are shared, not moved: a CONNECT tunnel spliced
//! after hyper has finished with the connection still holds it.
//!
//! Until its first successful login a connection also holds a pre-auth slot
//! of its source address ([`PreAuth`]): at most
//! `max_unauthenticated_per_source` per address (IPv6 per /64), each cut
//! `unauthenticated_timeout_ms` after accept if it has not logged in by then.
//! One address cannot hold the connection slots with sockets that never speak.

use proxynet_common::tasks::Stop;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::error::{ErrorKind, ProxyError};

/// Serves the connections the acceptor admits, one call per connection; the
/// futures it returns are spawned, each on a task of its own. The acceptor
/// knows nothing of the protocols spoken on them.
pub trait ConnectionHandler {
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

/// What a client connection holds while it, or a tunnel on it, lives.
#[derive(Clone)]
pub struct ConnectionTicket(Arc<TicketInner>);

struct TicketInner {
    peer: SocketAddr,
    cut: CancellationToken,
    /// Stream tickets of this connection alive now (HTTP/2).
    streams: AtomicUsize,
    holds: TicketHolds,
}

/// What the ticket keeps alive: a connection's own places, or (for one
/// stream of a multiplexed connection) the connection's ticket.
enum TicketHolds {
    Connection {
        _counted: OpenConnection,
        /// Released at the first successful login (or when the connection ends).
        pre_auth: std::sync::Mutex<Option<PreAuthSlot>>,
        _permit: OwnedSemaphorePermit,
        _alive: mpsc::Sender<()>,
    },
    Stream(StreamPlace),
}

/// One stream's place on its connection: counted while it lives.
struct StreamPlace {
    connection: ConnectionTicket,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.connection.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionTicket {
    pub fn peer(&self) -> SocketAddr {
        self.0.peer
    }

    /// The connection has logged in: it no longer counts against its
    /// address's pre-auth bound nor runs against the pre-auth deadline.
    pub fn authenticated(&self) {
        match &self.0.holds {
            TicketHolds::Connection { pre_auth, .. } => {
                if let Ok(mut slot) = pre_auth.lock() {
                    slot.take();
                }
            }
            TicketHolds::Stream(place) => place.connection.authenticated(),
        }
    }

    /// A ticket for one stream of this (multiplexed) connection: it keeps
    /// the connection's places, and its own cut token is a child of the
    /// connection's, so revoking the user of one HTTP/2 stream cuts that
    /// stream and leaves the connection's other users' streams alone, while
    /// cutting the connection still cuts every stream.
    pub fn stream(&self) -> ConnectionTicket {
        self.0.streams.fetch_add(1, Ordering::Relaxed);
        ConnectionTicket(Arc::new(TicketInner {
            peer: self.0.peer,
            cut: self.0.cut.child_token(),
            streams: AtomicUsize::new(0),
            holds: TicketHolds::Stream(StreamPlace {
                connection: self.clone(),
            }),
        }))
    }

    /// Stream tickets of this connection alive now: requests in flight and
    /// the tunnels they opened.
    pub fn open_streams(&self) -> usize {
        self.0.streams.load(Ordering::Relaxed)
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

/// Connections that have not logged in yet, per source address.
pub struct PreAuth {
    max_per_source: usize,
    /// Most unauthenticated connections from everyone together: many
    /// addresses (a /48, a botnet) cannot fill every connection slot either.
    max_total: usize,
    timeout: Duration,
    state: std::sync::Mutex<PreAuthState>,
}

#[derive(Default)]
struct PreAuthState {
    per_source: std::collections::HashMap<std::net::IpAddr, usize>,
    /// Slot id → (deadline, the connection's cut token).
    pending: std::collections::HashMap<u64, (tokio::time::Instant, CancellationToken)>,
    next_id: u64,
}

/// One unauthenticated connection's place in [`PreAuth`]; dropping it frees
/// the place.
struct PreAuthSlot {
    registry: Arc<PreAuth>,
    source: std::net::IpAddr,
    id: u64,
}

impl Drop for PreAuthSlot {
    fn drop(&mut self) {
        if let Ok(mut state) = self.registry.state.lock() {
            state.pending.remove(&self.id);
            if let Some(n) = state.per_source.get_mut(&self.source) {
                *n -= 1;
                if *n == 0 {
                    state.per_source.remove(&self.source);
                }
            }
        }
    }
}

impl PreAuth {
    pub fn new(max_per_source: usize, max_total: usize, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_per_source: max_per_source.max(1),
            max_total: max_total.max(1),
            timeout,
            state: Default::default(),
        })
    }

    /// A place for one more unauthenticated connection from `peer`, or
    /// `None` when its address holds the most already.
    fn admit(self: &Arc<Self>, peer: SocketAddr, cut: &CancellationToken) -> Option<PreAuthSlot> {
        let source = crate::limits::limit_key(peer.ip());
        let mut state = self.state.lock().ok()?;
        if state.pending.len() >= self.max_total {
            return None;
        }
        let held = state.per_source.entry(source).or_insert(0);
        if *held >= self.max_per_source {
            return None;
        }
        *held += 1;
        state.next_id += 1;
        let id = state.next_id;
        state.pending.insert(
            id,
            (tokio::time::Instant::now() + self.timeout, cut.clone()),
        );
        Some(PreAuthSlot {
            registry: self.clone(),
            source,
            id,
        })
    }

    /// Unauthenticated connections held now (for tests and metrics).
    pub fn held(&self) -> usize {
        self.state.lock().map(|s| s.pending.len()).unwrap_or(0)
    }

    /// Cuts connections past their pre-auth deadline, every quarter second:
    /// one sweep for all connections instead of a timer each.
    pub async fn run_deadlines(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            let now = tokio::time::Instant::now();
            // Cut under the lock: a login landing meanwhile (which takes
            // the slot out under the same lock) is never cut after it.
            let cut = match self.state.lock() {
                Ok(state) => {
                    let mut cut = 0u64;
                    for (deadline, token) in state.pending.values() {
                        if *deadline <= now && !token.is_cancelled() {
                            token.cancel();
                            cut += 1;
                        }
                    }
                    cut
                }
                Err(_) => continue,
            };
            if cut > 0 {
                metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_timeout")
                    .increment(cut);
            }
        }
    }
}

/// Connection permits and the drain counter.
pub struct Gate {
    permits: Arc<Semaphore>,
    alive: Option<mpsc::Sender<()>>,
    all_done: mpsc::Receiver<()>,
    cut_all: CancellationToken,
    pre_auth: Arc<PreAuth>,
}

/// Why a connection got no ticket.
enum NoTicket {
    /// `max_connections` are open.
    Full,
    /// Its source address holds the most unauthenticated connections.
    SourceBusy,
    /// Draining.
    Closing,
}

impl Gate {
    pub fn new(max_connections: usize, pre_auth: Arc<PreAuth>) -> Self {
        let (alive, all_done) = mpsc::channel(1);
        Self {
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            alive: Some(alive),
            all_done,
            cut_all: CancellationToken::new(),
            pre_auth,
        }
    }

    fn ticket(&self, peer: SocketAddr) -> Result<ConnectionTicket, NoTicket> {
        let cut = self.cut_all.child_token();
        // The per-source bound first: a flood from one address is closed
        // without taking (or even asking for) a connection slot.
        let slot = self
            .pre_auth
            .admit(peer, &cut)
            .ok_or(NoTicket::SourceBusy)?;
        let permit = self
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| NoTicket::Full)?;
        let alive = self.alive.clone().ok_or(NoTicket::Closing)?;
        Ok(ConnectionTicket(Arc::new(TicketInner {
            peer,
            cut,
            streams: AtomicUsize::new(0),
            holds: TicketHolds::Connection {
                _counted: OpenConnection::new(),
                pre_auth: std::sync::Mutex::new(Some(slot)),
                _permit: permit,
                _alive: alive,
            },
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
pub async fn run<H: ConnectionHandler + Clone + Send + 'static>(
    listeners: Listeners,
    handler: &H,
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
        let ticket = match gate.ticket(peer) {
            Ok(ticket) => ticket,
            Err(NoTicket::Full) => {
                metrics::counter!("proxynet_limit_refusals_total", "limit" => "connections")
                    .increment(1);
                // Over TLS a plain-text answer would be noise: just close.
                if !matches!(door, Door::Tls) {
                    tokio::spawn(refuse_over_limit(stream, matches!(door, Door::Socks)));
                }
                continue;
            }
            Err(NoTicket::SourceBusy) => {
                // Closed at once, unanswered: answering would cost the
                // flooding address more of our time than its connection.
                metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_per_source")
                    .increment(1);
                drop(stream);
                continue;
            }
            Err(NoTicket::Closing) => continue,
        };
        match door {
            Door::Socks => {
                tokio::spawn(handler.socks(stream, ticket));
            }
            Door::Proxy => {
                tokio::spawn(handler.proxy(stream, ticket));
            }
            Door::Tls => {
                let Some(acceptor) = listeners.tls.as_ref().map(|(_, a)| a.clone()) else {
                    continue;
                };
                let handler = handler.clone();
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
