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
//! `max_unauthenticated_per_source` per address (IPv6 per /64),
//! `known_source_factor` times that for an address that logged in lately,
//! each cut `unauthenticated_timeout_ms` after accept if it has not logged
//! in by then.
//! Past that a new connection waits, accepted but unread, for a slot of its
//! address to free, within the same deadline: a burst from one NAT address
//! is served in turn, and one address still cannot hold more slots than its
//! allowance with sockets that never speak.
//!
//! Behind a TCP load balancer every connection comes from the balancer: a
//! connection from one of the networks trusted with [`ProxyProtocol`] must
//! first send a PROXY protocol header ([`proxy_protocol`]), read before
//! anything else, and the client address it carries is the one the ticket
//! holds — so the pre-auth slot, the login throttle, the IP allow-list, the
//! access log and the abuse records all see the client, not the balancer.
//! Anyone else's connection is never read for a header: a forged one is just
//! bad input to the ingress.

pub mod proxy_protocol;

use proxynet_common::tasks::Stop;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{ErrorKind, ProxyError};
use proxynet_common::egress::Cidr;

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
    /// The client's address: the TCP peer's, or the one a trusted
    /// balancer's PROXY protocol header carried.
    pub fn peer(&self) -> SocketAddr {
        self.0.peer
    }

    /// The connection has logged in: it no longer counts against its
    /// address's pre-auth bound nor runs against the pre-auth deadline, and
    /// (at its first login) its address counts as known for a while.
    pub fn authenticated(&self) {
        match &self.0.holds {
            TicketHolds::Connection { pre_auth, .. } => {
                let slot = pre_auth.lock().ok().and_then(|mut slot| slot.take());
                if let Some(slot) = slot {
                    // Known first, then freed: the place goes to a waiter
                    // of the larger allowance.
                    slot.registry.logged_in(slot.source);
                    drop(slot);
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

/// The bounds [`PreAuth`] keeps (docs/tenancy.md, "Connection-level bounds").
#[derive(Debug, Clone, Copy)]
pub struct PreAuthLimits {
    /// Slots one address (IPv6: one /64) may hold.
    pub per_source: usize,
    /// Slots an address one of whose connections logged in within
    /// `known_for` may hold.
    pub per_known_source: usize,
    /// Connections one address may have waiting for a slot; beyond, new
    /// ones are closed at once.
    pub waiting_per_source: usize,
    /// Slots held by every address together.
    pub total: usize,
    /// Connections waiting for a slot, from every address together.
    pub waiting_total: usize,
    /// How long after a login its address counts as known.
    pub known_for: Duration,
    /// From accept to the cut of a connection still not logged in, waiting
    /// included.
    pub timeout: Duration,
}

/// Connections that have not logged in yet, per source address.
///
/// A connection holds a slot of its address until its first login. Past its
/// address's allowance a new connection waits, accepted but unread, for a
/// slot to free (a login or a close), first come first served, until its
/// deadline: a customer's burst through one NAT address is served in turn
/// instead of closed, while silent sockets still hold no more than the
/// allowance. Waiters are bounded too (per address and in all), so what a
/// flood costs stays bounded; past those bounds connections are closed.
pub struct PreAuth {
    limits: PreAuthLimits,
    state: std::sync::Mutex<PreAuthState>,
}

#[derive(Default)]
struct PreAuthState {
    per_source: HashMap<IpAddr, Source>,
    /// Slot id → (deadline, the connection's cut token).
    pending: HashMap<u64, (Instant, CancellationToken)>,
    next_id: u64,
    /// Connections waiting for a slot, from every address.
    waiting: usize,
    /// Addresses whose connections logged in, and when the last one did.
    logins: HashMap<IpAddr, Instant>,
}

impl PreAuthState {
    /// Forgets `source` once it holds and awaits nothing: the map stays as
    /// small as what is pending.
    fn tidy(&mut self, source: &IpAddr) {
        if self
            .per_source
            .get(source)
            .is_some_and(|s| s.held == 0 && s.waiting == 0)
        {
            self.per_source.remove(source);
        }
    }
}

/// One source address's slots and the connections waiting for one.
struct Source {
    /// As many permits as the address's allowance: a slot holds one, a
    /// waiter queues for one (tokio's semaphore hands freed permits to
    /// queued waiters first, in order).
    slots: Arc<Semaphore>,
    /// Permits `slots` holds in all (available, held or handed to a
    /// waiter): the allowance as last set.
    allowance: usize,
    /// Slots held now.
    held: usize,
    /// Connections waiting now.
    waiting: usize,
}

impl Source {
    fn new(allowance: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(allowance)),
            allowance,
            held: 0,
            waiting: 0,
        }
    }

    /// Raises the allowance to `to` at once; the new permits go to the
    /// waiters first.
    fn grow_to(&mut self, to: usize) {
        if to > self.allowance {
            self.slots.add_permits(to - self.allowance);
            self.allowance = to;
        }
    }

    /// Lowers the allowance towards `to` by the permits no one holds; the
    /// held ones are taken back as their slots free.
    fn shrink_to(&mut self, to: usize) {
        if self.allowance > to {
            self.allowance -= self.slots.forget_permits(self.allowance - to);
        }
    }
}

/// One unauthenticated connection's place in [`PreAuth`]; dropping it frees
/// the place.
struct PreAuthSlot {
    registry: Arc<PreAuth>,
    source: IpAddr,
    id: u64,
    /// Its address's permit (taken only when dropped).
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for PreAuthSlot {
    fn drop(&mut self) {
        let mut permit = self.permit.take();
        let Ok(mut guard) = self.registry.state.lock() else {
            return;
        };
        let state = &mut *guard;
        state.pending.remove(&self.id);
        let target = self
            .registry
            .allowance(&state.logins, &self.source, Instant::now());
        if let Some(entry) = state.per_source.get_mut(&self.source) {
            entry.held = entry.held.saturating_sub(1);
            if entry.allowance > target {
                if let Some(permit) = permit.take() {
                    // The address is no longer known: its place is not
                    // handed on, and its allowance is back towards the
                    // plain one even while connections wait.
                    permit.forget();
                    entry.allowance -= 1;
                }
            }
        }
        state.tidy(&self.source);
        drop(guard);
        // Freed after the bookkeeping, so the waiter it goes to finds this
        // slot counted out.
        drop(permit);
    }
}

/// What [`PreAuth::admit`] makes of a new connection.
enum Admission {
    /// A slot now: the connection is served.
    Slot(PreAuthSlot),
    /// Its address holds every slot it may: wait for one, unread.
    Wait(Waiting),
    /// Closed at once, for this limit (the refusal counter's label).
    Refused(&'static str),
}

/// A connection waiting for a slot of its address: counted among its
/// address's waiters until it gets one or gives up.
struct Waiting {
    registry: Arc<PreAuth>,
    source: IpAddr,
    slots: Arc<Semaphore>,
    /// The connection's pre-auth deadline, counted from its accept.
    deadline: Instant,
    /// Still counted among the waiters (until seated).
    counted: bool,
}

impl Waiting {
    /// Waits for a slot until the connection's deadline, its cut or the
    /// listeners closing (`closing`); `None` when it got none (the
    /// connection is then closed, never read).
    async fn slot(
        mut self,
        cut: &CancellationToken,
        closing: &CancellationToken,
    ) -> Option<PreAuthSlot> {
        // A timer per waiter: each waits on its own task anyway, and
        // waiters are bounded.
        let acquired = tokio::select! {
            permit = self.slots.clone().acquire_owned() => permit.ok(),
            () = tokio::time::sleep_until(self.deadline) => {
                metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_timeout")
                    .increment(1);
                None
            }
            () = cut.cancelled() => None,
            () = closing.cancelled() => None,
        };
        let permit = acquired?;
        let registry = self.registry.clone();
        registry.seat(&mut self, permit, cut)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        if let Ok(mut state) = self.registry.state.lock() {
            state.waiting = state.waiting.saturating_sub(1);
            if let Some(entry) = state.per_source.get_mut(&self.source) {
                entry.waiting = entry.waiting.saturating_sub(1);
            }
            state.tidy(&self.source);
        }
    }
}

/// Logins remembered at most (addresses that logged in within
/// `known_for`): beyond, a new address is not remembered, so the map stays
/// bounded whoever logs in.
const MAX_KNOWN_SOURCES: usize = 100_000;

/// Logins past `known_for` are forgotten every this many deadline sweeps
/// (10 s): walking the map every quarter second would be waste.
const PRUNE_EVERY: u64 = 40;

impl PreAuth {
    pub fn new(limits: PreAuthLimits) -> Arc<Self> {
        let per_source = limits.per_source.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Self {
            limits: PreAuthLimits {
                per_source,
                per_known_source: limits
                    .per_known_source
                    .clamp(per_source, Semaphore::MAX_PERMITS),
                total: limits.total.max(1),
                ..limits
            },
            state: Default::default(),
        })
    }

    /// The slots `source` may hold now: more while it is known.
    fn allowance(&self, logins: &HashMap<IpAddr, Instant>, source: &IpAddr, now: Instant) -> usize {
        let known = logins
            .get(source)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.limits.known_for);
        if known {
            self.limits.per_known_source
        } else {
            self.limits.per_source
        }
    }

    /// A slot for a connection from `peer` accepted at `accepted`, a place
    /// among its address's waiters, or a refusal.
    fn admit(
        self: &Arc<Self>,
        peer: SocketAddr,
        cut: &CancellationToken,
        accepted: Instant,
    ) -> Admission {
        let source = crate::login_throttle::limit_key(peer.ip());
        let deadline = accepted + self.limits.timeout;
        let Ok(mut guard) = self.state.lock() else {
            return Admission::Refused("unauthenticated_per_source");
        };
        let state = &mut *guard;
        if state.pending.len() >= self.limits.total {
            return Admission::Refused("unauthenticated_total");
        }
        let allowance = self.allowance(&state.logins, &source, accepted);
        let waiting_full = state.waiting >= self.limits.waiting_total;
        let entry = state
            .per_source
            .entry(source)
            .or_insert_with(|| Source::new(allowance));
        // A permit is free only while nobody waits: freed ones go to the
        // waiters first, so a newcomer never jumps the queue.
        match entry.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                entry.held += 1;
                Admission::Slot(self.register(state, source, deadline, cut, permit))
            }
            // A fresh entry always has a permit, so nothing is left to tidy.
            Err(_) if waiting_full => Admission::Refused("unauthenticated_total"),
            Err(_) if entry.waiting >= self.limits.waiting_per_source => {
                Admission::Refused("unauthenticated_per_source")
            }
            Err(_) => {
                entry.waiting += 1;
                let slots = entry.slots.clone();
                state.waiting += 1;
                Admission::Wait(Waiting {
                    registry: self.clone(),
                    source,
                    slots,
                    deadline,
                    counted: true,
                })
            }
        }
    }

    /// Gives `waiting` the slot its address's `permit` stands for; `None`
    /// when every address together holds the most slots already.
    fn seat(
        self: &Arc<Self>,
        waiting: &mut Waiting,
        permit: OwnedSemaphorePermit,
        cut: &CancellationToken,
    ) -> Option<PreAuthSlot> {
        let mut guard = self.state.lock().ok()?;
        let state = &mut *guard;
        if state.pending.len() >= self.limits.total {
            metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_total")
                .increment(1);
            return None;
        }
        let entry = state.per_source.get_mut(&waiting.source)?;
        entry.waiting = entry.waiting.saturating_sub(1);
        entry.held += 1;
        state.waiting = state.waiting.saturating_sub(1);
        waiting.counted = false;
        Some(self.register(state, waiting.source, waiting.deadline, cut, permit))
    }

    /// Enters a slot in the deadline sweep's list.
    fn register(
        self: &Arc<Self>,
        state: &mut PreAuthState,
        source: IpAddr,
        deadline: Instant,
        cut: &CancellationToken,
        permit: OwnedSemaphorePermit,
    ) -> PreAuthSlot {
        state.next_id += 1;
        let id = state.next_id;
        state.pending.insert(id, (deadline, cut.clone()));
        PreAuthSlot {
            registry: self.clone(),
            source,
            id,
            permit: Some(permit),
        }
    }

    /// A connection from `source` logged in: the address is known for
    /// `known_for`, and its larger allowance applies at once (its waiters
    /// first).
    fn logged_in(&self, source: IpAddr) {
        let Ok(mut guard) = self.state.lock() else {
            return;
        };
        let state = &mut *guard;
        if state.logins.len() >= MAX_KNOWN_SOURCES && !state.logins.contains_key(&source) {
            return;
        }
        state.logins.insert(source, Instant::now());
        if let Some(entry) = state.per_source.get_mut(&source) {
            entry.grow_to(self.limits.per_known_source);
        }
    }

    /// Lowers the allowance of addresses no longer known (by the permits no
    /// one holds; held ones are taken back as they free), and forgets
    /// logins past `known_for` when `prune`.
    fn settle(&self, now: Instant, prune: bool) {
        let Ok(mut guard) = self.state.lock() else {
            return;
        };
        let state = &mut *guard;
        if prune {
            let known_for = self.limits.known_for;
            state
                .logins
                .retain(|_, at| now.saturating_duration_since(*at) < known_for);
        }
        for (source, entry) in state.per_source.iter_mut() {
            let target = self.allowance(&state.logins, source, now);
            entry.shrink_to(target);
        }
    }

    /// Unauthenticated connections holding a slot now (for tests and metrics).
    pub fn held(&self) -> usize {
        self.state.lock().map(|s| s.pending.len()).unwrap_or(0)
    }

    /// Connections waiting for a slot now (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.state.lock().map(|s| s.waiting).unwrap_or(0)
    }

    /// Cuts connections past their pre-auth deadline, every quarter second:
    /// one sweep for all connections instead of a timer each. Also lowers
    /// the allowance of addresses no longer known and keeps the gauges.
    pub async fn run_deadlines(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweeps = 0u64;
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            sweeps += 1;
            let now = Instant::now();
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
            self.settle(now, sweeps.is_multiple_of(PRUNE_EVERY));
            crate::metrics::unauthenticated(self.held(), self.waiting());
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
    proxy_protocol: Arc<ProxyProtocol>,
}

/// Which peers must open with a PROXY protocol header, and how long they
/// have to send it.
#[derive(Debug, Clone, Default)]
pub struct ProxyProtocol {
    /// Trusted networks (the balancers); empty: no header is read from anyone.
    pub from: Vec<Cidr>,
    /// A trusted peer's header must be whole within this from accept.
    pub timeout: Duration,
}

impl ProxyProtocol {
    /// Whether a connection from `peer` must start with a header.
    pub fn trusts(&self, peer: SocketAddr) -> bool {
        // A dual-stack listener shows IPv4 peers as mapped IPv6 addresses.
        let ip = peer.ip().to_canonical();
        self.from.iter().any(|network| network.contains(ip))
    }
}

/// What turns a connection with a pre-auth slot into one with a ticket: a
/// connection permit and a place in the drain count. A waiting connection's
/// task holds one, so shutdown waits for it too (waiters are let go when the
/// listeners close).
struct Issuer {
    permits: Arc<Semaphore>,
    alive: mpsc::Sender<()>,
}

impl Issuer {
    /// The connection's ticket; `None` when `max_connections` are open.
    fn ticket(
        self,
        peer: SocketAddr,
        cut: CancellationToken,
        slot: PreAuthSlot,
    ) -> Option<ConnectionTicket> {
        let permit = self.permits.try_acquire_owned().ok()?;
        Some(ConnectionTicket(Arc::new(TicketInner {
            peer,
            cut,
            streams: AtomicUsize::new(0),
            holds: TicketHolds::Connection {
                _counted: OpenConnection::new(),
                pre_auth: std::sync::Mutex::new(Some(slot)),
                _permit: permit,
                _alive: self.alive,
            },
        })))
    }
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
            proxy_protocol: Arc::new(ProxyProtocol::default()),
        }
    }

    /// Requires a PROXY protocol header of connections from `trusted`.
    pub fn with_proxy_protocol(mut self, trusted: ProxyProtocol) -> Self {
        self.proxy_protocol = Arc::new(trusted);
        self
    }

    /// `None` once draining.
    fn issuer(&self) -> Option<Issuer> {
        Some(Issuer {
            permits: self.permits.clone(),
            alive: self.alive.clone()?,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> PreAuthLimits {
        PreAuthLimits {
            per_source: 2,
            per_known_source: 4,
            waiting_per_source: 3,
            total: 100,
            waiting_total: 100,
            known_for: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
        }
    }

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, last], 40_000))
    }

    /// A connection from `from` accepted now, with its own cut token.
    fn admit(pre_auth: &Arc<PreAuth>, from: SocketAddr) -> (Admission, CancellationToken) {
        let cut = CancellationToken::new();
        (pre_auth.admit(from, &cut, Instant::now()), cut)
    }

    fn slot(pre_auth: &Arc<PreAuth>, from: SocketAddr) -> PreAuthSlot {
        match admit(pre_auth, from).0 {
            Admission::Slot(slot) => slot,
            Admission::Wait(_) => panic!("waits, expected a slot"),
            Admission::Refused(why) => panic!("refused ({why}), expected a slot"),
        }
    }

    /// A waiter of `from` on a task of its own, queued before this returns.
    async fn queue_waiter(
        pre_auth: &Arc<PreAuth>,
        from: SocketAddr,
    ) -> (
        tokio::task::JoinHandle<Option<PreAuthSlot>>,
        CancellationToken,
    ) {
        let (admission, cut) = admit(pre_auth, from);
        let Admission::Wait(waiting) = admission else {
            panic!("expected to wait");
        };
        let task = {
            let (cut, closing) = (cut.clone(), CancellationToken::new());
            tokio::spawn(async move { waiting.slot(&cut, &closing).await })
        };
        // Let it take its place in the queue: freed slots go in order.
        tokio::task::yield_now().await;
        (task, cut)
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_bound_connections_wait_for_a_slot_instead_of_being_closed() {
        let pre_auth = PreAuth::new(limits());
        let from = peer(1);
        let first = slot(&pre_auth, from);
        let _second = slot(&pre_auth, from);
        let mut waiters = Vec::new();
        for _ in 0..3 {
            waiters.push(queue_waiter(&pre_auth, from).await.0);
        }
        assert_eq!((pre_auth.held(), pre_auth.waiting()), (2, 3));
        // Waiting is bounded too: the next one is closed at once.
        assert!(matches!(
            admit(&pre_auth, from).0,
            Admission::Refused("unauthenticated_per_source")
        ));
        // Another address is not held up.
        let _other = slot(&pre_auth, peer(2));
        // A slot freed goes to the first waiter, and only to it.
        drop(first);
        let seated = waiters.remove(0).await.unwrap();
        assert!(seated.is_some(), "the first waiter takes the freed slot");
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        assert_eq!((pre_auth.held(), pre_auth.waiting()), (3, 2));
        // Nor does a newcomer jump the queue.
        assert!(matches!(admit(&pre_auth, from).0, Admission::Wait(_)));
        drop(seated);
        assert!(waiters.remove(0).await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_at_its_deadline_from_accept_and_leaves_nothing_behind() {
        let pre_auth = PreAuth::new(limits());
        let from = peer(1);
        let started = Instant::now();
        let held = [slot(&pre_auth, from), slot(&pre_auth, from)];
        let (waiter, _cut) = queue_waiter(&pre_auth, from).await;
        assert!(waiter.await.unwrap().is_none(), "no slot freed in time");
        assert!(started.elapsed() >= limits().timeout);
        assert_eq!(pre_auth.waiting(), 0);
        drop(held);
        let state = pre_auth.state.lock().unwrap();
        assert!(state.per_source.is_empty() && state.pending.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_cut_gives_up_its_place() {
        let pre_auth = PreAuth::new(limits());
        let from = peer(1);
        let _held = [slot(&pre_auth, from), slot(&pre_auth, from)];
        let (waiter, cut) = queue_waiter(&pre_auth, from).await;
        cut.cancel();
        assert!(waiter.await.unwrap().is_none());
        assert_eq!(pre_auth.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_seated_waiter_keeps_the_deadline_counted_from_its_accept() {
        let pre_auth = PreAuth::new(limits());
        let stop = CancellationToken::new();
        tokio::spawn(pre_auth.clone().run_deadlines(stop.clone()));
        let from = peer(1);
        let first = slot(&pre_auth, from);
        let _second = slot(&pre_auth, from);
        let (waiter, cut) = queue_waiter(&pre_auth, from).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        drop(first);
        let _seated = waiter.await.unwrap().expect("a slot freed in time");
        assert!(!cut.is_cancelled());
        tokio::time::sleep(Duration::from_millis(4_500)).await;
        assert!(
            cut.is_cancelled(),
            "cut 10 s after its accept, not after it got its slot"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_that_logged_in_lately_gets_the_larger_allowance_for_a_while() {
        // A deadline past everything here: only the allowance is at stake.
        let pre_auth = PreAuth::new(PreAuthLimits {
            timeout: Duration::from_secs(3_600),
            ..limits()
        });
        let from = peer(1);
        let first = slot(&pre_auth, from);
        let _second = slot(&pre_auth, from);
        let (waiter, _cut) = queue_waiter(&pre_auth, from).await;
        // The first connection logs in (what `ConnectionTicket::authenticated`
        // does): the waiter is let in, and two more straight away.
        pre_auth.logged_in(first.source);
        drop(first);
        let _seated = waiter.await.unwrap().expect("let in at the login");
        let _third = slot(&pre_auth, from);
        let fourth = slot(&pre_auth, from);
        let (late, _cut) = queue_waiter(&pre_auth, from).await;
        assert_eq!(pre_auth.held(), 4);
        // Past `known_for` without a login, freed slots are taken back to
        // the plain allowance before a waiter gets one.
        tokio::time::advance(Duration::from_secs(301)).await;
        drop(fourth);
        tokio::task::yield_now().await;
        assert!(!late.is_finished(), "4 → 3 slots: still above the plain 2");
        assert_eq!(pre_auth.waiting(), 1);
        // An idle permit is taken back by the sweep's settling.
        let known = peer(2);
        let one = slot(&pre_auth, known);
        pre_auth.logged_in(one.source);
        pre_auth.settle(Instant::now(), false);
        let _more = [slot(&pre_auth, known), slot(&pre_auth, known)];
        tokio::time::advance(Duration::from_secs(301)).await;
        pre_auth.settle(Instant::now(), true);
        assert!(matches!(admit(&pre_auth, known).0, Admission::Wait(_)));
        assert!(pre_auth.state.lock().unwrap().logins.is_empty(), "pruned");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_from_every_address_together_is_bounded() {
        let pre_auth = PreAuth::new(PreAuthLimits {
            per_source: 1,
            waiting_total: 2,
            ..limits()
        });
        let _a = slot(&pre_auth, peer(1));
        let _waiting_a = [
            queue_waiter(&pre_auth, peer(1)).await,
            queue_waiter(&pre_auth, peer(1)).await,
        ];
        let _b = slot(&pre_auth, peer(2));
        assert!(matches!(
            admit(&pre_auth, peer(2)).0,
            Admission::Refused("unauthenticated_total")
        ));
    }
}
