//! Link v1, HTTP/2 with the roles reversed (the agent is the server), still
//! spoken to superproxies of the previous release: each stream a probe
//! (`GET` of the probe path) or a `CONNECT host:port` with the egress IP and
//! budget in headers, answered with the outcome in a response header.

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Empty;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use proxynet_common::splice::{splice_until, Plain};
use proxynet_wire::link::{
    Outcome, HEADER_CONNECT_BUDGET_MS, HEADER_EGRESS_IP, HEADER_OUTCOME, HEADER_VERSION,
    LINK_V1_HTTP2, PROBE_PATH,
};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::LinkStream;
use crate::tunnel::{admit, count, open, probe_outcome, TunnelContext, TunnelRequest};

pub(super) async fn serve(
    tls: LinkStream,
    ctx: Arc<TunnelContext>,
    stop: &CancellationToken,
) -> Result<(), hyper::Error> {
    let service = {
        let ctx = ctx.clone();
        service_fn(move |req| handle(ctx.clone(), req))
    };
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(proxynet_wire::link::H2_STREAM_WINDOW)
        .initial_connection_window_size(proxynet_wire::link::H2_CONNECTION_WINDOW)
        .max_frame_size(proxynet_wire::link::H2_MAX_FRAME_SIZE)
        .max_concurrent_streams(u32::try_from(ctx.config.max_tunnels).unwrap_or(u32::MAX))
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => return result,
        () = stop.cancelled() => connection.as_mut().graceful_shutdown(),
    }
    connection.await
}

/// A v1 stream's request: `CONNECT host:port` with the `proxynet-*` headers.
fn tunnel_request(req: &Request<hyper::body::Incoming>) -> Result<TunnelRequest, Outcome> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if req.method() != Method::CONNECT || header(HEADER_VERSION) != Some(&LINK_V1_HTTP2.to_string())
    {
        return Err(Outcome::BadRequest);
    }
    let authority = req.uri().authority().ok_or(Outcome::BadRequest)?;
    let egress_ip = header(HEADER_EGRESS_IP)
        .and_then(|v| v.parse().ok())
        .ok_or(Outcome::BadRequest)?;
    let budget_ms = header(HEADER_CONNECT_BUDGET_MS)
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or(Outcome::BadRequest)?;
    TunnelRequest::new(authority, egress_ip, budget_ms)
}

/// Serves one v1 (HTTP/2) stream: probe or tunnel.
async fn handle(
    ctx: Arc<TunnelContext>,
    mut req: Request<hyper::body::Incoming>,
) -> Result<Response<Empty<Bytes>>, Infallible> {
    if req.method() == Method::GET && req.uri().path() == PROBE_PATH {
        return Ok(answer(probe_outcome(&ctx)));
    }
    let Some(guard) = admit(&ctx) else {
        return Ok(answer(Outcome::Capacity));
    };
    let opened = match tunnel_request(&req) {
        Ok(request) => open(&ctx, &request).await,
        Err(outcome) => Err(outcome),
    };
    let tcp = match opened {
        Ok(tcp) => tcp,
        Err(outcome) => return Ok(answer(outcome)),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let limits = ctx.config.tunnel_limits();
    let cut = ctx.cut_token();
    tokio::spawn(async move {
        let _guard = guard;
        match on_upgrade.await {
            Ok(upgraded) => {
                let outcome =
                    splice_until(Plain(TokioIo::new(upgraded)), tcp, limits, cut.cancelled()).await;
                tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "tunnel closed");
            }
            Err(e) => {
                tracing::debug!(error = %e, "superproxy dropped the stream before it started")
            }
        }
    });
    Ok(answer(Outcome::Connected))
}

fn answer(outcome: Outcome) -> Response<Empty<Bytes>> {
    count(outcome);
    let mut response = Response::new(Empty::new());
    *response.status_mut() =
        http::StatusCode::from_u16(outcome.status()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        HEADER_OUTCOME,
        http::HeaderValue::from_static(outcome.as_str()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_carries_the_outcome_as_status_and_header() {
        for outcome in [
            Outcome::Connected,
            Outcome::PolicyDenied,
            Outcome::Capacity,
            Outcome::TimedOut,
        ] {
            let response = answer(outcome);
            assert_eq!(response.status().as_u16(), outcome.status());
            assert_eq!(response.headers()[HEADER_OUTCOME], outcome.as_str());
        }
    }
}
