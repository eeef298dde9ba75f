//! Client-facing protocols: read the credentials and the target off the
//! wire, run the [`crate::pipeline`], answer in the client's protocol.
//!
//! One port can serve both protocols: a SOCKS5 client's first byte is 0x05,
//! which no HTTP request line starts with ([`serve_any`]).

pub mod http;
pub mod socks5;
pub mod tls;

use std::sync::Arc;
use tokio::net::TcpStream;

use crate::accept::ConnectionTicket;
use crate::pipeline::Pipeline;

/// Peeks at the first byte and hands the connection to the right protocol.
pub async fn serve_any(pipeline: Arc<Pipeline>, stream: TcpStream, ticket: ConnectionTicket) {
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(
            pipeline.config.header_read_timeout(),
            stream.peek(&mut first),
        ) => peeked,
        // The pre-auth deadline (or a drain) ends a silent connection.
        () = ticket.cut().cancelled() => return,
    };
    match peeked {
        Ok(Ok(1)) if first[0] == 0x05 => socks5::serve_connection(pipeline, stream, ticket).await,
        Ok(Ok(1)) => http::serve_connection(pipeline, stream, ticket).await,
        _ => {
            tracing::debug!(peer = %ticket.peer(), "client sent nothing before the header timeout")
        }
    }
}
