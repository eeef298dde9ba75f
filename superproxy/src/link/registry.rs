//! Which exits have a live link to this superproxy.
//!
//! One entry per exit: the HTTP/2 sender of its newest link. A link that ends
//! removes itself, but only if it is still the registered one (an agent that
//! reconnected quickly must not be unregistered by its old link's goodbye).
//! Every change bumps a watch channel so the pool recomputes eligibility at once
//! instead of waiting for its next refresh.

use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::http2::SendRequest;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::watch;
use uuid::Uuid;

pub type LinkSender = SendRequest<Empty<Bytes>>;

#[derive(Clone)]
pub struct Link {
    pub id: u64,
    pub exit_id: Uuid,
    pub sender: LinkSender,
}

pub struct LinkRegistry {
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
    /// Registers a new link for `exit_id`, replacing any older one; returns its id.
    pub fn insert(&self, exit_id: Uuid, sender: LinkSender) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut links) = self.links.write() {
            links.insert(
                exit_id,
                Link {
                    id,
                    exit_id,
                    sender,
                },
            );
        }
        self.changed.send_modify(|v| *v += 1);
        id
    }

    /// Removes the link `link_id` of `exit_id` if it is still the registered one.
    pub fn remove(&self, exit_id: Uuid, link_id: u64) {
        let removed = match self.links.write() {
            Ok(mut links) if links.get(&exit_id).is_some_and(|l| l.id == link_id) => {
                links.remove(&exit_id);
                true
            }
            _ => false,
        };
        if removed {
            self.changed.send_modify(|v| *v += 1);
        }
    }

    pub fn get(&self, exit_id: &Uuid) -> Option<Link> {
        self.links.read().ok()?.get(exit_id).cloned()
    }

    pub fn snapshot(&self) -> HashMap<Uuid, Link> {
        self.links.read().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.links.read().map(|l| l.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

pub type SharedRegistry = Arc<LinkRegistry>;
