//! Serving one UDP association (SOCKS5 `UDP ASSOCIATE` at the superproxy):
//! admit, bind, then relay datagram capsules between a link stream and the
//! egress sockets.
//!
//! The stream (`StreamRequest::Udp`, link v2 only) carries
//! [`proxynet_wire::datagram`] capsules both ways. The agent binds one UDP
//! socket per egress IP asked for (at most one per family) and sends each
//! datagram from the socket of its destination's family, after the same
//! egress policy check a tunnel gets, on every datagram (names are resolved
//! by the agent, through a small per-association cache).
//!
//! Replies are accepted only from addresses this association has sent to
//! (address- and port-dependent filtering), so an egress socket never
//! becomes an open inbound relay into the superproxy. UDP may drop, and so
//! do we: a full socket buffer, a denied destination or a stream that cannot
//! take more output drops the datagram (counted) rather than stall the
//! association.

use bytes::BytesMut;
use metrics::Counter;
use proxynet_common::egress::{parse_ip_literal, EgressPolicy};
use proxynet_wire::datagram::{self, Datagram, DatagramAddr, DatagramError, MAX_CAPSULE};
use proxynet_wire::link::Outcome;
use proxynet_wire::mux::Incoming;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::dns::{Dns, DnsFailure};
use crate::policy::LivePolicy;
use crate::tunnel::{admit, ActiveGuard, TunnelContext};

/// Names one association keeps resolved: enough for any real client,
/// small enough that a client spraying names cannot grow it.
const MAX_NAMES: usize = 256;
/// How long a resolved name is reused: a game sending 1000 datagrams a
/// second to one name must not cost 1000 lookups a second.
const NAME_TTL: Duration = Duration::from_secs(30);
/// A name that did not resolve is retried sooner, but not per datagram (each
/// failed lookup stalls the association up to the resolver's timeout).
const FAILED_NAME_TTL: Duration = Duration::from_secs(5);
/// Destinations whose replies are let in; the oldest is forgotten first.
const MAX_PEERS: usize = 1024;
/// Output waiting for stream credit beyond which the sockets are not read:
/// the kernel's socket buffer then drops, as UDP would.
const MAX_PENDING_OUT: usize = 256 * 1024;
/// Larger than any UDP payload (65 527 bytes over IPv6), so nothing is
/// ever silently truncated.
const RECV_BUF_LEN: usize = 64 * 1024;
/// Datagrams taken off one socket per wake-up, so one busy socket cannot
/// keep the loop from the stream and the other socket.
const RECV_BATCH: usize = 32;
/// Stream bytes read per call: capsules are small, big ones arrive in parts.
const READ_CHUNK: usize = 16 * 1024;
/// Buffers grown past this by a burst are given back once empty, so an idle
/// association holds little memory.
const KEEP_CAPACITY: usize = 64 * 1024;

thread_local! {
    /// One receive buffer per worker thread rather than per association: it
    /// is only used between a readiness and the copy into the output, never
    /// across an await, and 64 KiB × every open association would add up.
    static RECV_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; RECV_BUF_LEN]);
}

/// Serves one `StreamRequest::Udp` stream: answers it, and relays until the
/// superproxy closes the stream, the association idles out or the exit is
/// withdrawn. `budget_ms` is not needed: nothing is dialled before the
/// answer (binding is immediate).
pub(crate) async fn serve(
    ctx: Arc<TunnelContext>,
    incoming: Incoming,
    egress_ips: Vec<IpAddr>,
    window: Option<u32>,
) {
    // Before anything is sent: the superproxy grants what it named.
    if let Some(window) = window {
        incoming.start_window(window);
    }
    let (guard, sockets) = match prepare(&ctx, &egress_ips).await {
        Ok(prepared) => prepared,
        Err(outcome) => {
            count(outcome);
            drop(incoming.reply(bytes::Bytes::from_static(outcome.as_str().as_bytes())));
            return;
        }
    };
    count(Outcome::Connected);
    let stream = incoming.reply(bytes::Bytes::from_static(
        Outcome::Connected.as_str().as_bytes(),
    ));
    let _guard = guard;
    let cut = ctx.cut_token();
    let relay = Relay::new(
        &ctx.policy,
        &ctx.dns,
        sockets,
        Duration::from_secs(ctx.config.udp_idle_timeout_secs.max(1)),
    );
    let summary = relay.run(stream, cut).await;
    tracing::debug!(
        out_datagrams = summary.out.count(Fate::Sent),
        out_bytes = summary.out.bytes,
        out_dropped = summary.out.dropped(),
        in_datagrams = summary.inbound.count(Fate::Sent),
        in_bytes = summary.inbound.bytes,
        in_dropped = summary.inbound.dropped(),
        end = ?summary.end,
        "udp association closed"
    );
}

fn count(outcome: Outcome) {
    metrics::counter!("proxynet_agent_udp_associations_total", "outcome" => outcome.as_str())
        .increment(1);
}

/// Whether `ip` is one this agent serves from: an egress IP, or an address
/// of an egress prefix.
fn egress_owned(ctx: &TunnelContext, ip: IpAddr) -> bool {
    ctx.config.owns_egress(ip)
}

/// Admits the association and binds its sockets, or says why not, in the
/// order a tunnel is refused: capacity, the request, draining, egress.
async fn prepare(
    ctx: &Arc<TunnelContext>,
    egress_ips: &[IpAddr],
) -> Result<(ActiveGuard, Sockets), Outcome> {
    let guard = admit(ctx).ok_or(Outcome::Capacity)?;
    let mut v4 = None;
    let mut v6 = None;
    for ip in egress_ips {
        let slot = if ip.is_ipv4() { &mut v4 } else { &mut v6 };
        if slot.replace(*ip).is_some() {
            return Err(Outcome::BadRequest);
        }
    }
    if v4.is_none() && v6.is_none() {
        return Err(Outcome::BadRequest);
    }
    if ctx.refusing.load(Ordering::Relaxed) || ctx.withdrawn.load(Ordering::Relaxed) {
        return Err(Outcome::Draining);
    }
    if !egress_ips.iter().all(|ip| egress_owned(ctx, *ip)) {
        return Err(Outcome::EgressUnavailable);
    }
    let sockets = Sockets {
        v4: bind(ctx, v4).await?,
        v6: bind(ctx, v6).await?,
    };
    Ok((guard, sockets))
}

/// Binds `ip` (any free port) as `egress.rs` binds egress addresses
/// (`IP_FREEBIND` for prefix addresses).
async fn bind(ctx: &TunnelContext, ip: Option<IpAddr>) -> Result<Option<UdpSocket>, Outcome> {
    let Some(ip) = ip else {
        return Ok(None);
    };
    let bound = crate::egress::bind_egress_udp(&ctx.config, ip);
    match bound {
        Ok(socket) => writable(socket).await,
        Err(e) => Err(e),
    }
    .map(Some)
    .map_err(|e| {
        tracing::debug!(egress_ip = %ip, error = %e, "cannot bind a udp egress socket");
        Outcome::EgressUnavailable
    })
}

/// `socket`, once the runtime knows it is writable.
///
/// Datagrams are sent with `try_send_to`, which tokio answers `WouldBlock`
/// without trying until its reactor has seen the socket writable; a fresh
/// socket is writable at once, but the reactor learns so only at its next
/// turn, and the association's first datagrams would be dropped meanwhile.
async fn writable(socket: UdpSocket) -> io::Result<UdpSocket> {
    tokio::time::timeout(Duration::from_secs(1), socket.writable())
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    Ok(socket)
}

/// An association's egress sockets, at most one per family.
pub(crate) struct Sockets {
    v4: Option<UdpSocket>,
    v6: Option<UdpSocket>,
}

impl Sockets {
    fn for_family(&self, addr: SocketAddr) -> Option<&UdpSocket> {
        if addr.is_ipv4() {
            self.v4.as_ref()
        } else {
            self.v6.as_ref()
        }
    }
}

/// How the relay resolves names (the agent's [`Dns`]; a table in tests).
pub(crate) trait Resolve {
    /// Every address of `host`, within the resolver's own time limit.
    fn lookup(&self, host: &str) -> impl Future<Output = Result<Vec<IpAddr>, DnsFailure>> + Send;
}

impl Resolve for Dns {
    async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, DnsFailure> {
        // The resolver bounds each lookup by its own timeout; there is no
        // connect budget to fit in.
        let deadline = Instant::now() + Duration::from_secs(60);
        let resolved = self.resolve(host, 0, deadline).await;
        metrics::counter!("proxynet_agent_dns_lookups_total", "result" => match &resolved {
            Ok(_) => "ok",
            Err(DnsFailure::TimedOut) => "timed_out",
            Err(DnsFailure::NoAddress) => "no_address",
        })
        .increment(1);
        resolved.map(|addrs| addrs.into_iter().map(|a| a.ip()).collect())
    }
}

/// What became of one datagram (a label of
/// `proxynet_agent_udp_datagrams_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Relayed: sent to its destination, or written to the stream.
    Sent,
    /// The egress policy denies every address of the destination.
    Denied,
    /// The destination name did not resolve.
    Unresolved,
    /// Allowed, but no socket of its family was bound.
    NoFamily,
    /// A full socket buffer, a send error, or too large to carry.
    Dropped,
    /// A reply from an address the association never sent to.
    UnknownPeer,
}

impl Fate {
    const ALL: [Fate; 6] = [
        Fate::Sent,
        Fate::Denied,
        Fate::Unresolved,
        Fate::NoFamily,
        Fate::Dropped,
        Fate::UnknownPeer,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Fate::Sent => "sent",
            Fate::Denied => "denied",
            Fate::Unresolved => "unresolved",
            Fate::NoFamily => "no_family",
            Fate::Dropped => "dropped",
            Fate::UnknownPeer => "unknown_peer",
        }
    }
}

/// One direction's datagram counts: kept for the closing log line, and
/// counted into metrics through handles registered once per association
/// (not a registry lookup per datagram).
pub(crate) struct Direction {
    tally: [u64; Fate::ALL.len()],
    /// Payload bytes relayed.
    pub(crate) bytes: u64,
    counters: [Counter; Fate::ALL.len()],
}

impl Direction {
    fn new(direction: &'static str) -> Self {
        Self {
            tally: [0; Fate::ALL.len()],
            bytes: 0,
            counters: Fate::ALL.map(|fate| {
                metrics::counter!(
                    "proxynet_agent_udp_datagrams_total",
                    "direction" => direction,
                    "outcome" => fate.as_str()
                )
            }),
        }
    }

    fn note(&mut self, fate: Fate) {
        let i = fate as usize;
        self.tally[i] += 1;
        self.counters[i].increment(1);
    }

    pub(crate) fn count(&self, fate: Fate) -> u64 {
        self.tally[fate as usize]
    }

    /// Every datagram not relayed, whatever the reason.
    pub(crate) fn dropped(&self) -> u64 {
        self.tally.iter().sum::<u64>() - self.count(Fate::Sent)
    }
}

/// Why an association ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The superproxy finished the stream.
    Closed,
    /// The stream was reset or the link lost.
    Reset,
    /// No datagram relayed either way for the idle timeout.
    Idle,
    /// The exit was withdrawn.
    Cut,
    /// An egress socket can no longer be waited on (the runtime is
    /// shutting down).
    Socket,
    /// The superproxy sent something that is not a capsule.
    Malformed(DatagramError),
}

pub(crate) struct Summary {
    /// Towards destinations.
    pub(crate) out: Direction,
    /// Towards the superproxy.
    pub(crate) inbound: Direction,
    pub(crate) end: End,
}

/// The destinations replies are accepted from, oldest forgotten first.
struct Peers {
    set: HashSet<SocketAddr>,
    order: VecDeque<SocketAddr>,
}

impl Peers {
    fn new() -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    fn insert(&mut self, addr: SocketAddr) {
        if self.set.contains(&addr) {
            return;
        }
        if self.order.len() >= MAX_PEERS {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        self.set.insert(addr);
        self.order.push_back(addr);
    }

    fn contains(&self, addr: &SocketAddr) -> bool {
        self.set.contains(addr)
    }
}

/// An address as a peer: IP and port only. The flow label and scope id a
/// received IPv6 source may carry must not make a known peer unknown.
fn peer(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

struct CachedName {
    answer: Result<Vec<IpAddr>, DnsFailure>,
    expires: Instant,
}

/// Names resolved for this association, bounded in count and in age.
struct NameCache {
    entries: HashMap<String, CachedName>,
}

impl NameCache {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    /// The addresses of `name`, from the cache while fresh, else from
    /// `resolver`; `None` when it does not resolve.
    async fn lookup<R: Resolve>(&mut self, resolver: &R, name: &str) -> Option<&[IpAddr]> {
        let now = Instant::now();
        let fresh = self.entries.get(name).is_some_and(|e| e.expires > now);
        if !fresh {
            let answer = resolver.lookup(name).await;
            let ttl = if answer.is_ok() {
                NAME_TTL
            } else {
                FAILED_NAME_TTL
            };
            let now = Instant::now();
            if self.entries.len() >= MAX_NAMES && !self.entries.contains_key(name) {
                self.entries.retain(|_, e| e.expires > now);
                if self.entries.len() >= MAX_NAMES {
                    let soonest = self
                        .entries
                        .iter()
                        .min_by_key(|(_, e)| e.expires)
                        .map(|(name, _)| name.clone());
                    if let Some(soonest) = soonest {
                        self.entries.remove(&soonest);
                    }
                }
            }
            self.entries.insert(
                name.to_owned(),
                CachedName {
                    answer,
                    expires: now + ttl,
                },
            );
        }
        self.entries
            .get(name)
            .and_then(|e| e.answer.as_deref().ok())
    }
}

/// The first address of `candidates` the policy allows and a socket of its
/// family can send to, or why there is none.
fn pick(
    policy: &EgressPolicy,
    sockets: &Sockets,
    candidates: impl Iterator<Item = SocketAddr>,
) -> Result<SocketAddr, Fate> {
    let mut fate = Fate::Denied;
    for addr in candidates {
        // `::ffff:192.0.2.1` is an IPv4 destination: it leaves from the
        // IPv4 socket, and its reply comes from the IPv4 address.
        let addr = peer(addr);
        if policy.check(addr).is_err() {
            continue;
        }
        if sockets.for_family(addr).is_some() {
            return Ok(addr);
        }
        fate = Fate::NoFamily;
    }
    Err(fate)
}

/// Appends a capsule for a received datagram without first copying the
/// payload into a `Datagram` of its own.
fn put_capsule(out: &mut BytesMut, from: SocketAddr, payload: &[u8]) -> Result<(), DatagramError> {
    datagram::encode_capsule(&DatagramAddr::Ip(from), payload, out)
}

async fn readable(socket: Option<&UdpSocket>) -> io::Result<()> {
    match socket {
        Some(socket) => socket.readable().await,
        None => std::future::pending().await,
    }
}

/// One association's relay: everything it needs, so tests can run it over
/// any byte stream with loopback sockets.
pub(crate) struct Relay<'a, R> {
    policy: &'a LivePolicy,
    resolver: &'a R,
    sockets: Sockets,
    idle_timeout: Duration,
    names: NameCache,
    peers: Peers,
    out: Direction,
    inbound: Direction,
    last_activity: Instant,
}

impl<'a, R: Resolve> Relay<'a, R> {
    pub(crate) fn new(
        policy: &'a LivePolicy,
        resolver: &'a R,
        sockets: Sockets,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            policy,
            resolver,
            sockets,
            idle_timeout,
            names: NameCache::new(),
            peers: Peers::new(),
            out: Direction::new("out"),
            inbound: Direction::new("in"),
            last_activity: Instant::now(),
        }
    }

    /// Relays until the stream ends, the association idles out or `cut`.
    /// One task does everything: the stream is read and written in the same
    /// select, so neither direction can block the other (a superproxy
    /// writing to us while we wait for its credit would otherwise deadlock).
    pub(crate) async fn run<S>(mut self, stream: S, cut: CancellationToken) -> Summary
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let mut input = BytesMut::new();
        let mut output = BytesMut::new();
        let idle = tokio::time::sleep(self.idle_timeout);
        tokio::pin!(idle);
        let end = loop {
            if input.capacity() - input.len() < READ_CHUNK / 4 {
                input.reserve(READ_CHUNK);
            }
            if output.is_empty() && output.capacity() > KEEP_CAPACITY {
                output = BytesMut::new();
            }
            if input.is_empty() && input.capacity() > KEEP_CAPACITY {
                input = BytesMut::with_capacity(READ_CHUNK);
            }
            let room = output.len() < MAX_PENDING_OUT;
            let (has_v4, has_v6) = (self.sockets.v4.is_some(), self.sockets.v6.is_some());
            tokio::select! {
                () = cut.cancelled() => break End::Cut,
                // Unread input never exceeds one capsule (whole ones are taken
                // off at once), so this bound only guards against a bug.
                read = reader.read_buf(&mut input), if input.len() < MAX_CAPSULE => match read {
                    Ok(0) => break End::Closed,
                    Ok(_) => {
                        if let Err(e) = self.forward_all(&mut input).await {
                            break End::Malformed(e);
                        }
                    }
                    Err(_) => break End::Reset,
                },
                written = writer.write_buf(&mut output), if !output.is_empty() => match written {
                    Ok(0) | Err(_) => break End::Reset,
                    Ok(_) => {}
                },
                ready = readable(self.sockets.v4.as_ref()), if room && has_v4 => match ready {
                    Ok(()) => self.receive(false, &mut output),
                    Err(_) => break End::Socket,
                },
                ready = readable(self.sockets.v6.as_ref()), if room && has_v6 => match ready {
                    Ok(()) => self.receive(true, &mut output),
                    Err(_) => break End::Socket,
                },
                () = &mut idle => {
                    // Re-armed lazily: cheaper than resetting the timer on
                    // every datagram.
                    let deadline = self.last_activity + self.idle_timeout;
                    if Instant::now() >= deadline {
                        break End::Idle;
                    }
                    idle.as_mut().reset(deadline);
                }
            }
        };
        if matches!(end, End::Closed | End::Idle) {
            // A clean end is a FIN, so the superproxy can tell it from a fault.
            let mut stream = reader.unsplit(writer);
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
        }
        Summary {
            out: self.out,
            inbound: self.inbound,
            end,
        }
    }

    /// Sends every whole capsule in `input`; an error closes the association.
    async fn forward_all(&mut self, input: &mut BytesMut) -> Result<(), DatagramError> {
        while let Some(datagram) = Datagram::decode(input)? {
            let fate = self.forward(&datagram).await;
            if fate == Fate::Sent {
                self.out.bytes += datagram.payload.len() as u64;
                self.last_activity = Instant::now();
            }
            self.out.note(fate);
        }
        Ok(())
    }

    async fn forward(&mut self, datagram: &Datagram) -> Fate {
        // Fetched per datagram: it is an Arc clone, and the stack addresses
        // learned meanwhile apply at once.
        let policy = self.policy.current();
        let target = match &datagram.addr {
            DatagramAddr::Ip(addr) => pick(&policy, &self.sockets, std::iter::once(*addr)),
            DatagramAddr::Name(name, port) => match parse_ip_literal(name) {
                // SOCKS clients send IP literals as names too.
                Some(ip) => pick(
                    &policy,
                    &self.sockets,
                    std::iter::once(SocketAddr::new(ip, *port)),
                ),
                None => {
                    let Some(ips) = self.names.lookup(self.resolver, name).await else {
                        return Fate::Unresolved;
                    };
                    pick(
                        &policy,
                        &self.sockets,
                        ips.iter().map(|ip| SocketAddr::new(*ip, *port)),
                    )
                }
            },
        };
        let target = match target {
            Ok(target) => target,
            Err(fate) => return fate,
        };
        let Some(socket) = self.sockets.for_family(target) else {
            return Fate::NoFamily;
        };
        // Never wait for room in the socket buffer: UDP may drop, and a
        // wait would stall every other datagram of the association.
        match socket.try_send_to(&datagram.payload, target) {
            Ok(_) => {
                self.peers.insert(target);
                Fate::Sent
            }
            Err(_) => Fate::Dropped,
        }
    }

    /// Takes what one socket has received (a batch at most) into `output`
    /// as capsules, keeping only replies from known peers.
    fn receive(&mut self, v6: bool, output: &mut BytesMut) {
        let socket = if v6 {
            self.sockets.v6.as_ref()
        } else {
            self.sockets.v4.as_ref()
        };
        let Some(socket) = socket else {
            return;
        };
        for _ in 0..RECV_BATCH {
            if output.len() >= MAX_PENDING_OUT {
                return;
            }
            let received = RECV_BUF.with_borrow_mut(|buf| {
                let (n, from) = socket.try_recv_from(buf)?;
                let from = peer(from);
                let payload = buf.get(..n).unwrap_or_default();
                let fate = if !self.peers.contains(&from) {
                    Fate::UnknownPeer
                } else if payload.len() > datagram::MAX_PAYLOAD {
                    Fate::Dropped
                } else if put_capsule(output, from, payload).is_ok() {
                    Fate::Sent
                } else {
                    Fate::Dropped
                };
                Ok::<_, io::Error>((fate, n))
            });
            match received {
                Ok((fate, n)) => {
                    if fate == Fate::Sent {
                        self.inbound.bytes += n as u64;
                        self.last_activity = Instant::now();
                    }
                    self.inbound.note(fate);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // A one-off error (an ICMP report): the next datagram may be fine.
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proxynet_common::egress::{Cidr, EgressPolicyConfig};
    use proxynet_wire::link::StreamRequest;
    use proxynet_wire::mux::{self, MuxConfig, Role};
    use std::sync::atomic::AtomicUsize;
    use tokio::io::DuplexStream;

    const WAIT: Duration = Duration::from_secs(5);

    /// Resolves from a table, counting lookups.
    #[derive(Default)]
    struct Table {
        names: HashMap<String, Vec<IpAddr>>,
        lookups: AtomicUsize,
    }

    impl Resolve for Table {
        fn lookup(
            &self,
            host: &str,
        ) -> impl Future<Output = Result<Vec<IpAddr>, DnsFailure>> + Send {
            self.lookups.fetch_add(1, Ordering::Relaxed);
            let answer = self.names.get(host).cloned().ok_or(DnsFailure::NoAddress);
            async move { answer }
        }
    }

    fn table(entries: &[(&str, &str)]) -> Table {
        Table {
            names: entries
                .iter()
                .map(|(name, ip)| (name.to_string(), vec![ip.parse().unwrap()]))
                .collect(),
            lookups: AtomicUsize::new(0),
        }
    }

    fn loopback_allowed() -> LivePolicy {
        LivePolicy::new(EgressPolicyConfig {
            allow: vec!["127.0.0.0/8".parse::<Cidr>().unwrap()],
            ..EgressPolicyConfig::default()
        })
    }

    async fn loopback_v4() -> Sockets {
        Sockets {
            v4: Some(
                writable(UdpSocket::bind("127.0.0.1:0").await.unwrap())
                    .await
                    .unwrap(),
            ),
            v6: None,
        }
    }

    /// A loopback socket that sends back whatever it receives.
    async fn echo() -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let _ = socket.send_to(&buf[..n], from).await;
            }
        });
        addr
    }

    async fn send(stream: &mut DuplexStream, addr: DatagramAddr, payload: &'static [u8]) {
        let mut out = BytesMut::new();
        Datagram {
            addr,
            payload: bytes::Bytes::from_static(payload),
        }
        .encode(&mut out)
        .unwrap();
        stream.write_all(&out).await.unwrap();
    }

    async fn receive<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Datagram {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(datagram) = Datagram::decode(buf).unwrap() {
                    return datagram;
                }
                assert_ne!(stream.read_buf(buf).await.unwrap(), 0, "stream ended");
            }
        })
        .await
        .expect("no datagram came back")
    }

    /// Runs a relay over a duplex stream; returns our end and the relay's
    /// summary-to-be.
    fn start(
        policy: LivePolicy,
        resolver: Table,
        sockets: Sockets,
        idle: Duration,
        cut: CancellationToken,
    ) -> (DuplexStream, tokio::task::JoinHandle<Summary>) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let task = tokio::spawn(async move {
            Relay::new(&policy, &resolver, sockets, idle)
                .run(theirs, cut)
                .await
        });
        (ours, task)
    }

    async fn finish(stream: DuplexStream, task: tokio::task::JoinHandle<Summary>) -> Summary {
        drop(stream);
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn datagrams_reach_their_destination_and_replies_come_back() {
        let echo = echo().await;
        let resolver = table(&[("echo.test", "127.0.0.1")]);
        let (mut stream, task) = start(
            loopback_allowed(),
            resolver,
            loopback_v4().await,
            WAIT,
            CancellationToken::new(),
        );
        let mut buf = BytesMut::new();
        send(&mut stream, DatagramAddr::Ip(echo), b"ping").await;
        let reply = receive(&mut stream, &mut buf).await;
        assert_eq!(reply.addr, DatagramAddr::Ip(echo));
        assert_eq!(&reply.payload[..], b"ping");
        for _ in 0..5 {
            send(
                &mut stream,
                DatagramAddr::Name("echo.test".into(), echo.port()),
                b"by name",
            )
            .await;
            let reply = receive(&mut stream, &mut buf).await;
            assert_eq!(reply.addr, DatagramAddr::Ip(echo));
            assert_eq!(&reply.payload[..], b"by name");
        }
        // An IP literal sent as a name needs no lookup.
        send(
            &mut stream,
            DatagramAddr::Name("127.0.0.1".into(), echo.port()),
            b"literal",
        )
        .await;
        assert_eq!(
            &receive(&mut stream, &mut buf).await.payload[..],
            b"literal"
        );
        let summary = finish(stream, task).await;
        assert_eq!(summary.end, End::Closed);
        assert_eq!(summary.out.count(Fate::Sent), 7);
        assert_eq!(summary.inbound.count(Fate::Sent), 7);
        assert_eq!(summary.out.bytes, 4 + 5 * 7 + 7);
        assert_eq!(summary.out.dropped(), 0);
    }

    #[tokio::test]
    async fn a_name_is_looked_up_once_while_fresh() {
        let echo = echo().await;
        let resolver = Arc::new(table(&[("echo.test", "127.0.0.1")]));
        let policy = loopback_allowed();
        let (mut stream, theirs) = tokio::io::duplex(1 << 20);
        let sockets = loopback_v4().await;
        let relay = {
            let resolver = resolver.clone();
            tokio::spawn(async move {
                Relay::new(&policy, resolver.as_ref(), sockets, WAIT)
                    .run(theirs, CancellationToken::new())
                    .await
            })
        };
        let mut buf = BytesMut::new();
        for _ in 0..20 {
            send(
                &mut stream,
                DatagramAddr::Name("echo.test".into(), echo.port()),
                b"x",
            )
            .await;
            receive(&mut stream, &mut buf).await;
        }
        // A name that does not resolve is not looked up per datagram either.
        for _ in 0..3 {
            send(&mut stream, DatagramAddr::Name("nx.test".into(), 9), b"x").await;
        }
        let summary = finish(stream, relay).await;
        assert_eq!(summary.out.count(Fate::Unresolved), 3);
        assert_eq!(resolver.lookups.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn replies_only_come_from_peers_the_association_sent_to() {
        let echo = echo().await;
        let sockets = loopback_v4().await;
        let egress = sockets.v4.as_ref().unwrap().local_addr().unwrap();
        let (mut stream, task) = start(
            loopback_allowed(),
            Table::default(),
            sockets,
            WAIT,
            CancellationToken::new(),
        );
        // A stranger knocks first: it must not get through.
        let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        stranger.send_to(b"let me in", egress).await.unwrap();
        send(&mut stream, DatagramAddr::Ip(echo), b"ping").await;
        let mut buf = BytesMut::new();
        let reply = receive(&mut stream, &mut buf).await;
        assert_eq!(&reply.payload[..], b"ping");
        // Another port of a peer's IP is a stranger too (same 127.0.0.1).
        stranger.send_to(b"still no", egress).await.unwrap();
        send(&mut stream, DatagramAddr::Ip(echo), b"pong").await;
        assert_eq!(&receive(&mut stream, &mut buf).await.payload[..], b"pong");
        let summary = finish(stream, task).await;
        assert_eq!(summary.inbound.count(Fate::UnknownPeer), 2);
        assert_eq!(summary.inbound.count(Fate::Sent), 2);
    }

    #[tokio::test]
    async fn denied_and_unroutable_destinations_are_dropped_and_counted() {
        let echo = echo().await;
        let resolver = table(&[
            ("v6only.test", "2606:4700:4700::1001"),
            ("lo.test", "127.0.0.1"),
        ]);
        // The default policy: loopback is denied.
        let (mut stream, task) = start(
            LivePolicy::new(EgressPolicyConfig::default()),
            resolver,
            loopback_v4().await,
            WAIT,
            CancellationToken::new(),
        );
        send(&mut stream, DatagramAddr::Ip(echo), b"x").await;
        send(&mut stream, DatagramAddr::Name("lo.test".into(), 53), b"x").await;
        // `::ffff:127.0.0.1` is loopback too.
        send(
            &mut stream,
            DatagramAddr::Ip(SocketAddr::new("::ffff:127.0.0.1".parse().unwrap(), 53)),
            b"x",
        )
        .await;
        // A denied port.
        send(
            &mut stream,
            DatagramAddr::Ip("93.184.215.14:25".parse().unwrap()),
            b"x",
        )
        .await;
        send(
            &mut stream,
            DatagramAddr::Name("v6only.test".into(), 53),
            b"x",
        )
        .await;
        send(
            &mut stream,
            DatagramAddr::Ip("[2606:4700::1111]:53".parse().unwrap()),
            b"x",
        )
        .await;
        let summary = finish(stream, task).await;
        assert_eq!(summary.out.count(Fate::Denied), 4);
        assert_eq!(summary.out.count(Fate::NoFamily), 2);
        assert_eq!(summary.out.count(Fate::Sent), 0);
        assert_eq!(summary.inbound.count(Fate::Sent), 0);
    }

    #[tokio::test]
    async fn a_malformed_capsule_closes_the_association() {
        let (mut stream, task) = start(
            loopback_allowed(),
            Table::default(),
            loopback_v4().await,
            WAIT,
            CancellationToken::new(),
        );
        stream
            .write_all(&[0, 0, 0, 7, 9, 1, 2, 3, 4, 0, 53])
            .await
            .unwrap();
        let summary = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        assert_eq!(
            summary.end,
            End::Malformed(DatagramError::UnknownAddressType(9))
        );
        let (mut stream, task) = start(
            loopback_allowed(),
            Table::default(),
            loopback_v4().await,
            WAIT,
            CancellationToken::new(),
        );
        stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let summary = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        assert!(matches!(
            summary.end,
            End::Malformed(DatagramError::TooLarge(_))
        ));
    }

    #[tokio::test]
    async fn an_idle_association_ends_with_a_fin_and_activity_keeps_it_open() {
        let echo = echo().await;
        let idle = Duration::from_millis(300);
        let (mut stream, task) = start(
            loopback_allowed(),
            Table::default(),
            loopback_v4().await,
            idle,
            CancellationToken::new(),
        );
        let started = Instant::now();
        let mut buf = BytesMut::new();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            send(&mut stream, DatagramAddr::Ip(echo), b"alive").await;
            receive(&mut stream, &mut buf).await;
        }
        // Still open after longer than one idle timeout, then idles out.
        assert!(started.elapsed() > idle);
        let mut rest = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        let summary = task.await.unwrap();
        assert_eq!(summary.end, End::Idle);
        assert_eq!(summary.out.count(Fate::Sent), 4);
    }

    #[tokio::test]
    async fn a_withdrawal_cuts_the_association() {
        let cut = CancellationToken::new();
        let (_stream, task) = start(
            loopback_allowed(),
            Table::default(),
            loopback_v4().await,
            WAIT,
            cut.clone(),
        );
        cut.cancel();
        let summary = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        assert_eq!(summary.end, End::Cut);
    }

    #[test]
    fn peers_are_bounded_and_the_oldest_goes_first() {
        let mut peers = Peers::new();
        let addr = |i: usize| SocketAddr::new("192.0.2.1".parse().unwrap(), i as u16 + 1);
        for i in 0..MAX_PEERS {
            peers.insert(addr(i));
            peers.insert(addr(i));
        }
        assert_eq!(peers.order.len(), MAX_PEERS);
        peers.insert(addr(MAX_PEERS));
        assert!(!peers.contains(&addr(0)));
        assert!(peers.contains(&addr(1)));
        assert!(peers.contains(&addr(MAX_PEERS)));
        assert_eq!(peers.set.len(), MAX_PEERS);
    }

    #[tokio::test]
    async fn the_name_cache_is_bounded() {
        let mut names = NameCache::new();
        let resolver = Table::default();
        for i in 0..MAX_NAMES + 10 {
            assert!(names
                .lookup(&resolver, &format!("n{i}.test"))
                .await
                .is_none());
        }
        assert_eq!(names.entries.len(), MAX_NAMES);
    }

    /// An agent serving from 127.0.0.1 with loopback targets allowed.
    fn loopback_agent(dir: &std::path::Path, extra: &[&str]) -> Arc<TunnelContext> {
        let mut ctx = crate::tunnel::tests::context(dir);
        let state_file = dir.join("exit-agent.json");
        let args = [
            "exit-agent",
            "--control-api",
            "https://control.example",
            "--egress-ip",
            "127.0.0.1",
            "--egress-allow",
            "127.0.0.0/8",
            "--state-file",
            state_file.to_str().unwrap(),
        ];
        let config = crate::Config::try_parse_from(args.iter().chain(extra)).unwrap();
        let inner = Arc::get_mut(&mut ctx).unwrap();
        inner.policy = LivePolicy::new(config.egress.policy(&[]));
        inner.config = config;
        ctx
    }

    fn request(egress_ips: &[&str]) -> bytes::Bytes {
        let request = StreamRequest::Udp {
            egress_ips: egress_ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            budget_ms: 1_000,
            window: Some(64 * 1024),
        };
        serde_json::to_vec(&request).unwrap().into()
    }

    /// A mux link whose acceptor serves every stream as a UDP association.
    fn link(ctx: Arc<TunnelContext>) -> mux::MuxHandle {
        let (a, b) = tokio::io::duplex(1 << 20);
        let (client, client_conn) = mux::start(a, Role::Client, MuxConfig::default());
        let (server, server_conn) = mux::start(b, Role::Server, MuxConfig::default());
        tokio::spawn(client_conn);
        tokio::spawn(server_conn);
        tokio::spawn(async move {
            while let Some(incoming) = server.accept().await {
                let Ok(StreamRequest::Udp {
                    egress_ips, window, ..
                }) = serde_json::from_slice(&incoming.request)
                else {
                    panic!("not a udp request");
                };
                tokio::spawn(serve(ctx.clone(), incoming, egress_ips, window));
            }
        });
        client
    }

    #[tokio::test]
    async fn an_association_over_the_mux_relays_and_frees_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = loopback_agent(dir.path(), &[]);
        let client = link(ctx.clone());
        let echo = echo().await;
        let (reply, mut stream) = client.open(request(&["127.0.0.1"])).await.unwrap();
        assert_eq!(&reply[..], b"connected");
        assert_eq!(ctx.active.load(Ordering::Relaxed), 1);
        let mut out = BytesMut::new();
        Datagram {
            addr: DatagramAddr::Ip(echo),
            payload: bytes::Bytes::from_static(b"over the mux"),
        }
        .encode(&mut out)
        .unwrap();
        stream.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        let reply = receive(&mut stream, &mut buf).await;
        assert_eq!(reply.addr, DatagramAddr::Ip(echo));
        assert_eq!(&reply.payload[..], b"over the mux");
        // Our FIN ends it cleanly: a FIN back, and the slot is free.
        stream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(WAIT, async {
            while ctx.active.load(Ordering::Relaxed) != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn an_address_of_an_egress_prefix_serves_associations() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = loopback_agent(dir.path(), &["--egress-prefix", "127.0.9.0/24"]);
        let client = link(ctx);
        // The target sees the prefix address as the source.
        let target = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (reply, mut stream) = client.open(request(&["127.0.9.7"])).await.unwrap();
        assert_eq!(&reply[..], b"connected");
        let mut out = BytesMut::new();
        Datagram {
            addr: DatagramAddr::Ip(target.local_addr().unwrap()),
            payload: bytes::Bytes::from_static(b"from the prefix"),
        }
        .encode(&mut out)
        .unwrap();
        stream.write_all(&out).await.unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = tokio::time::timeout(WAIT, target.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"from the prefix");
        assert_eq!(from.ip().to_string(), "127.0.9.7");
    }

    #[tokio::test]
    async fn associations_are_refused_like_tunnels() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = loopback_agent(dir.path(), &["--max-tunnels", "1"]);
        let client = link(ctx.clone());
        let outcome = |ips: &'static [&'static str]| {
            let client = client.clone();
            async move { client.open(request(ips)).await.unwrap().0 }
        };
        assert_eq!(
            &outcome(&["127.0.0.1", "127.0.0.2"]).await[..],
            b"bad_request"
        );
        assert_eq!(&outcome(&[]).await[..], b"bad_request");
        assert_eq!(&outcome(&["192.0.2.9"]).await[..], b"egress_unavailable");
        let (held_reply, held) = client.open(request(&["127.0.0.1"])).await.unwrap();
        assert_eq!(&held_reply[..], b"connected");
        assert_eq!(&outcome(&["127.0.0.1"]).await[..], b"capacity");
        ctx.withdrawn.store(true, Ordering::Relaxed);
        // Dropping our end resets the stream, which ends the association.
        drop(held);
        tokio::time::timeout(WAIT, async {
            while ctx.active.load(Ordering::Relaxed) != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(&outcome(&["127.0.0.1"]).await[..], b"draining");
    }

    #[tokio::test]
    async fn an_egress_ip_that_cannot_be_bound_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        // The test agent serves from 192.0.2.1, which no test host has.
        let ctx = crate::tunnel::tests::context(dir.path());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            prepare(&ctx, &[ip]).await.err(),
            Some(Outcome::EgressUnavailable)
        );
        assert_eq!(ctx.active.load(Ordering::Relaxed), 0);
    }
}
