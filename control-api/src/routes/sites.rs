//! Health per target site as the control plane shows and changes it
//! (docs/health.md, "Customer feedback and the sites API"): `GET
//! /v1/sites` lists the cooldowns of exits a site refuses, grouped by site,
//! worst first; `DELETE /v1/sites/{site}/cooldowns/{exit_id}` lets an
//! operator lift one. Customers' reports (`feedback.rs`) write cooldowns
//! through [`cool_fleet`] here.
//!
//! Everything lives in Redis under the contract of
//! `proxynet_store::site_cooldowns`, which the superproxies (the main
//! writers: they see the refusals) share: the same keys, field and value
//! formats, and every change announced on the events channel so each
//! superproxy applies it in memory without a Redis read.
//!
//! An operator sees the fleet. An account sees the fleet's cooldowns only
//! for sites it sent traffic to in the last 24 hours or reported itself,
//! and of the account-scoped cooldowns only its own: which sites refuse
//! which exits is what the operator's customers pay to learn, not
//! something one customer may read off another's traffic.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use proxynet_store::site_cooldowns::{self as contract, Announcement, Cooldown};
use rand::Rng;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::error::ApiError;
use crate::extract::{Json, Path, Query};
use crate::AppState;

/// A fleet cooldown written by the control plane (corroborated reports, an
/// operator's report) lasts this long the first time, doubling with each
/// repeat while the pair's back-off level is remembered.
pub(crate) const FLEET_COOL_BASE_MS: u64 = 10 * 60 * 1000;
/// The longest such cooldown.
pub(crate) const FLEET_COOL_MAX_MS: u64 = 6 * 3600 * 1000;
/// Most cooldowns the fleet keeps (the superproxies' bound too,
/// `superproxy/src/sites.rs`).
const MAX_FLEET_COOLDOWNS: u64 = 100_000;
/// Cooled sites kept per exit: the soonest to end goes first beyond it.
const COOLDOWNS_PER_EXIT: u64 = 64;
/// Sites an account's view may draw from its own traffic and reports.
const MAX_ACCOUNT_SITES: i64 = 10_000;

/// Lifts one fleet cooldown: the field out of all three keys (`KEYS` as
/// the store's `COOL_SCRIPT`; `ARGV[1]` the field, `ARGV[2]` the site), so the pair
/// also starts again from the base level. 1 when a live cooldown was
/// lifted, 0 when there was none (an ended one is forgotten all the same).
const LIFT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
if not v then return 0 end
local u = tonumber(string.match(v, '^(%-?%d+)'))
if u and u > now then return 1 end
return 0
";

pub(crate) fn unavailable(e: redis::RedisError) -> ApiError {
    ApiError::Unavailable(format!("site cooldowns unavailable: {e}"))
}

/// A site as a client wrote it, as cooldowns are keyed (400 otherwise).
pub(crate) fn site_param(raw: &str) -> Result<String, ApiError> {
    contract::site_of(raw).map_err(|e| ApiError::BadRequest(format!("site: {e}")))
}

/// One exit cooled for a site, fleet-wide.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct CooledExit {
    pub(crate) exit_id: Uuid,
    /// When the cooldown ends.
    pub(crate) until: DateTime<Utc>,
    /// Milliseconds from now (Redis' clock) until it ends.
    pub(crate) remaining_ms: i64,
    /// Cooldowns in a row for this pair, 0 the first (each doubles the next).
    pub(crate) level: u32,
}

/// One exit cooled for a site in one account's routing only.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct AccountCooledExit {
    pub(crate) account_id: Uuid,
    pub(crate) exit_id: Uuid,
    pub(crate) until: DateTime<Utc>,
    pub(crate) remaining_ms: i64,
}

/// One site and the exits cooled for it.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct SiteView {
    pub(crate) site: String,
    /// How many exits are cooled for it fleet-wide.
    pub(crate) cooled: usize,
    /// Those exits, the longest to go first.
    pub(crate) cooled_exits: Vec<CooledExit>,
    /// Exits cooled for one account only (its `blocked` reports): every
    /// account's for the operator, an account's own for its key.
    pub(crate) account_cooled_exits: Vec<AccountCooledExit>,
}

#[derive(Serialize)]
pub(super) struct SitesList {
    items: Vec<SiteView>,
}

#[derive(Deserialize)]
pub(super) struct SitesQuery {
    /// Only this site (a host name, address or block; normalised).
    site: Option<String>,
}

/// Every live cooldown at one instant of Redis' clock.
struct Snapshot {
    fleet: Vec<(Uuid, String, Cooldown)>,
    account: Vec<(Uuid, Uuid, String, i64)>,
    now_ms: i64,
}

async fn snapshot(state: &AppState) -> Result<Snapshot, ApiError> {
    let keys = state.projector.keys();
    let mut redis = state.redis.clone();
    let (fleet, account, (secs, micros)): (
        HashMap<String, String>,
        HashMap<String, String>,
        (i64, i64),
    ) = redis::pipe()
        .hgetall(keys.site_cooldowns())
        .hgetall(keys.site_account_cooldowns())
        .cmd("TIME")
        .query_async(&mut redis)
        .await
        .map_err(unavailable)?;
    let now_ms = secs * 1000 + micros / 1000;
    // Ended ones linger until a writer forgets them: never shown.
    let fleet = fleet
        .iter()
        .filter_map(|(field, value)| {
            let (exit, site) = contract::parse_field(field)?;
            let cooldown = Cooldown::parse(value)?;
            (cooldown.until_ms > now_ms).then(|| (exit, site.to_owned(), cooldown))
        })
        .collect();
    let account = account
        .iter()
        .filter_map(|(field, value)| {
            let (account, exit, site) = contract::parse_account_field(field)?;
            let until_ms: i64 = value.parse().ok()?;
            (until_ms > now_ms).then(|| (account, exit, site.to_owned(), until_ms))
        })
        .collect();
    Ok(Snapshot {
        fleet,
        account,
        now_ms,
    })
}

/// The sites an account may see the fleet's cooldowns of: those it sent
/// traffic to in the last 24 hours (the ledger's registrable domains, an
/// address as its block). Only its traffic: a report names any site, and
/// what the fleet knows of a site it never used is not its to read.
async fn account_sites(state: &AppState, account: Uuid) -> Result<HashSet<String>, ApiError> {
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT DISTINCT domain FROM usage_ledger
          WHERE account_id = $1 AND minute >= now() - interval '24 hours' AND domain IS NOT NULL
          LIMIT $2",
    )
    .bind(account)
    .bind(MAX_ACCOUNT_SITES)
    .fetch_all(&state.db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(domain,)| contract::site_of(&domain).ok())
        .collect())
}

/// The cooldowns `caller` may see, grouped by site, worst first (most
/// exits cooled fleet-wide, then most cooled for accounts); only `site`
/// when given.
pub(crate) async fn view(
    state: &AppState,
    caller: Caller,
    site: Option<&str>,
) -> Result<Vec<SiteView>, ApiError> {
    let visible = match caller {
        Caller::Operator => None,
        Caller::Account(account) => Some(account_sites(state, account).await?),
    };
    let snapshot = snapshot(state).await?;
    let now_ms = snapshot.now_ms;
    let timestamp = |ms: i64| DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default();
    let wanted = |s: &str| site.is_none_or(|only| only == s);
    let empty = |s: &str| SiteView {
        site: s.to_owned(),
        cooled: 0,
        cooled_exits: Vec::new(),
        account_cooled_exits: Vec::new(),
    };
    let mut sites: BTreeMap<String, SiteView> = BTreeMap::new();
    for (account, exit, s, until_ms) in snapshot.account {
        if !wanted(&s) || caller.scope().is_some_and(|own| own != account) {
            continue;
        }
        let view = sites.entry(s.clone()).or_insert_with(|| empty(&s));
        view.account_cooled_exits.push(AccountCooledExit {
            account_id: account,
            exit_id: exit,
            until: timestamp(until_ms),
            remaining_ms: until_ms - now_ms,
        });
    }
    for (exit, s, cooldown) in snapshot.fleet {
        let shown = match &visible {
            None => true,
            // An account's own cooldowns bring their site into its view.
            Some(own) => own.contains(&s) || sites.contains_key(&s),
        };
        if !wanted(&s) || !shown {
            continue;
        }
        let view = sites.entry(s.clone()).or_insert_with(|| empty(&s));
        view.cooled_exits.push(CooledExit {
            exit_id: exit,
            until: timestamp(cooldown.until_ms),
            remaining_ms: cooldown.until_ms - now_ms,
            level: cooldown.level,
        });
    }
    let mut items: Vec<SiteView> = sites
        .into_values()
        .map(|mut view| {
            view.cooled = view.cooled_exits.len();
            view.cooled_exits.sort_by_key(|c| Reverse(c.remaining_ms));
            view.account_cooled_exits
                .sort_by_key(|c| Reverse(c.remaining_ms));
            view
        })
        .collect();
    // Stable: equal sites stay in name order.
    items.sort_by_key(|v| (Reverse(v.cooled), Reverse(v.account_cooled_exits.len())));
    Ok(items)
}

/// `GET /v1/sites[?site=]`.
pub(super) async fn list(
    caller: Caller,
    State(state): State<AppState>,
    Query(query): Query<SitesQuery>,
) -> Result<Json<SitesList>, ApiError> {
    let site = query.site.as_deref().map(site_param).transpose()?;
    let items = view(&state, caller, site.as_deref()).await?;
    Ok(Json(SitesList { items }))
}

/// `DELETE /v1/sites/{site}/cooldowns/{exit_id}`: the exit goes back into
/// rotation for the site on every superproxy at once (announced), its
/// back-off forgotten; audited. 404 when no such cooldown is live.
pub(super) async fn lift(
    _op: Operator,
    State(state): State<AppState>,
    Path((site, exit)): Path<(String, Uuid)>,
) -> Result<StatusCode, ApiError> {
    let site = site_param(&site)?;
    let keys = state.projector.keys();
    let mut redis = state.redis.clone();
    let lifted: i64 = redis::Script::new(LIFT_SCRIPT)
        .key(keys.site_cooldowns())
        .key(keys.site_backoff())
        .key(keys.site_cooldowns_of_exit(exit))
        .arg(contract::field(exit, &site))
        .arg(&site)
        .invoke_async(&mut redis)
        .await
        .map_err(unavailable)?;
    if lifted == 0 {
        return Err(ApiError::NotFound("cooldown"));
    }
    announce(
        &state,
        &Announcement::Lifted {
            exit,
            site: site.clone(),
        },
    )
    .await;
    // Lifted already: an audit failure is logged, not undone.
    let recorded = async {
        let mut tx = state.db.begin().await?;
        crate::audit::record(
            &mut tx,
            "operator",
            "site.lift",
            &exit.to_string(),
            serde_json::json!({ "site": site }),
        )
        .await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = recorded {
        tracing::warn!(error = %e, exit = %exit, site = %site, "cooldown lifted but not audited");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Publishes a change on the events channel. Best effort: the cooldown is
/// already in Redis, where every superproxy's periodic resync finds it.
pub(crate) async fn announce_payload(state: &AppState, payload: String) {
    let mut redis = state.redis.clone();
    let published: Result<(), _> = redis
        .publish(state.projector.keys().events(), &payload)
        .await;
    if let Err(e) = published {
        tracing::warn!(error = %e, payload = %payload, "site cooldown change not announced");
    }
}

async fn announce(state: &AppState, announcement: &Announcement) {
    announce_payload(state, announcement.encode()).await;
}

/// What [`cool_fleet`] did.
#[derive(Serialize, Clone, Copy, Debug)]
pub(crate) struct FleetCooldown {
    /// Milliseconds until the pair's cooldown ends.
    pub(crate) remaining_ms: u64,
    pub(crate) level: u32,
    /// Whether this call cooled it (false: a live cooldown already held).
    pub(crate) new: bool,
}

/// Cools `exit` for `site` on the whole fleet (exponential back-off with
/// ±20 % jitter, under the contract's keys) and announces it; a pair
/// already cooled keeps its cooldown.
pub(crate) async fn cool_fleet(
    state: &AppState,
    exit: Uuid,
    site: &str,
) -> Result<FleetCooldown, ApiError> {
    let keys = state.projector.keys();
    let jitter: u32 = rand::thread_rng().gen_range(800..=1200);
    let mut redis = state.redis.clone();
    // The same script the superproxies cool with: one writer of the keys.
    let (remaining_ms, level, written, evicted): (i64, i64, i64, Vec<String>) =
        redis::Script::new(contract::COOL_SCRIPT)
            .key(keys.site_cooldowns())
            .key(keys.site_backoff())
            .key(keys.site_cooldowns_of_exit(exit))
            .arg(contract::field(exit, site))
            .arg(site)
            .arg(FLEET_COOL_BASE_MS)
            .arg(FLEET_COOL_MAX_MS)
            .arg(jitter)
            .arg(COOLDOWNS_PER_EXIT)
            .arg(MAX_FLEET_COOLDOWNS)
            .arg(keys.site_cooldowns_of_exit_stem())
            .invoke_async(&mut redis)
            .await
            .map_err(unavailable)?;
    let cooled = FleetCooldown {
        remaining_ms: u64::try_from(remaining_ms).unwrap_or(0),
        level: u32::try_from(level).unwrap_or(0),
        new: written == 1,
    };
    if cooled.new {
        announce(
            state,
            &Announcement::Cooled {
                exit,
                site: site.to_owned(),
                remaining_ms: cooled.remaining_ms,
                level: cooled.level,
            },
        )
        .await;
    }
    for gone in evicted {
        if let Some((exit, site)) = contract::parse_field(&gone) {
            let site = site.to_owned();
            announce(state, &Announcement::Lifted { exit, site }).await;
        }
    }
    Ok(cooled)
}
