//! How an association resolves destination names: through the agent's
//! resolver ([`Resolve`], a table in tests), and a small per-association
//! cache bounded in count and in age, failures kept briefly too.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;
use tokio::time::Instant;

use crate::dns::{Dns, DnsFailure};

/// Names one association keeps resolved: enough for any real client,
/// small enough that a client spraying names cannot grow it.
pub(super) const MAX_NAMES: usize = 256;
/// How long a resolved name is reused: a game sending 1000 datagrams a
/// second to one name must not cost 1000 lookups a second.
const NAME_TTL: Duration = Duration::from_secs(30);
/// A name that did not resolve is retried sooner, but not per datagram (each
/// failed lookup stalls the association up to the resolver's timeout).
const FAILED_NAME_TTL: Duration = Duration::from_secs(5);

/// How the relay resolves names (the agent's [`Dns`]; a table in tests).
pub(crate) trait Resolve {
    /// Every address of `host`, within the resolver's own time limit.
    fn lookup(&self, host: &str) -> impl Future<Output = Result<Vec<IpAddr>, DnsFailure>> + Send;
}

impl Resolve for Dns {
    async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, DnsFailure> {
        // The resolver bounds each lookup by its own timeout; there is no
        // connect budget to fit in.
        let deadline = Instant::now() + Duration::from_secs(60);
        let resolved = self.resolve(host, 0, deadline).await;
        metrics::counter!("proxynet_agent_dns_lookups_total", "result" => match &resolved {
            Ok(_) => "ok",
            Err(DnsFailure::TimedOut) => "timed_out",
            Err(DnsFailure::NoAddress) => "no_address",
        })
        .increment(1);
        resolved.map(|addrs| addrs.into_iter().map(|a| a.ip()).collect())
    }
}

pub(super) struct CachedName {
    answer: Result<Vec<IpAddr>, DnsFailure>,
    expires: Instant,
}

/// Names resolved for this association, bounded in count and in age.
pub(super) struct NameCache {
    pub(super) entries: HashMap<String, CachedName>,
}

impl NameCache {
    pub(super) fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    /// The addresses of `name`, from the cache while fresh, else from
    /// `resolver`; `None` when it does not resolve.
    pub(super) async fn lookup<R: Resolve>(
        &mut self,
        resolver: &R,
        name: &str,
    ) -> Option<&[IpAddr]> {
        let now = Instant::now();
        let fresh = self.entries.get(name).is_some_and(|e| e.expires > now);
        if !fresh {
            let answer = resolver.lookup(name).await;
            let ttl = if answer.is_ok() {
                NAME_TTL
            } else {
                FAILED_NAME_TTL
            };
            let now = Instant::now();
            if self.entries.len() >= MAX_NAMES && !self.entries.contains_key(name) {
                self.entries.retain(|_, e| e.expires > now);
                if self.entries.len() >= MAX_NAMES {
                    let soonest = self
                        .entries
                        .iter()
                        .min_by_key(|(_, e)| e.expires)
                        .map(|(name, _)| name.clone());
                    if let Some(soonest) = soonest {
                        self.entries.remove(&soonest);
                    }
                }
            }
            self.entries.insert(
                name.to_owned(),
                CachedName {
                    answer,
                    expires: now + ttl,
                },
            );
        }
        self.entries
            .get(name)
            .and_then(|e| e.answer.as_deref().ok())
    }
}
