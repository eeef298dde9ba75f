//! Accepting client connections: the connection limit, the drain guard, and
//! the [`ConnectionTicket`] that every connection — and every tunnel born on
//! it — holds for as long as it lives.
//!
//! A ticket owns one of `max_connections` permits, keeps the drain counter up
//! (shutdown waits for every ticket to be gone) and carries the connection's
//! cut token (revoking a user, a consent or a drain deadline cancels it and the
//! connection ends). Tickets are shared, not moved: a CONNECT tunnel spliced
//! after hyper has finished with the connection still holds it.
//!
//! Until its first successful login a connection also holds a pre-auth slot
//! of its source address ([`PreAuth`]): at most
//! `max_unauthenticated_per_source` per address (IPv6 per /64),
//! `known_source_factor` times that for an address that logged in lately,
//! each cut `unauthenticated_timeout_ms` after accept if it has not logged
//! in by then.
//! Past that a new connection waits, accepted but unread, for a slot of its
//! address to free, within the same deadline: a burst from one NAT address
//! is served in turn, and one address still cannot hold more slots than its
//! allowance with sockets that never speak.
//!
//! Behind a TCP load balancer every connection comes from the balancer: a
//! connection from one of the networks trusted with [`ProxyProtocol`] must
//! first send a PROXY protocol header ([`proxy_protocol`]), read before
//! anything else, and the client address it carries is the one the ticket
//! holds — so the pre-auth slot, the login throttle, the IP allow-list, the
//! access log and the abuse records all see the client, not the balancer.
//! Anyone else's connection is never read for a header: a forged one is just
//! bad input to the ingress.
//!
//! A file per job: `listen` (the accept loop and the listeners), `pre_auth`
//! (the per-source slots and the queue of connections waiting for one),
//! `gate` (the connection cap and the drain), `ticket` (what a connection
//! holds while it lives).

pub mod proxy_protocol;

mod gate;
mod listen;
mod pre_auth;
mod ticket;

#[cfg(test)]
mod tests;

pub(crate) use gate::{Gate, ProxyProtocol};
pub(crate) use listen::{run, ConnectionHandler, Listeners};
pub(crate) use pre_auth::{PreAuth, PreAuthLimits};
pub(crate) use ticket::ConnectionTicket;
