//! The connection cap and the drain: [`Gate`] holds the
//! `max_connections` permits, the drain counter shutdown waits on, the cut
//! that ends every connection at once, and what the accept loop admits
//! with (the [`PreAuth`] bound, the balancers trusted with
//! [`ProxyProtocol`]).

use proxynet_common::egress::Cidr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::pre_auth::PreAuth;
use super::ticket::Issuer;

/// Connection permits and the drain counter.
pub(crate) struct Gate {
    permits: Arc<Semaphore>,
    alive: Option<mpsc::Sender<()>>,
    all_done: mpsc::Receiver<()>,
    pub(super) cut_all: CancellationToken,
    pub(super) pre_auth: Arc<PreAuth>,
    pub(super) proxy_protocol: Arc<ProxyProtocol>,
}

/// Which peers must open with a PROXY protocol header, and how long they
/// have to send it.
#[derive(Debug, Clone, Default)]
pub struct ProxyProtocol {
    /// Trusted networks (the balancers); empty: no header is read from anyone.
    pub from: Vec<Cidr>,
    /// A trusted peer's header must be whole within this from accept.
    pub timeout: Duration,
}

impl ProxyProtocol {
    /// Whether a connection from `peer` must start with a header.
    pub fn trusts(&self, peer: SocketAddr) -> bool {
        // A dual-stack listener shows IPv4 peers as mapped IPv6 addresses.
        let ip = peer.ip().to_canonical();
        self.from.iter().any(|network| network.contains(ip))
    }
}

impl Gate {
    pub(crate) fn new(max_connections: usize, pre_auth: Arc<PreAuth>) -> Self {
        let (alive, all_done) = mpsc::channel(1);
        Self {
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            alive: Some(alive),
            all_done,
            cut_all: CancellationToken::new(),
            pre_auth,
            proxy_protocol: Arc::new(ProxyProtocol::default()),
        }
    }

    /// Requires a PROXY protocol header of connections from `trusted`.
    pub(crate) fn with_proxy_protocol(mut self, trusted: ProxyProtocol) -> Self {
        self.proxy_protocol = Arc::new(trusted);
        self
    }

    /// `None` once draining.
    pub(super) fn issuer(&self) -> Option<Issuer> {
        Some(Issuer {
            permits: self.permits.clone(),
            alive: self.alive.clone()?,
        })
    }

    /// Connections (and tunnels) still open.
    pub(crate) fn open(&self, max_connections: usize) -> usize {
        max_connections.max(1) - self.permits.available_permits()
    }

    /// Waits until every ticket is gone, at most `deadline`; true if they are.
    pub(crate) async fn wait_idle(&mut self, deadline: Duration) -> bool {
        self.alive = None;
        tokio::time::timeout(deadline, self.all_done.recv())
            .await
            .is_ok()
    }

    /// Ends every open connection and tunnel now.
    pub(crate) fn cut_all(&self) {
        self.cut_all.cancel();
    }
}
