//! Contracts shared by the proxynet binaries.
//!
//! Everything here is spoken by at least two of `superproxy`, `exit-agent` and
//! `control-api`: the wire format of the agent link ([`link`]) and of the
//! agent's heartbeat ([`heartbeat`]), the layout of the
//! shared Redis state ([`store`]) and how to reach it ([`redis_target`]), the egress policy that both the superproxy
//! (early literal check) and the agent (on the address actually dialled) apply
//! ([`egress`]), the tunnel byte pump both ends run ([`splice`]), and small
//! process conventions ([`ready`], [`telemetry`], [`shutdown`]).

pub mod buffers;
pub mod egress;
pub mod heartbeat;
pub mod link;
pub mod metrics;
pub mod mux;
pub mod ready;
pub mod redis_target;
pub mod runtime;
pub mod secret;
pub mod shutdown;
pub mod sockets;
pub mod splice;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod username;
