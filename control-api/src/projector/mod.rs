//! Projects what the data plane needs from Postgres into Redis.
//!
//! Every write in the API is followed by a targeted projection (one user, one
//! exit) and a pub/sub event so superproxies drop stale cache entries at once.
//! A periodic full re-projection repairs anything a Redis outage made us miss,
//! including keys of users deleted while Redis was down. Postgres stays the
//! truth: a failed projection is logged and retried by the next resync, never
//! turned into a failed API call after the database change has committed.
//!
//! The projection is monotonic. Every projected row carries a version taken
//! from one database sequence on each change, and Redis is written only
//! through [`PUT_USER_SCRIPT`]: a record never replaces a newer one, so a
//! resync that read Postgres before a change and writes after it cannot undo
//! it (no resurrected disabled user). A deleted user leaves a versioned
//! tombstone for [`TOMBSTONE_TTL_SECS`] for the same reason.
//!
//! This file holds the targeted projections (one user, account, exit, the
//! allow-list); [`resync`] the full one and its loop, [`heartbeats`] the
//! agents' liveness and reply, [`fleet`] the reads behind the health views.

pub(crate) mod exits;
mod fleet;
mod heartbeats;
mod reply_cache;
mod resync;

pub(crate) use exits::ExitRow;
use exits::EXIT_SELECT;
use reply_cache::ReplyCache;

pub(crate) use fleet::FleetHealth;

use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{
    user_bucket, AccountLimits, Channel, ExitRecord, Keys, ProvenanceBlock, QuotaPeriod,
    SourceType, SuperproxyRecord, Tombstone, UserRecord, DEL_EXIT_SCRIPT, DEL_USER_SCRIPT,
    EXIT_CHANGES_KEPT, HEARTBEAT_SCRIPT, LIVE_MEMBERS_SCRIPT, PUT_EXIT_SCRIPT, PUT_USER_SCRIPT,
    TOMBSTONE_TTL_SECS, USER_BUCKETS,
};
use redis::AsyncCommands;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;

#[derive(Clone)]
pub struct Projector {
    db: PgPool,
    redis: RedisConnection,
    keys: Keys,
    /// What the heartbeat replies reuse: the reply as last built and the
    /// agents' admin addresses as last read ([`ReplyCache`]).
    cache: ReplyCache,
    /// `--strict-egress-verification`: a contradicted declared egress blocks
    /// the exit.
    strict_egress: bool,
}

/// What every exit must deny, as the heartbeat reply builder receives it.
pub struct DenyInputs {
    pub superproxies: Vec<SuperproxyRecord>,
    pub agent_admin: Vec<std::net::SocketAddr>,
}

#[derive(sqlx::FromRow)]
struct UserRow {
    id: Uuid,
    account_id: Uuid,
    username: String,
    password_hash: String,
    enabled: bool,
    version: i64,
    max_concurrent_tunnels: Option<i32>,
    max_new_tunnels_per_second: Option<i32>,
    bandwidth_bytes: Option<i64>,
    quota_period: String,
    allowed_source_types: Option<Vec<String>>,
    allowed_countries: Option<Vec<String>>,
    allowed_channels: Option<Vec<String>>,
    allowlist_options: String,
    deleted: bool,
    ceilings: sqlx::types::Json<crate::ceilings::Limits>,
    entitlements: sqlx::types::Json<crate::ceilings::Entitlements>,
    policy: sqlx::types::Json<proxynet_store::policy::TrafficPolicy>,
    account_policy: sqlx::types::Json<proxynet_store::policy::TrafficPolicy>,
    retry_rules: sqlx::types::Json<Vec<proxynet_store::policy::RetryRule>>,
    account_retry_rules: sqlx::types::Json<Vec<proxynet_store::policy::RetryRule>>,
    /// Source types the account's plan prices; `None` without a plan.
    plan_types: Option<Vec<String>>,
    dedicated_only: bool,
    dedicated_fallback: bool,
}

/// A user with its account's entitlements and plan (`FROM USERS_FROM`).
const USER_COLUMNS: &str = "u.id, u.account_id, u.username, u.password_hash, \
     u.enabled AND a.deleted_at IS NULL AS enabled, u.version, \
     u.max_concurrent_tunnels, u.max_new_tunnels_per_second, u.bandwidth_bytes, u.quota_period, \
     u.allowed_source_types, u.allowed_countries, u.allowed_channels, u.allowlist_options, \
     u.deleted_at IS NOT NULL AS deleted, u.ceilings, a.entitlements, \
     u.policy, a.policy AS account_policy, \
     u.retry_rules, a.retry_rules AS account_retry_rules, \
     CASE WHEN a.plan_id IS NULL THEN NULL ELSE \
       ARRAY(SELECT p.source_type FROM plan_prices p WHERE p.plan_id = a.plan_id ORDER BY 1) END \
       AS plan_types, u.dedicated_only, a.dedicated_fallback";

const USERS_FROM: &str = "proxy_users u JOIN accounts a ON a.id = u.account_id";

impl Projector {
    pub fn new(db: PgPool, redis: RedisConnection, keys: Keys) -> Self {
        Self {
            db,
            redis,
            keys,
            cache: ReplyCache::default(),
            strict_egress: false,
        }
    }

    /// With `strict`, exits whose declared egress the reflector contradicts
    /// are projected blocked (`egress_unverified`).
    pub fn with_strict_egress(mut self, strict: bool) -> Self {
        self.strict_egress = strict;
        self
    }

    pub fn strict_egress(&self) -> bool {
        self.strict_egress
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The [`PUT_USER_SCRIPT`] call writing `json` (carrying `version`) as
    /// `username`'s key unless Redis holds a newer record (1 written, 0 kept).
    fn put_user(
        &self,
        username: &str,
        json: &str,
        version: i64,
        ttl_secs: Option<u64>,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PUT_USER_SCRIPT)
            .arg(2)
            .arg(self.keys.user(username))
            .arg(self.keys.users_in_bucket(user_bucket(username)))
            .arg(json)
            .arg(version)
            .arg(ttl_secs.map(|t| t.to_string()).unwrap_or_default())
            .arg(username);
        cmd
    }

    /// Re-projects one proxy user by name (deleted or missing → key removed).
    pub async fn user(&self, username: &str) {
        if let Err(e) = self.try_user(username).await {
            tracing::warn!(error = %e, "user projection failed; the next resync repairs it");
        }
    }

    async fn try_user(&self, username: &str) -> Result<(), ProjectionError> {
        self.project_user(username, None).await
    }

    /// Writes what Postgres says of `username` now: its live record, or the
    /// tombstone of its latest deleted row, or — if it never existed — removes
    /// the key, but only if the key holds nothing newer than `absent_bound`
    /// (a user created meanwhile survives).
    async fn project_user(
        &self,
        username: &str,
        absent_bound: Option<i64>,
    ) -> Result<(), ProjectionError> {
        let row: Option<UserRow> = sqlx::query_as(&format!(
            "SELECT {USER_COLUMNS} FROM {USERS_FROM} WHERE u.username = $1
              ORDER BY (u.deleted_at IS NULL) DESC, u.version DESC LIMIT 1"
        ))
        .bind(username)
        .fetch_optional(&self.db)
        .await?;
        let mut redis = self.redis.clone();
        match row {
            Some(row) if !row.deleted => {
                let json = serde_json::to_string(&user_record(&row))?;
                let _: i64 = self
                    .put_user(username, &json, row.version, None)
                    .query_async(&mut redis)
                    .await?;
            }
            Some(row) => {
                let json = serde_json::to_string(&Tombstone {
                    deleted: true,
                    version: row.version,
                })?;
                let _: i64 = self
                    .put_user(username, &json, row.version, Some(TOMBSTONE_TTL_SECS))
                    .query_async(&mut redis)
                    .await?;
            }
            None => {
                let _: i64 = redis::Script::new(DEL_USER_SCRIPT)
                    .key(self.keys.user(username))
                    .key(self.keys.users_in_bucket(user_bucket(username)))
                    .arg(absent_bound.unwrap_or(i64::MAX))
                    .arg(username)
                    .invoke_async(&mut redis)
                    .await?;
            }
        }
        let _: () = redis
            .publish(self.keys.events(), format!("user:{username}"))
            .await?;
        Ok(())
    }

    /// Re-projects every user of an account (after its entitlements, plan or
    /// existence changed). The caller bumped their versions in Postgres.
    pub async fn account(&self, account: Uuid) {
        let names: Result<Vec<(String,)>, _> = sqlx::query_as(
            "SELECT username FROM proxy_users WHERE account_id = $1 AND deleted_at IS NULL",
        )
        .bind(account)
        .fetch_all(&self.db)
        .await;
        match names {
            Ok(names) => {
                for (name,) in names {
                    self.user(&name).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "account projection failed; the next resync repairs it")
            }
        }
    }

    /// Re-projects the whole IP allow-list (CIDR → username of live, enabled
    /// users) under a fresh key, swapped in atomically, then announces it.
    pub async fn allowlist(&self) {
        if let Err(e) = self.try_allowlist().await {
            tracing::warn!(error = %e, "allow-list projection failed; the next resync repairs it");
        }
    }

    async fn try_allowlist(&self) -> Result<(), ProjectionError> {
        let all: Vec<(
            String,
            String,
            sqlx::types::Json<crate::ceilings::Entitlements>,
        )> = sqlx::query_as(
            "SELECT c.cidr::text, u.username, a.entitlements FROM user_source_cidrs c
                   JOIN proxy_users u ON u.id = c.user_id
                   JOIN accounts a ON a.id = u.account_id
                  WHERE u.deleted_at IS NULL AND u.enabled AND a.deleted_at IS NULL",
        )
        .fetch_all(&self.db)
        .await?;
        // Networks the account's current rules no longer permit (an operator
        // tightened them) log nobody in: the rules bind what exists too.
        let rows: Vec<(String, String)> = all
            .into_iter()
            .filter(|(cidr, _, entitlements)| {
                cidr.parse::<proxynet_common::egress::Cidr>()
                    .is_ok_and(|c| entitlements.0.allowlist.permits(&c).is_ok())
            })
            .map(|(cidr, user, _)| (cidr, user))
            .collect();
        let mut redis = self.redis.clone();
        let (key, staging) = (self.keys.allowlist(), self.keys.allowlist_staging());
        let mut pipe = redis::pipe();
        pipe.atomic().del(&staging).ignore();
        for (cidr, username) in &rows {
            pipe.hset(&staging, cidr, username).ignore();
        }
        if rows.is_empty() {
            pipe.del(&key).ignore();
        } else {
            pipe.rename(&staging, &key).ignore();
        }
        let _: () = pipe.query_async(&mut redis).await?;
        let _: () = redis.publish(self.keys.events(), "allowlist").await?;
        Ok(())
    }

    /// Projects the operator's traffic policy and announces it (`policy`):
    /// every superproxy re-reads it at once.
    pub async fn operator_policy(&self) {
        if let Err(e) = self.try_operator_policy().await {
            tracing::warn!(error = %e, "operator policy projection failed; the next resync repairs it");
        }
    }

    pub(crate) async fn try_operator_policy(&self) -> Result<(), ProjectionError> {
        let body: Option<(sqlx::types::Json<proxynet_store::policy::OperatorPolicy>,)> =
            sqlx::query_as("SELECT body FROM operator_policy")
                .fetch_optional(&self.db)
                .await?;
        let policy = body.map(|(b,)| b.0).unwrap_or_default();
        let mut redis = self.redis.clone();
        let _: () = redis
            .set(self.keys.operator_policy(), serde_json::to_string(&policy)?)
            .await?;
        let _: () = redis.publish(self.keys.events(), "policy").await?;
        Ok(())
    }

    /// Re-projects every exit of a source (after the source changed).
    pub async fn source_exits(&self, source: Uuid) {
        let ids: Result<Vec<(Uuid,)>, _> =
            sqlx::query_as("SELECT id FROM exits WHERE source_id = $1")
                .bind(source)
                .fetch_all(&self.db)
                .await;
        match ids {
            Ok(ids) => {
                for (id,) in ids {
                    self.exit(id).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "source projection failed; the next resync repairs it")
            }
        }
    }

    /// Re-projects one exit's record (not its liveness, which heartbeats own).
    pub async fn exit(&self, id: Uuid) {
        if let Err(e) = self.try_exit(id).await {
            tracing::warn!(error = %e, exit = %id, "exit projection failed; the next resync repairs it");
        }
    }

    async fn try_exit(&self, id: Uuid) -> Result<(), ProjectionError> {
        let row: Option<ExitRow> = sqlx::query_as(&format!("{EXIT_SELECT} WHERE e.id = $1"))
            .bind(id)
            .fetch_optional(&self.db)
            .await?;
        let mut redis = self.redis.clone();
        match row {
            Some(row) => {
                let json = serde_json::to_string(&row.to_record(self.strict_egress))?;
                let _: i64 = redis::Script::new(PUT_EXIT_SCRIPT)
                    .key(self.keys.exit(id))
                    .key(self.keys.exit_changes())
                    .arg(json)
                    .arg(row.version)
                    .arg(id.to_string())
                    .arg(EXIT_CHANGES_KEPT)
                    .invoke_async(&mut redis)
                    .await?;
            }
            None => {
                let _: i64 = redis::Script::new(DEL_EXIT_SCRIPT)
                    .key(self.keys.exit(id))
                    .key(self.keys.exit_changes())
                    .arg(id.to_string())
                    .arg(EXIT_CHANGES_KEPT)
                    .invoke_async(&mut redis)
                    .await?;
            }
        }
        let _: () = redis
            .publish(self.keys.events(), format!("exit:{id}"))
            .await?;
        Ok(())
    }

    /// The exit's record as projected into Redis.
    pub async fn exit_record(&self, id: Uuid) -> Result<Option<ExitRecord>, ProjectionError> {
        let mut redis = self.redis.clone();
        let json: Option<String> = redis.get(self.keys.exit(id)).await?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }
}

/// What the superproxy enforces for a user: its own limits (never looser
/// than its operator ceilings), the account's restrictions intersected with
/// its own, the account's totals, and the source types its plan prices.
fn user_record(row: &UserRow) -> UserRecord {
    use crate::ceilings::{intersect, min_some};
    let ceilings = &row.ceilings.0;
    let account = &row.entitlements.0.limits;
    let count = |v: Option<i32>| v.and_then(|v| u32::try_from(v).ok());
    let restrict = |own: &Option<Vec<String>>,
                    ceiling: &Option<Vec<String>>,
                    account: &Option<Vec<String>>| {
        intersect(
            intersect(own.as_deref(), ceiling.as_deref()).as_deref(),
            account.as_deref(),
        )
    };
    let source_types = restrict(
        &row.allowed_source_types,
        &ceilings.allowed_source_types,
        &account.allowed_source_types,
    );
    let channels = restrict(
        &row.allowed_channels,
        &ceilings.allowed_channels,
        &account.allowed_channels,
    );
    let period = QuotaPeriod::parse(&row.quota_period).unwrap_or_default();
    let bandwidth = crate::ceilings::user_bandwidth(
        row.bandwidth_bytes,
        period,
        ceilings.bandwidth_bytes,
        ceilings.period(),
    );
    UserRecord {
        id: row.id,
        account_id: row.account_id,
        username: row.username.clone(),
        password_hash: row.password_hash.clone(),
        enabled: row.enabled,
        version: row.version,
        max_concurrent_tunnels: count(min_some(
            row.max_concurrent_tunnels,
            ceilings.max_concurrent_tunnels,
        )),
        max_new_tunnels_per_second: count(min_some(
            row.max_new_tunnels_per_second,
            ceilings.max_new_tunnels_per_second,
        )),
        bandwidth_bytes: bandwidth.and_then(|v| u64::try_from(v).ok()),
        quota_period: period,
        allowed_source_types: source_types
            .map(|types| types.iter().filter_map(|t| SourceType::parse(t)).collect()),
        allowed_countries: restrict(
            &row.allowed_countries,
            &ceilings.allowed_countries,
            &account.allowed_countries,
        ),
        allowlist_options: Some(row.allowlist_options.clone()).filter(|o| !o.is_empty()),
        allowed_channels: channels
            .map(|channels| channels.iter().filter_map(|c| Channel::parse(c)).collect()),
        account_limits: account.has_totals().then(|| AccountLimits {
            max_concurrent_tunnels: count(account.max_concurrent_tunnels),
            max_new_tunnels_per_second: count(account.max_new_tunnels_per_second),
            bandwidth_bytes: account.bandwidth_bytes.and_then(|v| u64::try_from(v).ok()),
            quota_period: account.period(),
        }),
        plan_source_types: row
            .plan_types
            .as_ref()
            .map(|types| types.iter().filter_map(|t| SourceType::parse(t)).collect()),
        policy: row.policy.0.clone(),
        account_policy: row.account_policy.0.clone(),
        dedicated_only: row.dedicated_only,
        dedicated_fallback: row.dedicated_fallback,
        retry_rules: row.retry_rules.0.clone(),
        account_retry_rules: row.account_retry_rules.0.clone(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Internal(String),
}

/// Whose bytes a rebuilt quota counter sums.
#[derive(Clone, Copy)]
enum LedgerScope {
    Account,
    User,
}
