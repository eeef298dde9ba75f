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
pub async fn open_tunnel(
    link: &Link,
    target: &Target,
    egress_ip: IpAddr,
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    match &link.sender {
        LinkSender::Http2(sender) => {
            v1_http2::open(sender.clone(), target, egress_ip, budget).await
        }
        LinkSender::Mux(link) => v2_mux::open(link, target, egress_ip, budget).await,
    }
}

/// Sends one health probe on `link`; its round trip if the agent answered
/// it healthy in time.
pub async fn probe(link: &Link, timeout: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    probe_ok(link, timeout).await.then(|| started.elapsed())
}

async fn probe_ok(link: &Link, timeout: Duration) -> bool {
    match &link.sender {
        LinkSender::Http2(sender) => v1_http2::probe(sender.clone(), timeout).await,
        LinkSender::Mux(link) => v2_mux::probe(&link.handle, timeout).await,
    }
}
