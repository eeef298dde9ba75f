//! Every tunnel open on this superproxy, so a revocation can cut what is open
//! and not only refuse what comes next.
//!
//! A tunnel registers the user it runs for (with a digest of the password
//! hash it was authenticated against), its exit, and its connection's cut
//! token; the [`Registration`] removes the entry when the tunnel ends.
//! [`OpenTunnels::cut_user_if`] and [`OpenTunnels::cut_exit`] cancel the
//! matching connections; their splices end at once and their bytes are
//! metered as usual.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What a tunnel was opened for, as far as revocation cares.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub username: String,
    /// SHA-256 of the password hash the user was verified against.
    pub credential_digest: [u8; 32],
    pub exit_id: Uuid,
    /// The allow-listed network that let the tunnel in (no credentials).
    pub network: Option<proxynet_common::egress::Cidr>,
    /// What a traffic-policy change is judged against.
    pub watch: PolicyWatch,
    /// The address the tunnel leaves from, and for whom: what a change of
    /// the exit's dedicated addresses is judged against (`None` for a
    /// client connection).
    pub egress: Option<TunnelEgress>,
    cut: CancellationToken,
}

/// A tunnel's egress address and whose tunnel it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TunnelEgress {
    pub account: Uuid,
    pub user: Uuid,
    pub ip: std::net::IpAddr,
    /// A UDP association's address of the other family, when it has one:
    /// it sends from that one too.
    pub other_ip: Option<std::net::IpAddr>,
    /// It asked for the account's dedicated addresses.
    pub dedicated: bool,
}

impl TunnelEgress {
    /// Whether the tunnel may no longer leave from its address, given the
    /// exit's dedicated addresses now: a dedicated tunnel whose account (or
    /// user) no longer holds it, or a shared tunnel on an address someone
    /// now holds.
    pub(crate) fn misplaced(&self, held: &[proxynet_store::Dedication]) -> bool {
        let misplaced = |ip: std::net::IpAddr| {
            if self.dedicated {
                !held
                    .iter()
                    .any(|d| d.serves(self.account, self.user) && d.address.contains(ip))
            } else {
                held.iter().any(|d| d.address.contains(ip))
            }
        };
        misplaced(self.ip) || self.other_ip.is_some_and(misplaced)
    }
}

/// What a traffic-policy change re-checks for an open entry.
#[derive(Debug, Clone)]
pub(crate) enum PolicyWatch {
    /// A client connection: nothing of its own.
    Nothing,
    /// A tunnel: its target's normalised host and port.
    Target(String, u16),
    /// A UDP association: each datagram is judged by the record it was
    /// admitted with, so any change to the user's or account's policy ends
    /// it (the client opens a new one under the new rules).
    Association(std::sync::Arc<proxynet_store::UserRecord>),
}

#[derive(Default)]
pub(crate) struct OpenTunnels {
    entries: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
}

/// Keeps a tunnel in the registry; dropping it removes the entry.
pub(crate) struct Registration {
    registry: Arc<OpenTunnels>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut entries) = self.registry.entries.lock() {
            entries.remove(&self.id);
        }
        crate::metrics::tunnels_active(-1);
    }
}

impl OpenTunnels {
    // Each argument is one field of the entry; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register(
        self: &Arc<Self>,
        username: &str,
        credential_digest: [u8; 32],
        exit_id: Uuid,
        network: Option<proxynet_common::egress::Cidr>,
        watch: PolicyWatch,
        egress: Option<TunnelEgress>,
        cut: CancellationToken,
    ) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(
                id,
                Entry {
                    username: username.to_owned(),
                    credential_digest,
                    exit_id,
                    network,
                    watch,
                    egress,
                    cut,
                },
            );
        }
        crate::metrics::tunnels_active(1);
        Registration {
            registry: self.clone(),
            id,
        }
    }

    /// Distinct usernames with at least one open tunnel here.
    pub(crate) fn usernames(&self) -> Vec<String> {
        let Ok(entries) = self.entries.lock() else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries.values().map(|e| e.username.clone()).collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Cuts the tunnels of `username` for which `revoked` says so; returns how many.
    pub(crate) fn cut_user_if(&self, username: &str, revoked: impl Fn(&Entry) -> bool) -> usize {
        self.cut_where(|e| e.username == username && revoked(e))
    }

    /// Cuts the allow-listed tunnels for which `gone(network, username)`
    /// says their network no longer admits their user; returns how many.
    pub(crate) fn cut_where_network(
        &self,
        gone: impl Fn(&proxynet_common::egress::Cidr, &str) -> bool,
    ) -> usize {
        self.cut_where(|e| e.network.as_ref().is_some_and(|n| gone(n, &e.username)))
    }

    /// Cuts the tunnels whose target `refused(host, port)` says a changed
    /// policy no longer permits; returns how many.
    pub(crate) fn cut_where_target(&self, refused: impl Fn(&str, u16) -> bool) -> usize {
        self.cut_where(|e| matches!(&e.watch, PolicyWatch::Target(h, p) if refused(h, *p)))
    }

    /// Cuts the tunnels through `exit_id` whose egress `misplaced` says may
    /// no longer leave from where they do (an address allocated or
    /// released); returns how many.
    pub(crate) fn cut_misplaced(
        &self,
        exit_id: Uuid,
        misplaced: impl Fn(&TunnelEgress) -> bool,
    ) -> usize {
        self.cut_where(|e| e.exit_id == exit_id && e.egress.as_ref().is_some_and(&misplaced))
    }

    /// Cuts every tunnel through `exit_id`; returns how many.
    pub(crate) fn cut_exit(&self, exit_id: Uuid) -> usize {
        self.cut_where(|e| e.exit_id == exit_id)
    }

    fn cut_where(&self, matches: impl Fn(&Entry) -> bool) -> usize {
        let Ok(entries) = self.entries.lock() else {
            return 0;
        };
        let mut cut = 0;
        for entry in entries.values().filter(|e| matches(e)) {
            entry.cut.cancel();
            cut += 1;
        }
        if cut > 0 {
            crate::metrics::revoked(cut, "revocation");
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_what_matches_and_forgets_ended_tunnels() {
        let registry = Arc::new(OpenTunnels::default());
        let exit = Uuid::new_v4();
        let (a, b) = (CancellationToken::new(), CancellationToken::new());
        let ra = registry.register(
            "alice",
            [1; 32],
            exit,
            None,
            PolicyWatch::Nothing,
            None,
            a.clone(),
        );
        let net: proxynet_common::egress::Cidr = "192.0.2.0/24".parse().unwrap();
        let _rb = registry.register(
            "bob",
            [2; 32],
            Uuid::new_v4(),
            Some(net),
            PolicyWatch::Nothing,
            None,
            b.clone(),
        );
        assert_eq!(registry.cut_where_network(|_, user| user != "bob"), 0);
        assert_eq!(registry.usernames(), vec!["alice", "bob"]);
        assert_eq!(
            registry.cut_user_if("alice", |e| e.credential_digest != [1; 32]),
            0
        );
        assert_eq!(registry.cut_user_if("alice", |_| true), 1);
        assert!(a.is_cancelled() && !b.is_cancelled());
        drop(ra);
        assert_eq!(registry.cut_exit(exit), 0);
        assert_eq!(registry.entries.lock().unwrap().len(), 1);
        assert_eq!(registry.cut_where_network(|n, _| *n == net), 1);
        assert!(b.is_cancelled());
    }
}
