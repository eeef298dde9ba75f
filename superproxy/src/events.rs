//! Listens for change events from the control plane (`user:NAME`,
//! `exit:ID`, `allowlist`, `policy`) so caches drop stale
//! entries at once instead of when their TTL runs out, and for the fleet's
//! site cooldowns (`cool:…`, `uncool:…`, from superproxies and the
//! control-api) and the accounts' own (`acool:…`, `auncool:…`, from
//! customers' reports), applied from the payload alone. Losing events only
//! delays a change to the cache TTL (the cooldowns: to their resync, which
//! also runs at each subscription); the subscription reconnects on its own
//! (on a cluster, to the next seed node: pub/sub is cluster-wide).

use futures_util::StreamExt;
use proxynet_common::tasks::Stop;
use std::sync::Arc;
use std::time::Duration;

use proxynet_store::redis_target::RedisTarget;
use proxynet_store::site_cooldowns::{AccountAnnouncement, Announcement};

use crate::revocation::Revoker;
use crate::select::Pool;

/// How often the subscription's connection is checked, and how long a PING
/// may go unanswered before it is given up.
const PING_EVERY: Duration = Duration::from_secs(5);
const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// What each kind of event refreshes.
pub(crate) struct Listeners {
    pub revoker: Arc<Revoker>,
    pub pool: Arc<Pool>,
    pub allowlist: Arc<crate::allowlist::Allowlist>,
    pub operator_policy: Arc<crate::operator_policy::OperatorRules>,
    pub sites: Arc<crate::sites::SiteBook>,
}

pub(crate) async fn run(mut redis: RedisTarget, channel: String, listeners: Listeners, stop: Stop) {
    stop.run_until_cancelled(follow(&mut redis, &channel, &listeners))
        .await;
}

/// Follows the change events for ever, resubscribing when the subscription
/// is lost.
async fn follow(redis: &mut RedisTarget, channel: &str, listeners: &Listeners) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match redis.subscribe(channel).await {
            Ok(pubsub) => {
                backoff = Duration::from_millis(100);
                // Announcements made while unsubscribed are lost: read the
                // cooldowns whole (in the background; events flow meanwhile).
                let sites = listeners.sites.clone();
                tokio::spawn(async move { sites.resync().await });
                let (mut sink, mut messages) = pubsub.split();
                // A node that vanishes without closing the connection (a
                // partition, a dead host) would leave us waiting forever for
                // events that never come: a PING unanswered for PING_TIMEOUT
                // moves the subscription (on a cluster, to the next seed).
                let mut ping = tokio::time::interval(PING_EVERY);
                ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        msg = messages.next() => {
                            let Some(msg) = msg else { break };
                            let Ok(payload) = msg.get_payload::<String>() else {
                                continue;
                            };
                            if let Some(username) = payload.strip_prefix("user:") {
                                listeners.revoker.user_changed(username).await;
                            } else if payload.starts_with("exit:") {
                                listeners.pool.refresh().await;
                            } else if payload == "allowlist" {
                                listeners.allowlist.refresh().await;
                            } else if payload == "policy" {
                                listeners.operator_policy.refresh().await;
                            } else if let Some(announcement) = Announcement::parse(&payload) {
                                listeners.sites.apply(announcement);
                            } else if let Some(announcement) = AccountAnnouncement::parse(&payload) {
                                listeners.sites.apply_account(announcement);
                            }
                        }
                        _ = ping.tick() => {
                            let answered = tokio::time::timeout(PING_TIMEOUT, sink.ping::<redis::Value>()).await;
                            if !matches!(answered, Ok(Ok(_))) {
                                break;
                            }
                        }
                    }
                }
                tracing::warn!("change-event subscription lost; reconnecting");
            }
            Err(e) => tracing::debug!(error = %e, "change-event subscription failed; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
