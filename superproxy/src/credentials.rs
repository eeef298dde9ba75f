//! Proxy-user authentication without argon2 on the hot path.
//!
//! The user's record (argon2id hash, enabled flag) comes from Redis and is
//! cached briefly. A password check is remembered under a keyed hash (HMAC with
//! a per-process random key) of the presented username and password *and the
//! stored hash it was checked against*: a password rotation changes the stored
//! hash and so misses the cache, and a check against the old hash can never be
//! reused for the new one, however the two race. Misses run argon2 in a
//! detached task that owns its permit of the bounded verification pool, so a
//! client that disconnects mid-login neither frees a permit early nor leaves a
//! half-done entry behind; concurrent misses for one credential share one run.
//! Unknown users are checked against a dummy hash so they cost the same time
//! as a wrong password and get the same answer.

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;
use hmac::{Hmac, Mac};
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{Keys, UserEntry, UserRecord};
use proxynet_wire::username::is_base_username;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Semaphore};

use crate::error::{ErrorKind, ProxyError};

type CredentialKey = [u8; 32];

/// Upper bound on remembered verifications; beyond it, expired ones are dropped
/// first and, if that is not enough, the cache starts over.
const MAX_VERIFICATIONS: usize = 100_000;
/// Failed verifications are remembered for a shorter time than successes.
const FAILURE_TTL: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
struct Verification {
    ok: bool,
    at: Instant,
}

struct CachedRecord {
    record: Option<Arc<UserRecord>>,
    fetched: Instant,
}

/// A user whose password was verified, and the hash it was verified against.
#[derive(Clone)]
pub(crate) struct Verified {
    pub record: Arc<UserRecord>,
    /// SHA-256 of the stored password hash: a tunnel authenticated with it is
    /// revoked when the stored hash changes.
    pub credential_digest: [u8; 32],
}

#[derive(Clone)]
pub(crate) struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisConnection,
    keys: Keys,
    record_ttl: Duration,
    success_ttl: Duration,
    hmac_key: [u8; 32],
    dummy_hash: String,
    records: Mutex<HashMap<String, CachedRecord>>,
    verified: Mutex<HashMap<CredentialKey, Verification>>,
    in_flight: Mutex<HashMap<CredentialKey, watch::Receiver<Option<bool>>>>,
    argon_permits: Arc<Semaphore>,
}

impl Authenticator {
    pub(crate) fn new(
        redis: RedisConnection,
        keys: Keys,
        record_ttl: Duration,
        success_ttl: Duration,
    ) -> Result<Self, String> {
        use rand::RngCore;
        let mut hmac_key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut hmac_key);
        let mut dummy_password = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut dummy_password);
        let dummy_hash = Argon2::default()
            .hash_password(&dummy_password, &SaltString::generate(&mut OsRng))
            .map_err(|e| format!("argon2: {e}"))?
            .to_string();
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Self {
            inner: Arc::new(Inner {
                redis,
                keys,
                record_ttl,
                success_ttl,
                hmac_key,
                dummy_hash,
                records: Mutex::new(HashMap::new()),
                verified: Mutex::new(HashMap::new()),
                in_flight: Mutex::new(HashMap::new()),
                argon_permits: Arc::new(Semaphore::new(cpus)),
            }),
        })
    }

    /// Returns the user if `username`/`password` are right and the user is
    /// enabled. Every failure is the same [`ErrorKind::AuthRequired`].
    /// `charge` runs for every attempt that is not a remembered success: when
    /// an argon2 verification is about to start (so it counts when it starts,
    /// whatever happens to the client afterwards) and for a remembered
    /// failure. The failed-auth limiter charges the source address there.
    pub(crate) async fn authenticate(
        &self,
        username: &str,
        password: &str,
        charge: impl FnOnce() -> Result<(), ProxyError>,
    ) -> Result<Verified, ProxyError> {
        if !is_base_username(username) || password.is_empty() || password.len() > 255 {
            return Err(ProxyError::auth_required());
        }
        let record = self.record(username).await?;
        let stored_hash = record
            .as_ref()
            .map_or(self.inner.dummy_hash.as_str(), |r| r.password_hash.as_str());
        let ok = self.verify(username, password, stored_hash, charge).await?;
        match record {
            Some(r) if ok && r.enabled => Ok(Verified {
                credential_digest: Sha256::digest(r.password_hash.as_bytes()).into(),
                record: r,
            }),
            _ => Err(ProxyError::auth_required()),
        }
    }

    /// An enabled user by name, with no password check: for IP allow-list
    /// logins, where the source address is the credential.
    pub(crate) async fn allowlisted(&self, username: &str) -> Result<Verified, ProxyError> {
        if !is_base_username(username) {
            return Err(ProxyError::auth_required());
        }
        match self.record(username).await? {
            Some(r) if r.enabled => Ok(Verified {
                credential_digest: Sha256::digest(r.password_hash.as_bytes()).into(),
                record: r,
            }),
            _ => Err(ProxyError::auth_required()),
        }
    }

    /// Forgets the cached record of `username` (called on a change event).
    pub(crate) fn invalidate(&self, username: &str) {
        if let Ok(mut records) = self.inner.records.lock() {
            records.remove(username);
        }
    }

    /// What Redis holds for the user now (bypassing the cache, which it
    /// refreshes). `Err` when Redis cannot say — down, or back from a restart
    /// and not yet re-projected (an absent user proves nothing then, and a
    /// known user must not be refused and charged as a failed login).
    pub(crate) async fn fresh_entry(&self, username: &str) -> Result<UserEntry, redis::RedisError> {
        let mut redis = self.inner.redis.clone();
        // One MULTI (the marker shares the user key's slot): a flush and
        // re-projection cannot fall between the two reads.
        let (json, projected): (Option<String>, bool) = redis::pipe()
            .atomic()
            .get(self.inner.keys.user(username))
            .exists(self.inner.keys.users_projected(username))
            .query_async(&mut redis)
            .await?;
        let entry = UserEntry::parse(json.as_deref());
        if !projected && matches!(entry, UserEntry::Absent) {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "user store is being re-projected",
            )));
        }
        // A tombstone (a deleted user) or nothing at all is no user to log in as.
        let record = match &entry {
            UserEntry::Present(r) => Some(Arc::new((**r).clone())),
            UserEntry::Deleted | UserEntry::Absent => None,
        };
        if let Ok(mut records) = self.inner.records.lock() {
            if records.len() >= MAX_VERIFICATIONS {
                records.retain(|_, c| c.fetched.elapsed() < self.inner.record_ttl);
            }
            records.insert(
                username.to_owned(),
                CachedRecord {
                    record,
                    fetched: Instant::now(),
                },
            );
        }
        Ok(entry)
    }

    async fn record(&self, username: &str) -> Result<Option<Arc<UserRecord>>, ProxyError> {
        let cached = self.inner.records.lock().ok().and_then(|records| {
            records.get(username).map(|c| {
                (
                    c.record.clone(),
                    c.fetched.elapsed() < self.inner.record_ttl,
                )
            })
        });
        if let Some((record, true)) = &cached {
            return Ok(record.clone());
        }
        match self.fresh_entry(username).await {
            Ok(UserEntry::Present(record)) => Ok(Some(Arc::new(*record))),
            Ok(UserEntry::Deleted | UserEntry::Absent) => Ok(None),
            // Redis is down: a user we have seen keeps working on the last known
            // record; one we have never seen cannot be verified.
            Err(e) => match cached {
                Some((record, _)) => {
                    tracing::debug!(error = %e, "user lookup failed; using last known record");
                    Ok(record)
                }
                None => Err(ProxyError::new(
                    ErrorKind::StoreUnavailable,
                    "credential store unavailable; try again shortly",
                )),
            },
        }
    }

    async fn verify(
        &self,
        username: &str,
        password: &str,
        stored_hash: &str,
        charge: impl FnOnce() -> Result<(), ProxyError>,
    ) -> Result<bool, ProxyError> {
        let key = self.credential_key(username, password, stored_hash);
        if let Some(v) = self
            .inner
            .verified
            .lock()
            .ok()
            .and_then(|m| m.get(&key).copied())
        {
            let ttl = if v.ok {
                self.inner.success_ttl
            } else {
                FAILURE_TTL
            };
            if v.at.elapsed() < ttl {
                if !v.ok {
                    charge()?;
                }
                return Ok(v.ok);
            }
        }
        // Single flight: the first miss starts the verification, concurrent
        // ones wait for its answer.
        let mut answer = {
            let mut in_flight = self
                .inner
                .in_flight
                .lock()
                .map_err(|_| ProxyError::new(ErrorKind::Internal, "auth state poisoned"))?;
            match in_flight.get(&key) {
                Some(running) => running.clone(),
                None => {
                    charge()?;
                    metrics::counter!("proxynet_auth_verifications_total").increment(1);
                    let (tx, rx) = watch::channel(None);
                    in_flight.insert(key, rx.clone());
                    tokio::spawn(self.inner.clone().run_verification(
                        key,
                        password.to_owned(),
                        stored_hash.to_owned(),
                        tx,
                    ));
                    rx
                }
            }
        };
        let ok = answer
            .wait_for(Option::is_some)
            .await
            .map_err(|_| ProxyError::new(ErrorKind::Internal, "verification task ended"))?
            .unwrap_or(false);
        Ok(ok)
    }

    fn credential_key(&self, username: &str, password: &str, stored_hash: &str) -> CredentialKey {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.inner.hmac_key)
            .unwrap_or_else(|_| unreachable_hmac());
        mac.update(username.as_bytes());
        mac.update(&[0]);
        mac.update(password.as_bytes());
        mac.update(&[0]);
        mac.update(stored_hash.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl Inner {
    /// One argon2 verification, detached from whoever asked: it holds its
    /// permit for exactly as long as the hash runs, records the answer, and
    /// always removes its in-flight entry.
    async fn run_verification(
        self: Arc<Self>,
        key: CredentialKey,
        password: String,
        stored_hash: String,
        answer: watch::Sender<Option<bool>>,
    ) {
        let ok = match self.argon_permits.clone().acquire_owned().await {
            Ok(permit) => tokio::task::spawn_blocking(move || {
                let _permit = permit;
                PasswordHash::new(&stored_hash)
                    .map(|parsed| {
                        Argon2::default()
                            .verify_password(password.as_bytes(), &parsed)
                            .is_ok()
                    })
                    .unwrap_or(false)
            })
            .await
            .unwrap_or(false),
            Err(_) => false,
        };
        if let Ok(mut verified) = self.verified.lock() {
            if verified.len() >= MAX_VERIFICATIONS {
                let success_ttl = self.success_ttl;
                verified
                    .retain(|_, v| v.at.elapsed() < if v.ok { success_ttl } else { FAILURE_TTL });
                if verified.len() >= MAX_VERIFICATIONS {
                    verified.clear();
                }
            }
            verified.insert(
                key,
                Verification {
                    ok,
                    at: Instant::now(),
                },
            );
        }
        // Removed only after the result is cached, so no request finds neither.
        if let Ok(mut in_flight) = self.in_flight.lock() {
            in_flight.remove(&key);
        }
        let _ = answer.send(Some(ok));
    }
}

/// HMAC accepts keys of any length, so construction cannot fail.
fn unreachable_hmac() -> Hmac<Sha256> {
    #[allow(clippy::expect_used)]
    <Hmac<Sha256> as Mac>::new_from_slice(&[0u8; 32]).expect("HMAC takes any key length")
}

/// Decodes `Proxy-Authorization: Basic base64(user:pass)`.
pub(crate) fn parse_basic(header: &str) -> Option<(String, String)> {
    use base64::Engine;
    let (scheme, value) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()?;
    // The decoded buffer becomes the username: one allocation fewer.
    let mut user = String::from_utf8(decoded).ok()?;
    let colon = user.find(':')?;
    let pass = user[colon + 1..].to_owned();
    user.truncate(colon);
    Some((user, pass))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_parsing() {
        assert_eq!(
            parse_basic("Basic dXNlcjpwYTpzcw=="),
            Some(("user".into(), "pa:ss".into()))
        );
        assert_eq!(
            parse_basic("basic   dXNlcjpwYXNz"),
            Some(("user".into(), "pass".into()))
        );
        assert_eq!(parse_basic("Bearer abc"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
        assert_eq!(parse_basic("Basic dXNlcg=="), None);
    }
}
