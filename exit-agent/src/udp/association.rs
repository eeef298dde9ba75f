//! One UDP association's life: admitted like a tunnel (capacity, the
//! request, draining, egress ownership), its egress sockets bound, then
//! relayed until it ends, and counted.

use proxynet_wire::link::Outcome;
use proxynet_wire::mux::Incoming;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;

use super::relay::{Fate, Relay};
use super::sockets::Sockets;
use crate::tunnel::{admit, ActiveGuard, TunnelContext};

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
pub(super) async fn prepare(
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
pub(super) async fn writable(socket: UdpSocket) -> io::Result<UdpSocket> {
    tokio::time::timeout(Duration::from_secs(1), socket.writable())
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    Ok(socket)
}
