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
use chrono::{DateTime, Datelike, TimeZone, Utc};
use proxynet_common::egress::Cidr;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::net::IpAddr;
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::error::ApiError;
use crate::webhooks::{self, EventType};
use crate::{audit, AppState};

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Allocate {
    count: Option<u32>,
    country: Option<String>,
    city: Option<String>,
    source_type: Option<String>,
    /// Operators only: these addresses (or /64 prefixes), exactly.
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

/// An exit as allocation sees it.
#[derive(sqlx::FromRow)]
struct ExitRow {
    id: Uuid,
    egress_ips: Vec<String>,
    egress_prefixes: Vec<String>,
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
            let free = free_addresses(&mut tx, &wanted, count as usize, &[]).await?;
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
    let free = free_addresses(&mut tx, &wanted, 1, &[]).await?;
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
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

// ---- the steps ----------------------------------------------------------------

fn actor(caller: Caller) -> &'static str {
    match caller {
        Caller::Operator => "operator",
        Caller::Account(_) => "account",
    }
}

async fn lock(tx: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('proxynet:dedicated_ips'))")
        .execute(tx)
        .await
        .map(|_| ())
}

/// The account's plan prices for an address and a prefix (0 without a plan).
struct Prices {
    address: i64,
    prefix: i64,
}

async fn account_prices(tx: &mut sqlx::PgConnection, account: Uuid) -> Result<Prices, ApiError> {
    let row: Option<(i64, i64)> = sqlx::query_as(
        "SELECT COALESCE(p.dedicated_ip_price_cents, 0), COALESCE(p.dedicated_prefix_price_cents, 0) \
           FROM accounts a LEFT JOIN plans p ON p.id = a.plan_id \
          WHERE a.id = $1 AND a.deleted_at IS NULL",
    )
    .bind(account)
    .fetch_optional(tx)
    .await?;
    let (address, prefix) = row.ok_or(ApiError::NotFound("account"))?;
    Ok(Prices { address, prefix })
}

/// An account's own key allocates within its plan: at most the plan's
/// `dedicated_max_addresses` held at once (none without a plan), and only
/// of a source type the plan prices. Operators allocate beyond it.
async fn within_plan(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
    count: u32,
    source_type: Option<&str>,
) -> Result<(), ApiError> {
    let (held, max, priced): (i64, Option<i32>, Option<Vec<String>>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM dedicated_ips WHERE account_id = $1 AND released_at IS NULL), \
                p.dedicated_max_addresses, \
                CASE WHEN p.id IS NULL THEN NULL ELSE \
                  ARRAY(SELECT pp.source_type FROM plan_prices pp WHERE pp.plan_id = p.id) END \
           FROM accounts a LEFT JOIN plans p ON p.id = a.plan_id WHERE a.id = $1",
    )
    .bind(account)
    .fetch_one(tx)
    .await?;
    let max = i64::from(max.unwrap_or(0));
    if held + i64::from(count) > max {
        return Err(ApiError::Forbidden(format!(
            "the account's plan allows {max} dedicated address(es); it holds {held}"
        )));
    }
    if let (Some(asked), Some(priced)) = (source_type, &priced) {
        if !priced.iter().any(|t| t == asked) {
            return Err(ApiError::Forbidden(format!(
                "the account's plan does not price type={asked}"
            )));
        }
    }
    Ok(())
}

/// Every user must be the account's own (and not deleted).
async fn check_users(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
    users: &[Uuid],
) -> Result<(), ApiError> {
    if users.is_empty() {
        return Ok(());
    }
    let distinct: HashSet<&Uuid> = users.iter().collect();
    let (found,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM proxy_users WHERE id = ANY($1) AND account_id = $2 AND deleted_at IS NULL",
    )
    .bind(users)
    .bind(account)
    .fetch_one(tx)
    .await?;
    if found != distinct.len() as i64 {
        return Err(ApiError::BadRequest(
            "users: every id must be one of this account's proxy users".into(),
        ));
    }
    Ok(())
}

async fn assign(tx: &mut sqlx::PgConnection, id: Uuid, users: &[Uuid]) -> Result<(), sqlx::Error> {
    if users.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO dedicated_ip_users (dedicated_ip_id, user_id) SELECT $1, unnest($2::uuid[]) ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(users)
    .execute(tx)
    .await
    .map(|_| ())
}

async fn insert(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
    free: &Free,
    prices: &Prices,
    by: &str,
    replaces: Option<Uuid>,
    users_by_operator: bool,
) -> Result<Uuid, ApiError> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO dedicated_ips (id, account_id, exit_id, address, is_prefix, replaces, cents_per_month, allocated_by, users_by_operator) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id)
    .bind(account)
    .bind(free.exit_id)
    .bind(&free.address)
    .bind(free.is_prefix)
    .bind(replaces)
    .bind(if free.is_prefix { prices.prefix } else { prices.address })
    .bind(by)
    .bind(users_by_operator)
    .execute(tx)
    .await
    .map_err(|e| {
        // 23P01: the address overlaps one held (a /64 around it, or inside).
        if let sqlx::Error::Database(db) = &e {
            if db.code().as_deref() == Some("23P01") {
                return ApiError::Conflict("that address overlaps one already dedicated to an account".into());
            }
        }
        crate::error::conflict_on_unique(e, "that address is already dedicated to an account")
    })?;
    Ok(id)
}

async fn close(tx: &mut sqlx::PgConnection, id: Uuid, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE dedicated_ips SET released_at = clock_timestamp(), release_reason = $2 WHERE id = $1 AND released_at IS NULL",
    )
    .bind(id)
    .bind(reason)
    .execute(tx)
    .await
    .map(|_| ())
}

/// An address as the path gives it: a single address, or a prefix's network
/// address (with or without its `/64`), printed as the gateway prints it.
fn normalise(ip: &str) -> Result<String, ApiError> {
    let bare = ip.split('/').next().unwrap_or_default();
    bare.parse::<IpAddr>()
        .map(|a| a.to_string())
        .map_err(|_| ApiError::BadRequest(format!("{ip:?} is not an IP address")))
}

/// The account's held allocation of `ip`, or 404.
async fn held(tx: &mut sqlx::PgConnection, account: Uuid, ip: &str) -> Result<Item, ApiError> {
    let address = normalise(ip)?;
    let found: Option<Item> = sqlx::query_as(&format!(
        "{ITEM_SELECT} AND d.account_id = $1 AND (d.address = $2 OR d.address LIKE $2 || '/%')"
    ))
    .bind(account)
    .bind(address)
    .fetch_optional(tx)
    .await?;
    found.ok_or(ApiError::NotFound("dedicated address"))
}

/// This month's replacements against the plan's allowance.
async fn replacements(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
) -> Result<Replacements, ApiError> {
    let now = Utc::now();
    let start = Utc
        .with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(now);
    let (used, allowed): (i64, Option<i32>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM dedicated_ips WHERE account_id = $1 AND replaces IS NOT NULL AND allocated_at >= $2), \
                (SELECT p.dedicated_replacements_per_month FROM accounts a JOIN plans p ON p.id = a.plan_id WHERE a.id = $1)",
    )
    .bind(account)
    .bind(start)
    .fetch_one(tx)
    .await?;
    Ok(Replacements {
        period: format!("{:04}-{:02}", now.year(), now.month()),
        used,
        allowed: allowed.map_or(DEFAULT_REPLACEMENTS, i64::from),
    })
}

fn describe(wanted: &Wanted) -> String {
    let mut parts = Vec::new();
    if let Some(c) = &wanted.country {
        parts.push(format!("country={c}"));
    }
    if let Some(c) = &wanted.city {
        parts.push(format!("city={c}"));
    }
    if let Some(t) = &wanted.source_type {
        parts.push(format!("type={t}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(" "))
    }
}

/// Exactly the named addresses: each must be an egress IP of an exit, or a
/// /64 inside an exit's egress prefix, and held by nobody.
async fn named(tx: &mut sqlx::PgConnection, ips: &[String]) -> Result<Vec<Free>, ApiError> {
    if ips.is_empty() || ips.len() > MAX_PER_CALL as usize {
        return Err(ApiError::BadRequest(format!(
            "ips: 1 to {MAX_PER_CALL} addresses"
        )));
    }
    let exits = exits_matching(tx, &Wanted::default()).await?;
    let mut chosen = Vec::new();
    for raw in ips {
        let cidr: Cidr = raw.parse().map_err(|_| {
            ApiError::BadRequest(format!("ips: {raw:?} is not an address or prefix"))
        })?;
        let single = cidr.host_bits() == 0;
        let found = exits.iter().find_map(|exit| {
            if single {
                let ip = cidr.network();
                exit.egress_ips
                    .iter()
                    .any(|e| e.parse::<IpAddr>().ok() == Some(ip))
                    .then(|| Free {
                        exit_id: exit.id,
                        address: ip.to_string(),
                        is_prefix: false,
                    })
            } else {
                let masked = cidr.masked();
                (masked.prefix_len() == DEDICATED_V6_PREFIX && masked.network().is_ipv6())
                    .then_some(())?;
                exit.egress_prefixes
                    .iter()
                    .filter_map(|p| p.parse::<Cidr>().ok())
                    .any(|p| p.covers(&masked))
                    .then(|| Free {
                        exit_id: exit.id,
                        address: masked.to_string(),
                        is_prefix: true,
                    })
            }
        });
        let free = found.ok_or_else(|| {
            ApiError::BadRequest(format!(
                "ips: {raw} is not an egress address of any exit (or an IPv6 /64 inside an exit's egress prefix)"
            ))
        })?;
        chosen.push(free);
    }
    let held = held_addresses(tx).await?;
    if let Some(taken) = chosen.iter().find(|f| held.takes(&f.address)) {
        return Err(ApiError::Conflict(format!(
            "{} is already dedicated to an account",
            taken.address
        )));
    }
    Ok(chosen)
}

/// Every address held now. A candidate is free only when it overlaps none
/// of them: a single IPv6 address inside someone's /64, or a /64 around
/// someone's single address, is taken too.
async fn held_addresses(tx: &mut sqlx::PgConnection) -> Result<Held, sqlx::Error> {
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT address FROM dedicated_ips WHERE released_at IS NULL")
            .fetch_all(tx)
            .await?;
    Ok(Held(
        rows.into_iter().filter_map(|(a,)| a.parse().ok()).collect(),
    ))
}

struct Held(Vec<Cidr>);

impl Held {
    fn takes(&self, address: &str) -> bool {
        address
            .parse::<Cidr>()
            .map_or(true, |a| self.0.iter().any(|h| h.overlaps(&a)))
    }
}

/// Exits that can carry a dedicated address and match `wanted`, live ones
/// first.
async fn exits_matching(
    tx: &mut sqlx::PgConnection,
    wanted: &Wanted,
) -> Result<Vec<ExitRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, egress_ips, egress_prefixes FROM exits \
          WHERE withdrawn_at IS NULL AND NOT disabled \
            AND ($1::text IS NULL OR country = $1) \
            AND ($2::text IS NULL OR city = $2) \
            AND ($3::text IS NULL OR source_type = $3) \
          ORDER BY last_heartbeat_at DESC NULLS LAST, id",
    )
    .bind(&wanted.country)
    .bind(&wanted.city)
    .bind(&wanted.source_type)
    .fetch_all(tx)
    .await
}

/// Up to `count` free addresses matching `wanted`, spread over exits (one
/// from each in turn), so an account's addresses do not all go down with one
/// host.
async fn free_addresses(
    tx: &mut sqlx::PgConnection,
    wanted: &Wanted,
    count: usize,
    exclude: &[String],
) -> Result<Vec<Free>, sqlx::Error> {
    let exits = exits_matching(tx, wanted).await?;
    let mut held = held_addresses(tx).await?;
    held.0
        .extend(exclude.iter().filter_map(|a| a.parse::<Cidr>().ok()));
    let per_exit: Vec<Vec<Free>> = exits
        .iter()
        .map(|exit| free_on(exit, wanted, &held, count))
        .collect();
    Ok(round_robin(per_exit, count))
}

/// The free addresses of one exit (at most `count`).
fn free_on(exit: &ExitRow, wanted: &Wanted, held: &Held, count: usize) -> Vec<Free> {
    let kind_ok = |prefix: bool, v4: bool| wanted.kind.is_none_or(|k| k == (prefix, v4));
    let mut out = Vec::new();
    for ip in exit
        .egress_ips
        .iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
    {
        let address = ip.to_string();
        if kind_ok(false, ip.is_ipv4()) && !held.takes(&address) {
            out.push(Free {
                exit_id: exit.id,
                address,
                is_prefix: false,
            });
        }
    }
    for prefix in exit
        .egress_prefixes
        .iter()
        .filter_map(|p| p.parse::<Cidr>().ok())
    {
        if !prefix.network().is_ipv6()
            || prefix.prefix_len() > DEDICATED_V6_PREFIX
            || !kind_ok(true, false)
        {
            continue;
        }
        for subnet in subnets_64(&prefix).take(V6_SUBNETS_SCANNED as usize) {
            if out.len() >= count {
                break;
            }
            let address = subnet.to_string();
            if !held.takes(&address) {
                out.push(Free {
                    exit_id: exit.id,
                    address,
                    is_prefix: true,
                });
            }
        }
    }
    out.truncate(count);
    out
}

/// The /64s of an IPv6 prefix of /64 or wider, in order.
fn subnets_64(prefix: &Cidr) -> impl Iterator<Item = Cidr> {
    let masked = prefix.masked();
    let base = match masked.network() {
        IpAddr::V6(v6) => u128::from(v6),
        IpAddr::V4(_) => 0,
    };
    let bits = u32::from(DEDICATED_V6_PREFIX.saturating_sub(masked.prefix_len()));
    let count: u128 = 1u128.checked_shl(bits).unwrap_or(u128::MAX);
    (0..count).map(move |i| {
        let network = base | (i << 64);
        format!(
            "{}/{DEDICATED_V6_PREFIX}",
            std::net::Ipv6Addr::from(network)
        )
        .parse()
        .unwrap_or(masked)
    })
}

/// One from each list in turn until `count`.
fn round_robin(mut lists: Vec<Vec<Free>>, count: usize) -> Vec<Free> {
    let mut out = Vec::new();
    for list in &mut lists {
        list.reverse();
    }
    while out.len() < count {
        let mut took = false;
        for list in &mut lists {
            if out.len() >= count {
                break;
            }
            if let Some(free) = list.pop() {
                out.push(free);
                took = true;
            }
        }
        if !took {
            break;
        }
    }
    out
}

/// A new version for each exit whose dedicated addresses changed, in the
/// same transaction: the projection only replaces an older record, so
/// without it the change would never reach Redis.
async fn touch(tx: &mut sqlx::PgConnection, exits: &[Uuid]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE exits SET version = nextval('projection_version') WHERE id = ANY($1)")
        .bind(exits)
        .execute(tx)
        .await
        .map(|_| ())
}

async fn reproject(state: &AppState, exits: Vec<Uuid>) {
    let mut seen = HashSet::new();
    for exit in exits {
        if seen.insert(exit) {
            state.projector.exit(exit).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wide_prefix_splits_into_64s_in_order() {
        let prefix: Cidr = "2001:db8:aa00::/56".parse().unwrap();
        let subnets: Vec<String> = subnets_64(&prefix).take(3).map(|c| c.to_string()).collect();
        assert_eq!(
            subnets,
            [
                "2001:db8:aa00::/64",
                "2001:db8:aa00:1::/64",
                "2001:db8:aa00:2::/64"
            ]
        );
        assert_eq!(subnets_64(&prefix).count(), 256);
        let one: Cidr = "2001:db8:1:2::/64".parse().unwrap();
        assert_eq!(
            subnets_64(&one).map(|c| c.to_string()).collect::<Vec<_>>(),
            ["2001:db8:1:2::/64"]
        );
    }

    #[test]
    fn allocation_spreads_over_exits() {
        let exit = |n: u8, k: usize| -> Vec<Free> {
            (0..k)
                .map(|i| Free {
                    exit_id: Uuid::from_u128(u128::from(n)),
                    address: format!("192.0.2.{}", usize::from(n) * 10 + i),
                    is_prefix: false,
                })
                .collect()
        };
        let picked = round_robin(vec![exit(1, 3), exit(2, 1), exit(3, 2)], 5);
        let order: Vec<&str> = picked.iter().map(|f| f.address.as_str()).collect();
        assert_eq!(
            order,
            [
                "192.0.2.10",
                "192.0.2.20",
                "192.0.2.30",
                "192.0.2.11",
                "192.0.2.31"
            ]
        );
    }

    #[test]
    fn a_path_address_is_normalised_and_a_prefix_may_keep_its_length() {
        assert_eq!(normalise("2001:DB8:0:1::/64").unwrap(), "2001:db8:0:1::");
        assert_eq!(normalise("127.0.0.2").unwrap(), "127.0.0.2");
        assert!(normalise("nope").is_err());
    }
}
