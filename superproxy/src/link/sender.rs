//! How streams are opened on a link, by link version: the handle each
//! version's dialler uses and the registry keeps per exit. Its own file so
//! the registry and the versions both depend on it, not on each other.

use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::http2::SendRequest;
use proxynet_wire::mux::MuxHandle;

/// A v1 link's stream opener: one HTTP/2 request per stream.
pub(crate) type Http2Sender = SendRequest<Empty<Bytes>>;

/// A v2 link: the mux and what its agent agreed to.
#[derive(Clone)]
pub struct MuxLink {
    pub handle: MuxHandle,
    /// The agent starts tunnel streams with the window their OPEN names, so
    /// this superproxy can grant less under memory pressure.
    pub open_window: bool,
    /// The agent serves UDP associations (it said so in its hello).
    pub udp: bool,
}

/// How streams are opened on a link, by link version.
#[derive(Clone)]
pub enum LinkSender {
    /// v1: one HTTP/2 request per stream.
    Http2(Http2Sender),
    /// v2: one mux stream per stream.
    Mux(MuxLink),
}

impl LinkSender {
    pub fn version(&self) -> u16 {
        match self {
            LinkSender::Http2(_) => proxynet_wire::link::LINK_V1_HTTP2,
            LinkSender::Mux(_) => proxynet_wire::link::LINK_V2_MUX,
        }
    }
}
