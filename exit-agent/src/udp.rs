//! Serving one UDP association (SOCKS5 `UDP ASSOCIATE` at the superproxy):
//! admit, bind, then relay datagram capsules between a link stream and the
//! egress sockets.
//!
//! The stream (`StreamRequest::Udp`, link v2 only) carries
//! [`proxynet_wire::datagram`] capsules both ways. The agent binds one UDP
//! socket per egress IP asked for (at most one per family) and sends each
//! datagram from the socket of its destination's family, after the same
//! egress policy check a tunnel gets, on every datagram (names are resolved
//! by the agent, through a small per-association cache).
//!
//! Replies are accepted only from addresses this association has sent to
//! (address- and port-dependent filtering), so an egress socket never
//! becomes an open inbound relay into the superproxy. UDP may drop, and so
//! do we: a full socket buffer, a denied destination or a stream that cannot
//! take more output drops the datagram (counted) rather than stall the
//! association.
//!
//! The pieces: `association` (admission, binding, the association's life),
//! `sockets` (the egress sockets and the peers whose replies they let in),
//! `resolve` (names, through a small per-association cache) and `relay`
//! (the loop between the stream and the sockets, and its counts).

mod association;
mod relay;
mod resolve;
mod sockets;

pub(crate) use association::serve;

#[cfg(test)]
mod tests;
