//! The egress reflector's answer and the agent's report of it: one
//! definition for the three parties. A superproxy serves `GET /whoami` and
//! signs the peer address it saw ([`Reflection::signed`]); the agent asks
//! from each of its egress addresses and passes the answers on unchanged
//! ([`EgressReport`], `POST /v1/agent/exits/{id}/egress`); the control-api
//! records an address only when the signature holds
//! ([`Reflection::verify`]), so an agent cannot claim an address it does not
//! send from.
//!
//! The reflector signs only for the exit that asks. Asking takes two
//! requests from the same address: `GET /whoami/challenge` returns a
//! [`Challenge`] (stateless: the time, a random nonce and a MAC over both
//! and the caller's address under the reflector key), and
//! `GET /whoami?exit=ID&challenge=C&proof=P` is answered only when `C` is a
//! challenge this reflector key issued to this same address within
//! [`CHALLENGE_TTL_SECS`] and `P` is [`exit_proof`]: a MAC over the exit id
//! and `C` keyed with the SHA-256 of the exit's credential, which the agent
//! computes from its credential and the superproxy checks against the
//! exit's record (the digest the link listener already checks hellos
//! against). Whoever lacks the exit's credential gets no reflection for it.

use hmac::{Hmac, Mac};
use proxynet_common::egress::Cidr;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::net::IpAddr;
use uuid::Uuid;

/// The reflector's route that answers what it saw (step two of asking).
pub const WHOAMI_PATH: &str = "/whoami";

/// The reflector's route that issues a [`Challenge`] (step one of asking).
pub const CHALLENGE_PATH: &str = "/whoami/challenge";

/// How long a challenge may be answered after it was issued (seconds, on
/// the reflector's clock). Both steps take well under a second; the rest
/// is room for a slow line, not for replays (a challenge only ever
/// reflects the address it was issued to).
pub const CHALLENGE_TTL_SECS: i64 = 30;

/// How far in the future a challenge's time may lie (two superproxies
/// behind one reflector address share the key, not a clock).
const CHALLENGE_FUTURE_SKEW_SECS: i64 = 2;

/// Most observations (and failures) one report may carry: an exit declares
/// at most 256 egress IPs and 64 prefixes, one observation each.
pub const MAX_REPORTED: usize = 320;

/// What the reflector saw: the body of its `200` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// The reflector's answer to `GET /whoami/challenge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// `AT.NONCE.MAC`: opaque to the agent, which returns it unchanged in
    /// the `challenge` parameter of `GET /whoami` and in its [`exit_proof`].
    pub challenge: String,
}

impl Challenge {
    /// A challenge for a caller at `peer`, issued at `at` (Unix seconds)
    /// with the random `nonce` (hex), under the reflector `key`. Nothing is
    /// kept: [`challenge_holds`] recomputes the MAC.
    pub fn issue(key: &[u8], peer: IpAddr, at: i64, nonce: &str) -> Option<Self> {
        let mac = challenge_mac(key, peer, at, nonce)?;
        Some(Self {
            challenge: format!("{at}.{nonce}.{}", hex::encode(mac.finalize().into_bytes())),
        })
    }
}

/// Whether `challenge` was issued under `key` to a caller at `peer` no more
/// than [`CHALLENGE_TTL_SECS`] before `now` (compared in constant time).
pub fn challenge_holds(key: &[u8], challenge: &str, peer: IpAddr, now: i64) -> bool {
    let mut parts = challenge.splitn(3, '.');
    let (Some(at), Some(nonce), Some(mac)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(at) = at.parse::<i64>() else {
        return false;
    };
    if nonce.is_empty() || nonce.len() > 64 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    if at.saturating_sub(now) > CHALLENGE_FUTURE_SKEW_SECS
        || now.saturating_sub(at) > CHALLENGE_TTL_SECS
    {
        return false;
    }
    let Ok(mac) = hex::decode(mac) else {
        return false;
    };
    challenge_mac(key, peer, at, nonce).is_some_and(|m| m.verify_slice(&mac).is_ok())
}

/// The MAC binding a challenge to its time, nonce and the caller's address.
fn challenge_mac(key: &[u8], peer: IpAddr, at: i64, nonce: &str) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).ok()?;
    mac.update(format!("proxynet-reflector-challenge/1\n{peer}\n{at}\n{nonce}").as_bytes());
    Some(mac)
}

/// The exit's answer to `challenge`: HMAC-SHA256 (hex) of the exit id and
/// the challenge, keyed with `credential_sha256`, the SHA-256 (lower-case
/// hex) of the exit's credential. The agent computes it from its
/// credential; the reflector from the exit's record in Redis.
pub fn exit_proof(credential_sha256: &str, exit: Uuid, challenge: &str) -> Option<String> {
    proof_mac(credential_sha256, exit, challenge).map(|m| hex::encode(m.finalize().into_bytes()))
}

/// Whether `proof` is [`exit_proof`] of `exit` and `challenge` under
/// `credential_sha256` (compared in constant time; an empty digest proves
/// nothing).
pub fn exit_proof_holds(credential_sha256: &str, exit: Uuid, challenge: &str, proof: &str) -> bool {
    if credential_sha256.is_empty() {
        return false;
    }
    let Ok(proof) = hex::decode(proof) else {
        return false;
    };
    proof_mac(credential_sha256, exit, challenge).is_some_and(|m| m.verify_slice(&proof).is_ok())
}

fn proof_mac(credential_sha256: &str, exit: Uuid, challenge: &str) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(credential_sha256.as_bytes()).ok()?;
    mac.update(format!("proxynet-reflector-ask/1\n{exit}\n{challenge}").as_bytes());
    Some(mac)
}

/// An agent's report of what the reflectors saw from its egress addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressReport {
    #[serde(default)]
    #[schemars(length(max = MAX_REPORTED))]
    pub observed: Vec<EgressObservation>,
    /// Egress the agent could not observe (no reflector of its family, a
    /// timeout, a refused bind): reported, never an error.
    #[serde(default)]
    #[schemars(length(max = MAX_REPORTED))]
    pub unobserved: Vec<EgressUnobserved>,
}

/// One egress address and what a reflector saw from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressObservation {
    /// The declared egress it stands for: an egress IP (as a /32 or /128)
    /// or an egress prefix.
    #[schemars(with = "String")]
    pub egress: Cidr,
    /// The address the agent bound (inside `egress`).
    pub bound: IpAddr,
    /// The reflector's answer, as received.
    pub reflection: Reflection,
}

/// One egress address the agent could not observe, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressUnobserved {
    /// The declared egress it stands for (CIDR).
    #[schemars(with = "String")]
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
    fn a_challenge_holds_only_for_its_address_key_and_time() {
        let key = b"reflector key";
        let peer: IpAddr = "203.0.113.7".parse().unwrap();
        let at = 1_800_000_000;
        let c = Challenge::issue(key, peer, at, "00ff").unwrap().challenge;
        assert!(challenge_holds(key, &c, peer, at));
        assert!(challenge_holds(key, &c, peer, at + CHALLENGE_TTL_SECS));
        assert!(
            !challenge_holds(key, &c, peer, at + CHALLENGE_TTL_SECS + 1),
            "stale"
        );
        assert!(!challenge_holds(key, &c, peer, at - 60), "from the future");
        assert!(!challenge_holds(b"another key", &c, peer, at));
        assert!(
            !challenge_holds(key, &c, "203.0.113.8".parse().unwrap(), at),
            "issued to another address"
        );
        let moved = c.replacen(&at.to_string(), &(at + 5).to_string(), 1);
        assert!(!challenge_holds(key, &moved, peer, at + 5), "time changed");
        for bad in [
            "",
            "1.2",
            "x.00ff.ab",
            "1800000000..ab",
            "-9223372036854775808.00.00",
        ] {
            assert!(!challenge_holds(key, bad, peer, at), "{bad:?}");
        }
    }

    #[test]
    fn an_exit_proof_holds_under_its_credential_digest_only() {
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let exit = Uuid::new_v4();
        let proof = exit_proof(digest, exit, "1.00.ab").unwrap();
        assert!(exit_proof_holds(digest, exit, "1.00.ab", &proof));
        assert!(!exit_proof_holds(digest, Uuid::new_v4(), "1.00.ab", &proof));
        assert!(!exit_proof_holds(digest, exit, "1.00.ac", &proof));
        assert!(!exit_proof_holds(
            &digest.replace('9', "8"),
            exit,
            "1.00.ab",
            &proof
        ));
        assert!(!exit_proof_holds("", exit, "1.00.ab", &proof));
        assert!(!exit_proof_holds(digest, exit, "1.00.ab", "not hex"));
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
