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

use proxynet_protocol::redis_target::RedisConnection;
use proxynet_protocol::store::{
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
    /// The heartbeat reply as last built, one for agents whose policy
    /// reaches internal ranges and one for the rest: every agent of a kind
    /// gets the same answer, so 20,000 beats a second share one read.
    replies: std::sync::Arc<std::sync::Mutex<[Option<CachedReply>; 2]>>,
    /// The agents' admin addresses as last read.
    agent_admin: std::sync::Arc<std::sync::Mutex<Option<CachedAddrs>>>,
}

/// Addresses as read from Redis, and when.
type CachedAddrs = (std::time::Instant, Vec<std::net::SocketAddr>);

/// A serialised heartbeat reply and when it was built.
type CachedReply = (std::time::Instant, bytes::Bytes);

/// How long a heartbeat reply may reuse the superproxy list. Well below the
/// announcement TTL, so a superproxy that joins is dialled within a beat.
const SUPERPROXY_LIST_REUSE: Duration = Duration::from_millis(500);

/// How long the agents' admin addresses, as read from Redis, are reused
/// (they change when an agent moves its listener, rarely); a change reported
/// to this instance is read at its next reply.
const AGENT_ADMIN_REUSE: Duration = Duration::from_secs(10);

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
    /// Source types the account's plan prices; `None` without a plan.
    plan_types: Option<Vec<String>>,
}

#[derive(sqlx::FromRow)]
pub struct ExitRow {
    pub id: Uuid,
    pub name: String,
    pub source_type: String,
    pub owner: String,
    pub country: String,
    pub egress_ips: Vec<String>,
    pub credential_sha256: String,
    pub city: Option<String>,
    pub asn: Option<i64>,
    /// Agent-reported or operator-set.
    pub draining: bool,
    pub disabled: bool,
    pub version: i64,
    pub withdrawn: bool,
    /// The source's fields; `None` when the exit has no source.
    pub channel: Option<String>,
    pub supplier: Option<String>,
    pub agreement_ref: Option<String>,
    pub notice_description: Option<String>,
    pub source_opt_out: Option<String>,
    pub liable_party: Option<String>,
    pub abuse_contact: Option<String>,
    pub countries: Option<Vec<String>>,
    pub consent_required: Option<bool>,
    /// The exit's latest consent record.
    pub consent_state: Option<String>,
    pub consent_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// As persisted (batched, see `liveness.rs`).
    pub last_heartbeat_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl ExitRow {
    /// Whether the exit's provenance answers the four questions (where the
    /// address comes from and through which channel, how its owner was
    /// informed, how they opt out, who is liable) and, where consent is
    /// required, whether it is granted and unrevoked. Expiry is judged here
    /// and, at the instant itself, by every superproxy.
    pub fn provenance_block(&self) -> Option<ProvenanceBlock> {
        if self.withdrawn {
            return Some(ProvenanceBlock::Withdrawn);
        }
        let filled = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
        let complete = self.channel.as_deref().and_then(Channel::parse).is_some()
            && [
                &self.supplier,
                &self.agreement_ref,
                &self.notice_description,
                &self.source_opt_out,
                &self.liable_party,
                &self.abuse_contact,
            ]
            .into_iter()
            .all(filled)
            && self
                .countries
                .as_ref()
                .is_some_and(|c| c.contains(&self.country));
        if !complete {
            return Some(ProvenanceBlock::IncompleteProvenance);
        }
        if self.consent_required != Some(true) {
            return None;
        }
        match self.consent_state.as_deref() {
            None => Some(ProvenanceBlock::NoConsent),
            Some("revoked") => Some(ProvenanceBlock::ConsentRevoked),
            _ if self
                .consent_expires_at
                .is_some_and(|t| t <= chrono::Utc::now()) =>
            {
                Some(ProvenanceBlock::ConsentExpired)
            }
            _ => None,
        }
    }

    pub fn to_record(&self) -> ExitRecord {
        ExitRecord {
            id: self.id,
            name: self.name.clone(),
            egress_ips: self
                .egress_ips
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .collect(),
            source_type: SourceType::parse(&self.source_type).unwrap_or(SourceType::Dc),
            country: self.country.clone(),
            owner: self.owner.clone(),
            city: self.city.clone(),
            asn: self.asn.and_then(|a| u32::try_from(a).ok()),
            draining: self.draining,
            disabled: self.disabled,
            credential_sha256: self.credential_sha256.clone(),
            version: self.version,
            channel: self.channel.as_deref().and_then(Channel::parse),
            blocked: self.provenance_block(),
            consent_expires_at_ms: self
                .consent_expires_at
                .filter(|_| self.consent_required == Some(true))
                .map(|t| t.timestamp_millis()),
        }
    }
}

/// An exit with its source and its latest consent record. The projected
/// `draining` is the operator's switch; the agent's own drain announcement
/// reaches Redis with its heartbeat (`liveness.rs`).
const EXIT_SELECT: &str = "SELECT e.id, e.name, e.source_type, e.owner, e.country, e.egress_ips, \
     e.credential_sha256, e.city, e.asn, e.admin_draining AS draining, e.disabled, e.version, \
     e.withdrawn_at IS NOT NULL AS withdrawn, s.channel, s.supplier, s.agreement_ref, \
     s.notice_description, s.opt_out AS source_opt_out, s.liable_party, s.abuse_contact, \
     s.countries, s.consent_required, c.state AS consent_state, c.expires_at AS consent_expires_at, \
     e.last_heartbeat_at \
     FROM exits e LEFT JOIN sources s ON s.id = e.source_id \
     LEFT JOIN LATERAL (SELECT state, expires_at FROM consent_records \
                         WHERE exit_id = e.id ORDER BY version DESC LIMIT 1) c ON true";

/// A user with its account's entitlements and plan (`FROM USERS_FROM`).
const USER_COLUMNS: &str = "u.id, u.account_id, u.username, u.password_hash, \
     u.enabled AND a.deleted_at IS NULL AS enabled, u.version, \
     u.max_concurrent_tunnels, u.max_new_tunnels_per_second, u.bandwidth_bytes, u.quota_period, \
     u.allowed_source_types, u.allowed_countries, u.allowed_channels, u.allowlist_options, \
     u.deleted_at IS NOT NULL AS deleted, u.ceilings, a.entitlements, \
     CASE WHEN a.plan_id IS NULL THEN NULL ELSE \
       ARRAY(SELECT p.source_type FROM plan_prices p WHERE p.plan_id = a.plan_id ORDER BY 1) END \
       AS plan_types";

const USERS_FROM: &str = "proxy_users u JOIN accounts a ON a.id = u.account_id";

impl Projector {
    pub fn new(db: PgPool, redis: RedisConnection, keys: Keys) -> Self {
        Self {
            db,
            redis,
            keys,
            replies: Default::default(),
            agent_admin: Default::default(),
        }
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
                cidr.parse::<proxynet_protocol::egress::Cidr>()
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
                let json = serde_json::to_string(&row.to_record())?;
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

    /// One agent heartbeat: the exit is alive for `ttl` from now (Redis
    /// clock) and its drain announcement is recorded.
    pub async fn heartbeat(
        &self,
        id: Uuid,
        draining: bool,
        ttl: Duration,
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let _: i64 = redis::Script::new(HEARTBEAT_SCRIPT)
            .key(self.keys.exits_live())
            .key(self.keys.exits_draining())
            .key(self.keys.exit_changes())
            .arg(id.to_string())
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(if draining { "1" } else { "0" })
            .arg(EXIT_CHANGES_KEPT)
            .invoke_async(&mut redis)
            .await?;
        Ok(())
    }

    /// Live exit ids according to Redis.
    pub async fn live_exits(&self) -> Result<HashSet<Uuid>, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis::Script::new(LIVE_MEMBERS_SCRIPT)
            .key(self.keys.exits_live())
            .invoke_async(&mut redis)
            .await?;
        Ok(ids.iter().filter_map(|s| s.parse().ok()).collect())
    }

    /// The heartbeat reply `build` makes from the live superproxies and the
    /// agents' admin addresses, as JSON, reused while at most
    /// [`SUPERPROXY_LIST_REUSE`] old; `internal` picks the variant for agents
    /// whose policy reaches internal ranges.
    pub async fn heartbeat_reply<T: serde::Serialize>(
        &self,
        internal: bool,
        build: impl FnOnce(DenyInputs) -> T,
    ) -> Result<bytes::Bytes, ProjectionError> {
        let slot = usize::from(internal);
        if let Ok(cached) = self.replies.lock() {
            if let Some((at, reply)) = cached[slot].as_ref() {
                if at.elapsed() < SUPERPROXY_LIST_REUSE {
                    return Ok(reply.clone());
                }
            }
        }
        let inputs = DenyInputs {
            superproxies: self.live_superproxies().await?,
            agent_admin: self.agent_admin_addrs().await?,
        };
        let reply = bytes::Bytes::from(serde_json::to_vec(&build(inputs))?);
        if let Ok(mut cached) = self.replies.lock() {
            cached[slot] = Some((std::time::Instant::now(), reply.clone()));
        }
        Ok(reply)
    }

    /// Records exit `exit`'s admin listener addresses (see
    /// [`Keys::agent_admin_addrs`]), replacing what it reported before: one
    /// exit can only ever hold its own few entries.
    pub async fn record_agent_admin(
        &self,
        exit: Uuid,
        addrs: &[std::net::SocketAddr],
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let key = self.keys.agent_admin_addrs();
        if addrs.is_empty() {
            let _: i64 = redis.hdel(&key, exit.to_string()).await?;
        } else {
            let json = serde_json::to_string(addrs)?;
            let _: i64 = redis.hset(&key, exit.to_string(), json).await?;
        }
        // This instance's next reply reads them afresh (replies are rebuilt
        // at most twice a second); other instances within their reuse.
        if let Ok(mut cached) = self.agent_admin.lock() {
            *cached = None;
        }
        Ok(())
    }

    /// Every agent's admin addresses, deduplicated (most agents listen on
    /// the same loopback port), read at most every [`AGENT_ADMIN_REUSE`].
    async fn agent_admin_addrs(&self) -> Result<Vec<std::net::SocketAddr>, ProjectionError> {
        if let Ok(cached) = self.agent_admin.lock() {
            if let Some((at, addrs)) = cached.as_ref() {
                if at.elapsed() < AGENT_ADMIN_REUSE {
                    return Ok(addrs.clone());
                }
            }
        }
        let mut redis = self.redis.clone();
        let all: HashMap<String, String> = redis.hgetall(self.keys.agent_admin_addrs()).await?;
        let mut addrs: Vec<std::net::SocketAddr> = all
            .values()
            .filter_map(|json| serde_json::from_str::<Vec<std::net::SocketAddr>>(json).ok())
            .flatten()
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        if let Ok(mut cached) = self.agent_admin.lock() {
            *cached = Some((std::time::Instant::now(), addrs.clone()));
        }
        Ok(addrs)
    }

    pub async fn live_superproxies(&self) -> Result<Vec<SuperproxyRecord>, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis::Script::new(LIVE_MEMBERS_SCRIPT)
            .key(self.keys.superproxies_live())
            .invoke_async(&mut redis)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids
            .iter()
            .filter_map(|s| s.parse::<Uuid>().ok())
            .map(|id| self.keys.superproxy(id))
            .collect();
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut redis)
            .await?;
        Ok(values
            .into_iter()
            .flatten()
            .filter_map(|json| serde_json::from_str(&json).ok())
            .collect())
    }

    /// Every exit with its source and consent verdict (the same rows the
    /// projection writes), for the fleet view.
    pub async fn exit_rows(&self) -> Result<Vec<ExitRow>, ProjectionError> {
        Ok(sqlx::query_as(EXIT_SELECT).fetch_all(&self.db).await?)
    }

    /// Exits whose agent announced it is draining.
    pub async fn agent_draining(&self) -> Result<HashSet<Uuid>, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis.smembers(self.keys.exits_draining()).await?;
        Ok(ids.iter().filter_map(|s| s.parse().ok()).collect())
    }

    /// The summed running totals of every live superproxy.
    pub async fn superproxy_stats(
        &self,
    ) -> Result<proxynet_protocol::store::SuperproxyStats, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis::Script::new(LIVE_MEMBERS_SCRIPT)
            .key(self.keys.superproxies_live())
            .invoke_async(&mut redis)
            .await?;
        let mut total = proxynet_protocol::store::SuperproxyStats::default();
        let keys: Vec<String> = ids
            .iter()
            .filter_map(|s| s.parse::<Uuid>().ok())
            .map(|id| self.keys.stats(id))
            .collect();
        if keys.is_empty() {
            return Ok(total);
        }
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut redis)
            .await?;
        for one in values.into_iter().flatten().filter_map(|j| {
            serde_json::from_str::<proxynet_protocol::store::SuperproxyStats>(&j).ok()
        }) {
            total.tunnels_opened += one.tunnels_opened;
            total.bytes_up += one.bytes_up;
            total.bytes_down += one.bytes_down;
            for (k, v) in one.tunnels_failed {
                *total.tunnels_failed.entry(k).or_insert(0) += v;
            }
        }
        Ok(total)
    }

    /// Full re-projection of users and exits; removes user keys that no longer
    /// correspond to a live user.
    pub async fn resync(&self) -> Result<(), ProjectionError> {
        let users: Vec<UserRow> = sqlx::query_as(&format!(
            "SELECT {USER_COLUMNS} FROM {USERS_FROM} WHERE u.deleted_at IS NULL"
        ))
        .fetch_all(&self.db)
        .await?;
        let mut redis = self.redis.clone();
        // One pipeline per bucket (one hash slot each), several in flight.
        let mut by_bucket: HashMap<u8, Vec<&UserRow>> = HashMap::new();
        for row in &users {
            by_bucket
                .entry(user_bucket(&row.username))
                .or_default()
                .push(row);
        }
        let mut puts = Vec::new();
        for rows in by_bucket.values() {
            for chunk in rows.chunks(500) {
                let mut group = Vec::with_capacity(chunk.len());
                for row in chunk {
                    let json = serde_json::to_string(&user_record(row))?;
                    group.push(self.put_user(&row.username, &json, row.version, None));
                }
                puts.push(group);
            }
        }
        redis.exec_groups(puts).await?;
        // Keys of users this snapshot does not have: deleted while Redis was
        // away, or created after the snapshot. Each is re-checked on its own,
        // guarded by the version the key holds now. The bucket indexes list
        // every key (SCAN would see one node of a cluster only).
        let wanted: HashSet<&str> = users.iter().map(|u| u.username.as_str()).collect();
        let indexed: Vec<Vec<String>> = redis
            .query_batch(
                (0..USER_BUCKETS)
                    .map(|bucket| {
                        let mut cmd = redis::cmd("SMEMBERS");
                        cmd.arg(self.keys.users_in_bucket(bucket as u8));
                        cmd
                    })
                    .collect(),
            )
            .await?;
        let stale: Vec<String> = indexed
            .into_iter()
            .flatten()
            .filter(|name| !wanted.contains(name.as_str()))
            .collect();
        for username in stale {
            let key = self.keys.user(&username);
            let held: Option<String> = redis.get(&key).await?;
            if held.is_none() {
                // An expired tombstone (or a key lost with its node): only
                // the index entry is left to drop. Bound 0: a key written for
                // the name meanwhile (a user created again) is kept.
                let _: i64 = redis::Script::new(DEL_USER_SCRIPT)
                    .key(&key)
                    .key(self.keys.users_in_bucket(user_bucket(&username)))
                    .arg(0)
                    .arg(&username)
                    .invoke_async(&mut redis)
                    .await?;
                continue;
            }
            let version = held
                .as_deref()
                .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
                .and_then(|v| v["version"].as_i64());
            if held
                .as_deref()
                .and_then(|j| serde_json::from_str::<Tombstone>(j).ok())
                .is_some_and(|t| t.deleted)
            {
                continue; // a tombstone expires on its own
            }
            self.project_user(&username, Some(version.unwrap_or(0)))
                .await?;
        }

        self.rebuild_quota_counters(&users).await?;
        self.try_allowlist().await?;

        let exits: Vec<ExitRow> = sqlx::query_as(EXIT_SELECT).fetch_all(&self.db).await?;
        // Unchanged records are not rewritten and make no change entry, so a
        // resync of 100,000 unchanged exits costs the superproxies nothing.
        let put = redis::Script::new(PUT_EXIT_SCRIPT);
        let _: Result<String, _> = put.prepare_invoke().load_async(&mut redis).await;
        for chunk in exits.chunks(500) {
            let mut pipe = redis::pipe();
            for row in chunk {
                pipe.cmd("EVALSHA")
                    .arg(put.get_hash())
                    .arg(2)
                    .arg(self.keys.exit(row.id))
                    .arg(self.keys.exit_changes())
                    .arg(serde_json::to_string(&row.to_record())?)
                    .arg(row.version)
                    .arg(row.id.to_string())
                    .arg(EXIT_CHANGES_KEPT)
                    .ignore();
            }
            let _: () = pipe.query_async(&mut redis).await?;
        }
        Ok(())
    }

    /// Runs [`Self::resync`] now, every `period`, and at once whenever Redis
    /// (or one cluster node) comes back empty — a restart without
    /// persistence, a flush: the projection markers written after each full
    /// resync ([`Keys::projection_markers`]) are counted every second, so
    /// users and exits reappear within a second of Redis returning.
    /// Says the control plane is taking heartbeats: refreshes
    /// [`Keys::control_plane_alive`] every half `interval`, expiring after
    /// one `interval`, so superproxies notice within a heartbeat interval
    /// that no control-api answers (long before exits' liveness lapses).
    pub async fn run_presence(self, instance: String, interval: Duration) {
        let every = (interval / 2).max(Duration::from_millis(50));
        let ttl_ms = u64::try_from(interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(100);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut redis = self.redis.clone();
            let written: Result<(), _> = redis::cmd("SET")
                .arg(self.keys.control_plane_alive())
                .arg(&instance)
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut redis)
                .await;
            if let Err(e) = written {
                tracing::debug!(error = %e, "cannot refresh the control plane's presence");
            }
        }
    }

    pub async fn run_resync_loop(self, period: Duration) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_full: Option<std::time::Instant> = None;
        let markers = self.keys.projection_markers();
        loop {
            tick.tick().await;
            let mut redis = self.redis.clone();
            // One EXISTS over every marker (split per node on a cluster).
            let markers_present: Result<usize, _> = redis.exists(&markers).await;
            let due = last_full.is_none_or(|t| t.elapsed() >= period);
            match markers_present.map(|n| n == markers.len()) {
                Ok(true) if !due => continue,
                Ok(present) => {
                    if !present && last_full.is_some() {
                        tracing::warn!(
                            "redis lost the projection (restart or flush); re-projecting now"
                        );
                    }
                }
                Err(_) => continue, // Redis is down: nothing to write to yet.
            }
            match self.resync().await {
                Ok(()) => {
                    let pairs: Vec<(&String, &str)> = markers.iter().map(|m| (m, "1")).collect();
                    let _: Result<(), _> = redis.mset(&pairs).await;
                    tracing::debug!("redis projection resynced");
                    // After the markers: superproxies need not wait for a
                    // walk of the whole keyspace to stop running degraded.
                    if last_full.is_none() {
                        self.remove_legacy_user_keys().await;
                    }
                    last_full = Some(std::time::Instant::now());
                }
                Err(e) => tracing::warn!(error = %e, "redis projection resync failed; retrying"),
            }
        }
    }

    /// Releases before bucketed user keys wrote `user:{NAME}` and one
    /// `projection:complete` marker. Once the new layout is projected they are
    /// removed, so a superproxy of the old release still running cannot keep
    /// authenticating from records nobody updates any more (without them it
    /// falls back to its cache and reports the store degraded until it is
    /// upgraded). Those releases ran on a single Redis only, so SCAN sees
    /// every such key; on a cluster there is nothing to remove.
    async fn remove_legacy_user_keys(&self) {
        let RedisConnection::Single(conn) = &self.redis else {
            return;
        };
        let mut redis = conn.clone();
        // `user:{NAME}` ends in `}`; a bucketed key ends in its username,
        // which never holds a brace.
        let literal_prefix: String = self
            .keys
            .prefix()
            .chars()
            .flat_map(|c| {
                let glob = matches!(c, '*' | '?' | '[' | ']' | '\\');
                glob.then_some('\\').into_iter().chain([c])
            })
            .collect();
        let pattern = format!("{literal_prefix}user:{{*}}");
        let mut legacy: Vec<String> = Vec::new();
        let scan = redis::ScanOptions::default()
            .with_pattern(pattern)
            .with_count(1_000);
        if let Ok(mut keys) = redis.scan_options::<String>(scan).await {
            while let Some(Ok(key)) = keys.next_item().await {
                legacy.push(key);
            }
        }
        legacy.push(format!("{}projection:complete", self.keys.prefix()));
        for chunk in legacy.chunks(1_000) {
            let removed: Result<i64, _> = redis.del(chunk).await;
            if let Ok(n @ 1..) = removed {
                tracing::info!(removed = n, "removed user keys of the previous key layout");
            }
        }
    }

    /// Quota counters that Redis lost (restart, flush) are rebuilt from the
    /// ledger, never left at zero; live counters are not touched (`SET NX`).
    /// The accounts' totals too.
    async fn rebuild_quota_counters(&self, users: &[UserRow]) -> Result<(), ProjectionError> {
        let now = chrono::Utc::now().timestamp();
        let mut accounts_done = HashSet::new();
        for user in users
            .iter()
            .filter(|u| u.entitlements.0.limits.bandwidth_bytes.is_some())
        {
            if !accounts_done.insert(user.account_id) {
                continue;
            }
            let (window, start, end) = user.entitlements.0.limits.period().window(now);
            let key = self.keys.account_quota_used(user.account_id, &window);
            self.rebuild_counter(&key, LedgerScope::Account, user.account_id, start, end)
                .await?;
        }
        for user in users.iter().filter(|u| u.bandwidth_bytes.is_some()) {
            let period = QuotaPeriod::parse(&user.quota_period).unwrap_or_default();
            let (window, start, end) = period.window(now);
            let key = self.keys.quota_used(user.id, &window);
            self.rebuild_counter(&key, LedgerScope::User, user.id, start, end)
                .await?;
        }
        Ok(())
    }

    /// Sets `key`, if Redis lost it, to the bytes the ledger holds for `id`
    /// in `[start, end)`; it expires a week after the window.
    async fn rebuild_counter(
        &self,
        key: &str,
        scope: LedgerScope,
        id: Uuid,
        start: i64,
        end: i64,
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let exists: bool = redis.exists(key).await?;
        if exists {
            return Ok(());
        }
        let sql = match scope {
            LedgerScope::Account => {
                "SELECT COALESCE(SUM(bytes_up + bytes_down), 0)::bigint FROM usage_ledger
                  WHERE account_id = $1 AND minute >= to_timestamp($2) AND minute < to_timestamp($3)"
            }
            LedgerScope::User => {
                "SELECT COALESCE(SUM(bytes_up + bytes_down), 0)::bigint FROM usage_ledger
                  WHERE user_id = $1 AND minute >= to_timestamp($2) AND minute < to_timestamp($3)"
            }
        };
        let (used,): (i64,) = sqlx::query_as(sql)
            .bind(id)
            .bind(start as f64)
            .bind(end as f64)
            .fetch_one(&self.db)
            .await?;
        let _: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(used)
            .arg("NX")
            .arg("EXAT")
            .arg(end + 7 * 86_400)
            .query_async(&mut redis)
            .await?;
        Ok(())
    }

    /// How every superproxy currently sees `exits` (their published health
    /// observations), in the order given.
    pub async fn fleet_health(&self, exits: &[Uuid]) -> Result<Vec<FleetHealth>, ProjectionError> {
        if exits.is_empty() {
            return Ok(Vec::new());
        }
        let reports: Vec<HashMap<String, String>> = self
            .redis
            .query_batch(
                exits
                    .iter()
                    .map(|id| {
                        let mut cmd = redis::cmd("HGETALL");
                        cmd.arg(self.keys.health(*id));
                        cmd
                    })
                    .collect(),
            )
            .await?;
        Ok(reports
            .into_iter()
            .map(|by_superproxy| {
                let views: Vec<serde_json::Value> = by_superproxy
                    .values()
                    .filter_map(|v| serde_json::from_str(v).ok())
                    .collect();
                let reporting = views.len();
                let available = views.iter().filter(|v| v["available"] == true).count();
                let mean = |field: &str| {
                    (reporting > 0).then(|| {
                        views.iter().filter_map(|v| v[field].as_f64()).sum::<f64>()
                            / reporting as f64
                    })
                };
                let sum = |field: &str| views.iter().filter_map(|v| v[field].as_u64()).sum();
                FleetHealth {
                    superproxies_reporting: reporting,
                    superproxies_seeing_it_available: available,
                    superproxies_ejecting_it: views.iter().filter(|v| v["ejected"] == true).count(),
                    score: mean("score"),
                    success: mean("success_ewma"),
                    probe_rtt_ms: mean("probe_rtt_ms").filter(|v| *v > 0.0),
                    in_flight: sum("in_flight"),
                    ejections: sum("ejections"),
                    tunnels: sum("tunnels"),
                    bytes_up: sum("bytes_up"),
                    bytes_down: sum("bytes_down"),
                }
            })
            .collect())
    }
}

/// An exit's health as the superproxy fleet reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetHealth {
    pub superproxies_reporting: usize,
    pub superproxies_seeing_it_available: usize,
    /// Superproxies that currently eject it (passive faults).
    pub superproxies_ejecting_it: usize,
    /// Mean of the reporting superproxies' scores.
    pub score: Option<f64>,
    /// Mean connect success rate (EWMA) over the reporting superproxies.
    pub success: Option<f64>,
    /// Mean active-probe round trip, ms.
    pub probe_rtt_ms: Option<f64>,
    /// Tunnels open through the exit, summed over superproxies.
    pub in_flight: u64,
    /// Ejections so far, summed over superproxies.
    pub ejections: u64,
    /// Tunnels opened and bytes moved through it, summed over superproxies
    /// (totals since each superproxy linked it).
    pub tunnels: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
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
    // A user's quota is its own (its period); a ceiling of the same period
    // bounds it, one of another period is the account's total's business.
    let period = QuotaPeriod::parse(&row.quota_period).unwrap_or_default();
    let bandwidth = match ceilings.bandwidth_bytes {
        Some(c) if ceilings.period() == period => min_some(row.bandwidth_bytes, Some(c)),
        _ => row.bandwidth_bytes,
    };
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
