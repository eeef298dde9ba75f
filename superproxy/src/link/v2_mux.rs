//! Link v2, the mux (`wire/src/mux/`), from the superproxy's side:
//! starting it on an admitted link, opening a tunnel stream (an OPEN naming
//! the target, the egress IP, the budget and the stream's window), probing.

use proxynet_wire::link::{Outcome, StreamRequest};
use proxynet_wire::mux::frame::STREAM_WINDOW;
use proxynet_wire::mux::{self, MuxConfig, MuxHandle, OpenError, RecvBudget, Role};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::sender::{LinkSender, MuxLink};
use super::stream::ExitStream;
use super::version::{outcome_detail, AgentTls, LinkDriver};
use crate::error::{ErrorKind, ProxyError};
use crate::target::Target;

/// Plaintext rustls may hold for sending before the socket takes it: large
/// enough that one bulk write becomes one vectored syscall of many records.
const TLS_SEND_BUFFER: usize = 512 * 1024;

/// Starts the mux on an admitted link: we open every stream (an agent that
/// opens one breaks the protocol and is not left holding our memory), and
/// every link's streams share the instance's receive budget.
pub(super) fn start(
    mut tls: AgentTls,
    recv_budget: Arc<RecvBudget>,
    open_window: bool,
    udp: bool,
) -> (LinkSender, LinkDriver) {
    tls.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
    let (handle, connection) = mux::start(
        tls,
        Role::Client,
        MuxConfig {
            accepts_streams: false,
            recv_budget: Some(recv_budget),
            ..MuxConfig::default()
        },
    );
    let driver: LinkDriver = Box::pin(async move { connection.await.err().map(|e| e.to_string()) });
    (
        LinkSender::Mux(MuxLink {
            handle,
            open_window,
            udp,
        }),
        driver,
    )
}

pub(super) async fn open(
    link: &MuxLink,
    target: &Target,
    egress_ip: IpAddr,
    budget: Duration,
    upstream: Option<proxynet_wire::link::UpstreamAsk>,
) -> Result<ExitStream, ProxyError> {
    // What the receive budget allows a new stream now, where the agent
    // takes it from the OPEN (older agents get the full window).
    let window = link.open_window.then(|| link.handle.next_window());
    let request = StreamRequest::Tunnel {
        target: target.authority(),
        egress_ip,
        budget_ms: budget.as_millis() as u64,
        window,
        upstream,
    };
    open_stream(link, &request, window, budget).await
}

/// Opens a UDP association from `egress_ips` (one per family); the stream
/// then carries datagram capsules. Only for agents that said `udp`.
pub(super) async fn open_association(
    link: &MuxLink,
    egress_ips: &[IpAddr],
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    if !link.udp {
        return Err(ProxyError::new(
            ErrorKind::ExitUnavailable,
            "the exit's agent does not carry UDP",
        ));
    }
    let window = link.open_window.then(|| link.handle.next_window());
    let request = StreamRequest::Udp {
        egress_ips: egress_ips.to_vec(),
        budget_ms: budget.as_millis() as u64,
        window,
    };
    open_stream(link, &request, window, budget).await
}

/// Sends one OPEN and reads the agent's outcome.
async fn open_stream(
    link: &MuxLink,
    request: &StreamRequest,
    window: Option<u32>,
    budget: Duration,
) -> Result<ExitStream, ProxyError> {
    let request = serde_json::to_vec(request).map_err(|e| {
        ProxyError::new(ErrorKind::Internal, "could not encode the link request").caused_by(e)
    })?;
    let opening = link
        .handle
        .open_with_window(request.into(), window.unwrap_or(STREAM_WINDOW));
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

pub(super) async fn probe(handle: &MuxHandle, timeout: Duration) -> bool {
    let Ok(request) = serde_json::to_vec(&StreamRequest::Probe) else {
        return false;
    };
    let answered = tokio::time::timeout(timeout, handle.open(request.into())).await;
    // The probe stream carries nothing: dropping it (with the answer) ends it.
    matches!(answered, Ok(Ok((reply, _))) if &reply[..] == Outcome::Connected.as_str().as_bytes())
}
