//! Choosing the exit: the pool of exits this superproxy can route through,
//! the choice among them, and the session pins that keep a choice.
//!
//! The room, a file per job: this file the pool and its upkeep; [`view`]
//! the immutable snapshot, the power-of-two choice and the targeting match;
//! [`sync`] the Redis reads; [`candidates`] one tunnel's ordered candidates;
//! [`sticky`] the session policy (pin first, re-pin, keep the IP);
//! [`sessions`] the pins in Redis; [`egress_ip`] the egress address for a
//! target (an egress IP, or an address drawn from an egress prefix).
//!
//! An exit is eligible when its agent heartbeats (Redis live set), it is neither
//! draining (its agent said so, or an operator) nor disabled, and it has a
//! link to this superproxy. The view is published as an immutable snapshot,
//! so picking an exit takes no lock beyond one `Arc` clone. When Redis is
//! unreachable the last known view stays in use (degraded).
//!
//! Keeping it current costs O(changes), not O(exits): the pool is read in
//! full once, then follows the exit change stream ([`POOL_DELTA_SCRIPT`]:
//! one round trip returning only the exits that changed or expired since the
//! last read). A superproxy that fell further behind than the stream keeps
//! (or a Redis that restarted) reads the pool in full again. The view is
//! rebuilt when something changed, a link came or went, or a consent runs out
//! (at the earliest expiry among linked exits, so an expiry is acted on
//! within a second).
//!
//! **The data plane outlives the control plane.** Liveness in Redis is
//! written by the control-api's heartbeat handler. When the control plane
//! falls silent (its presence key lapses: every instance is down, stopped
//! or cut off), exits that were live then and whose liveness lapses since
//! stay eligible for `control_plane_grace` as long as this superproxy holds
//! a live link to them that passes its probes: the link and the probes are
//! the data plane's own evidence that the exit is there. An exit whose
//! liveness had lapsed before (its agent stopped beating while the control
//! plane took heartbeats: a hung control connection, a withdrawn host) was
//! out for a reason the control plane saw, and the outage does not bring it
//! back, link or no link. Everything else the control plane decided and
//! this instance knows (disabled, drained, consent, provenance) keeps
//! applying. Provenance blocks, and the cuts they cause, are judged over
//! every linked exit, live or not.
//!
//! The same evidence bridges a store that lost its liveness (a Redis that
//! restarted empty, a flush): the control-api re-projects the records
//! within a second, but the live set only refills as agents beat again. An
//! exit that was live before such a full read and is not in it stays
//! eligible for [`RESET_HOLD`] while its link is up and passes its probes,
//! or until its liveness comes back (or lapses again, which is then news).

mod candidates;
pub(crate) mod cooling;
mod egress_ip;
mod known;
pub(crate) mod sessions;
mod sticky;
mod sync;
#[cfg(test)]
pub(crate) mod test_support;
mod view;

pub(crate) use candidates::Candidates;
pub(crate) use egress_ip::{egress_ip_for, egress_ip_of_family};
pub(crate) use sticky::Sticky;
use sync::*;
pub use view::*;

use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{
    ExitRecord, Keys, ProvenanceBlock, LIVE_AND_DRAINING_SCRIPT, POOL_DELTA_SCRIPT,
};
use rand::Rng;
use redis::AsyncCommands;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

use crate::health::HealthBook;
use crate::link::registry::{Link, LinkRegistry};
use crate::open_tunnels::OpenTunnels;
use cooling::SiteCooling;
use known::Known;
use proxynet_wire::username::Targeting;

pub(crate) struct Pool {
    health: Arc<HealthBook>,
    open_tunnels: Arc<OpenTunnels>,
    /// Exits blocked by provenance in the last two rebuilds, so a newly
    /// blocked exit's tunnels are cut once more after a racing open.
    recently_blocked: std::sync::Mutex<[HashSet<Uuid>; 2]>,
    /// Linked exits' dedicated addresses at the last rebuild.
    dedications: std::sync::Mutex<HashMap<Uuid, Vec<proxynet_store::Dedication>>>,
    /// Whether any linked exit has a dedicated address: while none has, a
    /// shared tunnel skips the check at registration (one atomic load).
    any_dedicated: std::sync::atomic::AtomicBool,
    /// Whether any linked exit was blocked for provenance at the last
    /// rebuild (set before its cut): while none was, a tunnel skips the
    /// check at registration (one atomic load).
    any_blocked: std::sync::atomic::AtomicBool,
    redis: RedisConnection,
    keys: Keys,
    registry: Arc<LinkRegistry>,
    view: RwLock<Arc<PoolView>>,
    /// Last records read from Redis, kept for degraded operation.
    known: RwLock<Known>,
    /// Serialises refreshes (timer and change events).
    refreshing: tokio::sync::Mutex<()>,
    last_rebuild: std::sync::Mutex<Instant>,
    /// How long probed links keep exits eligible while the control plane is silent.
    control_plane_grace: Duration,
    /// The earliest consent expiry ahead among linked exits: a rebuild is due then.
    next_expiry: std::sync::Mutex<Option<Instant>>,
    expiry_changed: tokio::sync::Notify,
}

/// Changes applied per delta read at most; more wait for the next read.
const DELTA_BATCH: usize = 10_000;

/// Rebuilds happen on change; this bounds how stale a time-based block
/// (a consent that expires) can get if nothing else changes.
const REBUILD_AT_LEAST_EVERY: Duration = Duration::from_secs(5);

impl Pool {
    pub(crate) fn new(
        redis: RedisConnection,
        keys: Keys,
        registry: Arc<LinkRegistry>,
        health: Arc<HealthBook>,
        open_tunnels: Arc<OpenTunnels>,
        control_plane_grace: Duration,
    ) -> Self {
        Self {
            control_plane_grace,
            next_expiry: std::sync::Mutex::new(None),
            expiry_changed: tokio::sync::Notify::new(),
            health,
            open_tunnels,
            recently_blocked: std::sync::Mutex::new([HashSet::new(), HashSet::new()]),
            dedications: std::sync::Mutex::default(),
            any_dedicated: std::sync::atomic::AtomicBool::new(false),
            any_blocked: std::sync::atomic::AtomicBool::new(false),
            redis,
            keys,
            registry,
            view: RwLock::new(Arc::new(PoolView::default())),
            known: RwLock::new(Known::default()),
            refreshing: tokio::sync::Mutex::new(()),
            last_rebuild: std::sync::Mutex::new(Instant::now()),
        }
    }

    pub(crate) fn view(&self) -> Arc<PoolView> {
        self.view.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// Whether exit `id` is eligible in the view published now.
    pub(crate) fn still_eligible(&self, id: &Uuid) -> bool {
        self.view
            .read()
            .is_ok_and(|view| view.index.contains_key(id))
    }

    /// Whether exit `id` is blocked for provenance now (consent revoked or
    /// expired, a withdrawal), as its last record read says: its open
    /// tunnels are cut ([`Pool::cut_newly_blocked`]), and a tunnel that
    /// registered after that cut checks itself.
    /// Until a rebuild has seen a linked exit blocked, nothing was cut and
    /// the record is not read: an exit blocked since is cut by that rebuild.
    pub(crate) fn barred(&self, id: &Uuid) -> bool {
        if !self.any_blocked.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.record(id)
            .is_some_and(|r| r.provenance_block(now_ms).is_some())
    }

    /// Picks an exit matching `targeting`, skipping `tried` (see [`choose`]).
    pub(crate) fn pick(&self, tried: &[Uuid], targeting: &Targeting) -> Option<Candidate> {
        choose(&self.view(), &self.health, tried, targeting)
    }

    /// The last record read for exit `id`, eligible or not (a session's
    /// lost exit is usually not).
    /// The exit's dedicated addresses as known now, when a tunnel through
    /// it must be checked against them: `None` (nothing to check) while no
    /// linked exit has any and the tunnel is a shared one.
    pub(crate) fn dedications_to_check(
        &self,
        id: &Uuid,
        dedicated_tunnel: bool,
    ) -> Option<Arc<ExitRecord>> {
        if !dedicated_tunnel
            && !self
                .any_dedicated
                .load(std::sync::atomic::Ordering::Acquire)
        {
            return None;
        }
        self.record(id)
    }

    pub(crate) fn record(&self, id: &Uuid) -> Option<Arc<ExitRecord>> {
        self.known.read().ok()?.records.get(id).cloned()
    }

    pub(crate) fn health(&self) -> &Arc<HealthBook> {
        &self.health
    }

    /// Revoked or expired consent (or a withdrawal) cuts the exit's open
    /// tunnels, not only its next ones: those newly blocked in this rebuild
    /// or the one before (a tunnel opening while the block arrived is caught
    /// by the second round).
    fn cut_newly_blocked(&self, blocked: &[(Arc<ExitRecord>, ProvenanceBlock)]) {
        let now: HashSet<Uuid> = blocked.iter().map(|(r, _)| r.id).collect();
        let Ok(mut rounds) = self.recently_blocked.lock() else {
            return;
        };
        let [before_last, last] = &*rounds;
        for id in &now {
            // Cut unless it was already blocked in both earlier rounds (then
            // both cut it). Checking only the older round missed an exit
            // blocked, unblocked and blocked again within three rebuilds
            // (rebuilds happen on change, so that can take minutes).
            if !last.contains(id) || !before_last.contains(id) {
                let cut = self.open_tunnels.cut_exit(*id);
                if cut > 0 {
                    tracing::info!(exit = %id, tunnels = cut, "exit lost its provenance or consent; open tunnels cut");
                }
            }
        }
        let last = last.clone();
        *rounds = [last, now];
    }

    /// An address allocated to an account (or released, or moved) cuts the
    /// open tunnels that may no longer leave from it: another account's, a
    /// shared tunnel's, or a dedicated tunnel's whose account (or user) no
    /// longer holds it. Only exits whose dedicated addresses changed since
    /// the last rebuild are looked at.
    fn cut_misplaced(&self, now: HashMap<Uuid, Vec<proxynet_store::Dedication>>) {
        // Before the cut: a tunnel registering after it then checks itself.
        self.any_dedicated
            .store(!now.is_empty(), std::sync::atomic::Ordering::Release);
        let Ok(mut last) = self.dedications.lock() else {
            return;
        };
        if now.is_empty() && last.is_empty() {
            return;
        }
        let changed: HashSet<Uuid> = now
            .keys()
            .chain(last.keys())
            .filter(|id| now.get(*id) != last.get(*id))
            .copied()
            .collect();
        for id in changed {
            let held = now.get(&id).map(Vec::as_slice).unwrap_or_default();
            let cut = self
                .open_tunnels
                .cut_misplaced(id, |egress| egress.misplaced(held));
            if cut > 0 {
                tracing::info!(exit = %id, tunnels = cut, "dedicated addresses changed; tunnels that may no longer leave from theirs cut");
            }
        }
        *last = now;
    }

    /// Keeps the view current until `stop`: on every refresh,
    /// every link change, and at the earliest consent expiry ahead.
    pub(crate) async fn run(self: Arc<Self>, period: Duration, stop: Stop) {
        let mut links_changed = self.registry.subscribe();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let expiry = self.next_expiry.lock().ok().and_then(|e| *e);
            let at_expiry = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => self.refresh().await,
                changed = links_changed.changed() => {
                    if changed.is_err() { return; }
                    self.fetch_missing_records().await;
                    self.rebuild();
                }
                () = at_expiry => self.rebuild(),
                () = self.expiry_changed.notified() => {}
            }
        }
    }

    /// Reads what changed in Redis (everything, the first time) and rebuilds
    /// the view if anything did. Refreshes run one at a time: a change event
    /// arriving during the timer's read waits for it, then reads on from it.
    pub(crate) async fn refresh(&self) {
        let _one_at_a_time = self.refreshing.lock().await;
        let (cursor, read_at_ms, was_degraded) = match self.known.read() {
            Ok(k) => (k.cursor.clone(), k.read_at_ms, k.degraded),
            Err(_) => return,
        };
        let read = match cursor {
            Some(cursor) => {
                match self.read_delta(&cursor, read_at_ms).await {
                    Ok(None) => {
                        tracing::info!("exit change stream no longer holds our place; reading the pool in full");
                        self.read_full().await
                    }
                    Ok(Some(delta)) => Ok(delta),
                    Err(e) => Err(ReadError::Redis(e)),
                }
            }
            None => self.read_full().await,
        };
        let changed = match read {
            Ok(read) => self.apply(read),
            Err(e) => {
                match &e {
                    ReadError::Redis(e) => {
                        crate::metrics::store_error("redis", "pool_refresh");
                        tracing::warn!(error = %e, "pool refresh failed; routing on the last known pool");
                    }
                    ReadError::NotProjected if !was_degraded => {
                        tracing::info!("redis holds no complete projection yet; routing on the last known pool");
                    }
                    ReadError::NotProjected => {}
                }
                if let Ok(mut known) = self.known.write() {
                    known.degraded = true;
                }
                !was_degraded
            }
        };
        let stale = self
            .last_rebuild
            .lock()
            .map(|t| t.elapsed() >= REBUILD_AT_LEAST_EVERY)
            .unwrap_or(true);
        if changed || stale {
            self.rebuild();
        }
    }

    /// Reads the records of linked exits this instance has none of (one that
    /// linked after the last full read, while its heartbeats lapse): the
    /// grace and the provenance cuts need them.
    async fn fetch_missing_records(&self) {
        let missing: Vec<Uuid> = {
            let Ok(known) = self.known.read() else { return };
            self.registry
                .snapshot()
                .into_keys()
                .filter(|id| !known.records.contains_key(id))
                .collect()
        };
        if missing.is_empty() {
            return;
        }
        let keys: Vec<String> = missing.iter().map(|id| self.keys.exit(*id)).collect();
        let mut redis = self.redis.clone();
        let values: Result<Vec<Option<String>>, _> =
            redis::cmd("MGET").arg(&keys).query_async(&mut redis).await;
        let Ok(values) = values else { return };
        if let Ok(mut known) = self.known.write() {
            for json in values.into_iter().flatten() {
                if let Ok(record) = serde_json::from_str::<ExitRecord>(&json) {
                    known.records.insert(record.id, Arc::new(record));
                }
            }
        }
    }

    /// Applies a read; true if the pool changed.
    fn apply(&self, read: Read) -> bool {
        match self.known.write() {
            Ok(mut known) => known.apply(read),
            Err(_) => false,
        }
    }

    /// A live, linked exit blocked by provenance that would match
    /// `targeting`: the reason class a 503 names.
    pub(crate) fn blocked_match(&self, targeting: &Targeting) -> Option<ProvenanceBlock> {
        self.view()
            .blocked
            .iter()
            .find(|(record, _)| matches(record, targeting))
            .map(|(_, why)| *why)
    }

    fn rebuild(&self) {
        if let Ok(mut at) = self.last_rebuild.lock() {
            *at = Instant::now();
        }
        let links = self.registry.snapshot();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let now = Instant::now();
        let mut blocked = Vec::new();
        let mut next_expiry_ms: Option<i64> = None;
        let mut held_by_links = 0;
        let mut dedications = HashMap::new();
        let (eligible, live, degraded, silent_since) = match self.known.read() {
            Ok(known) => {
                let mut eligible = Vec::new();
                // Every linked exit with a record: provenance is judged for
                // all of them (a block cuts tunnels through any linked exit),
                // eligibility only for the live ones.
                for (id, link) in &links {
                    let Some(record) = known.records.get(id) else {
                        continue;
                    };
                    if !record.dedicated.is_empty() {
                        dedications.insert(*id, record.dedicated.clone());
                    }
                    if let Some(at) = record.consent_expires_at_ms.filter(|at| *at > now_ms) {
                        next_expiry_ms = Some(next_expiry_ms.map_or(at, |n| n.min(at)));
                    }
                    // Provenance first: an exit that cannot answer for its
                    // address carries nothing, whatever else it is.
                    if let Some(why) = record.provenance_block(now_ms) {
                        blocked.push((record.clone(), why));
                        continue;
                    }
                    // While the control plane is silent (and within the
                    // grace), a linked exit that was live when it fell
                    // silent and passes its probes is live whatever its
                    // heartbeat key says.
                    let heartbeat_live = known.live.contains(id);
                    let held = known.held_by_link(id, now, self.control_plane_grace);
                    let link_live = held && self.health.exit(*id).available(now);
                    if !(heartbeat_live || link_live) {
                        continue;
                    }
                    if record.draining
                        || known.agent_draining.contains(id)
                        || record.disabled
                        || !record.has_egress()
                    {
                        continue;
                    }
                    if !heartbeat_live {
                        held_by_links += 1;
                    }
                    eligible.push(Candidate {
                        record: record.clone(),
                        link: link.clone(),
                    });
                }
                (
                    eligible,
                    known.live.len(),
                    known.degraded,
                    known.control_silent_since,
                )
            }
            Err(_) => return,
        };
        let next_expiry = next_expiry_ms
            .map(|at| now + Duration::from_millis(u64::try_from(at - now_ms).unwrap_or(0)));
        if let Ok(mut current) = self.next_expiry.lock() {
            if *current != next_expiry {
                *current = next_expiry;
                self.expiry_changed.notify_one();
            }
        }
        crate::metrics::control_plane(silent_since, held_by_links);
        // Before the cut: a tunnel registering after it finds the flag set.
        self.any_blocked
            .store(!blocked.is_empty(), std::sync::atomic::Ordering::Release);
        self.cut_newly_blocked(&blocked);
        self.cut_misplaced(dedications);
        let index = eligible
            .iter()
            .enumerate()
            .map(|(i, c)| (c.record.id, i))
            .collect();
        crate::metrics::pool(eligible.len(), blocked.len(), live, degraded);
        if let Ok(mut view) = self.view.write() {
            *view = Arc::new(PoolView {
                eligible,
                index,
                live,
                degraded,
                blocked,
                control_plane_silent_since: silent_since,
                held_by_links,
            });
        }
    }
}
