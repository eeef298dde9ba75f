//! The agent's egress policy, kept current: besides its own configuration it
//! protects every address the control plane reports as part of the stack —
//! each superproxy's listeners, the control-api and its stores — so those are
//! denied when a tunnel names them by hostname (`localhost`, a name that
//! resolves to them) just as when it names them literally.

use proxynet_protocol::egress::{EgressPolicy, EgressPolicyConfig};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

pub struct LivePolicy {
    base: EgressPolicyConfig,
    learned: RwLock<BTreeSet<SocketAddr>>,
    current: RwLock<Arc<EgressPolicy>>,
}

impl LivePolicy {
    pub fn new(base: EgressPolicyConfig) -> Self {
        let current = Arc::new(EgressPolicy::new(base.clone()));
        Self {
            base,
            learned: RwLock::new(BTreeSet::new()),
            current: RwLock::new(current),
        }
    }

    pub fn current(&self) -> Arc<EgressPolicy> {
        self.current
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|_| Arc::new(EgressPolicy::new(self.base.clone())))
    }

    /// Replaces the addresses learned from the control plane; recompiles the
    /// policy only when they changed.
    pub fn learn(&self, addrs: impl IntoIterator<Item = SocketAddr>) {
        let addrs: BTreeSet<SocketAddr> = addrs.into_iter().collect();
        {
            let Ok(mut learned) = self.learned.write() else {
                return;
            };
            if *learned == addrs {
                return;
            }
            learned.clone_from(&addrs);
        }
        let mut config = self.base.clone();
        config.protected.extend(addrs.iter().copied());
        let policy = Arc::new(EgressPolicy::new(config));
        if let Ok(mut current) = self.current.write() {
            *current = policy;
        }
        tracing::info!(
            protected = addrs.len(),
            "egress policy updated with the stack's service addresses"
        );
    }
}
