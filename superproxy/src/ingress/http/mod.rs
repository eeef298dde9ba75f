//! HTTP/1.1 proxy ingress: `CONNECT` tunnels ([`connect`]) and absolute-form
//! requests ([`forward`]).
//!
//! Every request head first passes the strict [`head_guard`]. A connection's
//! first request, when it is a plain `CONNECT`, is then served by
//! [`first_connect`] without hyper; everything else is parsed by hyper
//! (bounded size, header-read timeout against slowloris). Both kinds of
//! request run the one tunnel [`crate::pipeline`]; origin-form requests get
//! 400 (this is a forward proxy, not a web server). `Proxy-Authorization`
//! ends here.

pub(crate) mod connect;
pub(crate) mod expect;
pub(crate) mod first_connect;
pub(crate) mod forward;
pub(crate) mod h2;
pub(crate) mod head_guard;
pub(crate) mod hygiene;
pub(crate) mod response;

use http::{header, Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use proxynet_common::secret::Secret;
use std::convert::Infallible;
use std::sync::Arc;

use crate::accept::ConnectionTicket;
use crate::credentials::parse_basic;
use crate::error::{ErrorKind, ProxyError};
use crate::ingress::IngressLimits;
use crate::pipeline::Pipeline;
use crate::request::Credentials;
use head_guard::{HeadGuard, HeadLimits, TunnelSwitch};
use proxynet_common::splice::TunnelLimits;
use response::{error_response, ProxyBody};

/// Largest request head accepted (431 beyond), and largest response head
/// relayed from an origin on absolute-form (502 beyond).
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in one request head (431 beyond), and in one
/// origin response (502 beyond): enough for a response with 200 cookies.
pub const MAX_HEADERS: usize = 256;

/// Serves one client connection (plain TCP, or TLS on the HTTPS listener).
pub(crate) async fn serve_connection<IO>(
    pipeline: Arc<Pipeline>,
    limits: IngressLimits,
    stream: IO,
    ticket: ConnectionTicket,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let switch = TunnelSwitch::default();
    let guarded = HeadGuard::new(
        stream,
        HeadLimits {
            max_head_bytes: MAX_HEAD_BYTES,
            max_fields: MAX_HEADERS,
        },
        switch.clone(),
    );
    let guarded = match first_connect::serve(&pipeline, limits, guarded, &switch, &ticket).await {
        first_connect::Remaining::Done => return,
        first_connect::Remaining::Hyper(guarded) => guarded,
    };
    let identity = forward::ConnectionIdentity::default();
    let service = {
        let (pipeline, ticket) = (pipeline.clone(), ticket.clone());
        service_fn(move |req| {
            handle(
                pipeline.clone(),
                limits.tunnel,
                Some(switch.clone()),
                ticket.clone(),
                identity.clone(),
                req,
            )
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .preserve_header_case(true)
        .max_headers(MAX_HEADERS)
        // The guard enforces the real limit with a proper 431; hyper's buffer
        // only needs room for a head the guard already accepted.
        .max_buf_size(MAX_HEAD_BYTES + 16 * 1024);
    builder.auto_date_header(false);
    let connection = builder
        .serve_connection(TokioIo::new(guarded), service)
        .with_upgrades();
    tokio::select! {
        result = connection => {
            if let Err(e) = result {
                tracing::debug!(peer = %ticket.peer(), error = %e, "client connection ended with an error");
            }
        }
        () = ticket.cut().cancelled() => {
            tracing::debug!(peer = %ticket.peer(), "client connection cut");
        }
    }
}

/// Answers one request; `switch` is the HTTP/1.1 connection's head guard
/// (`None` on HTTP/2, where a request is one stream).
pub(super) async fn handle(
    pipeline: Arc<Pipeline>,
    limits: TunnelLimits,
    switch: Option<TunnelSwitch>,
    ticket: ConnectionTicket,
    identity: forward::ConnectionIdentity,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let is_connect = req.method() == Method::CONNECT;
    // Exactly the heads the guard holds the following bytes for.
    let may_switch = is_connect || may_upgrade(&req);
    let response = match route(pipeline, limits, switch.clone(), ticket, identity, req).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(error = %e, "request refused");
            error_response(&e)
        }
    };
    if let Some(switch) = switch.filter(|_| may_switch) {
        // The answer decides what the guard does with the bytes behind the
        // head: a CONNECT's 2xx or an upgrade's 101 turns them into the
        // tunnel's; anything else means they are the next request.
        let status = response.status();
        if (is_connect && status.is_success()) || status == http::StatusCode::SWITCHING_PROTOCOLS {
            switch.engage();
        } else {
            switch.refuse();
        }
    }
    Ok(response)
}

async fn route(
    pipeline: Arc<Pipeline>,
    limits: TunnelLimits,
    switch: Option<TunnelSwitch>,
    ticket: ConnectionTicket,
    identity: forward::ConnectionIdentity,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let h2 = switch.is_none();
    if req.method() == Method::CONNECT {
        return connect::connect(pipeline, limits, switch, ticket, req).await;
    }
    if req.uri().scheme().is_none() {
        return Err(ProxyError::new(
            ErrorKind::BadRequest,
            "this is a forward proxy: send CONNECT or an absolute-form request",
        ));
    }
    forward::forward(pipeline, limits, h2, ticket, identity, req).await
}

/// A bodiless HTTP/1.1 request with an `Upgrade` field: the one test for
/// both the head guard's wait (`Framing::Upgrade`) and the answer that ends
/// it, so no decision is ever left over for a later head.
pub(super) fn may_upgrade<B>(req: &Request<B>) -> bool {
    let headers = req.headers();
    req.version() == http::Version::HTTP_11
        && headers.contains_key(header::UPGRADE)
        && !headers.contains_key(header::TRANSFER_ENCODING)
        && headers.get_all(header::CONTENT_LENGTH).iter().all(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').all(|n| n.trim() == "0"))
        })
}

/// The `Proxynet-Options` header's value (the first, as `HeaderMap::get`
/// reads `Proxy-Authorization`), if the client sent one: username-grammar
/// options for the login ([`crate::request::OPTIONS_HEADER`]). Bytes that
/// are not UTF-8 are kept as replacement characters, which the grammar's
/// ASCII alphabet then refuses with the header named.
fn header_options<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(crate::request::OPTIONS_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// The `Proxynet-Report` header, if the client sent one (the first, as
/// [`header_options`] reads its header): what the client says the site it
/// asks for did to its session's exit ([`crate::request::REPORT_HEADER`]).
/// Read before the hop-by-hop fields are stripped (it is one of them); an
/// absolute-form request reads it with
/// `TargetSpec::UrlAuthority(..).reported(header_report(headers))`.
pub(super) fn header_report(headers: &http::HeaderMap) -> Option<crate::request::SiteReport> {
    headers
        .get(crate::request::REPORT_HEADER)
        .map(|v| crate::request::SiteReport::from_value(v.as_bytes()))
}

/// The `Proxy-Authorization: Basic` credentials, if the client sent any. A
/// header that does not decode still counts as presented (and fails).
fn credentials<B>(req: &Request<B>) -> Option<Credentials> {
    let header = req.headers().get(header::PROXY_AUTHORIZATION)?;
    let (username, password) = header
        .to_str()
        .ok()
        .and_then(parse_basic)
        .unwrap_or_default();
    Some(Credentials {
        username,
        password: Secret::new(password),
    })
}
