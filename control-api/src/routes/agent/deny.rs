//! What an exit is told to deny: which of its reported admin addresses the
//! fleet protects (only those the control plane verified it holds), and the
//! heartbeat reply's deny list and superproxy records.

use proxynet_store::{ExitRecord, SuperproxyRecord};
use proxynet_wire::heartbeat::MAX_ADMIN_ADDRS;
use std::net::SocketAddr;

/// Most admin addresses of one exit that enter the fleet's protected set
/// (an agent listens on one port, on a few addresses at most).
pub(crate) const MAX_PROTECTED_ADMIN_ADDRS: usize = 8;

/// An exit's reported admin addresses, sorted by what the fleet does with
/// them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AdminClaims {
    /// Every exit is told to deny these.
    pub(crate) protected: Vec<SocketAddr>,
    /// Claimed on an address the control plane has not verified the exit
    /// holds: ignored (logged, and shown on `GET /v1/exits/{id}`).
    pub(crate) unverified: Vec<SocketAddr>,
}

/// Sorts `reported` (an agent's admin addresses) against `record`. An
/// address is protected fleet-wide only when the exit holds it as far as
/// the control plane knows: it is one the reflector verified
/// ([`ExitRecord::verified_egress`]: seen as the exit's own, not merely
/// declared), or a loopback address of an exit the reflector saw on
/// loopback (it shares the reflector's host, a demo or test stack, where
/// its neighbours' tunnels could reach its loopback listener; anywhere
/// else another host's loopback is no concern of the fleet's). Anything
/// else would let an exit put any address on every exit's deny list and
/// refuse it to every customer. At most [`MAX_PROTECTED_ADMIN_ADDRS`].
pub(crate) fn sort_admin_claims(record: &ExitRecord, reported: &[SocketAddr]) -> AdminClaims {
    let verified = &record.verified_egress;
    let seen_on_loopback = verified.iter().any(|ip| ip.is_loopback());
    let mut claims = AdminClaims::default();
    for addr in reported.iter().take(MAX_ADMIN_ADDRS) {
        let ip = addr.ip().to_canonical();
        let held = verified.contains(&ip)
            || (ip.is_loopback() && seen_on_loopback)
            || is_private_network(ip);
        let list = if held {
            &mut claims.protected
        } else {
            &mut claims.unverified
        };
        if !list.contains(addr) {
            list.push(*addr);
        }
    }
    claims.protected.truncate(MAX_PROTECTED_ADMIN_ADDRS);
    claims
}

/// A private network's address (RFC 1918, IPv6 unique-local): the egress
/// policy refuses these to every customer unless the operator made an exit
/// `internal`, so protecting one takes nothing from anybody, and it keeps a
/// NAT'd exit's admin listener from its LAN neighbours' tunnels (such an
/// address can never be verified by the reflector).
fn is_private_network(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_private(),
        std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xfe00) == 0xfc00,
    }
}

/// The reply's deny list and superproxy records from what the projector read.
pub(super) fn deny_list(
    own: &[std::net::SocketAddr],
    inputs: crate::projector::DenyInputs,
    internal: bool,
) -> (Vec<SuperproxyRecord>, Vec<std::net::SocketAddr>) {
    let mut deny: Vec<std::net::SocketAddr> = own.to_vec();
    let mut superproxies = inputs.superproxies;
    for s in &mut superproxies {
        deny.extend(std::mem::take(&mut s.service_addrs));
        deny.push(s.link_addr);
        // The reflector the agent is told to ask: no exit may reach it
        // through another exit's tunnel (it would sign that exit's address).
        deny.extend(s.reflector);
    }
    deny.extend(inputs.agent_admin);
    if !internal {
        deny.retain(|a| !proxynet_common::egress::in_special_range(a.ip()));
    }
    deny.sort_unstable();
    deny.dedup();
    (superproxies, deny)
}
