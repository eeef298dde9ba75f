//! The superproxy's side of the agent link.
//!
//! Agents dial in ([`listener`]), prove who they are with their enrolled
//! credential, agree on a link version and hand us a connection on which we
//! open streams (HTTP/2 for v1, the mux for v2). [`registry`] keeps one live
//! link per exit; [`dial`] opens a tunnel stream on it, [`stream`] is that
//! stream whichever version carries it. Each link version is one file:
//! [`v1_http2`] and [`v2_mux`] (starting the link, opening and probing
//! streams); the rest is shared.

pub(crate) mod dial;
pub(crate) mod listener;
pub(crate) mod registry;
mod sender;
pub(crate) mod stream;
pub(crate) mod tls;
pub(crate) mod v1_http2;
pub(crate) mod v2_mux;
mod version;

/// ALPN protocol id of the link. It names the hello exchange, which every
/// link version shares; the link version itself is agreed in the hello.
pub(crate) const LINK_ALPN: &[u8] = b"proxynet-link/1";
