//! SOCKS5 UDP ASSOCIATE (RFC 1928 §7): the relay between the client's UDP
//! socket and its association's stream through an exit.
//!
//! The association was authenticated and admitted like a tunnel (it holds
//! one concurrent-tunnel lease, a meter, a revocation registration and an
//! access-log line) before the client learnt the relay's port. Each
//! datagram the client sends carries the SOCKS UDP header (RSV, FRAG, the
//! destination); the relay checks it and forwards it to the exit as one
//! capsule ([`proxynet_wire::datagram`]) on the association's stream; the
//! exit sends it from its egress address and returns replies the same way.
//!
//! What keeps the relay from being turned on third parties:
//! - datagrams are accepted only from the control connection's source
//!   address (and the port the client declared, when it declared one), and
//!   the first such datagram that passes every check fixes the client's
//!   UDP address: replies go only there, never to an address a datagram
//!   names;
//! - fragments (FRAG ≠ 0) are dropped, as the RFC allows;
//! - per association: a datagram-rate bound, a bounded queue towards the
//!   exit (full: dropped — UDP may drop, the relay must not buffer without
//!   end), literal destinations the egress policy denies never leave;
//! - payload bytes are charged to the meter per datagram, once queued
//!   towards the exit (a dropped datagram is not billed), so quotas bind as
//!   on TCP; a datagram to a destination the exit then denies is billed
//!   (the exit counts it, the superproxy cannot know).
//!
//! Per destination ([`flows`]): each new flow (destination and port) is
//! held to the per-domain limits a tunnel to it would be, and each
//! destination is written to the abuse desk's target log, normalised, at
//! its first sight in a minute, bounded by a rate rather than a count.
//!
//! The association ends when its TCP control connection closes (RFC 1928),
//! when nothing crosses it for the tunnel idle timeout, at the tunnel
//! lifetime, when it is cut (revocation, drain), or when a quota is spent.

use bytes::{Bytes, BytesMut};
use governor::{DefaultDirectRateLimiter, Quota};
use proxynet_common::splice::{End, TunnelLimits};
use proxynet_wire::datagram::{self, Datagram, DatagramAddr};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::pipeline::{Pipeline, Tunnel};

mod flows;

use flows::{Destinations, Flows, FLOW_SWEEP};

/// Datagrams per second one association may send (and its burst).
const DATAGRAMS_PER_SECOND: u32 = 2000;
const DATAGRAM_BURST: u32 = 500;
/// Capsules waiting for the exit stream; beyond, datagrams are dropped.
const QUEUE_CAPSULES: usize = 256;
/// Room for the SOCKS header in front of the largest payload.
const RECV_BUFFER: usize = datagram::MAX_PAYLOAD + 3 + 1 + 1 + 255 + 2 + 1;

/// Where the client's datagrams may come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SourceFilter {
    /// The control connection's source address.
    pub ip: IpAddr,
    /// The port the client declared in its request, if it declared one.
    pub port: Option<u16>,
}

impl SourceFilter {
    fn admits(&self, from: SocketAddr) -> bool {
        from.ip().to_canonical() == self.ip.to_canonical()
            && self.port.is_none_or(|p| p == from.port())
    }
}

/// Runs the association until it ends; the tunnel's holds (lease, meter,
/// registration, access-log line) are released when this returns.
pub(crate) async fn relay(
    pipeline: Arc<Pipeline>,
    mut control: TcpStream,
    udp: UdpSocket,
    source: SourceFilter,
    (tunnel, other_family): (Tunnel, Option<IpAddr>),
    limits: TunnelLimits,
) -> End {
    let Tunnel { io, mut holds, .. } = tunnel;
    let (io, meter_handle) = io.into_parts();
    let meter = meter_handle.0.clone();
    let (mut exit_read, mut exit_write) = tokio::io::split(io);
    let (queue, mut queued) = mpsc::channel::<Bytes>(QUEUE_CAPSULES);
    let rate = DefaultDirectRateLimiter::direct(
        Quota::per_second(NonZeroU32::new(DATAGRAMS_PER_SECOND).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(DATAGRAM_BURST).unwrap_or(NonZeroU32::MIN)),
    );
    let lifetime_ends = Instant::now() + limits.max_lifetime;

    let writer = async {
        while let Some(capsule) = queued.recv().await {
            if let Err(e) = exit_write.write_all(&capsule).await {
                return End::Error(e.kind());
            }
        }
        let _ = exit_write.shutdown().await;
        End::Closed
    };
    let mut destinations = Destinations::new();
    let relay = async {
        let mut client_addr: Option<SocketAddr> = None;
        let mut flows = Flows::new(pipeline.flows_limited(&holds));
        let mut sweep = tokio::time::interval(FLOW_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut from_client = vec![0u8; RECV_BUFFER];
        let mut from_exit = BytesMut::with_capacity(64 * 1024);
        let mut control_byte = [0u8; 64];
        let mut last_activity = Instant::now();
        let cut = holds.cut();
        tokio::pin!(cut);
        loop {
            let idle_ends = last_activity + limits.idle_timeout;
            tokio::select! {
                read = control.read(&mut control_byte) => match read {
                    // Nothing is expected on the control connection; it
                    // closing ends the association.
                    Ok(0) | Err(_) => return End::Closed,
                    Ok(_) => {}
                },
                received = udp.recv_from(&mut from_client) => {
                    let Ok((n, from)) = received else { continue };
                    match client_datagram(&pipeline, &holds, &from_client[..n], from, source, &mut client_addr, &rate) {
                        // Only the client's own datagrams keep it alive: a
                        // stranger spraying the port does not.
                        Err(drop_reason) => crate::metrics::udp_datagram("up", drop_reason),
                        Ok((addr, payload)) => {
                            let now = Instant::now();
                            // The per-domain limits, per flow: a refused
                            // flow's datagram neither leaves nor keeps the
                            // association alive.
                            if let Err(drop_reason) = flows.admit(&pipeline, &holds, &addr, now).await {
                                crate::metrics::udp_datagram("up", drop_reason);
                                continue;
                            }
                            last_activity = now;
                            destinations.see(&pipeline, &holds, other_family, &addr);
                            if meter.is_cut() {
                                return End::Error(std::io::ErrorKind::ConnectionAborted);
                            }
                            // Straight from the receive buffer into the capsule: one copy.
                            let mut capsule = BytesMut::with_capacity(payload.len() + 16);
                            if datagram::encode_capsule(&addr, payload, &mut capsule).is_err() {
                                crate::metrics::udp_datagram("up", "bad_request");
                                continue;
                            }
                            // Charged once queued: a datagram dropped here
                            // is not billed (at most this one datagram can
                            // pass the quota's edge).
                            match queue.try_send(capsule.freeze()) {
                                Ok(()) => crate::metrics::udp_datagram("up", "relayed"),
                                Err(_) => {
                                    crate::metrics::udp_datagram("up", "queue_full");
                                    continue;
                                }
                            }
                            if !meter.charge_datagram(true, payload.len()) {
                                return End::Error(std::io::ErrorKind::ConnectionAborted);
                            }
                        }
                    }
                },
                read = exit_read.read_buf(&mut from_exit) => {
                    match read {
                        Ok(0) => return End::Closed,
                        Err(e) => return End::Error(e.kind()),
                        Ok(_) => {}
                    }
                    // Replies keep it alive (the exit accepts them only
                    // from peers the client sent to).
                    last_activity = Instant::now();
                    loop {
                        match Datagram::decode(&mut from_exit) {
                            Ok(Some(reply)) => {
                                if !meter.charge_datagram(false, reply.payload.len()) {
                                    return End::Error(std::io::ErrorKind::ConnectionAborted);
                                }
                                crate::metrics::udp_datagram("down", send_to_client(&udp, client_addr, &reply));
                            }
                            Ok(None) => break,
                            // The exit broke the framing: nothing after it can be trusted.
                            Err(_) => return End::Error(std::io::ErrorKind::InvalidData),
                        }
                    }
                },
                _ = sweep.tick() => flows.refresh(pipeline.flows_limited(&holds), Instant::now()),
                () = tokio::time::sleep_until(idle_ends) => return End::Idle,
                () = tokio::time::sleep_until(lifetime_ends) => return End::Lifetime,
                () = &mut cut => return End::Cut,
            }
        }
    };
    let end = tokio::select! {
        end = writer => end,
        end = relay => end,
    };
    holds.ended(end);
    tracing::debug!(
        up = meter.up(),
        down = meter.down(),
        ?end,
        "UDP association closed"
    );
    let unrecorded = destinations.unrecorded();
    if unrecorded > 0 {
        // The abuse desk's record of this association is incomplete: say so
        // where an operator answering a complaint can find it.
        tracing::warn!(
            account = %holds.account_id(),
            user_id = %holds.user_id(),
            unrecorded,
            "UDP association sent to more new destinations than the target log's rate records; datagrams to unrecorded ones counted"
        );
    }
    drop(meter_handle);
    end
}

/// Checks one datagram from the client's side; why it is dropped otherwise.
fn client_datagram<'b>(
    pipeline: &Pipeline,
    holds: &crate::pipeline::Holds,
    bytes: &'b [u8],
    from: SocketAddr,
    source: SourceFilter,
    client_addr: &mut Option<SocketAddr>,
    rate: &DefaultDirectRateLimiter,
) -> Result<(DatagramAddr, &'b [u8]), &'static str> {
    admit_client_datagram(bytes, from, source, client_addr, rate, |addr| {
        pipeline.datagram_allowed(holds, addr)
    })
}

/// Every check of a client datagram, in order: who sent it, the SOCKS
/// header, the size, the rate, then `allowed` (the traffic and egress
/// policies). Only a datagram that passes them all fixes the client's
/// address: garbage or a denied destination from another port of the
/// client's host (a neighbour behind the same NAT) takes nothing over, and
/// spends none of the association's rate. (A neighbour sending a valid,
/// allowed datagram first still can when the client declared no port: the
/// RFC's binding is the declared one.)
fn admit_client_datagram<'b>(
    bytes: &'b [u8],
    from: SocketAddr,
    source: SourceFilter,
    client_addr: &mut Option<SocketAddr>,
    rate: &DefaultDirectRateLimiter,
    allowed: impl FnOnce(&DatagramAddr) -> bool,
) -> Result<(DatagramAddr, &'b [u8]), &'static str> {
    if !source.admits(from) {
        return Err("foreign_source");
    }
    // One client address per association: replies go there only.
    if client_addr.is_some_and(|known| known != from) {
        return Err("foreign_source");
    }
    // RSV (2 bytes), FRAG, then the destination.
    let [_, _, frag, rest @ ..] = bytes else {
        return Err("bad_request");
    };
    if *frag != 0 {
        return Err("fragment");
    }
    let (addr, used) = datagram::decode_addr(rest).map_err(|_| "bad_request")?;
    let payload = &rest[used..];
    if payload.len() > datagram::MAX_PAYLOAD {
        return Err("too_large");
    }
    if rate.check().is_err() {
        return Err("rate_limited");
    }
    if !allowed(&addr) {
        return Err("denied");
    }
    client_addr.get_or_insert(from);
    Ok((addr, payload))
}

/// Sends a reply to the client's UDP address with its SOCKS header; the
/// outcome for the metric.
fn send_to_client(udp: &UdpSocket, client: Option<SocketAddr>, reply: &Datagram) -> &'static str {
    let Some(client) = client else {
        return "no_client";
    };
    let mut packet = BytesMut::with_capacity(reply.payload.len() + 24);
    packet.extend_from_slice(&[0, 0, 0]);
    if datagram::encode_addr(&reply.addr, &mut packet).is_err() {
        return "bad_request";
    }
    packet.extend_from_slice(&reply.payload);
    match udp.try_send_to(&packet, client) {
        Ok(_) => "relayed",
        // The client's socket is full: UDP drops, the relay does not queue.
        Err(_) => "dropped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_control_connections_address_is_admitted() {
        let any_port = SourceFilter {
            ip: "127.0.0.1".parse().unwrap(),
            port: None,
        };
        assert!(any_port.admits("127.0.0.1:4000".parse().unwrap()));
        assert!(any_port.admits("[::ffff:127.0.0.1]:4000".parse().unwrap()));
        assert!(!any_port.admits("127.0.0.2:4000".parse().unwrap()));
        let declared = SourceFilter {
            port: Some(5000),
            ..any_port
        };
        assert!(declared.admits("127.0.0.1:5000".parse().unwrap()));
        assert!(!declared.admits("127.0.0.1:5001".parse().unwrap()));
    }

    /// Every check, with a policy that allows every destination.
    fn admit<'b>(
        bytes: &'b [u8],
        from: SocketAddr,
        source: SourceFilter,
        client_addr: &mut Option<SocketAddr>,
        rate: &DefaultDirectRateLimiter,
    ) -> Result<(DatagramAddr, &'b [u8]), &'static str> {
        admit_client_datagram(bytes, from, source, client_addr, rate, |_| true)
    }

    /// Datagrams from 127.0.0.1, any port (the client declared none).
    fn from_loopback() -> SourceFilter {
        SourceFilter {
            ip: "127.0.0.1".parse().unwrap(),
            port: None,
        }
    }

    fn rate() -> DefaultDirectRateLimiter {
        DefaultDirectRateLimiter::direct(
            Quota::per_second(NonZeroU32::new(DATAGRAMS_PER_SECOND).unwrap())
                .allow_burst(NonZeroU32::new(DATAGRAM_BURST).unwrap()),
        )
    }

    /// RSV, FRAG 0, ATYP 1 127.0.0.1:53, then `payload`.
    fn packet(payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0, 0, 0, 1, 127, 0, 0, 1, 0, 53];
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn the_first_admitted_datagram_fixes_the_client_address() {
        let source = from_loopback();
        let (rate, mut client) = (rate(), None);
        let me: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let p = packet(b"hi");
        let (addr, payload) = admit(&p, me, source, &mut client, &rate).unwrap();
        assert_eq!(payload, b"hi");
        assert!(matches!(addr, DatagramAddr::Ip(a) if a.port() == 53));
        assert_eq!(client, Some(me));
        // Another port of the same host is a stranger from now on, and a
        // stranger's datagram does not take the slot of the client's own.
        let other: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        assert_eq!(
            admit(&p, other, source, &mut client, &rate).err(),
            Some("foreign_source")
        );
        let elsewhere: SocketAddr = "127.0.0.9:4000".parse().unwrap();
        assert_eq!(
            admit(&p, elsewhere, source, &mut None, &rate).err(),
            Some("foreign_source")
        );
        assert_eq!(client, Some(me));
    }

    #[test]
    fn a_malformed_or_denied_datagram_does_not_fix_the_client_address() {
        let source = from_loopback();
        let (rate, mut client) = (rate(), None);
        let neighbour: SocketAddr = "127.0.0.1:4999".parse().unwrap();
        for garbage in [&[0u8, 0][..], &[0, 0, 1, 1, 127, 0, 0, 1, 0, 53]] {
            assert!(admit(garbage, neighbour, source, &mut client, &rate).is_err());
        }
        // Nor does a datagram to a destination the policy denies.
        let to_anywhere = packet(b"x");
        let denied =
            admit_client_datagram(&to_anywhere, neighbour, source, &mut client, &rate, |_| {
                false
            });
        assert_eq!(denied.err(), Some("denied"));
        assert_eq!(client, None);
        let me: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert!(admit(&packet(b"x"), me, source, &mut client, &rate).is_ok());
        assert_eq!(client, Some(me));
    }

    #[test]
    fn fragments_short_headers_and_oversized_payloads_are_dropped() {
        let source = from_loopback();
        let me: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let rate = rate();
        let mut fragment = packet(b"x");
        fragment[2] = 1;
        let oversized = packet(&vec![0u8; datagram::MAX_PAYLOAD + 1]);
        let largest = packet(&vec![0u8; datagram::MAX_PAYLOAD]);
        let cases: [(&[u8], Result<(), &str>); 5] = [
            (&fragment, Err("fragment")),
            (&[0, 0], Err("bad_request")),
            (&[0, 0, 0, 9, 1, 2], Err("bad_request")),
            (&oversized, Err("too_large")),
            (&largest, Ok(())),
        ];
        for (bytes, want) in cases {
            let got = admit(bytes, me, source, &mut Some(me), &rate).map(|_| ());
            assert_eq!(got, want, "{:?}", &bytes[..bytes.len().min(6)]);
        }
    }

    #[test]
    fn a_burst_past_the_rate_is_dropped() {
        let source = from_loopback();
        let me: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let (rate, mut client) = (rate(), Some(me));
        let p = packet(b"x");
        let passed = (0..DATAGRAM_BURST * 2)
            .filter(|_| admit(&p, me, source, &mut client, &rate).is_ok())
            .count();
        // The burst, and what the rate refills while the loop runs.
        assert!(
            passed >= DATAGRAM_BURST as usize && passed < (DATAGRAM_BURST * 2) as usize,
            "{passed}"
        );
    }
}
