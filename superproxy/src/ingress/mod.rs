//! Client-facing listeners: accept a connection and speak its protocol.
//!
//! One port can serve both protocols: a SOCKS5 client's first byte is 0x05,
//! which no HTTP request line starts with ([`serve_any`]).

pub mod forward;
pub mod head_guard;
pub mod http;
pub mod socks5;

use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

use crate::Gateway;

/// Peeks at the first byte and hands the connection to the right protocol.
pub async fn serve_any(gateway: Arc<Gateway>, stream: TcpStream, peer: SocketAddr) {
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(
        gateway.config.header_read_timeout(),
        stream.peek(&mut first),
    )
    .await;
    match peeked {
        Ok(Ok(1)) if first[0] == 0x05 => socks5::serve_connection(gateway, stream, peer).await,
        Ok(Ok(1)) => http::serve_connection(gateway, stream, peer).await,
        _ => tracing::debug!(%peer, "client sent nothing before the header timeout"),
    }
}
