//! SOCKS5 ingress (RFC 1928 with RFC 1929 username/password).
//!
//! The protocol bytes are handled by fast-socks5 behind this module's
//! boundary: nothing outside it sees a fast-socks5 type, so the crate can be
//! replaced without touching the data path. Names are never resolved here
//! (socks5h semantics): a domain target goes to the exit unresolved. The whole
//! handshake runs under the header-read timeout, which fast-socks5 lacks.
//! CONNECT and UDP ASSOCIATE ([`super::socks5_udp`]) are served; BIND gets
//! reply 7.

use fast_socks5::server::{PasswordAuthentication, Socks5ServerProtocol};
use fast_socks5::util::target_addr::TargetAddr;
use fast_socks5::{ReplyError, Socks5Command};
use proxynet_common::secret::Secret;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpStream;

use super::IngressLimits;
use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::pipeline::Pipeline;
use crate::request::{Client, Credentials, Ingress, TargetSpec};
use crate::target::Target;

type CommandRead = Socks5ServerProtocol<TcpStream, fast_socks5::server::states::CommandRead>;

/// What the client asked for after logging in.
enum Request {
    Connect(Target),
    /// UDP ASSOCIATE, with the port the client says it will send from
    /// (`None`: it did not say).
    Associate {
        port: Option<u16>,
    },
}

pub(crate) async fn serve_connection(
    pipeline: Arc<Pipeline>,
    limits: IngressLimits,
    stream: TcpStream,
    ticket: ConnectionTicket,
) {
    let started = Instant::now();
    let peer = ticket.peer();
    // The UDP relay listens where the client reached us.
    let local = stream.local_addr();
    let handshake = tokio::select! {
        done = tokio::time::timeout(
            limits.header_read_timeout,
            handshake(&pipeline, stream, &ticket, started),
        ) => done,
        // The pre-auth deadline (or a drain) ends a handshake too.
        () = ticket.cut().cancelled() => {
            tracing::debug!(%peer, "SOCKS handshake cut");
            return;
        }
    };
    let (proto, request, client) = match handshake {
        Err(_) => {
            tracing::debug!(%peer, "SOCKS handshake timed out");
            return;
        }
        Ok(Err(reason)) => {
            tracing::debug!(%peer, %reason, "SOCKS handshake failed");
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Ok(Some(request))) => request,
    };
    let target = match request {
        Request::Connect(target) => target,
        Request::Associate { port } => {
            associate(
                pipeline, limits, proto, port, local, client, ticket, started,
            )
            .await;
            return;
        }
    };
    let mut tunnel = match pipeline
        .open_as(
            client,
            Ingress::Socks5,
            TargetSpec::Parsed(target),
            &ticket,
            started,
        )
        .await
    {
        Ok(tunnel) => tunnel,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "SOCKS tunnel refused");
            let _ = proto.reply_error(&reply_for(e.kind)).await;
            return;
        }
    };
    // The bound address is the exit's, which the client has no use for and
    // we do not disclose; RFC 1928 allows zeros.
    let mut client = match proto
        .reply_success(SocketAddr::from(([0, 0, 0, 0], 0)))
        .await
    {
        Ok(stream) => stream,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "client went away before the tunnel started");
            return;
        }
    };
    // A tunnel to an address whose domain rules wait for the server name in
    // its first bytes is judged by them now (refused: closed; at once for
    // every other tunnel).
    if !pipeline.judge_first_bytes(&mut tunnel, &mut client).await {
        return;
    }
    let outcome = tunnel.splice(client, limits.tunnel).await;
    tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "SOCKS tunnel closed");
}

/// Serves a UDP ASSOCIATE: binds the relay beside the control connection,
/// opens the association through the pipeline, tells the client the relay's
/// address and relays until the association ends.
#[allow(clippy::too_many_arguments)]
async fn associate(
    pipeline: Arc<Pipeline>,
    limits: IngressLimits,
    proto: CommandRead,
    port: Option<u16>,
    local: std::io::Result<SocketAddr>,
    client: Client,
    ticket: ConnectionTicket,
    started: Instant,
) {
    let peer = ticket.peer();
    let udp = match local {
        Ok(local) => tokio::net::UdpSocket::bind(SocketAddr::new(local.ip(), 0)).await,
        Err(e) => Err(e),
    };
    let (udp, relay_addr) = match udp.and_then(|u| u.local_addr().map(|a| (u, a))) {
        Ok(bound) => bound,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot bind a UDP relay socket");
            let _ = proto.reply_error(&ReplyError::GeneralFailure).await;
            return;
        }
    };
    let (tunnel, other_family) = match pipeline.open_association(client, &ticket, started).await {
        Ok(opened) => opened,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "SOCKS UDP association refused");
            let _ = proto.reply_error(&reply_for(e.kind)).await;
            return;
        }
    };
    // An IPv4 client on a dual-stack listener is told a plain IPv4 address;
    // behind a balancer, the address configured for it (the balancer
    // relays TCP only, so datagrams come to this host directly).
    let relay_ip = limits
        .udp_advertise
        .unwrap_or_else(|| relay_addr.ip().to_canonical());
    let relay_addr = SocketAddr::new(relay_ip, relay_addr.port());
    let control = match proto.reply_success(relay_addr).await {
        Ok(control) => control,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "client went away before the association started");
            return;
        }
    };
    let source = super::socks5_udp::SourceFilter {
        ip: peer.ip(),
        port,
    };
    super::socks5_udp::relay(
        pipeline,
        control,
        udp,
        source,
        (tunnel, other_family),
        limits.tunnel,
    )
    .await;
}

/// Authenticates (answering the RFC 1929 sub-negotiation) and reads the
/// command. `Ok(None)`: the client was answered (auth failure, unsupported
/// command or address) and the connection is done.
async fn handshake(
    pipeline: &Pipeline,
    stream: TcpStream,
    ticket: &ConnectionTicket,
    started: Instant,
) -> Result<Option<(CommandRead, Request, Client)>, String> {
    let peer = ticket.peer();
    let auth = Socks5ServerProtocol::start(stream)
        .negotiate_auth(&[PasswordAuthentication])
        .await
        .map_err(|e| e.to_string())?;
    let (username, password, pending) = auth
        .read_username_password()
        .await
        .map_err(|e| e.to_string())?;
    let credentials = Credentials {
        username,
        password: Secret::new(password),
    };
    // The command comes after the login: a refused login is logged as a
    // SOCKS5 tunnel, whatever it would have asked for.
    let (accepted, client) = match pipeline
        .authenticate(Some(credentials), None, ticket, Ingress::Socks5, started)
        .await
    {
        Ok(client) => (pending.accept().await.map_err(|e| e.to_string())?, client),
        Err(e) => {
            tracing::debug!(%peer, error = %e, "SOCKS login refused");
            let _ = pending.reject().await;
            return Ok(None);
        }
    };
    let proto = Socks5ServerProtocol::finish_auth(accepted);
    let (proto, command, target) = proto.read_command().await.map_err(|e| e.to_string())?;
    match command {
        Socks5Command::TCPConnect => {}
        Socks5Command::UDPAssociate => {
            // The address the client will send from; we accept datagrams
            // from its control connection's address only, on the port it
            // names (if it names one).
            let port = match target {
                TargetAddr::Ip(addr) => Some(addr.port()),
                TargetAddr::Domain(_, port) => Some(port),
            }
            .filter(|p| *p != 0);
            return Ok(Some((proto, Request::Associate { port }, client)));
        }
        _ => {
            let _ = proto.reply_error(&ReplyError::CommandNotSupported).await;
            return Ok(None);
        }
    }
    let parsed = match target {
        TargetAddr::Ip(addr) => Target::new(&addr.ip().to_string(), addr.port()),
        TargetAddr::Domain(name, port) => Target::new(&name, port),
    };
    match parsed {
        Ok(target) => Ok(Some((proto, Request::Connect(target), client))),
        Err(e) => {
            let error = ProxyError::new(ErrorKind::BadRequest, format!("bad target: {e}"));
            let _ = proto.reply_error(&reply_for(error.kind)).await;
            Ok(None)
        }
    }
}

/// The RFC 1928 reply for a failure, from the one error type.
fn reply_for(kind: ErrorKind) -> ReplyError {
    match kind.socks_reply() {
        0x02 => ReplyError::ConnectionNotAllowed,
        0x03 => ReplyError::NetworkUnreachable,
        0x04 => ReplyError::HostUnreachable,
        0x05 => ReplyError::ConnectionRefused,
        0x06 => ReplyError::TtlExpired,
        0x07 => ReplyError::CommandNotSupported,
        0x08 => ReplyError::AddressTypeNotSupported,
        _ => ReplyError::GeneralFailure,
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::{AsyncWriteExt, DuplexStream};

    /// Runs the server side of the handshake over arbitrary client bytes,
    /// accepting any credentials, as far as the bytes allow.
    async fn parse(bytes: Vec<u8>) {
        let (mut client, server): (DuplexStream, DuplexStream) = tokio::io::duplex(1 << 16);
        client.write_all(&bytes).await.unwrap();
        client.shutdown().await.unwrap();
        let run = async {
            let auth = Socks5ServerProtocol::start(server)
                .negotiate_auth(&[PasswordAuthentication])
                .await
                .ok()?;
            let (_user, _pass, pending) = auth.read_username_password().await.ok()?;
            let accepted = pending.accept().await.ok()?;
            let (_proto, _cmd, target) = Socks5ServerProtocol::finish_auth(accepted)
                .read_command()
                .await
                .ok()?;
            let _ = match target {
                TargetAddr::Ip(addr) => Target::new(&addr.ip().to_string(), addr.port()),
                TargetAddr::Domain(name, port) => Target::new(&name, port),
            };
            Some(())
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), run).await;
    }

    fn socks_ish() -> impl Strategy<Value = Vec<u8>> {
        let greeting = prop::collection::vec(any::<u8>(), 0..4).prop_map(|m| {
            let mut v = vec![5, m.len() as u8];
            v.extend(m);
            v.push(2);
            v
        });
        let auth = (
            prop::collection::vec(any::<u8>(), 0..8),
            prop::collection::vec(any::<u8>(), 0..8),
        )
            .prop_map(|(u, p)| {
                let mut v = vec![1, u.len() as u8];
                v.extend(u);
                v.push(p.len() as u8);
                v.extend(p);
                v
            });
        let request = (0u8..5, 0u8..6, prop::collection::vec(any::<u8>(), 0..40)).prop_map(
            |(cmd, atyp, rest)| {
                let mut v = vec![5, cmd, 0, atyp];
                v.extend(rest);
                v
            },
        );
        (greeting, auth, request).prop_map(|(g, a, r)| [g, a, r].concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn socks_handshake_never_panics_on_noise(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(parse(bytes));
        }

        #[test]
        fn socks_handshake_never_panics_on_near_valid_input(bytes in socks_ish()) {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(parse(bytes));
        }
    }
}
