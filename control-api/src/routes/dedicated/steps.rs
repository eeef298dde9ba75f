//! The steps the routes are made of: the lock, the plan's bounds and
//! prices, the rows written and closed, the exits re-projected.

use super::{Free, Item, Replacements, Wanted, DEFAULT_REPLACEMENTS, ITEM_SELECT};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;
use chrono::{Datelike, TimeZone, Utc};
use std::collections::HashSet;
use std::net::IpAddr;
use uuid::Uuid;

pub(super) fn actor(caller: Caller) -> &'static str {
    match caller {
        Caller::Operator => "operator",
        Caller::Account(_) => "account",
    }
}

pub(super) async fn lock(tx: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('proxynet:dedicated_ips'))")
        .execute(tx)
        .await
        .map(|_| ())
}

/// The account's plan prices for an address and a prefix (0 without a plan).
pub(super) struct Prices {
    pub(super) address: i64,
    pub(super) prefix: i64,
}

pub(super) async fn account_prices(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
) -> Result<Prices, ApiError> {
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
pub(super) async fn within_plan(
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
pub(super) async fn check_users(
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

pub(super) async fn assign(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    users: &[Uuid],
) -> Result<(), sqlx::Error> {
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

pub(super) async fn insert(
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

pub(super) async fn close(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    reason: &str,
) -> Result<(), sqlx::Error> {
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
pub(super) fn normalise(ip: &str) -> Result<String, ApiError> {
    let bare = ip.split('/').next().unwrap_or_default();
    bare.parse::<IpAddr>()
        .map(|a| a.to_string())
        .map_err(|_| ApiError::BadRequest(format!("{ip:?} is not an IP address")))
}

/// The account's held allocation of `ip`, or 404.
pub(super) async fn held(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
    ip: &str,
) -> Result<Item, ApiError> {
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
pub(super) async fn replacements(
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

pub(super) fn describe(wanted: &Wanted) -> String {
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

/// A new version for each exit whose dedicated addresses changed, in the
/// same transaction: the projection only replaces an older record, so
/// without it the change would never reach Redis.
pub(super) async fn touch(tx: &mut sqlx::PgConnection, exits: &[Uuid]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE exits SET version = nextval('projection_version') WHERE id = ANY($1)")
        .bind(exits)
        .execute(tx)
        .await
        .map(|_| ())
}

/// Releases every address `account` holds (it is being deleted); the exits
/// they were on, touched for re-projection after the commit.
pub(crate) async fn release_all_of(
    tx: &mut sqlx::PgConnection,
    account: Uuid,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let released: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE dedicated_ips SET released_at = clock_timestamp(), release_reason = 'account_deleted'
          WHERE account_id = $1 AND released_at IS NULL RETURNING exit_id",
    )
    .bind(account)
    .fetch_all(&mut *tx)
    .await?;
    let mut exits: Vec<Uuid> = released.into_iter().map(|(e,)| e).collect();
    exits.sort_unstable();
    exits.dedup();
    touch(tx, &exits).await?;
    Ok(exits)
}

pub(crate) async fn reproject(state: &AppState, exits: Vec<Uuid>) {
    let mut seen = HashSet::new();
    for exit in exits {
        if seen.insert(exit) {
            state.projector.exit(exit).await;
        }
    }
}
