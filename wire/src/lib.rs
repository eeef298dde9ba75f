//! What proxynet's parties say to each other on the wire: the agent link
//! ([`link`]: hello, link versions, stream requests and outcomes; [`mux`]:
//! the v2 framing), the agent's heartbeat to the control-api
//! ([`heartbeat`]), and the proxy username grammar clients send
//! ([`username`]).

pub mod heartbeat;
pub mod link;
pub mod mux;
pub mod username;
