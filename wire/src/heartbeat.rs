//! The heartbeat an agent sends the control-api, and the answer: one
//! definition for both ends (`POST /v1/agent/exits/{id}/heartbeat`). The
//! answer names the superproxies to dial as each announced itself
//! ([`SuperproxyRecord`], which `proxynet-store` re-exports: the same JSON
//! is the announcement's record in Redis).

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use uuid::Uuid;

/// Most admin addresses one agent may report (more are ignored).
pub const MAX_ADMIN_ADDRS: usize = 16;

/// What an agent says about itself in each beat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Heartbeat")]
pub struct HeartbeatRequest {
    /// The agent is draining (SIGTERM) or withdrawn: no new tunnels.
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub active_tunnels: u64,
    /// The agent's admin listener: every other exit is told to deny it, so
    /// a tunnel through a neighbour cannot reach it. Only the first 16
    /// (`MAX_ADMIN_ADDRS`) are read, and only those on addresses the
    /// reflector verified the exit holds are protected.
    #[serde(default)]
    #[schemars(length(max = MAX_ADMIN_ADDRS))]
    pub admin_addrs: Vec<SocketAddr>,
    /// The agent's egress policy widens a built-in special range
    /// (`--egress-allow`): only then is it told about service addresses in
    /// those ranges (everyone else denies them anyway).
    #[serde(default)]
    pub internal_targets: bool,
}

/// The control-api's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReply {
    pub heartbeat_interval_ms: u64,
    #[serde(default)]
    pub heartbeat_ttl_ms: u64,
    /// Where to dial, and whose certificate to expect: nothing else.
    pub superproxies: Vec<SuperproxyRecord>,
    /// Addresses never to dial, unlabelled: the control plane's services and
    /// stores, every superproxy's listeners and every agent's admin
    /// listener. Agents that cannot reach internal ranges anyway are told
    /// only the public ones: an exit learns what it must deny, nothing more.
    #[serde(default)]
    pub protected: Vec<SocketAddr>,
    /// Egress reflectors the operator runs besides the superproxies' own
    /// (`http://HOST:PORT/whoami`, the control-api's `--reflector-url`):
    /// where the agent learns the public address its traffic leaves from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reflectors: Vec<String>,
}

/// A superproxy's announcement: where agents should dial and which certificate to pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuperproxyRecord {
    pub id: Uuid,
    pub link_addr: SocketAddr,
    /// SHA-256 (hex) of the DER certificate the link listener presents.
    pub cert_sha256: String,
    /// Every address this superproxy's listeners answer on (proxy, SOCKS,
    /// admin, link), unspecified binds expanded to its host's addresses:
    /// agents deny them as tunnel targets, however the target is spelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_addrs: Vec<SocketAddr>,
    /// Where this superproxy's egress reflector answers (`GET /whoami`):
    /// agents learn the public address their traffic leaves from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflector: Option<SocketAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_agents_beat_still_parses_and_unknown_fields_do_not() {
        let old: HeartbeatRequest =
            serde_json::from_str(r#"{"draining":false,"active_tunnels":3}"#).unwrap();
        assert_eq!(old.active_tunnels, 3);
        assert!(old.admin_addrs.is_empty());
        assert!(serde_json::from_str::<HeartbeatRequest>(r#"{"nope":1}"#).is_err());
    }
}
