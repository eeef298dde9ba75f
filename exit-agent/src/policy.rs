//! The agent's egress policy, kept current: besides its own configuration it
//! protects every address the control plane reports as part of the stack —
//! each superproxy's listeners, the control-api and its stores — so those are
//! denied when a tunnel names them by hostname (`localhost`, a name that
//! resolves to them) just as when it names them literally.

use proxynet_common::egress::{Cidr, EgressPolicy, EgressPolicyConfig};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

pub(crate) struct LivePolicy {
    base: EgressPolicyConfig,
    learned: RwLock<BTreeSet<SocketAddr>>,
    current: RwLock<Arc<EgressPolicy>>,
}

impl LivePolicy {
    pub(crate) fn new(base: EgressPolicyConfig) -> Self {
        let current = Arc::new(EgressPolicy::new(base.clone()));
        Self {
            base,
            learned: RwLock::new(BTreeSet::new()),
            current: RwLock::new(current),
        }
    }

    pub(crate) fn current(&self) -> Arc<EgressPolicy> {
        self.current
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|_| Arc::new(EgressPolicy::new(self.base.clone())))
    }

    /// Replaces the addresses learned from the control plane; recompiles the
    /// policy only when they changed.
    pub(crate) fn learn(&self, addrs: impl IntoIterator<Item = SocketAddr>) {
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

/// Denies the exit's own egress addresses as destinations. A prefix is
/// routed to this host itself (`ip -6 route add local PREFIX dev lo`), so
/// every address in it reaches this host's services listening on `[::]` —
/// and those addresses are on no interface, so the check for services on
/// the host's own addresses would not see them.
pub(crate) fn deny_own_egress(
    mut policy: EgressPolicyConfig,
    config: &crate::config::Config,
) -> EgressPolicyConfig {
    let own_ips = config.egress_ips.iter().filter_map(|ip| {
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        format!("{ip}/{bits}").parse::<Cidr>().ok()
    });
    policy.deny.extend(own_ips);
    policy.deny.extend(config.egress_prefixes.iter().copied());
    policy
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_exits_own_egress_addresses_and_prefixes_are_never_destinations() {
        use clap::Parser;
        let config = crate::config::Config::try_parse_from([
            "exit-agent",
            "--control-api",
            "https://control.example",
            "--egress-ip",
            "1.2.3.4",
            "--egress-prefix",
            "2a00:1450:7::/64",
        ])
        .unwrap();
        let policy = EgressPolicy::new(deny_own_egress(EgressPolicyConfig::default(), &config));
        for denied in [
            "198.51.100.7:22",
            "[2001:db8:7::1]:22",
            "[2001:db8:7::ffff]:53",
        ] {
            assert!(policy.check(denied.parse().unwrap()).is_err(), "{denied}");
        }
        assert!(policy.check("1.2.3.5:443".parse().unwrap()).is_ok());
        assert!(policy
            .check("[2a00:1450:8::1]:443".parse().unwrap())
            .is_ok());
    }

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
