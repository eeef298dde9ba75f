//! The target log for abuse lookups: how many tunnels each (account, user,
//! exit, egress IP, target host:port) opened per minute, since the last
//! flush, drained into each batch's [`TargetRow`]s.
//!
//! Its own type because it has nothing to do with bytes: it is counted when
//! a tunnel opens, not as its bytes move, and only rides along in a batch.

use proxynet_store::TargetRow;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// (account, user, exit, egress IP, target host, target port, minute)
type TargetKey = (Uuid, Uuid, Uuid, IpAddr, String, u16, i64);

/// Tunnels opened since the last flush, per abuse-lookup key.
pub(super) struct TargetLog {
    opened: Mutex<HashMap<TargetKey, u32>>,
}

impl TargetLog {
    pub(super) fn new() -> Self {
        Self {
            opened: Mutex::new(HashMap::new()),
        }
    }

    /// Notes one opened tunnel: who reached which host:port through which
    /// egress IP, this minute.
    pub(super) fn record(
        &self,
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        egress_ip: IpAddr,
        host: String,
        port: u16,
    ) {
        let minute = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
            / 60
            * 60;
        if let Ok(mut targets) = self.opened.lock() {
            *targets
                .entry((account_id, user_id, exit_id, egress_ip, host, port, minute))
                .or_default() += 1;
        }
    }

    /// Everything noted since the last drain, as rows for a batch.
    pub(super) fn drain(&self) -> Vec<TargetRow> {
        self.opened
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
            .into_iter()
            .map(
                |(
                    (account_id, user_id, exit_id, egress_ip, target_host, target_port, minute),
                    tunnels,
                )| {
                    TargetRow {
                        account_id,
                        user_id,
                        exit_id,
                        egress_ip,
                        target_host,
                        target_port,
                        minute,
                        tunnels,
                    }
                },
            )
            .collect()
    }
}
