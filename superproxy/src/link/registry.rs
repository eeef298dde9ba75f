//! Which exits have a live link to this superproxy.
//!
//! One entry per exit: the stream opener of its newest link (an HTTP/2
//! sender on a v1 link, a mux handle on a v2 link). A second link
//! presenting the same exit's credential replaces the first (newest wins: an
//! agent that reconnects after a network blip must not wait for its dead link
//! to time out); new tunnels go to the new link, the old one finishes its
//! open tunnels and closes once nothing holds its sender. The listener logs
//! and audits every replacement, since it is also what a stolen credential
//! looks like. A link that ends removes itself, but only if it is still the
//! registered one (an old link's goodbye must not unregister its successor).
//! Every change bumps a watch channel so the pool recomputes eligibility at once
//! instead of waiting for its next refresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use tokio::sync::watch;
use uuid::Uuid;

pub use super::sender::{LinkSender, MuxLink};

#[derive(Clone)]
pub struct Link {
    pub id: u64,
    pub exit_id: Uuid,
    /// Where the agent dialled from.
    pub peer: std::net::SocketAddr,
    pub sender: LinkSender,
}

pub(crate) struct LinkRegistry {
    links: RwLock<HashMap<Uuid, Link>>,
    next_id: AtomicU64,
    changed: watch::Sender<u64>,
}

impl Default for LinkRegistry {
    fn default() -> Self {
        Self {
            links: RwLock::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            changed: watch::Sender::new(0),
        }
    }
}

impl LinkRegistry {
    /// Registers a new link for `exit_id`, replacing any older one; returns
    /// its id and the link it replaced.
    pub(crate) fn insert(
        &self,
        exit_id: Uuid,
        peer: std::net::SocketAddr,
        sender: LinkSender,
    ) -> (u64, Option<Link>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let replaced = self.links.write().ok().and_then(|mut links| {
            links.insert(
                exit_id,
                Link {
                    id,
                    exit_id,
                    peer,
                    sender,
                },
            )
        });
        self.changed.send_modify(|v| *v += 1);
        metrics::gauge!("proxynet_links_up").set(self.len() as f64);
        (id, replaced)
    }

    /// Removes the link `link_id` of `exit_id` if it is still the registered one.
    pub(crate) fn remove(&self, exit_id: Uuid, link_id: u64) {
        let removed = match self.links.write() {
            Ok(mut links) if links.get(&exit_id).is_some_and(|l| l.id == link_id) => {
                links.remove(&exit_id);
                true
            }
            _ => false,
        };
        if removed {
            self.changed.send_modify(|v| *v += 1);
            metrics::gauge!("proxynet_links_up").set(self.len() as f64);
        }
    }

    pub(crate) fn snapshot(&self) -> HashMap<Uuid, Link> {
        self.links.read().map(|l| l.clone()).unwrap_or_default()
    }

    pub(crate) fn len(&self) -> usize {
        self.links.read().map(|l| l.len()).unwrap_or(0)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}
