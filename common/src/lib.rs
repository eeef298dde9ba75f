//! What every proxynet binary runs on, whatever it speaks: the egress
//! policy both the superproxy (early literal check) and the agent (on the
//! address actually dialled) apply ([`egress`]), the tunnel byte pump both
//! ends run ([`splice`], [`buffers`]), socket options ([`sockets`]), strings
//! that never print ([`secret`]), the one shape of background work
//! ([`tasks`]), and process conventions ([`runtime`], [`ready`],
//! [`telemetry`], [`metrics`], [`shutdown`]).
//!
//! Beside it: `proxynet-store` (the shared Redis state) and `proxynet-wire`
//! (what crosses a wire between parties).

pub mod buffers;
pub mod egress;
pub mod metrics;
pub mod ready;
pub mod runtime;
pub mod secret;
pub mod shutdown;
pub mod sockets;
pub mod splice;
pub mod tasks;
pub mod telemetry;
