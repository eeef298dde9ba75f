//! Dedicated IPs: egress addresses (or IPv6 /64s of an exit's egress
//! prefix) allocated to one account, which only that account's tunnels
//! leave from (docs/dedicated.md).
//!
//! Each allocation is one row, one interval: releasing, replacing or moving
//! an address closes its row and (for the latter two) opens another, so
//! invoices count address-days from the rows alone and nothing is ever
//! rewritten. Allocation is serialised by one transaction-scoped advisory
//! lock: choosing free addresses and taking them is one step, and two
//! accounts never race for one address (the partial unique index is the
//! backstop). After the commit the exits concerned are re-projected: their
//! records carry their dedicated addresses, and the `exit:ID` event makes
//! every superproxy apply the change (and cut what may no longer leave from
//! an address) within milliseconds.

use crate::extract::{Json, Path, Query};
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use proxynet_store::SourceType;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::error::ApiError;
use crate::webhooks::{self, EventType};
use crate::{audit, AppState};

mod free;
mod steps;
#[cfg(test)]
mod tests;

use free::{free_addresses, named};
use steps::*;
pub(crate) use steps::{release_all_of, reproject};

/// Most addresses one call allocates.
const MAX_PER_CALL: u32 = 256;
/// Replacements per month for an account without a plan.
const DEFAULT_REPLACEMENTS: i64 = 2;
/// The prefix length an egress prefix is split into.
const DEDICATED_V6_PREFIX: u8 = 64;
/// How many /64s of a wider egress prefix are looked at per exit when
/// looking for free ones.
const V6_SUBNETS_SCANNED: u128 = 4_096;

/// One held allocation as the API shows it.
#[derive(Serialize, sqlx::FromRow)]
pub(super) struct Item {
    #[serde(skip)]
    id: Uuid,
    ip: String,
    prefix: bool,
    exit_id: Uuid,
    exit_name: String,
    account_id: Uuid,
    country: String,
    city: Option<String>,
    source_type: String,
    allocated_at: DateTime<Utc>,
    /// `live`, `down`, `draining` or `disabled` (from the exit's last
    /// persisted heartbeat and its switches).
    state: String,
    users: Vec<Uuid>,
    users_by_operator: bool,
    cents_per_month: i64,
}

#[derive(Serialize)]
pub(super) struct Items {
    items: Vec<Item>,
}

#[derive(Serialize)]
pub(super) struct Replacements {
    period: String,
    used: i64,
    allowed: i64,
}

#[derive(Serialize)]
pub(super) struct Listing {
    items: Vec<Item>,
    replacements: Replacements,
}

const ITEM_SELECT: &str = "SELECT d.id, d.address AS ip, d.is_prefix AS prefix, d.exit_id, \
     e.name AS exit_name, d.account_id, e.country, e.city, e.source_type, d.allocated_at, \
     CASE WHEN e.disabled OR e.withdrawn_at IS NOT NULL THEN 'disabled' \
          WHEN e.admin_draining OR e.draining THEN 'draining' \
          WHEN e.last_heartbeat_at > now() - interval '1 minute' THEN 'live' \
          ELSE 'down' END AS state, \
     ARRAY(SELECT du.user_id FROM dedicated_ip_users du WHERE du.dedicated_ip_id = d.id \
           ORDER BY du.user_id) AS users, \
     d.users_by_operator, d.cents_per_month \
     FROM dedicated_ips d JOIN exits e ON e.id = d.exit_id \
     WHERE d.released_at IS NULL";

async fn items_where(
    db: impl sqlx::PgExecutor<'_>,
    filter: &str,
    account: Option<Uuid>,
    ids: &[Uuid],
) -> Result<Vec<Item>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{ITEM_SELECT} {filter} ORDER BY d.allocated_at, d.address"
    ))
    .bind(account)
    .bind(ids)
    .fetch_all(db)
    .await
}

/// `count` (with optional targeting) or, for operators, `ips`
/// (docs/dedicated.md).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "AllocateDedicated")]
pub(super) struct Allocate {
    #[schemars(range(min = 1, max = MAX_PER_CALL))]
    count: Option<u32>,
    #[schemars(regex(pattern = "^[A-Za-z]{2}$"))]
    country: Option<String>,
    city: Option<String>,
    #[schemars(with = "Option<SourceType>")]
    source_type: Option<String>,
    /// Operators only: these addresses (or /64 prefixes), exactly.
    #[schemars(length(min = 1, max = MAX_PER_CALL))]
    ips: Option<Vec<String>>,
    /// The account's users the addresses serve (none: all of them).
    users: Option<Vec<Uuid>>,
}

/// What a free address must match.
#[derive(Default, Clone)]
struct Wanted {
    country: Option<String>,
    city: Option<String>,
    source_type: Option<String>,
    /// Replacing: the same kind (a single address or a prefix) and family.
    kind: Option<(bool, bool)>,
}

/// A free address found for an allocation.
struct Free {
    exit_id: Uuid,
    address: String,
    is_prefix: bool,
}

/// `POST /v1/accounts/{id}/dedicated-ips`
pub(super) async fn allocate(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    Json(body): Json<Allocate>,
) -> Result<(StatusCode, Json<Items>), ApiError> {
    caller.check_account(account)?;
    let mut tx = state.db.begin().await?;
    lock(&mut tx).await?;
    let prices = account_prices(&mut tx, account).await?;
    let users = body.users.clone().unwrap_or_default();
    check_users(&mut tx, account, &users).await?;
    let chosen = match (&body.ips, body.count) {
        (Some(_), Some(_)) => {
            return Err(ApiError::BadRequest(
                "either count (with targeting) or ips, not both".into(),
            ))
        }
        (Some(ips), None) => {
            if caller != Caller::Operator {
                return Err(ApiError::Forbidden(
                    "only an operator allocates named addresses; ask for a count".into(),
                ));
            }
            named(&mut tx, ips).await?
        }
        (None, Some(count)) => {
            if count == 0 || count > MAX_PER_CALL {
                return Err(ApiError::BadRequest(format!("count: 1 to {MAX_PER_CALL}")));
            }
            if caller != Caller::Operator {
                within_plan(&mut tx, account, count, body.source_type.as_deref()).await?;
            }
            let wanted = Wanted {
                country: body.country.as_ref().map(|c| c.to_ascii_uppercase()),
                city: body.city.as_ref().map(|c| c.to_lowercase()),
                source_type: body.source_type.clone(),
                kind: None,
            };
            let free = free_addresses(&mut tx, &wanted, count as usize).await?;
            if free.len() < count as usize {
                return Err(ApiError::Conflict(format!(
                    "only {} free address(es) match{}; asked for {count}",
                    free.len(),
                    describe(&wanted)
                )));
            }
            free
        }
        (None, None) => {
            return Err(ApiError::BadRequest(
                "count (or, for operators, ips) is required".into(),
            ))
        }
    };
    let by = actor(caller);
    let mut ids = Vec::with_capacity(chosen.len());
    for free in &chosen {
        let id = insert(
            &mut tx,
            account,
            free,
            &prices,
            by,
            None,
            caller == Caller::Operator && body.users.is_some(),
        )
        .await?;
        assign(&mut tx, id, &users).await?;
        ids.push(id);
    }
    let items = items_where(&mut *tx, "AND d.id = ANY($2)", None, &ids).await?;
    let shown: Vec<&str> = items.iter().map(|i| i.ip.as_str()).collect();
    audit::record(
        &mut tx,
        by,
        "dedicated_ip.allocate",
        &account.to_string(),
        serde_json::json!({"ips": shown}),
    )
    .await?;
    webhooks::emit(
        &mut tx,
        EventType::DedicatedIpAllocated,
        Some(account),
        serde_json::json!({"account_id": account, "ips": shown}),
    )
    .await?;
    let exits: Vec<Uuid> = items.iter().map(|i| i.exit_id).collect();
    touch(&mut tx, &exits).await?;
    tx.commit().await?;
    webhooks::wake();
    reproject(&state, exits).await;
    Ok((StatusCode::CREATED, Json(Items { items })))
}

/// `GET /v1/accounts/{id}/dedicated-ips`
pub(super) async fn list(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
) -> Result<Json<Listing>, ApiError> {
    caller.check_account(account)?;
    let exists: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM accounts WHERE id = $1 AND deleted_at IS NULL")
            .bind(account)
            .fetch_optional(&state.db)
            .await?;
    exists.ok_or(ApiError::NotFound("account"))?;
    let items = items_where(
        &state.db,
        "AND d.account_id = $1 AND $2::uuid[] IS NOT NULL",
        Some(account),
        &[],
    )
    .await?;
    let mut conn = state.db.acquire().await?;
    let replacements = replacements(&mut conn, account).await?;
    Ok(Json(Listing {
        items,
        replacements,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MapQuery {
    account_id: Option<Uuid>,
}

/// `GET /v1/dedicated-ips` (operators): every held address.
pub(super) async fn map(
    _: Operator,
    State(state): State<AppState>,
    Query(query): Query<MapQuery>,
) -> Result<Json<Items>, ApiError> {
    let items = items_where(
        &state.db,
        "AND ($1::uuid IS NULL OR d.account_id = $1) AND $2::uuid[] IS NOT NULL",
        query.account_id,
        &[],
    )
    .await?;
    Ok(Json(Items { items }))
}

/// `DELETE /v1/accounts/{id}/dedicated-ips/{ip}`
pub(super) async fn release(
    caller: Caller,
    State(state): State<AppState>,
    Path((account, ip)): Path<(Uuid, String)>,
) -> Result<StatusCode, ApiError> {
    caller.check_account(account)?;
    let mut tx = state.db.begin().await?;
    lock(&mut tx).await?;
    let held = held(&mut tx, account, &ip).await?;
    close(&mut tx, held.id, "released").await?;
    let by = actor(caller);
    audit::record(
        &mut tx,
        by,
        "dedicated_ip.release",
        &account.to_string(),
        serde_json::json!({"ip": held.ip}),
    )
    .await?;
    webhooks::emit(
        &mut tx,
        EventType::DedicatedIpReleased,
        Some(account),
        serde_json::json!({"account_id": account, "ip": held.ip}),
    )
    .await?;
    touch(&mut tx, &[held.exit_id]).await?;
    tx.commit().await?;
    webhooks::wake();
    reproject(&state, vec![held.exit_id]).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/accounts/{id}/dedicated-ips/{ip}/replace`: a free address of the
/// same country, city, source type, kind and family instead; the old one is
/// released (and its open tunnels cut). Counts against the month's allowance.
pub(super) async fn replace(
    caller: Caller,
    State(state): State<AppState>,
    Path((account, ip)): Path<(Uuid, String)>,
) -> Result<Json<Items>, ApiError> {
    caller.check_account(account)?;
    let mut tx = state.db.begin().await?;
    lock(&mut tx).await?;
    let old = held(&mut tx, account, &ip).await?;
    let allowance = replacements(&mut tx, account).await?;
    if allowance.used >= allowance.allowed {
        return Err(ApiError::Conflict(format!(
            "replacement allowance used: {} of {} in {}",
            allowance.used, allowance.allowed, allowance.period
        )));
    }
    let family_v4 = old
        .ip
        .split('/')
        .next()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .is_some_and(|a| a.is_ipv4());
    let wanted = Wanted {
        country: Some(old.country.clone()),
        city: old.city.clone(),
        source_type: Some(old.source_type.clone()),
        kind: Some((old.prefix, family_v4)),
    };
    // The old address stays held until this transaction ends, so it is
    // never handed back as its own replacement.
    let free = free_addresses(&mut tx, &wanted, 1).await?;
    let Some(free) = free.into_iter().next() else {
        return Err(ApiError::Conflict(format!(
            "no free address matches{} to replace {}",
            describe(&wanted),
            old.ip
        )));
    };
    let prices = account_prices(&mut tx, account).await?;
    close(&mut tx, old.id, "replaced").await?;
    let by = actor(caller);
    let id = insert(
        &mut tx,
        account,
        &free,
        &prices,
        by,
        Some(old.id),
        old.users_by_operator,
    )
    .await?;
    assign(&mut tx, id, &old.users).await?;
    let items = items_where(&mut *tx, "AND d.id = ANY($2)", None, &[id]).await?;
    audit::record(
        &mut tx,
        by,
        "dedicated_ip.replace",
        &account.to_string(),
        serde_json::json!({"old": old.ip, "new": free.address}),
    )
    .await?;
    webhooks::emit(
        &mut tx,
        EventType::DedicatedIpReplaced,
        Some(account),
        serde_json::json!({"account_id": account, "old": old.ip, "new": free.address}),
    )
    .await?;
    touch(&mut tx, &[old.exit_id, free.exit_id]).await?;
    tx.commit().await?;
    webhooks::wake();
    reproject(&state, vec![old.exit_id, free.exit_id]).await;
    Ok(Json(Items { items }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "AssignDedicated")]
pub(super) struct AssignUsers {
    user_ids: Vec<Uuid>,
}

/// `PUT /v1/accounts/{id}/dedicated-ips/{ip}/users`: which of the account's
/// users the address serves (empty: all). An operator's assignment binds
/// the customer, as every operator-set entitlement does.
pub(super) async fn set_users(
    caller: Caller,
    State(state): State<AppState>,
    Path((account, ip)): Path<(Uuid, String)>,
    Json(body): Json<AssignUsers>,
) -> Result<Json<Items>, ApiError> {
    caller.check_account(account)?;
    let mut tx = state.db.begin().await?;
    lock(&mut tx).await?;
    let held = held(&mut tx, account, &ip).await?;
    if held.users_by_operator && caller != Caller::Operator {
        return Err(ApiError::Forbidden(
            "an operator assigned this address's users; ask the operator to change them".into(),
        ));
    }
    check_users(&mut tx, account, &body.user_ids).await?;
    sqlx::query("DELETE FROM dedicated_ip_users WHERE dedicated_ip_id = $1")
        .bind(held.id)
        .execute(&mut *tx)
        .await?;
    assign(&mut tx, held.id, &body.user_ids).await?;
    sqlx::query("UPDATE dedicated_ips SET users_by_operator = $2 WHERE id = $1")
        .bind(held.id)
        .bind(caller == Caller::Operator)
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        actor(caller),
        "dedicated_ip.assign",
        &account.to_string(),
        serde_json::json!({"ip": held.ip, "user_ids": body.user_ids}),
    )
    .await?;
    let items = items_where(&mut *tx, "AND d.id = ANY($2)", None, &[held.id]).await?;
    touch(&mut tx, &[held.exit_id]).await?;
    tx.commit().await?;
    reproject(&state, vec![held.exit_id]).await;
    Ok(Json(Items { items }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "MoveDedicated")]
pub(super) struct Move {
    account_id: Uuid,
}

/// `POST /v1/dedicated-ips/{ip}/move` (operators): the address goes to
/// another account, priced by that account's plan; its user assignment is
/// dropped (the users were the old account's).
pub(super) async fn move_to(
    _: Operator,
    State(state): State<AppState>,
    Path(ip): Path<String>,
    Json(body): Json<Move>,
) -> Result<Json<Items>, ApiError> {
    let mut tx = state.db.begin().await?;
    lock(&mut tx).await?;
    let from: Option<(Uuid,)> = sqlx::query_as(
        "SELECT account_id FROM dedicated_ips WHERE released_at IS NULL AND (address = $1 OR address LIKE $1 || '/%')",
    )
    .bind(normalise(&ip)?)
    .fetch_optional(&mut *tx)
    .await?;
    let (from,) = from.ok_or(ApiError::NotFound("dedicated address"))?;
    let old = held(&mut tx, from, &ip).await?;
    if from == body.account_id {
        let items = items_where(&mut *tx, "AND d.id = ANY($2)", None, &[old.id]).await?;
        return Ok(Json(Items { items }));
    }
    let prices = account_prices(&mut tx, body.account_id).await?;
    close(&mut tx, old.id, "moved").await?;
    let free = Free {
        exit_id: old.exit_id,
        address: old.ip.clone(),
        is_prefix: old.prefix,
    };
    let id = insert(
        &mut tx,
        body.account_id,
        &free,
        &prices,
        "operator",
        None,
        false,
    )
    .await?;
    let items = items_where(&mut *tx, "AND d.id = ANY($2)", None, &[id]).await?;
    audit::record(
        &mut tx,
        "operator",
        "dedicated_ip.move",
        &old.ip,
        serde_json::json!({"from": from, "to": body.account_id}),
    )
    .await?;
    // Each account learns its own side, never the other account's id.
    for (account, direction) in [(from, "out"), (body.account_id, "in")] {
        webhooks::emit(
            &mut tx,
            EventType::DedicatedIpMoved,
            Some(account),
            serde_json::json!({"account_id": account, "ip": old.ip, "moved": direction}),
        )
        .await?;
    }
    touch(&mut tx, &[old.exit_id]).await?;
    tx.commit().await?;
    webhooks::wake();
    reproject(&state, vec![old.exit_id]).await;
    Ok(Json(Items { items }))
}
