//! Link version 2: a lean stream multiplexer with per-stream credit.
//!
//! Runs inside the link's TLS 1.3 connection after the hello exchange. Why a
//! mux of our own instead of HTTP/2 is in docs/benchmarks.md (in short: large
//! frames written many-per-syscall, no per-write allocations in a framing
//! library, and each stream bounded by its own credit with no shared window,
//! so stalled tunnels cannot starve the others).
//!
//! A stream starts with an OPEN carrying the application's request; the
//! acceptor answers with one REPLY, after which both sides send DATA within
//! the credit the other returned ([`frame::STREAM_WINDOW`] each way to
//! start). A DATA frame flagged FIN half-closes; RESET abandons a stream;
//! GOAWAY stops new streams; PING/PONG keep an idle link honest.

mod connection;
mod error;
mod flow;
pub mod frame;
pub mod read_ahead;
mod recv_queue;
mod shared;
mod stream;

pub use connection::{start, Connection, Incoming, MuxConfig, MuxHandle, Role};
pub use error::{MuxError, OpenError};
pub use flow::{RecvBudget, INITIAL_STREAM_WINDOW, MIN_STREAM_WINDOW};
pub use read_ahead::ReadAhead;
pub use stream::MuxStream;

#[cfg(test)]
mod tests;
