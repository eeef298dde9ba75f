//! What proxynet's parties say to each other on the wire: the agent link
//! ([`link`]: hello, link versions, stream requests and outcomes; [`mux`]:
//! the v2 framing; [`datagram`]: UDP datagrams on a link stream), the
//! agent's heartbeat to the control-api
//! ([`heartbeat`]), the egress reflector's signed answer and the agent's
//! report of it ([`reflector`]), the proxy username grammar clients send
//! ([`username`], with the [`continent`] of each country), and a sticky
//! session's pin as Redis stores it ([`session_pin`]).

pub mod continent;
pub mod datagram;
pub mod heartbeat;
pub mod link;
pub mod mux;
pub mod reflector;
pub mod session_pin;
pub mod username;
