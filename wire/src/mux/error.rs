//! Why a mux connection ended, and why a stream could not be opened.

use std::io;
use std::sync::Arc;

/// Why a connection ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MuxError {
    #[error("link i/o: {0}")]
    Io(Arc<io::Error>),
    #[error("peer broke the link protocol: {0}")]
    Protocol(&'static str),
    #[error("peer did not answer a keepalive in time")]
    KeepaliveTimeout,
    #[error("peer stopped reading the link")]
    WriteStalled,
    #[error("link closed")]
    Closed,
}

/// Why a stream could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpenError {
    /// The connection is closed or going away: the request was never sent.
    #[error("link is not taking new streams")]
    Unavailable,
    /// The connection failed after the request was sent.
    #[error("link lost while opening: {0}")]
    Lost(MuxError),
    /// The peer reset the stream without answering (e.g. over its stream limit).
    #[error("peer refused the stream")]
    Refused,
}
