//! HTTP/1.1 proxy ingress: `CONNECT` tunnels and absolute-form requests.
//!
//! Every request head first passes the strict [`HeadGuard`]; hyper then parses
//! it (bounded size, header-read timeout against slowloris). A `CONNECT` is
//! authenticated, a tunnel is opened through an exit, and only then is `200`
//! sent, so every failure still has a status and a `Proxy-Status`. Absolute-form
//! requests go to [`super::forward`]. Origin-form requests get 400: this is a
//! forward proxy, not a web server. `Proxy-Authorization` ends here.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

use super::head_guard::{HeadGuard, HeadLimits, TunnelSwitch};
use crate::authenticate::parse_basic;
use crate::error::{ErrorKind, ProxyError};
use crate::target::Target;
use crate::tunnel::{Client, OpenTunnel};
use crate::usage::Metered;
use crate::Gateway;
use proxynet_protocol::splice::splice;

/// Largest request head accepted (431 beyond).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in one request head (431 beyond).
pub const MAX_HEADERS: usize = 100;

/// Response header naming the exit that served the request or tunnel.
pub const EXIT_HEADER: &str = "proxynet-exit";
/// Response header with a sticky session's pin expiry (Unix seconds).
pub const SESSION_EXPIRES_HEADER: &str = "proxynet-session-expires";

/// Response bodies: our own short texts or a streamed upstream body.
pub type ProxyBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty_body() -> ProxyBody {
    full_body(Bytes::new())
}

fn error_response(error: &ProxyError) -> Response<ProxyBody> {
    error
        .to_response()
        .map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

pub async fn serve_connection(gateway: Arc<Gateway>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let switch = TunnelSwitch::default();
    let guarded = HeadGuard::new(
        stream,
        HeadLimits {
            max_head_bytes: MAX_HEAD_BYTES,
            max_fields: MAX_HEADERS,
        },
        switch.clone(),
    );
    let service = {
        let gateway = gateway.clone();
        service_fn(move |req| handle(gateway.clone(), switch.clone(), peer, req))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(gateway.config.header_read_timeout())
        .preserve_header_case(true)
        .max_headers(MAX_HEADERS)
        // The guard enforces the real limit with a proper 431; hyper's buffer
        // only needs room for a head the guard already accepted.
        .max_buf_size(MAX_HEAD_BYTES + 16 * 1024);
    builder.auto_date_header(false);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(guarded), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

async fn handle(
    gateway: Arc<Gateway>,
    switch: TunnelSwitch,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let response = match route(gateway, switch, peer, req).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(error = %e, "request refused");
            error_response(&e)
        }
    };
    Ok(response)
}

async fn route(
    gateway: Arc<Gateway>,
    switch: TunnelSwitch,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if req.method() == Method::CONNECT {
        return connect(gateway, switch, peer, req).await;
    }
    if req.uri().scheme().is_none() {
        return Err(ProxyError::new(
            ErrorKind::BadRequest,
            "this is a forward proxy: send CONNECT or an absolute-form request",
        ));
    }
    let client = authenticate(&gateway, &req, peer).await?;
    let lease = gateway.admit(&client).await?;
    super::forward::forward(gateway, req, client, lease).await
}

async fn authenticate(
    gateway: &Gateway,
    req: &Request<Incoming>,
    peer: SocketAddr,
) -> Result<Client, ProxyError> {
    let header = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(ProxyError::auth_required)?;
    let (username, password) = parse_basic(header).ok_or_else(ProxyError::auth_required)?;
    gateway.authenticate(&username, &password, peer.ip()).await
}

/// `Proxynet-Exit` and, for sessions, `Proxynet-Session-Expires` (Unix seconds).
pub fn tunnel_headers(headers: &mut http::HeaderMap, tunnel: &OpenTunnel) {
    if let Ok(v) = HeaderValue::from_str(&tunnel.exit.record.id.to_string()) {
        headers.insert(EXIT_HEADER, v);
    }
    if let Some(pin) = tunnel.pin {
        headers.insert(
            SESSION_EXPIRES_HEADER,
            HeaderValue::from(pin.expires_unix()),
        );
    }
}

async fn connect(
    gateway: Arc<Gateway>,
    switch: TunnelSwitch,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let authority = req
        .uri()
        .authority()
        .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "CONNECT needs host:port"))?
        .as_str()
        .to_owned();
    let client = authenticate(&gateway, &req, peer).await?;
    let lease = gateway.admit(&client).await?;
    let target = Target::parse_authority(&authority)
        .map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("bad CONNECT target: {e}")))?;
    let tunnel = gateway.tunnels.open(&target, &client).await?;
    let exit_id = tunnel.exit.record.id;
    let mut response = Response::new(empty_body());
    tunnel_headers(response.headers_mut(), &tunnel);
    tracing::debug!(exit = %exit_id, %target, "tunnel open");

    // From the 200 on, the client connection carries tunnel bytes.
    switch.engage();
    let meter = gateway.usage.meter(
        client.account_id,
        client.user_id,
        exit_id,
        client.limits.bandwidth,
    );
    let on_client_upgrade = hyper::upgrade::on(req);
    let limits = gateway.config.tunnel_limits();
    tokio::spawn(async move {
        let client = match on_client_upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(e) => {
                tracing::debug!(error = %e, "client went away before the tunnel started");
                return;
            }
        };
        let OpenTunnel { io, in_flight, .. } = tunnel;
        let exit = Metered::new(TokioIo::new(io), meter);
        let outcome = splice(client, exit, limits).await;
        drop((in_flight, lease));
        tracing::debug!(exit = %exit_id, up = outcome.up, down = outcome.down, end = ?outcome.end, "tunnel closed");
    });

    *response.status_mut() = StatusCode::OK;
    Ok(response)
}
