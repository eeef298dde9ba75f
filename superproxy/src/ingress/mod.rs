//! Client-facing protocols: read the credentials and the target off the
//! wire, run the [`crate::pipeline`], answer in the client's protocol.
//!
//! One port can serve both protocols: a SOCKS5 client's first byte is 0x05,
//! which no HTTP request line starts with ([`serve_any`]). [`Ingresses`] is
//! what the acceptor hands each admitted connection to.

pub(crate) mod http;
pub(crate) mod socks5;
pub(crate) mod socks5_udp;
pub(crate) mod tls;

use proxynet_common::splice::TunnelLimits;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

use crate::accept::{ConnectionHandler, ConnectionTicket};
use crate::pipeline::Pipeline;

/// What the ingresses need besides the pipeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IngressLimits {
    /// A request head (or SOCKS handshake) must arrive within this.
    pub header_read_timeout: Duration,
    /// Idle timeout and lifetime of every tunnel.
    pub tunnel: TunnelLimits,
    /// The address UDP ASSOCIATE replies name instead of the one the
    /// client's connection reached (behind a load balancer).
    pub udp_advertise: Option<IpAddr>,
}

/// Every ingress, as the acceptor's connection handler.
#[derive(Clone)]
pub(crate) struct Ingresses {
    pipeline: Arc<Pipeline>,
    limits: IngressLimits,
}

impl Ingresses {
    pub(crate) fn new(pipeline: Arc<Pipeline>, limits: IngressLimits) -> Self {
        Self { pipeline, limits }
    }
}

impl ConnectionHandler for Ingresses {
    fn proxy(
        &self,
        stream: TcpStream,
        ticket: ConnectionTicket,
    ) -> impl Future<Output = ()> + Send + 'static {
        serve_any(self.pipeline.clone(), self.limits, stream, ticket)
    }

    fn socks(
        &self,
        stream: TcpStream,
        ticket: ConnectionTicket,
    ) -> impl Future<Output = ()> + Send + 'static {
        socks5::serve_connection(self.pipeline.clone(), self.limits, stream, ticket)
    }

    fn tls(
        &self,
        stream: tokio_rustls::server::TlsStream<TcpStream>,
        ticket: ConnectionTicket,
    ) -> impl Future<Output = ()> + Send + 'static {
        let pipeline = self.pipeline.clone();
        let limits = self.limits;
        async move {
            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                http::h2::serve_connection(pipeline, limits, stream, ticket).await
            } else {
                http::serve_connection(pipeline, limits, stream, ticket).await
            }
        }
    }
}

/// Peeks at the first byte and hands the connection to the right protocol.
pub(crate) async fn serve_any(
    pipeline: Arc<Pipeline>,
    limits: IngressLimits,
    stream: TcpStream,
    ticket: ConnectionTicket,
) {
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(limits.header_read_timeout, stream.peek(&mut first)) => peeked,
        // The pre-auth deadline (or a drain) ends a silent connection.
        () = ticket.cut().cancelled() => return,
    };
    match peeked {
        Ok(Ok(1)) if first[0] == 0x05 => {
            socks5::serve_connection(pipeline, limits, stream, ticket).await
        }
        Ok(Ok(1)) => http::serve_connection(pipeline, limits, stream, ticket).await,
        _ => {
            tracing::debug!(peer = %ticket.peer(), "client sent nothing before the header timeout")
        }
    }
}
