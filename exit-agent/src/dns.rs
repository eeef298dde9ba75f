//! Name resolution at the exit: asynchronous (hickory), bounded in
//! concurrency and in time, so a flood of slow names can neither exhaust
//! blocking threads nor hold tunnels past their connect budget.
//!
//! Uses the host's resolver configuration (`/etc/resolv.conf`, `/etc/hosts`),
//! or the name servers given with `--dns-server` (a local resolver of the
//! operator's, or a test's own DNS server); if the host's configuration
//! cannot be read, falls back to the system resolver, still bounded.
//!
//! Every name is resolved once per tunnel and the tunnel connects to an
//! address of that answer that the egress policy vetted (`tunnel.rs`): a
//! name that answers differently the next time (DNS rebinding) never
//! reaches the second answer.

use hickory_resolver::TokioResolver;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Why a name gave no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DnsFailure {
    /// No answer in time (or no free resolver slot in time).
    TimedOut,
    /// The name does not exist or has no address.
    NoAddress,
}

pub(crate) struct Dns {
    resolver: Option<TokioResolver>,
    permits: Semaphore,
    timeout: Duration,
}

impl Dns {
    /// A resolver of the host's configuration, or of `servers` when given.
    pub(crate) fn new(max_in_flight: usize, timeout: Duration, servers: &[SocketAddr]) -> Self {
        let builder = if servers.is_empty() {
            TokioResolver::builder_tokio()
        } else {
            let name_servers = servers
                .iter()
                .map(|addr| {
                    let mut server =
                        hickory_resolver::config::NameServerConfig::udp_and_tcp(addr.ip());
                    for connection in &mut server.connections {
                        connection.port = addr.port();
                    }
                    server
                })
                .collect();
            Ok(TokioResolver::builder_with_config(
                hickory_resolver::config::ResolverConfig::from_name_servers(name_servers),
                hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
            ))
        };
        let resolver = match builder.and_then(|mut builder| {
            // Our own deadline bounds each lookup; one attempt per server keeps
            // the resolver from outliving it.
            builder.options_mut().timeout = timeout;
            builder.options_mut().attempts = 1;
            builder.build()
        }) {
            Ok(resolver) => Some(resolver),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the resolver configuration; using the system resolver");
                None
            }
        };
        Self {
            resolver,
            permits: Semaphore::new(max_in_flight.max(1)),
            timeout,
        }
    }

    /// Every address of `host`, at most until `deadline` (and our own timeout).
    pub(crate) async fn resolve(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<Vec<SocketAddr>, DnsFailure> {
        let deadline = deadline.min(Instant::now() + self.timeout);
        let lookup = async {
            let _permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| DnsFailure::TimedOut)?;
            let addrs: Vec<SocketAddr> = match &self.resolver {
                Some(resolver) => resolver
                    .lookup_ip(host)
                    .await
                    .map_err(|_| DnsFailure::NoAddress)?
                    .iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect(),
                None => tokio::net::lookup_host((host, port))
                    .await
                    .map_err(|_| DnsFailure::NoAddress)?
                    .collect(),
            };
            if addrs.is_empty() {
                Err(DnsFailure::NoAddress)
            } else {
                Ok(addrs)
            }
        };
        tokio::time::timeout_at(deadline, lookup)
            .await
            .unwrap_or(Err(DnsFailure::TimedOut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(max_in_flight: usize, timeout: Duration) -> Dns {
        let server: SocketAddr = "127.0.0.1:53".parse().unwrap();
        Dns::new(max_in_flight, timeout, &[server])
    }

    #[tokio::test]
    async fn a_lookup_waiting_for_a_slot_past_its_deadline_times_out() {
        let dns = dns(1, Duration::from_secs(30));
        let _busy = dns.permits.acquire().await.unwrap();
        let started = Instant::now();
        let deadline = Instant::now() + Duration::from_millis(50);
        let result = dns.resolve("example.com", 443, deadline).await;
        assert_eq!(result, Err(DnsFailure::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn the_resolvers_own_timeout_bounds_a_later_deadline() {
        let dns = dns(1, Duration::from_millis(50));
        let _busy = dns.permits.acquire().await.unwrap();
        let started = Instant::now();
        let far = Instant::now() + Duration::from_secs(60);
        let result = dns.resolve("example.com", 443, far).await;
        assert_eq!(result, Err(DnsFailure::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_zero_concurrency_bound_still_allows_one_lookup_at_a_time() {
        assert_eq!(
            dns(0, Duration::from_secs(1)).permits.available_permits(),
            1
        );
    }
}
