//! Opens one tunnel stream through an exit's link.
//!
//! One stream per tunnel, no extra round trip: the request (an HTTP/2
//! `CONNECT` on a v1 link, a mux OPEN on a v2 link) carries the target, the
//! egress IP and what is left of the connect budget; the answer is a typed
//! outcome. Failures are classified so the caller knows whether the
//! target may have been reached (never retried) or certainly was not (retried
//! on another exit).

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use proxynet_protocol::link::{
    Outcome, StreamRequest, HEADER_CONNECT_BUDGET_MS, HEADER_EGRESS_IP, HEADER_OUTCOME,
    HEADER_VERSION, LINK_V1_HTTP2,
};
use proxynet_protocol::mux::{MuxHandle, OpenError};
use std::net::IpAddr;
use std::time::Duration;

use super::registry::{Link, LinkSender, MuxLink};
use super::stream::ExitStream;
use crate::error::{ErrorKind, ProxyError};
use crate::target::Target;
use proxynet_protocol::mux::frame::STREAM_WINDOW;

/// Asks `link`'s agent to connect to `target` from `egress_ip` within `budget`.
pub async fn open_tunnel(
    link: &Link,
    target: &Target,
    egress_ip: IpAddr,
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    match &link.sender {
        LinkSender::Http2(sender) => open_http2(sender.clone(), target, egress_ip, budget).await,
        LinkSender::Mux(link) => open_mux(link, target, egress_ip, budget).await,
    }
}

async fn open_mux(
    link: &MuxLink,
    target: &Target,
    egress_ip: IpAddr,
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    // What the receive budget allows a new stream now, where the agent
    // takes it from the OPEN (older agents get the full window).
    let window = link.open_window.then(|| link.handle.next_window());
    let request = StreamRequest::Tunnel {
        target: target.authority(),
        egress_ip,
        budget_ms: budget.as_millis() as u64,
        window,
    };
    let request = serde_json::to_vec(&request).map_err(|e| {
        ProxyError::new(ErrorKind::Internal, "could not encode the link request").caused_by(e)
    })?;
    let opening = match window {
        Some(w) => link.handle.open_with_window(request.into(), w),
        None => link.handle.open_with_window(request.into(), STREAM_WINDOW),
    };
    let (reply, stream) = match tokio::time::timeout(budget, opening).await {
        Err(_) => {
            return Err(ProxyError::new(
                ErrorKind::ConnectionTimeout,
                "target did not answer within the connect budget",
            ))
        }
        // Never sent, or refused unread: safe to try elsewhere.
        Ok(Err(OpenError::Unavailable)) => {
            return Err(ProxyError::new(
                ErrorKind::ExitUnavailable,
                "exit link is not taking new tunnels",
            ))
        }
        Ok(Err(OpenError::Refused)) => {
            return Err(ProxyError::new(
                ErrorKind::ExitUnavailable,
                "exit refused the stream",
            ))
        }
        Ok(Err(OpenError::Lost(e))) => {
            return Err(
                ProxyError::new(ErrorKind::ExitLinkLost, "the exit link failed").caused_by(e),
            )
        }
        Ok(Ok(opened)) => opened,
    };
    match std::str::from_utf8(&reply).ok().and_then(Outcome::parse) {
        Some(Outcome::Connected) => Ok(ExitStream::Mux(stream)),
        Some(outcome) => Err(ProxyError::new(
            ErrorKind::from_outcome(outcome),
            outcome_detail(outcome),
        )),
        None => Err(ProxyError::new(
            ErrorKind::ExitLinkLost,
            "exit answered without a known outcome",
        )),
    }
}

async fn open_http2(
    mut sender: super::registry::Http2Sender,
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

fn outcome_detail(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Connected => "connected",
        Outcome::Refused => "target refused the connection",
        Outcome::TimedOut => "target did not answer in time",
        Outcome::Unreachable => "target network or host unreachable from the exit",
        Outcome::DnsError => "target name did not resolve",
        Outcome::PolicyDenied => "target address is not allowed by the egress policy",
        Outcome::EgressUnavailable => "exit cannot use the requested egress address",
        Outcome::Draining => "exit is draining",
        Outcome::Capacity => "exit is at capacity",
        Outcome::BadRequest => "exit did not understand the tunnel request",
    }
}

/// Sends one health probe on `link`; its round trip if the agent answered
/// it healthy in time.
pub async fn probe(link: &Link, timeout: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    probe_ok(link, timeout).await.then(|| started.elapsed())
}

async fn probe_ok(link: &Link, timeout: Duration) -> bool {
    match &link.sender {
        LinkSender::Http2(sender) => probe_http2(sender.clone(), timeout).await,
        LinkSender::Mux(link) => probe_mux(&link.handle, timeout).await,
    }
}

async fn probe_mux(handle: &MuxHandle, timeout: Duration) -> bool {
    let Ok(request) = serde_json::to_vec(&StreamRequest::Probe) else {
        return false;
    };
    let answered = tokio::time::timeout(timeout, handle.open(request.into())).await;
    // The probe stream carries nothing: dropping it (with the answer) ends it.
    matches!(answered, Ok(Ok((reply, _))) if &reply[..] == Outcome::Connected.as_str().as_bytes())
}

async fn probe_http2(mut sender: super::registry::Http2Sender, timeout: Duration) -> bool {
    use proxynet_protocol::link::PROBE_PATH;
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
