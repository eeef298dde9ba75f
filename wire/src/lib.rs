//! What proxynet's parties say to each other on the wire: the agent link
//! ([`link`]: hello, link versions, stream requests and outcomes; [`mux`]:
//! the v2 framing; [`datagram`]: UDP datagrams on a link stream), the
//! agent's heartbeat to the control-api
//! ([`heartbeat`]), the egress reflector's signed answer and the agent's
//! report of it ([`reflector`]), and the proxy username grammar clients send
//! ([`username`], with the [`continent`] of each country and the
//! [`provenance`] vocabulary exits are targeted by).

pub mod continent;
pub mod datagram;
pub mod heartbeat;
pub mod link;
pub mod mux;
pub mod provenance;
pub mod reflector;
pub mod username;
