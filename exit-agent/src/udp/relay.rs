//! The relay loop of one association: capsules from the stream sent to
//! their destinations (policy-checked on every datagram), replies from known
//! peers written back as capsules, one task doing both, and what became of
//! every datagram counted.

use bytes::BytesMut;
use metrics::Counter;
use proxynet_common::egress::{parse_ip_literal, EgressPolicy};
use proxynet_wire::datagram::{self, Datagram, DatagramAddr, DatagramError, MAX_CAPSULE};
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::resolve::{NameCache, Resolve};
use super::sockets::{peer, Peers, Sockets};
use crate::policy::LivePolicy;

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
