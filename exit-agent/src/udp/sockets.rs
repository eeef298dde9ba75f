//! An association's egress sockets (at most one per family) and the peers
//! whose replies they let in: only destinations the association sent to,
//! bounded, the oldest forgotten first.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use tokio::net::UdpSocket;

/// Destinations whose replies are let in; the oldest is forgotten first.
pub(super) const MAX_PEERS: usize = 1024;

/// An association's egress sockets, at most one per family.
pub(crate) struct Sockets {
    pub(super) v4: Option<UdpSocket>,
    pub(super) v6: Option<UdpSocket>,
}

impl Sockets {
    pub(super) fn for_family(&self, addr: SocketAddr) -> Option<&UdpSocket> {
        if addr.is_ipv4() {
            self.v4.as_ref()
        } else {
            self.v6.as_ref()
        }
    }
}

/// The destinations replies are accepted from, oldest forgotten first.
pub(super) struct Peers {
    pub(super) set: HashSet<SocketAddr>,
    pub(super) order: VecDeque<SocketAddr>,
}

impl Peers {
    pub(super) fn new() -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    pub(super) fn insert(&mut self, addr: SocketAddr) {
        if self.set.contains(&addr) {
            return;
        }
        if self.order.len() >= MAX_PEERS {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        self.set.insert(addr);
        self.order.push_back(addr);
    }

    pub(super) fn contains(&self, addr: &SocketAddr) -> bool {
        self.set.contains(addr)
    }
}

/// An address as a peer: IP and port only. The flow label and scope id a
/// received IPv6 source may carry must not make a known peer unknown.
pub(super) fn peer(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}
