//! What every link version shares with the rest of the link room: the TLS
//! stream a version's framing starts on, the driver it hands back, and what
//! an agent's outcome means to the client.

use proxynet_wire::link::Outcome;
use proxynet_wire::mux::ReadAhead;
use tokio::net::TcpStream;

/// An agent's link once TLS is up, before the version's framing starts.
pub(super) type AgentTls = tokio_rustls::server::TlsStream<ReadAhead<TcpStream>>;

/// Drives a started link until it ends; the error text when it failed.
pub(super) type LinkDriver =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send>>;

/// What the client is told an outcome means.
pub(super) fn outcome_detail(outcome: Outcome) -> &'static str {
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
        Outcome::UpstreamRefused => "exit's upstream gateway refused the tunnel",
    }
}
