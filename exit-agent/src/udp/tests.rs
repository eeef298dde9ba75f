//! Tests of UDP associations: the relay over a duplex stream, its peer and
//! name bounds, and whole associations over a mux link.

use super::association::{prepare, serve, writable};
use super::relay::{End, Fate, Relay, Summary};
use super::resolve::{NameCache, Resolve, MAX_NAMES};
use super::sockets::{Peers, Sockets, MAX_PEERS};
use crate::dns::DnsFailure;
use crate::policy::LivePolicy;
use crate::tunnel::TunnelContext;
use bytes::BytesMut;
use clap::Parser;
use proxynet_common::egress::{Cidr, EgressPolicyConfig};
use proxynet_wire::datagram::{Datagram, DatagramAddr, DatagramError};
use proxynet_wire::link::{Outcome, StreamRequest};
use proxynet_wire::mux::{self, MuxConfig, Role};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(5);

/// Resolves from a table, counting lookups.
#[derive(Default)]
struct Table {
    names: HashMap<String, Vec<IpAddr>>,
    lookups: AtomicUsize,
}

impl Resolve for Table {
    fn lookup(&self, host: &str) -> impl Future<Output = Result<Vec<IpAddr>, DnsFailure>> + Send {
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
