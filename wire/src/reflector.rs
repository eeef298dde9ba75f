//! The egress reflector's answer and the agent's report of it: one
//! definition for the three parties. A superproxy serves `GET /whoami` and
//! signs the peer address it saw ([`Reflection::signed`]); the agent asks
//! from each of its egress addresses and passes the answers on unchanged
//! ([`EgressReport`], `POST /v1/agent/exits/{id}/egress`); the control-api
//! records an address only when the signature holds
//! ([`Reflection::verify`]), so an agent cannot claim an address it does not
//! send from.

use hmac::{Hmac, Mac};
use proxynet_common::egress::Cidr;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::net::IpAddr;
use uuid::Uuid;

/// The reflector's one route.
pub const WHOAMI_PATH: &str = "/whoami";

/// Most observations (and failures) one report may carry: an exit declares
/// at most 256 egress IPs and 64 prefixes, one observation each.
pub const MAX_REPORTED: usize = 320;

/// What the reflector saw: the body of its `200` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reflection {
    /// The peer address of the connection, as the reflector saw it.
    pub address: IpAddr,
    /// When, Unix seconds on the reflector's clock.
    pub at: i64,
    /// The exit that asked (`/whoami?exit=ID`), when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<Uuid>,
    /// HMAC-SHA256 (hex) of the three fields above under the reflector key;
    /// absent when the reflector has no key yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

impl Reflection {
    /// A reflection of `address` at `at` for `exit`, signed with `key`.
    pub fn signed(key: &[u8], address: IpAddr, at: i64, exit: Option<Uuid>) -> Self {
        let proof = mac(key, address, at, exit).map(|m| hex::encode(m.finalize().into_bytes()));
        Self {
            address,
            at,
            exit,
            proof,
        }
    }

    /// Whether `proof` is the signature of the other fields under `key`
    /// (compared in constant time).
    pub fn verify(&self, key: &[u8]) -> bool {
        let Some(proof) = self.proof.as_deref().and_then(|p| hex::decode(p).ok()) else {
            return false;
        };
        mac(key, self.address, self.at, self.exit).is_some_and(|m| m.verify_slice(&proof).is_ok())
    }
}

/// The MAC over a reflection's fields, versioned and newline-separated so
/// no two field values spell the same message.
fn mac(key: &[u8], address: IpAddr, at: i64, exit: Option<Uuid>) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).ok()?;
    let exit = exit.map(|e| e.to_string()).unwrap_or_default();
    mac.update(format!("proxynet-reflection/1\n{address}\n{at}\n{exit}").as_bytes());
    Some(mac)
}

/// An agent's report of what the reflectors saw from its egress addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressReport {
    #[serde(default)]
    pub observed: Vec<EgressObservation>,
    /// Egress the agent could not observe (no reflector of its family, a
    /// timeout, a refused bind): reported, never an error.
    #[serde(default)]
    pub unobserved: Vec<EgressUnobserved>,
}

/// One egress address and what a reflector saw from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressObservation {
    /// The declared egress it stands for: an egress IP (as a /32 or /128)
    /// or an egress prefix.
    pub egress: Cidr,
    /// The address the agent bound (inside `egress`).
    pub bound: IpAddr,
    /// The reflector's answer, as received.
    pub reflection: Reflection,
}

/// One egress address the agent could not observe, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressUnobserved {
    pub egress: Cidr,
    pub bound: IpAddr,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reflection_verifies_under_its_key_only_and_unchanged() {
        let key = b"0123456789abcdef0123456789abcdef";
        let exit = Some(Uuid::new_v4());
        let seen = Reflection::signed(key, "203.0.113.7".parse().unwrap(), 1_800_000_000, exit);
        assert!(seen.verify(key));
        assert!(!seen.verify(b"another key"));
        let mut moved = seen.clone();
        moved.address = "198.51.100.1".parse().unwrap();
        assert!(!moved.verify(key), "a changed address breaks the proof");
        let mut later = seen.clone();
        later.at += 1;
        assert!(!later.verify(key));
        let mut other_exit = seen.clone();
        other_exit.exit = Some(Uuid::new_v4());
        assert!(!other_exit.verify(key));
        let mut unsigned = seen;
        unsigned.proof = None;
        assert!(!unsigned.verify(key));
        unsigned.proof = Some("not hex".into());
        assert!(!unsigned.verify(key));
    }

    #[test]
    fn a_report_names_its_egress_as_networks_and_refuses_unknown_fields() {
        let report: EgressReport = serde_json::from_str(
            r#"{"observed":[{"egress":"198.18.0.1","bound":"198.18.0.1",
                "reflection":{"address":"10.0.0.1","at":5,"proof":"ab"}}]}"#,
        )
        .unwrap();
        assert_eq!(report.observed[0].egress.to_string(), "198.18.0.1/32");
        assert!(report.unobserved.is_empty());
        assert!(serde_json::from_str::<EgressReport>(r#"{"nope":[]}"#).is_err());
    }
}
