//! What the rest of the agent tells the public-egress observer: the
//! reflectors the heartbeats name, and that a link came back. Its own file
//! because the tunnel context holds one, while the observer reads the
//! tunnel context: neither imports the other back.

use proxynet_wire::heartbeat::HeartbeatReply;
use proxynet_wire::reflector::WHOAMI_PATH;

/// What the rest of the agent tells the observer: the reflectors the
/// heartbeats name, and that a link came back (a reason to look again).
pub(crate) struct EgressWatch {
    pub(super) learned: tokio::sync::watch::Sender<Vec<String>>,
    pub(super) recheck: tokio::sync::Notify,
}

impl Default for EgressWatch {
    fn default() -> Self {
        Self {
            learned: tokio::sync::watch::Sender::new(Vec::new()),
            recheck: tokio::sync::Notify::new(),
        }
    }
}

impl EgressWatch {
    /// Takes the reflectors `reply` names (a change only if they differ).
    pub(crate) fn learn(&self, reply: &HeartbeatReply) {
        let mut urls: Vec<String> = reply
            .superproxies
            .iter()
            .filter_map(|s| s.reflector)
            .map(|addr| format!("http://{addr}{WHOAMI_PATH}"))
            .chain(reply.reflectors.iter().cloned())
            .collect();
        urls.sort_unstable();
        urls.dedup();
        self.learned.send_if_modified(|known| {
            let changed = *known != urls;
            if changed {
                *known = urls;
            }
            changed
        });
    }

    /// A link came back: observe again soon.
    pub(crate) fn link_reconnected(&self) {
        self.recheck.notify_one();
    }
}
