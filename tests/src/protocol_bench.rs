//! The protocol phases of `bench protocols` (scripts/bench): tunnel setup as
//! an HTTP/2 `CONNECT` stream on one connection to the HTTPS proxy beside
//! HTTP/1.1 `CONNECT` over a fresh TLS connection per tunnel, and UDP echo
//! round trips through a SOCKS5 UDP association beside direct ones.
//!
//! Each sample is one whole exchange (setup plus a 1-byte echo for tunnels,
//! one datagram out and back for UDP). Every loop is bounded by its count
//! and a time limit.

use base64::Engine;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// What the protocol phases measure against.
#[derive(Debug, Clone)]
pub struct ProtocolTargets {
    /// The superproxy's HTTPS proxy listener and the CA its certificate chains to.
    pub tls_proxy: SocketAddr,
    pub ca: PathBuf,
    pub socks: SocketAddr,
    pub user: String,
    pub password: String,
    /// A TCP echo and a UDP echo target.
    pub echo: SocketAddr,
    pub udp_echo: SocketAddr,
    /// Samples per phase.
    pub count: usize,
}

#[derive(Debug, Serialize)]
pub struct ProtocolReport {
    pub h1_tls_connect_p50_ms: f64,
    pub h1_tls_connect_p99_ms: f64,
    pub h2_connect_p50_ms: f64,
    pub h2_connect_p99_ms: f64,
    pub udp_proxy_rtt_p50_ms: f64,
    pub udp_proxy_rtt_p99_ms: f64,
    pub udp_direct_rtt_p50_ms: f64,
    pub udp_direct_rtt_p99_ms: f64,
    pub errors: u64,
    /// The errors by exchange: `h1`, `h2`, `udp_proxy`, `udp_direct`.
    pub errors_by_exchange: [u64; 4],
}

/// Longest any one phase may run.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

pub async fn measure(t: &ProtocolTargets) -> ProtocolReport {
    let h1_only = tls_connector(&t.ca, &[b"http/1.1"]);
    let h2_first = tls_connector(&t.ca, &[b"h2", b"http/1.1"]);
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", t.user, t.password))
    );

    let mut by_exchange = [0u64; 4];
    let h1 = samples(t.count, &mut by_exchange[0], || {
        h1_tls_tunnel(&h1_only, t, &auth)
    })
    .await;

    let h2_sender = h2_connection(&h2_first, t.tls_proxy).await;
    let h2 = samples(t.count, &mut by_exchange[1], || {
        // A handle on the one connection (SendRequest clones share it).
        h2_tunnel(h2_sender.clone(), t.echo, &auth)
    })
    .await;

    let relay = udp_association(t).await;
    let udp_proxy = match &relay {
        Some((_control, socket, relay)) => {
            samples(t.count, &mut by_exchange[2], || {
                udp_round_trip(socket, *relay, Some(t.udp_echo))
            })
            .await
        }
        None => {
            by_exchange[2] += 1;
            Vec::new()
        }
    };
    let direct = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let udp_direct = samples(t.count, &mut by_exchange[3], || {
        udp_round_trip(&direct, t.udp_echo, None)
    })
    .await;

    ProtocolReport {
        h1_tls_connect_p50_ms: percentile(&h1, 0.50),
        h1_tls_connect_p99_ms: percentile(&h1, 0.99),
        h2_connect_p50_ms: percentile(&h2, 0.50),
        h2_connect_p99_ms: percentile(&h2, 0.99),
        udp_proxy_rtt_p50_ms: percentile(&udp_proxy, 0.50),
        udp_proxy_rtt_p99_ms: percentile(&udp_proxy, 0.99),
        udp_direct_rtt_p50_ms: percentile(&udp_direct, 0.50),
        udp_direct_rtt_p99_ms: percentile(&udp_direct, 0.99),
        errors: by_exchange.iter().sum(),
        errors_by_exchange: by_exchange,
    }
}

/// Runs `one` up to `count` times within [`PHASE_LIMIT`]; sorted durations.
async fn samples<F, Fut>(count: usize, errors: &mut u64, mut one: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<()>>,
{
    let deadline = Instant::now() + PHASE_LIMIT;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        match tokio::time::timeout(Duration::from_secs(5), one()).await {
            Ok(Ok(())) => out.push(started.elapsed()),
            _ => *errors += 1,
        }
        if Instant::now() > deadline {
            break;
        }
    }
    out.sort();
    out
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// A TLS client trusting only `ca`, offering `alpn`.
fn tls_connector(ca: &std::path::Path, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_to(
    tls: &tokio_rustls::TlsConnector,
    proxy: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(proxy).await?;
    tcp.set_nodelay(true)?;
    tls.connect("localhost".try_into().map_err(std::io::Error::other)?, tcp)
        .await
}

/// A fresh TLS connection, `CONNECT` over HTTP/1.1, one echoed byte.
async fn h1_tls_tunnel(
    tls: &tokio_rustls::TlsConnector,
    t: &ProtocolTargets,
    auth: &str,
) -> std::io::Result<()> {
    let mut s = tls_to(tls, t.tls_proxy).await?;
    let target = t.echo;
    s.write_all(
        format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    read_connect_answer(&mut s).await?;
    s.write_all(b"x").await?;
    let mut byte = [0u8; 1];
    s.read_exact(&mut byte).await?;
    Ok(())
}

/// Reads a CONNECT answer's head byte by byte (nothing after it is
/// consumed); an error unless it is a 200.
pub async fn read_connect_answer<S>(s: &mut S) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || s.read(&mut byte).await? == 0 {
            return Err(std::io::Error::other("proxy closed during CONNECT"));
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&head)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned(),
        ));
    }
    Ok(())
}

type H2Sender = hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>;

async fn h2_connection(tls: &tokio_rustls::TlsConnector, proxy: SocketAddr) -> H2Sender {
    let stream = tls_to(tls, proxy).await.unwrap();
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the HTTPS proxy offers h2"
    );
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// One `CONNECT` stream on the shared HTTP/2 connection, one echoed byte.
async fn h2_tunnel(mut sender: H2Sender, target: SocketAddr, auth: &str) -> std::io::Result<()> {
    sender.ready().await.map_err(std::io::Error::other)?;
    let request = hyper::Request::builder()
        .method(hyper::Method::CONNECT)
        .uri(target.to_string())
        .header("proxy-authorization", auth)
        .body(Empty::new())
        .map_err(std::io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(std::io::Error::other)?;
    if response.status() != hyper::StatusCode::OK {
        return Err(std::io::Error::other(format!("{}", response.status())));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(std::io::Error::other)?;
    let mut io = TokioIo::new(upgraded);
    io.write_all(b"x").await?;
    let mut byte = [0u8; 1];
    io.read_exact(&mut byte).await?;
    Ok(())
}

/// Logs in on the SOCKS port and asks for a UDP association: the control
/// connection (kept open), the client socket and the relay's address.
async fn udp_association(t: &ProtocolTargets) -> Option<(TcpStream, UdpSocket, SocketAddr)> {
    let mut s = TcpStream::connect(t.socks).await.ok()?;
    s.write_all(&[5, 1, 2]).await.ok()?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.ok()?;
    let mut login = vec![1, t.user.len() as u8];
    login.extend_from_slice(t.user.as_bytes());
    login.push(t.password.len() as u8);
    login.extend_from_slice(t.password.as_bytes());
    s.write_all(&login).await.ok()?;
    let mut status = [0u8; 2];
    s.read_exact(&mut status).await.ok()?;
    if status[1] != 0 {
        return None;
    }
    s.write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0]).await.ok()?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.ok()?;
    if reply[1] != 0 || reply[3] != 1 {
        return None;
    }
    let relay = SocketAddr::from((
        [reply[4], reply[5], reply[6], reply[7]],
        u16::from_be_bytes([reply[8], reply[9]]),
    ));
    let socket = UdpSocket::bind("127.0.0.1:0").await.ok()?;
    Some((s, socket, relay))
}

/// One datagram to `to` and its echo back; through the relay when
/// `through` names the echo target (with the SOCKS UDP header).
async fn udp_round_trip(
    socket: &UdpSocket,
    to: SocketAddr,
    through: Option<SocketAddr>,
) -> std::io::Result<()> {
    let payload = b"proxynet-udp-rtt";
    let mut packet = Vec::with_capacity(32);
    if let Some(SocketAddr::V4(target)) = through {
        packet.extend_from_slice(&[0, 0, 0, 1]);
        packet.extend_from_slice(&target.ip().octets());
        packet.extend_from_slice(&target.port().to_be_bytes());
    }
    packet.extend_from_slice(payload);
    socket.send_to(&packet, to).await?;
    let mut buf = [0u8; 128];
    let (n, _) = socket.recv_from(&mut buf).await?;
    if !buf[..n].ends_with(payload) {
        return Err(std::io::Error::other("a different datagram came back"));
    }
    Ok(())
}
