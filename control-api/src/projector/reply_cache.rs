//! What the heartbeat replies reuse, and nothing else: the reply as last
//! built (one for agents whose policy reaches internal ranges, one for the
//! rest: every agent of a kind gets the same answer, so 20,000 beats a
//! second share one read) and the agents' admin addresses as last read,
//! with the one prune of stale entries that may be under way. Its own type,
//! each cache behind its own lock, so the projection itself holds no state
//! beyond its connections.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a heartbeat reply may reuse the superproxy list. Well below the
/// announcement TTL, so a superproxy that joins is dialled within a beat.
pub(super) const SUPERPROXY_LIST_REUSE: Duration = Duration::from_millis(500);

/// How long the agents' admin addresses, as read from Redis, are reused
/// (they change when an agent moves its listener, rarely); a change reported
/// to this instance is read at its next reply.
pub(super) const AGENT_ADMIN_REUSE: Duration = Duration::from_secs(10);

/// A value and when it was built or read.
type Stamped<T> = Option<(Instant, T)>;

/// Shared by the clones of one projector (one per request handler).
#[derive(Clone, Default)]
pub(super) struct ReplyCache {
    replies: Arc<Mutex<[Stamped<Bytes>; 2]>>,
    agent_admin: Arc<Mutex<Stamped<Vec<SocketAddr>>>>,
    pruning: Arc<AtomicBool>,
}

impl ReplyCache {
    /// The reply of kind `internal` built less than
    /// [`SUPERPROXY_LIST_REUSE`] ago, if there is one.
    pub(super) fn reply(&self, internal: bool) -> Option<Bytes> {
        let cached = self.replies.lock().ok()?;
        let (at, reply) = cached[usize::from(internal)].as_ref()?;
        (at.elapsed() < SUPERPROXY_LIST_REUSE).then(|| reply.clone())
    }

    /// Keeps `reply` as the reply of kind `internal`, built now.
    pub(super) fn keep_reply(&self, internal: bool, reply: Bytes) {
        if let Ok(mut cached) = self.replies.lock() {
            cached[usize::from(internal)] = Some((Instant::now(), reply));
        }
    }

    /// The agents' admin addresses read less than [`AGENT_ADMIN_REUSE`]
    /// ago, if they were.
    pub(super) fn admin_addrs(&self) -> Option<Vec<SocketAddr>> {
        let cached = self.agent_admin.lock().ok()?;
        let (at, addrs) = cached.as_ref()?;
        (at.elapsed() < AGENT_ADMIN_REUSE).then(|| addrs.clone())
    }

    /// Keeps `addrs` as the agents' admin addresses, read now.
    pub(super) fn keep_admin_addrs(&self, addrs: Vec<SocketAddr>) {
        if let Ok(mut cached) = self.agent_admin.lock() {
            *cached = Some((Instant::now(), addrs));
        }
    }

    /// An exit reported a change: the next reply reads the addresses afresh.
    pub(super) fn forget_admin_addrs(&self) {
        if let Ok(mut cached) = self.agent_admin.lock() {
            *cached = None;
        }
    }

    /// The right to prune stale admin entries, unless a prune is under
    /// way; the prune ends when the returned guard is dropped.
    pub(super) fn start_prune(&self) -> Option<PruneUnderWay> {
        (!self.pruning.swap(true, Ordering::AcqRel)).then(|| PruneUnderWay(self.pruning.clone()))
    }
}

/// A prune of stale admin entries under way; another may start once this
/// is dropped.
pub(super) struct PruneUnderWay(Arc<AtomicBool>);

impl Drop for PruneUnderWay {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
