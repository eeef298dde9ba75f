//! Response bodies and headers shared by the HTTP ingress's handlers.

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::{BodyExt, Full};

use crate::error::ProxyError;
use crate::pipeline::Tunnel;

/// Response header naming the exit that served the request or tunnel.
pub(crate) const EXIT_HEADER: &str = "proxynet-exit";
/// Response header with a sticky session's pin expiry (Unix seconds).
pub(crate) const SESSION_EXPIRES_HEADER: &str = "proxynet-session-expires";
/// Response header with how many exits a forwarded request went through,
/// when a retry rule sent it through more than one (a site banned the
/// first): docs/health.md, "Retry on ban".
pub(crate) const ATTEMPTS_HEADER: &str = "proxynet-attempts";

/// Response bodies: our own short texts or a streamed upstream body.
pub(crate) type ProxyBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub(crate) fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(crate) fn empty_body() -> ProxyBody {
    full_body(Bytes::new())
}

/// The one rendering of an error (see [`ProxyError::to_response`]).
pub(crate) fn error_response(error: &ProxyError) -> Response<ProxyBody> {
    error
        .to_response()
        .map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

/// The answer to a `CONNECT` whose tunnel is open — `200` with
/// [`tunnel_headers`] and no body — whichever path serves it (hyper's, or
/// the first-CONNECT path that writes it itself).
pub(crate) fn connect_established(tunnel: &Tunnel) -> Response<()> {
    let mut response = Response::new(());
    tunnel_headers(response.headers_mut(), tunnel);
    response
}

/// `Proxynet-Exit` and, for sessions, `Proxynet-Session-Expires` (Unix seconds).
pub(crate) fn tunnel_headers(headers: &mut http::HeaderMap, tunnel: &Tunnel) {
    if let Ok(v) = HeaderValue::from_str(&tunnel.exit_id.to_string()) {
        headers.insert(EXIT_HEADER, v);
    }
    if let Some(pin) = tunnel.pin {
        headers.insert(
            SESSION_EXPIRES_HEADER,
            HeaderValue::from(pin.expires_unix()),
        );
    }
}
