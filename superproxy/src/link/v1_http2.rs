//! Link v1, HTTP/2 with the roles reversed (the superproxy is the client),
//! still spoken to agents of the previous release: starting it on an
//! admitted link, opening a tunnel (`CONNECT host:port` with the egress IP and
//! budget in headers, the outcome in a response header), probing.

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use proxynet_wire::link::{
    Outcome, HEADER_CONNECT_BUDGET_MS, HEADER_EGRESS_IP, HEADER_OUTCOME, HEADER_VERSION,
    LINK_V1_HTTP2,
};
use std::net::IpAddr;
use std::time::Duration;

use super::sender::{Http2Sender, LinkSender};
use super::stream::ExitStream;
use super::version::{outcome_detail, AgentTls, LinkDriver};
use crate::error::{ErrorKind, ProxyError};
use crate::target::Target;

/// The HTTP/2 handshake on an admitted link. Windows are credit, not
/// buffers: memory grows only while a peer does not read (see the constants
/// for the isolation rule).
pub(super) async fn start(tls: AgentTls) -> Result<(LinkSender, LinkDriver), String> {
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(proxynet_wire::link::H2_STREAM_WINDOW)
        .initial_connection_window_size(proxynet_wire::link::H2_CONNECTION_WINDOW)
        .max_frame_size(proxynet_wire::link::H2_MAX_FRAME_SIZE)
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http/2 handshake: {e}"))?;
    let driver: LinkDriver = Box::pin(async move { connection.await.err().map(|e| e.to_string()) });
    Ok((LinkSender::Http2(sender), driver))
}

pub(super) async fn open(
    mut sender: Http2Sender,
    target: &Target,
    egress_ip: IpAddr,
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    let uri: Uri = target
        .authority()
        .parse()
        .map_err(|_| ProxyError::new(ErrorKind::BadRequest, "target is not a valid authority"))?;
    let request = Request::builder()
        .method(Method::CONNECT)
        .uri(uri)
        .header(HEADER_VERSION, LINK_V1_HTTP2)
        .header(HEADER_EGRESS_IP, egress_ip.to_string())
        .header(HEADER_CONNECT_BUDGET_MS, budget.as_millis().to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| {
            ProxyError::new(ErrorKind::Internal, "could not build the link request").caused_by(e)
        })?;

    // A link that is not ready never saw the request: safe to try elsewhere.
    sender.ready().await.map_err(|e| {
        ProxyError::new(ErrorKind::ExitUnavailable, "the exit link is unavailable").caused_by(e)
    })?;
    let response = match tokio::time::timeout(budget, sender.send_request(request)).await {
        Err(_) => {
            return Err(ProxyError::new(
                ErrorKind::ConnectionTimeout,
                "target did not answer within the connect budget",
            ))
        }
        Ok(Err(e)) if e.is_canceled() => {
            return Err(ProxyError::new(
                ErrorKind::ExitUnavailable,
                "exit link closed before the tunnel was sent",
            ))
        }
        Ok(Err(e)) => {
            return Err(
                ProxyError::new(ErrorKind::ExitLinkLost, "the exit link failed").caused_by(e),
            )
        }
        Ok(Ok(response)) => response,
    };
    let outcome = response
        .headers()
        .get(HEADER_OUTCOME)
        .and_then(|v| v.to_str().ok())
        .and_then(Outcome::parse);
    match outcome {
        Some(Outcome::Connected) if response.status().is_success() => hyper::upgrade::on(response)
            .await
            .map(|upgraded| ExitStream::Http2(TokioIo::new(upgraded)))
            .map_err(|e| {
                ProxyError::new(ErrorKind::ExitLinkLost, "the exit link's upgrade failed")
                    .caused_by(e)
            }),
        Some(outcome) => Err(ProxyError::new(
            ErrorKind::from_outcome(outcome),
            outcome_detail(outcome),
        )),
        None => Err(ProxyError::new(
            ErrorKind::ExitLinkLost,
            format!("exit answered {} without an outcome", response.status()),
        )),
    }
}

pub(super) async fn probe(mut sender: Http2Sender, timeout: Duration) -> bool {
    use proxynet_wire::link::PROBE_PATH;
    let Ok(request) = Request::builder()
        .method(Method::GET)
        .uri(format!("http://proxynet{PROBE_PATH}"))
        .header(HEADER_VERSION, LINK_V1_HTTP2)
        .body(Empty::<Bytes>::new())
    else {
        return false;
    };
    let answered = tokio::time::timeout(timeout, async move {
        sender.ready().await.ok()?;
        sender.send_request(request).await.ok()
    })
    .await;
    matches!(answered, Ok(Some(response))
        if response.status().is_success()
            && response.headers().get(HEADER_OUTCOME).and_then(|v| v.to_str().ok()) == Some(Outcome::Connected.as_str()))
}
