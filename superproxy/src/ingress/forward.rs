//! Absolute-form HTTP/1.1 (`GET http://host/path`): forward one request
//! through an exit.
//!
//! Each request gets its own tunnel, so rotating users leave from a new exit per
//! request while the client keeps its connection alive. Bodies stream both ways
//! (hyper re-frames them: `Content-Length` when known, chunked otherwise);
//! nothing is buffered whole. The request goes out in origin-form with `Host`
//! taken from the request target (RFC 9112 §3.2.2) and hop-by-hop fields removed.

use http::{header, HeaderValue, Method, Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::sync::Arc;

use super::http::ProxyBody;
use crate::error::{ErrorKind, ProxyError};
use crate::hygiene::end_to_end;
use crate::target::Target;
use crate::tunnel::Client;
use crate::usage::Metered;
use crate::Gateway;
use hyper_util::rt::TokioIo;

/// Methods this proxy answers itself when `Max-Forwards` reaches zero.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, CONNECT";

pub async fn forward(
    gateway: Arc<Gateway>,
    req: Request<Incoming>,
    client: Client,
    lease: Option<crate::admission::Lease>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if req.method() == Method::TRACE {
        // TRACE would echo our customers' credentials and cookies back through a cache.
        return Err(ProxyError::new(
            ErrorKind::MethodNotAllowed,
            "TRACE is not allowed",
        ));
    }
    let uri = req.uri().clone();
    if uri.scheme_str() != Some("http") {
        return Err(ProxyError::new(
            ErrorKind::BadRequest,
            "only http:// URLs can be forwarded; use CONNECT for https",
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "request target has no host"))?;
    if authority.as_str().contains('@') {
        return Err(ProxyError::new(
            ErrorKind::BadRequest,
            "request target must not carry userinfo",
        ));
    }
    let target = Target::new(authority.host(), authority.port_u16().unwrap_or(80))
        .map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("bad request target: {e}")))?;

    let mut headers = end_to_end(req.headers());
    if req.method() == Method::OPTIONS {
        if let Some(max) = max_forwards(&headers)? {
            if max == 0 {
                let mut response = Response::new(super::http::empty_body());
                response
                    .headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
                return Ok(response);
            }
            headers.insert(
                header::HeaderName::from_static("max-forwards"),
                HeaderValue::from(max - 1),
            );
        }
    }
    let host = HeaderValue::from_str(authority.as_str()).map_err(|_| {
        ProxyError::new(
            ErrorKind::BadRequest,
            "request target host is not a valid header value",
        )
    })?;
    headers.insert(header::HOST, host);

    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let origin_form: Uri = path
        .parse()
        .map_err(|_| ProxyError::new(ErrorKind::BadRequest, "request target path is invalid"))?;
    let (parts, body) = req.into_parts();
    let mut upstream = Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = origin_form;
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = headers;

    let tunnel = gateway.tunnels.open(&target, &client).await?;
    let mut tunnel_info = http::HeaderMap::new();
    super::http::tunnel_headers(&mut tunnel_info, &tunnel);
    let in_flight = tunnel.in_flight;
    let meter = gateway.usage.meter(
        client.account_id,
        client.user_id,
        tunnel.exit.record.id,
        client.limits.bandwidth,
    );
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .handshake::<_, Incoming>(TokioIo::new(Metered::new(TokioIo::new(tunnel.io), meter)))
        .await
        .map_err(|e| {
            ProxyError::new(ErrorKind::ExitLinkLost, format!("exit stream failed: {e}"))
        })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
        // The upstream connection outlives the response head: count it until it ends.
        drop((in_flight, lease));
    });
    let response = sender.send_request(upstream).await.map_err(|e| {
        ProxyError::new(
            ErrorKind::BadResponse,
            format!("target closed the connection or sent an invalid response: {e}"),
        )
    })?;
    let (mut parts, body) = response.into_parts();
    parts.headers = end_to_end(&parts.headers);
    parts.headers.extend(tunnel_info);
    let body: ProxyBody = body.map_err(Box::from).boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

fn max_forwards(headers: &header::HeaderMap) -> Result<Option<u32>, ProxyError> {
    match headers.get("max-forwards") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .map(Some)
            .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "Max-Forwards is not a number")),
    }
}
