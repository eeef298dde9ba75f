//! The agent's egress policy, kept current: besides its own configuration it
//! protects every address the control plane reports as part of the stack —
//! each superproxy's listeners, the control-api and its stores — so those are
//! denied when a tunnel names them by hostname (`localhost`, a name that
//! resolves to them) just as when it names them literally.

use proxynet_common::egress::{EgressPolicy, EgressPolicyConfig};
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

#[cfg(test)]
mod tests {
    use super::*;
    use proxynet_common::egress::{Cidr, Denial};

    fn loopback_allowed() -> EgressPolicyConfig {
        EgressPolicyConfig {
            allow: vec!["127.0.0.0/8".parse::<Cidr>().unwrap()],
            ..EgressPolicyConfig::default()
        }
    }

    #[test]
    fn learned_service_addresses_are_denied_until_no_longer_reported() {
        let live = LivePolicy::new(loopback_allowed());
        let redis: SocketAddr = "127.0.0.1:6379".parse().unwrap();
        let other_loopback: SocketAddr = "127.0.0.2:6379".parse().unwrap();
        let web: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(live.current().check(redis), Ok(()));
        live.learn([redis]);
        assert_eq!(live.current().check(redis), Err(Denial::ProtectedService));
        // Any loopback address reaches a service listening on loopback.
        assert_eq!(
            live.current().check(other_loopback),
            Err(Denial::ProtectedService)
        );
        assert_eq!(live.current().check(web), Ok(()));
        live.learn(std::iter::empty::<SocketAddr>());
        assert_eq!(live.current().check(redis), Ok(()));
    }

    #[test]
    fn learning_keeps_the_base_rules_and_recompiles_only_on_change() {
        let live = LivePolicy::new(EgressPolicyConfig::default());
        let api: SocketAddr = "198.51.100.10:7070".parse().unwrap();
        live.learn([api]);
        let first = live.current();
        let smtp: SocketAddr = "93.184.215.14:25".parse().unwrap();
        assert_eq!(first.check(smtp), Err(Denial::Port(25)));
        live.learn([api]);
        assert!(Arc::ptr_eq(&first, &live.current()));
        live.learn([api, "198.51.100.11:7070".parse().unwrap()]);
        assert!(!Arc::ptr_eq(&first, &live.current()));
    }
}
