//! Revocation that cuts what is open: a user disabled, deleted or given a new
//! password loses its open tunnels on this superproxy, not only new ones.
//!
//! Two paths, so a lost change event only delays a cut: the control-api's
//! `user:NAME` event re-checks that user at once ([`Revoker::user_changed`]),
//! and a sweep every `interval` re-checks every user with a tunnel open here
//! ([`Revoker::run_sweep`]). A tunnel is cut when its user's record is gone,
//! disabled, or carries a different password hash than the one the tunnel was
//! authenticated against. Worst case: `interval` plus one Redis round trip.
//! A key that is simply missing is not a revocation (a deleted user leaves a
//! tombstone): a Redis that restarted empty must not cut every tunnel before
//! the control-api has re-projected.

use proxynet_common::tasks::Stop;
use std::sync::Arc;
use std::time::Duration;

use crate::credentials::Authenticator;
use crate::open_tunnels::{OpenTunnels, PolicyWatch};
use proxynet_store::UserEntry;
use sha2::{Digest, Sha256};

pub(crate) struct Revoker {
    pub auth: Authenticator,
    pub open_tunnels: Arc<OpenTunnels>,
}

impl Revoker {
    /// Drops the cached record and cuts the user's tunnels that it no longer allows.
    pub(crate) async fn user_changed(&self, username: &str) {
        self.auth.invalidate(username);
        self.revalidate(username).await;
    }

    async fn revalidate(&self, username: &str) {
        let entry = match self.auth.fresh_entry(username).await {
            Ok(entry) => entry,
            // Redis cannot say: keep what is open (the sweep retries).
            Err(e) => {
                tracing::debug!(error = %e, "cannot re-check a user's tunnels right now");
                return;
            }
        };
        let cut = match entry {
            UserEntry::Present(r) if r.enabled => {
                let current: [u8; 32] = Sha256::digest(r.password_hash.as_bytes()).into();
                // A changed traffic policy cuts what it now refuses: a
                // tunnel's target, or an association admitted under other
                // rules (its datagrams were judged by those).
                let policy_refuses = |watch: &PolicyWatch| match watch {
                    PolicyWatch::Nothing => false,
                    PolicyWatch::Target(host, _) => crate::pipeline::customer_refuses(&r, host),
                    PolicyWatch::Association(admitted) => {
                        admitted.policy != r.policy || admitted.account_policy != r.account_policy
                    }
                };
                self.open_tunnels.cut_user_if(username, |e| {
                    e.credential_digest != current || policy_refuses(&e.watch)
                })
            }
            UserEntry::Present(_) | UserEntry::Deleted => {
                self.open_tunnels.cut_user_if(username, |_| true)
            }
            UserEntry::Absent => 0,
        };
        if cut > 0 {
            tracing::info!(
                user = username,
                tunnels = cut,
                "user revoked or re-keyed; open tunnels cut"
            );
        }
    }

    /// Re-checks every user with an open tunnel here, every `interval`.
    pub(crate) async fn run_sweep(self: Arc<Self>, interval: Duration, stop: Stop) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            for username in self.open_tunnels.usernames() {
                self.revalidate(&username).await;
            }
        }
    }
}
