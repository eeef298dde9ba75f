//! The superproxy's side of the agent link.
//!
//! Agents dial in ([`listener`]), prove who they are with their enrolled
//! credential, and hand us an HTTP/2 connection on which we are the client.
//! [`registry`] keeps one live link per exit; [`dial`] opens a tunnel stream on it.

pub mod dial;
pub mod listener;
pub mod registry;
pub mod tls;

/// ALPN protocol id of the link; bumped with [`proxynet_protocol::link::LINK_VERSION`].
pub const LINK_ALPN: &[u8] = b"proxynet-link/1";
