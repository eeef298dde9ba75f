//! Opens one tunnel stream through an exit's link.
//!
//! One stream per tunnel, no extra round trip: the request (an HTTP/2
//! `CONNECT` on a v1 link, a mux OPEN on a v2 link) carries the target, the
//! egress IP and what is left of the connect budget; the answer is a typed
//! outcome. The version-specific halves are [`super::v1_http2`] and
//! [`super::v2_mux`]. Failures are classified so the caller knows whether the
//! target may have been reached (never retried) or certainly was not (retried
//! on another exit).

use std::net::IpAddr;
use std::time::Duration;

use super::registry::{Link, LinkSender};
use super::stream::ExitStream;
use super::{v1_http2, v2_mux};
use crate::error::ProxyError;
use crate::target::Target;

/// Asks `link`'s agent to connect to `target` from `egress_ip` within `budget`.
/// `upstream`: for an upstream exit, what its partner's username is built
/// from (only link v2 carries it; an upstream exit's agent speaks v2).
pub(crate) async fn open_tunnel(
    link: &Link,
    target: &Target,
    egress_ip: IpAddr,
    budget: Duration,
    upstream: Option<proxynet_wire::link::UpstreamAsk>,
) -> Result<ExitStream, ProxyError> {
    match &link.sender {
        LinkSender::Http2(sender) => {
            v1_http2::open(sender.clone(), target, egress_ip, budget).await
        }
        LinkSender::Mux(link) => v2_mux::open(link, target, egress_ip, budget, upstream).await,
    }
}

/// Asks `link`'s agent for a UDP association from `egress_ips` (at most one
/// per family). v1 links and agents that did not offer UDP refuse before
/// anything is sent (retry-safe).
pub(crate) async fn open_association(
    link: &Link,
    egress_ips: &[IpAddr],
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    match &link.sender {
        LinkSender::Http2(_) => Err(ProxyError::new(
            crate::error::ErrorKind::ExitUnavailable,
            "the exit's link version does not carry UDP",
        )),
        LinkSender::Mux(link) => v2_mux::open_association(link, egress_ips, budget).await,
    }
}

/// Whether `link` can carry a UDP association.
pub(crate) fn carries_udp(link: &Link) -> bool {
    matches!(&link.sender, LinkSender::Mux(mux) if mux.udp)
}

/// Sends one health probe on `link`; its round trip if the agent answered
/// it healthy in time.
pub(crate) async fn probe(link: &Link, timeout: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    probe_ok(link, timeout).await.then(|| started.elapsed())
}

async fn probe_ok(link: &Link, timeout: Duration) -> bool {
    match &link.sender {
        LinkSender::Http2(sender) => v1_http2::probe(sender.clone(), timeout).await,
        LinkSender::Mux(link) => v2_mux::probe(&link.handle, timeout).await,
    }
}
