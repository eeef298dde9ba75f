//! Who is calling: the operator (the bootstrap admin token or an operator API
//! key), an account (its API key), or an enrolled agent.
//!
//! Account-scoped routes take a [`Caller`] and pass [`Caller::scope`] into
//! every query (`$n::uuid IS NULL OR account_id = $n`), so another account's
//! rows are never read, let alone changed: they answer 404 as if absent.
//! Operator-only routes take [`Operator`], which answers 403 to account keys.
//! Routes that must know *which* key is calling (minting a key records its
//! parent; a dashboard session is bound to the key it logged in with) take
//! [`KeyCaller`].
//!
//! Every API key has a request rate ([`KeyRates`]): past it, `429` with
//! `Retry-After`. The bootstrap admin token has none (it is the operator's
//! way in when everything else fails). A request is identified once: the
//! caller is kept in the request's extensions, so a handler taking both
//! [`Operator`] and [`KeyCaller`] looks the key up, and charges it, once.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};
use proxynet_common::secret::{constant_time_eq, sha256_hex};
use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::ApiError;
use crate::AppState;

/// An authenticated API caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Account(uuid::Uuid),
}

impl Caller {
    /// `None` for the operator (every account), the account's id otherwise.
    pub fn scope(self) -> Option<uuid::Uuid> {
        match self {
            Caller::Operator => None,
            Caller::Account(id) => Some(id),
        }
    }

    /// 404 unless the caller may see `account` (another account's data is
    /// answered as absent, not as forbidden, so ids cannot be probed).
    pub fn check_account(self, account: uuid::Uuid) -> Result<(), ApiError> {
        match self.scope() {
            Some(own) if own != account => Err(ApiError::NotFound("account")),
            _ => Ok(()),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(KeyCaller::from_request_parts(parts, state).await?.caller)
    }
}

/// A caller and the API key it presented (`None`: the bootstrap admin token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyCaller {
    pub caller: Caller,
    pub key_id: Option<uuid::Uuid>,
}

impl FromRequestParts<AppState> for KeyCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        if let Some(known) = parts.extensions.get::<KeyCaller>() {
            return Ok(*known);
        }
        let presented = bearer(parts).ok_or(ApiError::Unauthorized)?;
        let caller = caller_for_key(state, presented).await?;
        if let Some(key) = caller.key_id {
            state.key_rates.charge(key, caller.caller)?;
        }
        parts.extensions.insert(caller);
        Ok(caller)
    }
}

/// A rate: requests a second, and how many may come at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRate {
    /// Requests a second, sustained; 0: no limit.
    pub per_second: u32,
    /// Requests at once after a quiet spell (at least 1).
    pub burst: u32,
}

/// One limiter per API key and its rate.
struct Limiter {
    limiter: DefaultKeyedRateLimiter<uuid::Uuid>,
    rate: KeyRate,
}

impl Limiter {
    fn new(rate: KeyRate) -> Option<Self> {
        let per_second = NonZeroU32::new(rate.per_second)?;
        let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
        Some(Self {
            limiter: DefaultKeyedRateLimiter::keyed(
                Quota::per_second(per_second).allow_burst(burst),
            ),
            rate,
        })
    }
}

/// Request rates of API keys, per key, on this control-api: account keys
/// at one rate, operator keys at another (`--api-key-rate`,
/// `--operator-key-rate`). Each instance counts its own requests, so N
/// control-apis behind a balancer allow a key up to N times its rate.
pub struct KeyRates {
    account: Option<Limiter>,
    operator: Option<Limiter>,
    /// All of one account's keys together, at [`ACCOUNT_RATE_FACTOR`] times
    /// a key's rate: minting more keys (an account may hold hundreds) does
    /// not multiply what an account may ask.
    whole_account: Option<Limiter>,
}

/// How many keys' worth of requests one account's keys share.
pub(crate) const ACCOUNT_RATE_FACTOR: u32 = 2;

impl KeyRates {
    pub fn new(account: KeyRate, operator: KeyRate) -> Self {
        let whole = KeyRate {
            per_second: account.per_second.saturating_mul(ACCOUNT_RATE_FACTOR),
            burst: account.burst.saturating_mul(ACCOUNT_RATE_FACTOR),
        };
        Self {
            account: Limiter::new(account),
            operator: Limiter::new(operator),
            whole_account: Limiter::new(whole),
        }
    }

    /// Charges one request to key `id` of `caller` (and an account key's
    /// request to its account too): past a rate, `429` with how long until
    /// the next is allowed.
    pub fn charge(&self, id: uuid::Uuid, caller: Caller) -> Result<(), ApiError> {
        match caller {
            Caller::Operator => Self::charge_one(&self.operator, id, "operator", "this API key"),
            Caller::Account(account) => {
                Self::charge_one(&self.account, id, "account", "this API key")?;
                Self::charge_one(
                    &self.whole_account,
                    account,
                    "whole_account",
                    "this account's API keys together",
                )
            }
        }
    }

    fn charge_one(
        limiter: &Option<Limiter>,
        id: uuid::Uuid,
        kind: &'static str,
        who: &str,
    ) -> Result<(), ApiError> {
        let Some(Limiter { limiter, rate }) = limiter else {
            return Ok(());
        };
        let Err(not_until) = limiter.check_key(&id) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(limiter.clock().now());
        metrics::counter!("proxynet_api_rate_limited_total", "key" => kind).increment(1);
        Err(ApiError::TooManyRequests {
            detail: format!(
                "{who} made more than {} requests a second (bursts of {}); retry in {} ms",
                rate.per_second,
                rate.burst.max(1),
                wait.as_millis().max(1)
            ),
            retry_after: retry_after_secs(wait),
        })
    }

    /// Forgets keys that are quiet again (bounded memory).
    pub fn housekeeping(&self) {
        for limiter in [&self.account, &self.operator, &self.whole_account]
            .into_iter()
            .flatten()
        {
            limiter.limiter.retain_recent();
        }
    }
}

/// Customer reports (`POST /v1/feedback`) a key may send a minute, sustained.
pub(crate) const FEEDBACK_PER_MINUTE: u32 = 10;
/// Reports a key may send at once after a quiet spell.
pub(crate) const FEEDBACK_BURST: u32 = 30;

/// Reports per API key ([`FEEDBACK_PER_MINUTE`], bursts of
/// [`FEEDBACK_BURST`]): far below a key's API rate, as a report may write a
/// cooldown and a row. The admin token has none. Like [`KeyRates`], counted
/// per control-api instance.
pub struct FeedbackRates(DefaultKeyedRateLimiter<uuid::Uuid>);

impl Default for FeedbackRates {
    fn default() -> Self {
        let per_minute = NonZeroU32::new(FEEDBACK_PER_MINUTE).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(FEEDBACK_BURST).unwrap_or(NonZeroU32::MIN);
        Self(DefaultKeyedRateLimiter::keyed(
            Quota::per_minute(per_minute).allow_burst(burst),
        ))
    }
}

impl FeedbackRates {
    /// Charges one report to key `id`: past its rate, `429` with how long
    /// until the next is allowed.
    pub fn charge(&self, id: uuid::Uuid) -> Result<(), ApiError> {
        let Err(not_until) = self.0.check_key(&id) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(self.0.clock().now());
        metrics::counter!("proxynet_api_rate_limited_total", "key" => "feedback").increment(1);
        Err(ApiError::TooManyRequests {
            detail: format!(
                "this API key sent more than {FEEDBACK_PER_MINUTE} reports a minute (bursts of {FEEDBACK_BURST}); retry in {} s",
                retry_after_secs(wait)
            ),
            retry_after: retry_after_secs(wait),
        })
    }

    /// Forgets keys that are quiet again (bounded memory).
    pub fn housekeeping(&self) {
        self.0.retain_recent();
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1.
fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// Who a presented key (the admin token or an API key) belongs to. A key is
/// valid while neither it nor its account is revoked or deleted.
pub(crate) async fn caller_for_key(
    state: &AppState,
    presented: &str,
) -> Result<KeyCaller, ApiError> {
    let digest = sha256_hex(presented);
    // Compare digests so the comparison time does not depend on the token's length.
    let admin = sha256_hex(state.admin_token.expose());
    if constant_time_eq(digest.as_bytes(), admin.as_bytes()) {
        return Ok(KeyCaller {
            caller: Caller::Operator,
            key_id: None,
        });
    }
    let key: Option<(uuid::Uuid, Option<uuid::Uuid>)> = sqlx::query_as(
        "SELECT k.id, k.account_id FROM api_keys k LEFT JOIN accounts a ON a.id = k.account_id
          WHERE k.key_sha256 = $1 AND k.revoked_at IS NULL AND a.deleted_at IS NULL",
    )
    .bind(&digest)
    .fetch_optional(&state.db)
    .await?;
    let (id, account) = key.ok_or(ApiError::Unauthorized)?;
    state.key_use.touch(&state.db, id).await;
    Ok(KeyCaller {
        caller: account.map_or(Caller::Operator, Caller::Account),
        key_id: Some(id),
    })
}

/// Whether key `id` is still valid (not revoked, its account not deleted).
pub(crate) async fn key_is_valid(state: &AppState, id: uuid::Uuid) -> Result<bool, sqlx::Error> {
    let row: Option<(uuid::Uuid,)> = sqlx::query_as(
        "SELECT k.id FROM api_keys k LEFT JOIN accounts a ON a.id = k.account_id
          WHERE k.id = $1 AND k.revoked_at IS NULL AND a.deleted_at IS NULL",
    )
    .bind(id)
    .fetch_optional(&state.db)
    .await?;
    Ok(row.is_some())
}

/// When each key was last used, written at most once a minute per key (a
/// busy key must not cost a row update per request).
#[derive(Default)]
pub struct KeyUse(std::sync::Mutex<std::collections::HashMap<uuid::Uuid, std::time::Instant>>);

/// How stale `last_used_at` may be.
const LAST_USED_GRANULARITY: std::time::Duration = std::time::Duration::from_secs(60);

impl KeyUse {
    async fn touch(&self, db: &sqlx::PgPool, id: uuid::Uuid) {
        let now = std::time::Instant::now();
        let due = match self.0.lock() {
            Ok(mut seen) => {
                if seen.len() > 100_000 {
                    seen.retain(|_, at| now.duration_since(*at) < LAST_USED_GRANULARITY);
                }
                match seen.get(&id) {
                    Some(at) if now.duration_since(*at) < LAST_USED_GRANULARITY => false,
                    _ => {
                        seen.insert(id, now);
                        true
                    }
                }
            }
            Err(_) => false,
        };
        if due {
            let written = sqlx::query("UPDATE api_keys SET last_used_at = now() WHERE id = $1")
                .bind(id)
                .execute(db)
                .await;
            if let Err(e) = written {
                tracing::debug!(error = %e, "cannot record a key's last use");
            }
        }
    }
}

/// Extractor for operator-only routes: account keys get 403.
pub(crate) struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Operator => Ok(Operator),
            Caller::Account(_) => Err(ApiError::Forbidden(
                "this route needs an operator key".into(),
            )),
        }
    }
}

/// The bearer token of a request, if it has a well-formed one.
pub(crate) fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// A new random secret: 32 bytes from the OS generator, hex-encoded, with a
/// readable prefix so leaked tokens are recognisable by secret scanners.
pub(crate) fn new_secret(prefix: &str) -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{prefix}_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(authorization: Option<&str>) -> Parts {
        let mut request = axum::http::Request::builder();
        if let Some(value) = authorization {
            request = request.header(axum::http::header::AUTHORIZATION, value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn an_account_key_sees_only_its_own_account() {
        let own = uuid::Uuid::new_v4();
        let caller = Caller::Account(own);
        assert_eq!(caller.scope(), Some(own));
        assert!(caller.check_account(own).is_ok());
        // Another account's data is absent, not forbidden: ids cannot be probed.
        assert!(matches!(
            caller.check_account(uuid::Uuid::new_v4()),
            Err(ApiError::NotFound("account"))
        ));
    }

    #[test]
    fn the_operator_is_scoped_to_every_account() {
        assert_eq!(Caller::Operator.scope(), None);
        assert!(Caller::Operator.check_account(uuid::Uuid::new_v4()).is_ok());
    }

    #[test]
    fn a_bearer_token_is_read_whatever_the_scheme_case() {
        assert_eq!(bearer(&parts(Some("Bearer pn_abc"))), Some("pn_abc"));
        assert_eq!(bearer(&parts(Some("bearer   pn_abc  "))), Some("pn_abc"));
        assert_eq!(bearer(&parts(Some("BEARER pn_abc"))), Some("pn_abc"));
    }

    #[test]
    fn other_schemes_and_empty_tokens_are_no_bearer_token() {
        for value in ["Basic dXNlcjpwYXNz", "Bearer", "Bearer    ", "pn_abc"] {
            assert_eq!(bearer(&parts(Some(value))), None, "{value:?}");
        }
        assert_eq!(bearer(&parts(None)), None);
    }

    #[test]
    fn a_key_past_its_burst_waits_for_its_rate_and_other_keys_do_not() {
        let rates = KeyRates::new(
            KeyRate {
                per_second: 1,
                burst: 3,
            },
            KeyRate {
                per_second: 0,
                burst: 0,
            },
        );
        let account = Caller::Account(uuid::Uuid::new_v4());
        let (key, neighbour) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        for _ in 0..3 {
            assert!(rates.charge(key, account).is_ok());
        }
        match rates.charge(key, account) {
            Err(ApiError::TooManyRequests {
                detail,
                retry_after,
            }) => {
                assert_eq!(retry_after, 1, "{detail}");
                assert!(detail.contains("1 requests a second"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        // Per key: a neighbour of the same account has its own budget, but
        // the account's keys together have ACCOUNT_RATE_FACTOR times one.
        for _ in 0..3 {
            assert!(rates.charge(neighbour, account).is_ok(), "per key");
        }
        let third = uuid::Uuid::new_v4();
        match rates.charge(third, account) {
            Err(ApiError::TooManyRequests { detail, .. }) => {
                assert!(
                    detail.contains("this account's API keys together"),
                    "{detail}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            rates
                .charge(third, Caller::Account(uuid::Uuid::new_v4()))
                .is_ok(),
            "another account is not charged"
        );
        // Operator keys here have no limit.
        for _ in 0..100 {
            assert!(rates.charge(key, Caller::Operator).is_ok());
        }
    }

    #[test]
    fn reports_past_their_burst_wait_a_minute_share_and_other_keys_do_not() {
        let rates = FeedbackRates::default();
        let (key, neighbour) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        for _ in 0..FEEDBACK_BURST {
            assert!(rates.charge(key).is_ok());
        }
        match rates.charge(key) {
            Err(ApiError::TooManyRequests {
                detail,
                retry_after,
            }) => {
                // One report comes back every six seconds.
                assert!((1..=6).contains(&retry_after), "{retry_after}: {detail}");
                assert!(detail.contains("10 reports a minute"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        assert!(rates.charge(neighbour).is_ok(), "per key");
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
    }

    #[test]
    fn new_secrets_are_prefixed_random_hex() {
        let a = new_secret("pn_key");
        let b = new_secret("pn_key");
        let hex = a.strip_prefix("pn_key_").unwrap();
        assert_eq!(hex.len(), 64);
        assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }
}
