//! IP allow-list login: a request that carries no proxy credentials, from a
//! source address inside a user's allow-listed CIDR, is that user — with its
//! limits, quotas and billing — and its targeting comes from the user's
//! `allowlist_options` (username grammar). Credentials, when present, win.
//!
//! The CIDR → username map is projected by the control-api into one Redis
//! hash; this module keeps a copy, re-read on the `allowlist` change event
//! and every `interval` (so a change reaches every superproxy within it even
//! if the event is lost). CIDRs never overlap across users (the database
//! refuses it), so the first match is the only match; entries are checked
//! longest prefix first anyway. A lookup is a scan of the list: fine for the
//! thousands of networks customers allow-list; a prefix trie is the next
//! step if that grows.
//!
//! A tunnel let in by a network remembers it; when a refresh no longer maps
//! that network to the tunnel's user (removed, given to nobody, the user
//! disabled), the tunnel is cut: within `allowlist_refresh_ms` at worst,
//! at once on the change event.

use proxynet_common::egress::Cidr;
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use redis::AsyncCommands;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub(crate) struct Allowlist {
    redis: RedisConnection,
    keys: Keys,
    entries: RwLock<Arc<Vec<(Cidr, String)>>>,
    open_tunnels: Arc<crate::open_tunnels::OpenTunnels>,
}

impl Allowlist {
    pub(crate) fn new(
        redis: RedisConnection,
        keys: Keys,
        open_tunnels: Arc<crate::open_tunnels::OpenTunnels>,
    ) -> Self {
        Self {
            redis,
            keys,
            entries: RwLock::new(Arc::new(Vec::new())),
            open_tunnels,
        }
    }

    /// The allow-listed network containing `ip` and the user it belongs to.
    pub(crate) fn lookup(&self, ip: IpAddr) -> Option<(Cidr, String)> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let entries = self.entries.read().ok()?.clone();
        entries.iter().find(|(cidr, _)| cidr.contains(ip)).cloned()
    }

    /// Re-reads the map; on failure the last one stays in use.
    pub(crate) async fn refresh(&self) {
        let mut redis = self.redis.clone();
        let map: Result<HashMap<String, String>, _> = redis.hgetall(self.keys.allowlist()).await;
        // An empty map from a Redis that lost the projection (restarted
        // empty, flushed) proves nothing: keep what we know, cut nothing,
        // until the control-api has projected again.
        if matches!(&map, Ok(m) if m.is_empty()) {
            let projected: Result<bool, _> = redis.exists(self.keys.exits_projected()).await;
            if !projected.unwrap_or(false) {
                tracing::debug!(
                    "allow-list empty and the projection not rebuilt yet; keeping the last one"
                );
                return;
            }
        }
        match map {
            Ok(map) => {
                let mut entries: Vec<(Cidr, String)> = map
                    .into_iter()
                    .filter_map(|(cidr, user)| Some((cidr.parse().ok()?, user)))
                    .collect();
                entries.sort_by_key(|(cidr, _)| std::cmp::Reverse(cidr.prefix_len()));
                let entries = Arc::new(entries);
                if let Ok(mut current) = self.entries.write() {
                    *current = entries.clone();
                }
                // Tunnels whose network no longer lets their user in end now.
                let current: std::collections::HashSet<(String, &str)> = entries
                    .iter()
                    .map(|(c, u)| (c.to_string(), u.as_str()))
                    .collect();
                let cut = self.open_tunnels.cut_where_network(|network, user| {
                    !current.contains(&(network.to_string(), user))
                });
                if cut > 0 {
                    tracing::info!(
                        tunnels = cut,
                        "allow-listed network removed; its tunnels cut"
                    );
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "allow-list refresh failed; keeping the last one")
            }
        }
    }

    pub(crate) async fn run(self: Arc<Self>, interval: Duration, stop: Stop) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.refresh().await;
        }
    }
}
