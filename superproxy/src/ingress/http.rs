//! HTTP/1.1 proxy ingress: `CONNECT` tunnels.
//!
//! hyper parses the request head (bounded size, header-read timeout against
//! slowloris, malformed request lines answered 400 by hyper itself). A
//! `CONNECT` is authenticated, a tunnel is opened through an exit, and only then
//! is `200` sent, so every failure still has a status and a `Proxy-Status`.
//! The credentials live in `Proxy-Authorization`, which ends here: what flows
//! into the tunnel afterwards is the client's own bytes.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

use crate::authenticate::parse_basic;
use crate::error::{ErrorKind, ProxyError};
use crate::splice::splice;
use crate::target::Target;
use crate::Gateway;

/// Largest request head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in one request head.
pub const MAX_HEADERS: usize = 100;

/// Response header naming the exit that serves the tunnel.
pub const EXIT_HEADER: &str = "proxynet-exit";

pub async fn serve_connection(gateway: Arc<Gateway>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let service = {
        let gateway = gateway.clone();
        service_fn(move |req| handle(gateway.clone(), req))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(gateway.config.header_read_timeout())
        .preserve_header_case(true)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEAD_BYTES);
    builder.auto_date_header(false);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

async fn handle(
    gateway: Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match route(gateway, req).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(error = %e, "request refused");
            e.to_response()
        }
    };
    Ok(response)
}

async fn route(
    gateway: Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, ProxyError> {
    if req.method() == Method::CONNECT {
        return connect(gateway, req).await;
    }
    if req.uri().scheme().is_none() {
        return Err(ProxyError::new(
            ErrorKind::BadRequest,
            "this is a forward proxy: send CONNECT or an absolute-form request",
        ));
    }
    Err(ProxyError::new(
        ErrorKind::MethodNotAllowed,
        "only CONNECT is supported on this listener",
    ))
}

async fn connect(
    gateway: Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, ProxyError> {
    let authority = req
        .uri()
        .authority()
        .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "CONNECT needs host:port"))?
        .as_str()
        .to_owned();
    let user = {
        let header = req
            .headers()
            .get(header::PROXY_AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(ProxyError::auth_required)?;
        let (username, password) = parse_basic(header).ok_or_else(ProxyError::auth_required)?;
        gateway.auth.authenticate(&username, &password).await?
    };
    let target = Target::parse_authority(&authority)
        .map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("bad CONNECT target: {e}")))?;
    let tunnel = gateway.tunnels.open(&target).await?;
    let exit_id = tunnel.exit.record.id;
    tracing::debug!(user = %user.id, exit = %exit_id, %target, "tunnel open");

    let on_client_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let mut client = match on_client_upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(e) => {
                tracing::debug!(error = %e, "client went away before the tunnel started");
                return;
            }
        };
        let mut exit = TokioIo::new(tunnel.io);
        match splice(&mut client, &mut exit).await {
            Ok(t) => tracing::debug!(exit = %exit_id, up = t.up, down = t.down, "tunnel closed"),
            Err(e) => tracing::debug!(exit = %exit_id, error = %e, "tunnel ended with an error"),
        }
    });

    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::OK;
    if let Ok(v) = HeaderValue::from_str(&exit_id.to_string()) {
        response.headers_mut().insert(EXIT_HEADER, v);
    }
    Ok(response)
}
