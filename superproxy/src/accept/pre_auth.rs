//! The per-source pre-auth bound: the slots each source address's
//! not-yet-logged-in connections hold, the queue of connections waiting,
//! accepted but unread, for one of its slots to free, the larger allowance
//! of an address that logged in lately, and the sweep that cuts
//! connections past their pre-auth deadline (docs/tenancy.md,
//! "Connection-level bounds").

use proxynet_common::tasks::Stop;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The bounds [`PreAuth`] keeps (docs/tenancy.md, "Connection-level bounds").
#[derive(Debug, Clone, Copy)]
pub struct PreAuthLimits {
    /// Slots one address (IPv6: one /64) may hold.
    pub per_source: usize,
    /// Slots an address one of whose connections logged in within
    /// `known_for` may hold.
    pub per_known_source: usize,
    /// Connections one address may have waiting for a slot; beyond, new
    /// ones are closed at once.
    pub waiting_per_source: usize,
    /// Slots held by every address together.
    pub total: usize,
    /// Connections waiting for a slot, from every address together.
    pub waiting_total: usize,
    /// How long after a login its address counts as known.
    pub known_for: Duration,
    /// From accept to the cut of a connection still not logged in, waiting
    /// included.
    pub timeout: Duration,
}

/// Connections that have not logged in yet, per source address.
///
/// A connection holds a slot of its address until its first login. Past its
/// address's allowance a new connection waits, accepted but unread, for a
/// slot to free (a login or a close), first come first served, until its
/// deadline: a customer's burst through one NAT address is served in turn
/// instead of closed, while silent sockets still hold no more than the
/// allowance. Waiters are bounded too (per address and in all), so what a
/// flood costs stays bounded; past those bounds connections are closed.
pub(crate) struct PreAuth {
    limits: PreAuthLimits,
    pub(super) state: std::sync::Mutex<PreAuthState>,
}

#[derive(Default)]
pub(super) struct PreAuthState {
    pub(super) per_source: HashMap<IpAddr, Source>,
    /// Slot id → (deadline, the connection's cut token).
    pub(super) pending: HashMap<u64, (Instant, CancellationToken)>,
    next_id: u64,
    /// Connections waiting for a slot, from every address.
    waiting: usize,
    /// Addresses whose connections logged in, and when the last one did.
    pub(super) logins: HashMap<IpAddr, Instant>,
}

impl PreAuthState {
    /// Forgets `source` once it holds and awaits nothing: the map stays as
    /// small as what is pending.
    fn tidy(&mut self, source: &IpAddr) {
        if self
            .per_source
            .get(source)
            .is_some_and(|s| s.held == 0 && s.waiting == 0)
        {
            self.per_source.remove(source);
        }
    }
}

/// One source address's slots and the connections waiting for one.
pub(super) struct Source {
    /// As many permits as the address's allowance: a slot holds one, a
    /// waiter queues for one (tokio's semaphore hands freed permits to
    /// queued waiters first, in order).
    slots: Arc<Semaphore>,
    /// Permits `slots` holds in all (available, held or handed to a
    /// waiter): the allowance as last set.
    allowance: usize,
    /// Slots held now.
    held: usize,
    /// Connections waiting now.
    waiting: usize,
}

impl Source {
    fn new(allowance: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(allowance)),
            allowance,
            held: 0,
            waiting: 0,
        }
    }

    /// Raises the allowance to `to` at once; the new permits go to the
    /// waiters first.
    fn grow_to(&mut self, to: usize) {
        if to > self.allowance {
            self.slots.add_permits(to - self.allowance);
            self.allowance = to;
        }
    }

    /// Lowers the allowance towards `to` by the permits no one holds; the
    /// held ones are taken back as their slots free.
    fn shrink_to(&mut self, to: usize) {
        if self.allowance > to {
            self.allowance -= self.slots.forget_permits(self.allowance - to);
        }
    }
}

/// One unauthenticated connection's place in [`PreAuth`]; dropping it frees
/// the place.
pub(super) struct PreAuthSlot {
    pub(super) registry: Arc<PreAuth>,
    pub(super) source: IpAddr,
    id: u64,
    /// Its address's permit (taken only when dropped).
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for PreAuthSlot {
    fn drop(&mut self) {
        let mut permit = self.permit.take();
        let Ok(mut guard) = self.registry.state.lock() else {
            return;
        };
        let state = &mut *guard;
        state.pending.remove(&self.id);
        let target = self
            .registry
            .allowance(&state.logins, &self.source, Instant::now());
        if let Some(entry) = state.per_source.get_mut(&self.source) {
            entry.held = entry.held.saturating_sub(1);
            if entry.allowance > target {
                if let Some(permit) = permit.take() {
                    // The address is no longer known: its place is not
                    // handed on, and its allowance is back towards the
                    // plain one even while connections wait.
                    permit.forget();
                    entry.allowance -= 1;
                }
            }
        }
        state.tidy(&self.source);
        drop(guard);
        // Freed after the bookkeeping, so the waiter it goes to finds this
        // slot counted out.
        drop(permit);
    }
}

/// What [`PreAuth::admit`] makes of a new connection.
pub(super) enum Admission {
    /// A slot now: the connection is served.
    Slot(PreAuthSlot),
    /// Its address holds every slot it may: wait for one, unread.
    Wait(Waiting),
    /// Closed at once, for this limit (the refusal counter's label).
    Refused(&'static str),
}

/// A connection waiting for a slot of its address: counted among its
/// address's waiters until it gets one or gives up.
pub(super) struct Waiting {
    registry: Arc<PreAuth>,
    source: IpAddr,
    slots: Arc<Semaphore>,
    /// The connection's pre-auth deadline, counted from its accept.
    deadline: Instant,
    /// Still counted among the waiters (until seated).
    counted: bool,
}

impl Waiting {
    /// Waits for a slot until the connection's deadline, its cut or the
    /// listeners closing (`closing`); `None` when it got none (the
    /// connection is then closed, never read).
    pub(super) async fn slot(
        mut self,
        cut: &CancellationToken,
        closing: &CancellationToken,
    ) -> Option<PreAuthSlot> {
        // A timer per waiter: each waits on its own task anyway, and
        // waiters are bounded.
        let acquired = tokio::select! {
            permit = self.slots.clone().acquire_owned() => permit.ok(),
            () = tokio::time::sleep_until(self.deadline) => {
                metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_timeout")
                    .increment(1);
                None
            }
            () = cut.cancelled() => None,
            () = closing.cancelled() => None,
        };
        let permit = acquired?;
        let registry = self.registry.clone();
        registry.seat(&mut self, permit, cut)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        if let Ok(mut state) = self.registry.state.lock() {
            state.waiting = state.waiting.saturating_sub(1);
            if let Some(entry) = state.per_source.get_mut(&self.source) {
                entry.waiting = entry.waiting.saturating_sub(1);
            }
            state.tidy(&self.source);
        }
    }
}

/// Logins remembered at most (addresses that logged in within
/// `known_for`): beyond, a new address is not remembered, so the map stays
/// bounded whoever logs in.
const MAX_KNOWN_SOURCES: usize = 100_000;

/// Logins past `known_for` are forgotten every this many deadline sweeps
/// (10 s): walking the map every quarter second would be waste.
const PRUNE_EVERY: u64 = 40;

impl PreAuth {
    pub(crate) fn new(limits: PreAuthLimits) -> Arc<Self> {
        let per_source = limits.per_source.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Self {
            limits: PreAuthLimits {
                per_source,
                per_known_source: limits
                    .per_known_source
                    .clamp(per_source, Semaphore::MAX_PERMITS),
                total: limits.total.max(1),
                ..limits
            },
            state: Default::default(),
        })
    }

    /// The slots `source` may hold now: more while it is known.
    fn allowance(&self, logins: &HashMap<IpAddr, Instant>, source: &IpAddr, now: Instant) -> usize {
        let known = logins
            .get(source)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.limits.known_for);
        if known {
            self.limits.per_known_source
        } else {
            self.limits.per_source
        }
    }

    /// A slot for a connection from `peer` accepted at `accepted`, a place
    /// among its address's waiters, or a refusal.
    pub(super) fn admit(
        self: &Arc<Self>,
        peer: SocketAddr,
        cut: &CancellationToken,
        accepted: Instant,
    ) -> Admission {
        let source = crate::login_throttle::limit_key(peer.ip());
        let deadline = accepted + self.limits.timeout;
        let Ok(mut guard) = self.state.lock() else {
            return Admission::Refused("unauthenticated_per_source");
        };
        let state = &mut *guard;
        if state.pending.len() >= self.limits.total {
            return Admission::Refused("unauthenticated_total");
        }
        let allowance = self.allowance(&state.logins, &source, accepted);
        let waiting_full = state.waiting >= self.limits.waiting_total;
        let entry = state
            .per_source
            .entry(source)
            .or_insert_with(|| Source::new(allowance));
        // A permit is free only while nobody waits: freed ones go to the
        // waiters first, so a newcomer never jumps the queue.
        match entry.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                entry.held += 1;
                Admission::Slot(self.register(state, source, deadline, cut, permit))
            }
            // A fresh entry always has a permit, so nothing is left to tidy.
            Err(_) if waiting_full => Admission::Refused("unauthenticated_total"),
            Err(_) if entry.waiting >= self.limits.waiting_per_source => {
                Admission::Refused("unauthenticated_per_source")
            }
            Err(_) => {
                entry.waiting += 1;
                let slots = entry.slots.clone();
                state.waiting += 1;
                Admission::Wait(Waiting {
                    registry: self.clone(),
                    source,
                    slots,
                    deadline,
                    counted: true,
                })
            }
        }
    }

    /// Gives `waiting` the slot its address's `permit` stands for; `None`
    /// when every address together holds the most slots already.
    fn seat(
        self: &Arc<Self>,
        waiting: &mut Waiting,
        permit: OwnedSemaphorePermit,
        cut: &CancellationToken,
    ) -> Option<PreAuthSlot> {
        let mut guard = self.state.lock().ok()?;
        let state = &mut *guard;
        if state.pending.len() >= self.limits.total {
            metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_total")
                .increment(1);
            return None;
        }
        let entry = state.per_source.get_mut(&waiting.source)?;
        entry.waiting = entry.waiting.saturating_sub(1);
        entry.held += 1;
        state.waiting = state.waiting.saturating_sub(1);
        waiting.counted = false;
        Some(self.register(state, waiting.source, waiting.deadline, cut, permit))
    }

    /// Enters a slot in the deadline sweep's list.
    fn register(
        self: &Arc<Self>,
        state: &mut PreAuthState,
        source: IpAddr,
        deadline: Instant,
        cut: &CancellationToken,
        permit: OwnedSemaphorePermit,
    ) -> PreAuthSlot {
        state.next_id += 1;
        let id = state.next_id;
        state.pending.insert(id, (deadline, cut.clone()));
        PreAuthSlot {
            registry: self.clone(),
            source,
            id,
            permit: Some(permit),
        }
    }

    /// A connection from `source` logged in: the address is known for
    /// `known_for`, and its larger allowance applies at once (its waiters
    /// first).
    pub(super) fn logged_in(&self, source: IpAddr) {
        let Ok(mut guard) = self.state.lock() else {
            return;
        };
        let state = &mut *guard;
        if state.logins.len() >= MAX_KNOWN_SOURCES && !state.logins.contains_key(&source) {
            return;
        }
        state.logins.insert(source, Instant::now());
        if let Some(entry) = state.per_source.get_mut(&source) {
            entry.grow_to(self.limits.per_known_source);
        }
    }

    /// Lowers the allowance of addresses no longer known (by the permits no
    /// one holds; held ones are taken back as they free), and forgets
    /// logins past `known_for` when `prune`.
    pub(super) fn settle(&self, now: Instant, prune: bool) {
        let Ok(mut guard) = self.state.lock() else {
            return;
        };
        let state = &mut *guard;
        if prune {
            let known_for = self.limits.known_for;
            state
                .logins
                .retain(|_, at| now.saturating_duration_since(*at) < known_for);
        }
        for (source, entry) in state.per_source.iter_mut() {
            let target = self.allowance(&state.logins, source, now);
            entry.shrink_to(target);
        }
    }

    /// Unauthenticated connections holding a slot now (for tests and metrics).
    pub(crate) fn held(&self) -> usize {
        self.state.lock().map(|s| s.pending.len()).unwrap_or(0)
    }

    /// Connections waiting for a slot now (for tests and metrics).
    pub(crate) fn waiting(&self) -> usize {
        self.state.lock().map(|s| s.waiting).unwrap_or(0)
    }

    /// Cuts connections past their pre-auth deadline, every quarter second:
    /// one sweep for all connections instead of a timer each. Also lowers
    /// the allowance of addresses no longer known and keeps the gauges.
    pub(crate) async fn run_deadlines(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweeps = 0u64;
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            sweeps += 1;
            let now = Instant::now();
            // Cut under the lock: a login landing meanwhile (which takes
            // the slot out under the same lock) is never cut after it.
            let cut = match self.state.lock() {
                Ok(state) => {
                    let mut cut = 0u64;
                    for (deadline, token) in state.pending.values() {
                        if *deadline <= now && !token.is_cancelled() {
                            token.cancel();
                            cut += 1;
                        }
                    }
                    cut
                }
                Err(_) => continue,
            };
            if cut > 0 {
                metrics::counter!("proxynet_limit_refusals_total", "limit" => "unauthenticated_timeout")
                    .increment(cut);
            }
            self.settle(now, sweeps.is_multiple_of(PRUNE_EVERY));
            crate::metrics::unauthenticated(self.held(), self.waiting());
        }
    }
}
