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

use std::os::fd::AsFd;

/// Unsent bytes the kernel queues for one outside socket before writes wait.
/// Enough to keep a fast reader busy between two of our writes.
pub const UNSENT_LIMIT: u32 = 256 * 1024;

/// Sets, once, what every socket accepted from a client-facing listener
/// inherits (the kernel copies a listener's TCP options to the sockets it
/// accepts): no Nagle delay, and [`UNSENT_LIMIT`]. Per connection that was
/// two system calls and, for the unsent bound, a reactor wake-up each (the
/// kernel signals write space when the option changes).
pub fn prepare_client_listener(listener: &impl AsFd) {
    let socket = socket2::SockRef::from(listener);
    if let Err(e) = socket.set_tcp_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set on a listener");
    }
    bound_unsent(listener);
}

/// Bounds the bytes `socket` may hold that its peer has not been sent yet.
/// On a socket not yet connected (or a listener) it costs no wake-up.
/// Best effort: a kernel without the option keeps its default.
pub fn bound_unsent(socket: &impl AsFd) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(socket).set_tcp_notsent_lowat(UNSENT_LIMIT) {
        tracing::debug!(error = %e, "TCP_NOTSENT_LOWAT not set");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = socket;
}
