//! Kernel options for the sockets that face the outside world: clients at
//! the superproxy, targets at the agent.
//!
//! A peer that stops reading leaves our kernel holding what we already
//! wrote to it. Left to autotuning, the send buffer of one such socket grows
//! to `tcp_wmem`'s maximum (4 MiB on stock Linux), so a thousand stalled
//! tunnels pin gigabytes of kernel memory the process never sees. Past
//! `tcp_mem` the kernel is under memory pressure for every socket on the
//! host: it shrinks windows, drops segments, and resets sockets closed with
//! data still queued, so other tenants' downloads lose their tails. Bounding
//! the *unsent* part (`TCP_NOTSENT_LOWAT`) keeps a stalled socket to what is
//! in flight plus this much, while a reading peer still gets a full
//! congestion window (unlike a fixed `SO_SNDBUF`, which would cap throughput
//! on long paths).

use tokio::net::TcpStream;

/// Unsent bytes the kernel queues for one outside socket before writes wait.
/// Enough to keep a fast reader busy between two of our writes.
pub const UNSENT_LIMIT: u32 = 256 * 1024;

/// Bounds the bytes `stream` may hold that the peer has not been sent yet.
/// Best effort: a kernel without the option keeps its default.
pub fn bound_unsent(stream: &TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_notsent_lowat(UNSENT_LIMIT) {
        tracing::debug!(error = %e, "TCP_NOTSENT_LOWAT not set");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = stream;
}
