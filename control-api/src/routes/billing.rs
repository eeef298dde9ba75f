//! Plans, invoices and quota state.
//!
//! An invoice line is the ledger's bytes for one exit source type at one
//! price in one calendar month, times that price per GB (10^9 bytes, up +
//! down). Every ledger row carries the source type and price in force when
//! its bytes were recorded, so re-typing a source or changing an account's
//! plan never re-prices the past. Amounts are integer cents, rounded up per
//! line, so a customer is never billed for bytes we did not carry and we
//! never lose a fraction.
//!
//! An account on a plan routes only through the source types its plan
//! prices (the superproxy refuses the rest, 403); an account without a plan
//! routes through any type and its invoice lines are priced 0.
//!
//! Dedicated addresses are billed by the address-day, from the
//! `dedicated_ips` rows alone (each row is one allocation interval
//! `[allocated_at, released_at)`, still open while `released_at` is NULL):
//!
//! - every row of the account whose interval, its open end read as now,
//!   overlaps the month gives one `dedicated` line, the interval clipped to
//!   the month (`from`, `to`);
//! - `address_days` = the clipped duration in days rounded up to a whole
//!   day (a started day is billed), never more than the month's days;
//! - `amount_cents = ceil(cents_per_month × address_days / days_in_month)`,
//!   integer arithmetic, with the row's own `cents_per_month`: the price
//!   snapshot taken at allocation, so re-pricing a plan never re-prices the
//!   past;
//! - the invoice's `address_days` is the lines' sum and `total_cents`
//!   includes their amounts.
//!
//! A replacement or a move closes one row and opens another, so the day it
//! happens is a started day of both and is billed on both lines.

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{Datelike, TimeZone, Utc};
use proxynet_store::{QuotaPeriod, SourceType};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::error::{conflict_on_unique, ApiError};
use crate::routes::users::fetch;
use crate::{audit, AppState};

mod dedicated;

use dedicated::{dedicated_line, DedicatedInterval, DedicatedLine};

const BYTES_PER_GB: i128 = 1_000_000_000;

/// Replacements a month a plan allows when it does not say (the column's
/// default too).
const DEFAULT_DEDICATED_REPLACEMENTS_PER_MONTH: i32 = 2;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreatePlan {
    name: String,
    /// Cents per GB by source type (`dc`, `isp`, `res`, `mobile`).
    // Read as strings and checked (a source type each, never negative);
    // described as the map it is checked to be.
    #[schemars(with = "BTreeMap<SourceType, u64>")]
    prices: BTreeMap<String, i64>,
    /// Cents per dedicated address per calendar month (default 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    dedicated_ip_price_cents: Option<i64>,
    /// Cents per dedicated IPv6 /64 per calendar month (default 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    dedicated_prefix_price_cents: Option<i64>,
    /// Replacements of a dedicated address an account may make per calendar
    /// month (default 2).
    #[serde(default)]
    #[schemars(range(min = 0, max = i32::MAX))]
    dedicated_replacements_per_month: Option<i32>,
    /// Dedicated addresses (and prefixes) an account on this plan may hold
    /// at once by its own key (default 0: only an operator allocates).
    #[serde(default)]
    #[schemars(range(min = 0, max = i32::MAX))]
    dedicated_max_addresses: Option<i32>,
}

#[derive(Serialize)]
pub(super) struct Plan {
    id: Uuid,
    name: String,
    prices: BTreeMap<String, i64>,
    dedicated_ip_price_cents: i64,
    dedicated_prefix_price_cents: i64,
    dedicated_replacements_per_month: i32,
    dedicated_max_addresses: i32,
}

pub(super) async fn create_plan(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<CreatePlan>,
) -> Result<(StatusCode, Json<Plan>), ApiError> {
    if body.name.trim().is_empty() || body.name.len() > 200 {
        return Err(ApiError::BadRequest("name: 1 to 200 characters".into()));
    }
    for (source, cents) in &body.prices {
        if SourceType::parse(source).is_none() {
            return Err(ApiError::BadRequest(format!(
                "prices.{source}: not a source type (dc, isp, res, mobile)"
            )));
        }
        if *cents < 0 {
            return Err(ApiError::BadRequest(format!(
                "prices.{source}: must not be negative"
            )));
        }
    }
    let ip_price = body.dedicated_ip_price_cents.unwrap_or(0);
    let prefix_price = body.dedicated_prefix_price_cents.unwrap_or(0);
    let replacements = body
        .dedicated_replacements_per_month
        .unwrap_or(DEFAULT_DEDICATED_REPLACEMENTS_PER_MONTH);
    let max_addresses = body.dedicated_max_addresses.unwrap_or(0);
    for (field, value) in [
        ("dedicated_max_addresses", i64::from(max_addresses)),
        ("dedicated_ip_price_cents", ip_price),
        ("dedicated_prefix_price_cents", prefix_price),
        ("dedicated_replacements_per_month", i64::from(replacements)),
    ] {
        if value < 0 {
            return Err(ApiError::BadRequest(format!(
                "{field}: must not be negative"
            )));
        }
    }
    let id = Uuid::new_v4();
    let mut tx = state.db.begin().await?;
    sqlx::query(
        "INSERT INTO plans (id, name, dedicated_ip_price_cents, dedicated_prefix_price_cents,
                            dedicated_replacements_per_month, dedicated_max_addresses)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(body.name.trim())
    .bind(ip_price)
    .bind(prefix_price)
    .bind(replacements)
    .bind(max_addresses)
    .execute(&mut *tx)
    .await
    .map_err(|e| conflict_on_unique(e, "name: a plan with this name exists"))?;
    for (source, cents) in &body.prices {
        sqlx::query(
            "INSERT INTO plan_prices (plan_id, source_type, cents_per_gb) VALUES ($1, $2, $3)",
        )
        .bind(id)
        .bind(source)
        .bind(cents)
        .execute(&mut *tx)
        .await?;
    }
    audit::record(
        &mut tx,
        "operator",
        "plan.create",
        &id.to_string(),
        serde_json::json!({
            "name": body.name,
            "prices": body.prices,
            "dedicated_ip_price_cents": ip_price,
            "dedicated_prefix_price_cents": prefix_price,
            "dedicated_replacements_per_month": replacements,
            "dedicated_max_addresses": max_addresses,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(Plan {
            id,
            name: body.name.trim().to_owned(),
            prices: body.prices,
            dedicated_ip_price_cents: ip_price,
            dedicated_prefix_price_cents: prefix_price,
            dedicated_replacements_per_month: replacements,
            dedicated_max_addresses: max_addresses,
        }),
    ))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetPlan {
    plan_id: Uuid,
}

/// `PUT /v1/accounts/{id}/plan` (operators).
pub(super) async fn set_plan(
    _: Operator,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    Json(body): Json<SetPlan>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    let updated = sqlx::query("UPDATE accounts SET plan_id = $2 WHERE id = $1 AND deleted_at IS NULL AND EXISTS (SELECT 1 FROM plans WHERE id = $2)")
        .bind(account)
        .bind(body.plan_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if updated == 0 {
        return Err(ApiError::NotFound("account or plan"));
    }
    // Rows are priced by the plan in force at their minute.
    sqlx::query(
        "INSERT INTO account_plan_history (account_id, plan_id, from_at) VALUES ($1, $2, clock_timestamp())",
    )
    .bind(account)
    .bind(body.plan_id)
    .execute(&mut *tx)
    .await?;
    // The users' records carry which source types the plan prices.
    super::accounts::touch_users(&mut tx, account).await?;
    audit::record(
        &mut tx,
        "operator",
        "account.set_plan",
        &account.to_string(),
        serde_json::json!({"plan_id": body.plan_id}),
    )
    .await?;
    tx.commit().await?;
    state.projector.account(account).await;
    Ok(StatusCode::NO_CONTENT)
}

/// A plan as `list_plans` reads it: its prices as two parallel arrays.
#[derive(sqlx::FromRow)]
struct PlanRow {
    id: Uuid,
    name: String,
    source_types: Vec<String>,
    cents_per_gb: Vec<i64>,
    dedicated_ip_price_cents: i64,
    dedicated_prefix_price_cents: i64,
    dedicated_replacements_per_month: i32,
    dedicated_max_addresses: i32,
}

/// `GET /v1/plans?limit=&after=NAME` (operators), by name.
pub(super) async fn list_plans(
    _: Operator,
    State(state): State<AppState>,
    Query(page): Query<crate::routes::page::PageQuery>,
) -> Result<(axum::http::HeaderMap, Json<Vec<Plan>>), ApiError> {
    let limit = page.limit()?;
    let rows: Vec<PlanRow> = sqlx::query_as(
        "SELECT p.id, p.name,
                ARRAY(SELECT source_type FROM plan_prices WHERE plan_id = p.id ORDER BY source_type)
                  AS source_types,
                ARRAY(SELECT cents_per_gb FROM plan_prices WHERE plan_id = p.id ORDER BY source_type)
                  AS cents_per_gb,
                p.dedicated_ip_price_cents, p.dedicated_prefix_price_cents,
                p.dedicated_replacements_per_month, p.dedicated_max_addresses
           FROM plans p WHERE ($1::text IS NULL OR p.name > $1) ORDER BY p.name LIMIT $2",
    )
    .bind(&page.after)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let plans = rows
        .into_iter()
        .map(|row| Plan {
            id: row.id,
            name: row.name,
            prices: row.source_types.into_iter().zip(row.cents_per_gb).collect(),
            dedicated_ip_price_cents: row.dedicated_ip_price_cents,
            dedicated_prefix_price_cents: row.dedicated_prefix_price_cents,
            dedicated_replacements_per_month: row.dedicated_replacements_per_month,
            dedicated_max_addresses: row.dedicated_max_addresses,
        })
        .collect();
    let (headers, plans) =
        crate::routes::page::finish(plans, limit, "/v1/plans", |p| p.name.clone());
    Ok((headers, Json(plans)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct InvoiceQuery {
    /// `YYYY-MM`; default the current month.
    month: Option<String>,
    /// `json` (default) or `csv`.
    format: Option<String>,
}

#[derive(Serialize)]
pub(super) struct InvoiceLine {
    source_type: String,
    bytes_up: i64,
    bytes_down: i64,
    gb: f64,
    cents_per_gb: i64,
    amount_cents: i64,
}

#[derive(Serialize)]
pub(super) struct Invoice {
    account_id: Uuid,
    month: String,
    plan_id: Option<Uuid>,
    lines: Vec<InvoiceLine>,
    dedicated: Vec<DedicatedLine>,
    /// The dedicated lines' address-days, summed.
    address_days: i64,
    total_cents: i64,
}

/// `GET /v1/accounts/{id}/invoices?month=YYYY-MM&format=json|csv`
pub(super) async fn invoice(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    Query(query): Query<InvoiceQuery>,
) -> Result<Response, ApiError> {
    caller.check_account(account)?;
    let plan: Option<(Option<Uuid>,)> =
        sqlx::query_as("SELECT plan_id FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(&state.db)
            .await?;
    let (plan_id,) = plan.ok_or(ApiError::NotFound("account"))?;
    let (year, month) = match &query.month {
        Some(m) => parse_month(m)?,
        None => {
            let now = Utc::now();
            (now.year(), now.month())
        }
    };
    let start = Utc
        .with_ymd_and_hms(year, month, 1, 0, 0, 0)
        .single()
        .ok_or_else(|| ApiError::BadRequest("month: invalid".into()))?;
    let (ny, nm) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let end = Utc
        .with_ymd_and_hms(ny, nm, 1, 0, 0, 0)
        .single()
        .ok_or_else(|| ApiError::BadRequest("month: invalid".into()))?;
    // Priced from the rows themselves: what was in force when the bytes moved.
    // Bytes of attempts the gateway gave up on (a ban it retried through
    // another exit) are not billed (docs/usage.md).
    let rows: Vec<(String, i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT COALESCE(l.source_type, 'unknown'), SUM(l.bytes_up)::bigint,
                SUM(l.bytes_down)::bigint, l.cents_per_gb
           FROM usage_ledger l
          WHERE l.account_id = $1 AND l.minute >= $2 AND l.minute < $3 AND l.billable
          GROUP BY 1, l.cents_per_gb
          ORDER BY 1, l.cents_per_gb",
    )
    .bind(account)
    .bind(start)
    .bind(end)
    .fetch_all(&state.db)
    .await?;
    let lines: Vec<InvoiceLine> = rows
        .into_iter()
        .map(|(source_type, up, down, cents)| {
            let bytes = i128::from(up) + i128::from(down);
            let cents_per_gb = cents.unwrap_or(0);
            // Round up per line: integer arithmetic, no float money.
            let amount = (bytes * i128::from(cents_per_gb) + BYTES_PER_GB - 1) / BYTES_PER_GB;
            InvoiceLine {
                source_type,
                bytes_up: up,
                bytes_down: down,
                gb: bytes as f64 / BYTES_PER_GB as f64,
                cents_per_gb,
                amount_cents: i64::try_from(amount).unwrap_or(i64::MAX),
            }
        })
        .collect();
    // Every interval that overlaps the month; an open one is clipped at now
    // below (one clock for the whole invoice).
    let intervals: Vec<DedicatedInterval> = sqlx::query_as(
        "SELECT address, is_prefix, exit_id, allocated_at, released_at, cents_per_month
           FROM dedicated_ips
          WHERE account_id = $1 AND allocated_at < $3
            AND (released_at IS NULL OR released_at > $2)
          ORDER BY allocated_at, address",
    )
    .bind(account)
    .bind(start)
    .bind(end)
    .fetch_all(&state.db)
    .await?;
    let now = Utc::now();
    let dedicated: Vec<DedicatedLine> = intervals
        .into_iter()
        .filter_map(|interval| dedicated_line(interval, now, start, end))
        .collect();
    let total_address_days = dedicated
        .iter()
        .fold(0i64, |sum, l| sum.saturating_add(l.address_days));
    // Saturating: a line's amount is capped at i64::MAX, a sum of them must
    // not wrap into a negative bill.
    let total_cents = lines
        .iter()
        .map(|l| l.amount_cents)
        .chain(dedicated.iter().map(|l| l.amount_cents))
        .fold(0i64, i64::saturating_add);
    let invoice = Invoice {
        account_id: account,
        month: format!("{year:04}-{month:02}"),
        plan_id,
        lines,
        dedicated,
        address_days: total_address_days,
        total_cents,
    };
    match query.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(invoice).into_response()),
        "csv" => {
            let mut csv =
                String::from("month,source_type,bytes_up,bytes_down,cents_per_gb,amount_cents\n");
            for l in &invoice.lines {
                csv.push_str(&format!(
                    "{},{},{},{},{},{}\n",
                    invoice.month,
                    l.source_type,
                    l.bytes_up,
                    l.bytes_down,
                    l.cents_per_gb,
                    l.amount_cents
                ));
            }
            // Same columns: the address in `source_type` (`dedicated:` and
            // the address), no bytes, and its price per month where a byte
            // line has its price per GB.
            for l in &invoice.dedicated {
                csv.push_str(&format!(
                    "{},dedicated:{},,,{},{}\n",
                    invoice.month, l.ip, l.cents_per_month, l.amount_cents
                ));
            }
            csv.push_str(&format!(
                "{},total,,,,{}\n",
                invoice.month, invoice.total_cents
            ));
            Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv).into_response())
        }
        _ => Err(ApiError::BadRequest("format: json or csv".into())),
    }
}

fn parse_month(m: &str) -> Result<(i32, u32), ApiError> {
    let bad = || ApiError::BadRequest("month: YYYY-MM".into());
    let (y, mo) = m.split_once('-').ok_or_else(bad)?;
    let y: i32 = y.parse().map_err(|_| bad())?;
    let mo: u32 = mo.parse().map_err(|_| bad())?;
    if !(2000..=9999).contains(&y) || !(1..=12).contains(&mo) {
        return Err(bad());
    }
    Ok((y, mo))
}

#[derive(Serialize)]
pub(super) struct QuotaState {
    user_id: Uuid,
    bandwidth_bytes: Option<i64>,
    period: String,
    period_start: chrono::DateTime<Utc>,
    period_end: chrono::DateTime<Utc>,
    /// Bytes counted so far this period (the superproxies' shared counter, or
    /// the ledger when Redis cannot say).
    used_bytes: i64,
    remaining_bytes: Option<i64>,
    warn_percent: i32,
    /// Used at least `warn_percent` of the quota (the soft threshold).
    warning: bool,
    /// Used the whole quota: new tunnels are refused, open ones cut.
    exhausted: bool,
}

/// `GET /v1/users/{id}/quota`
pub(super) async fn quota(
    caller: Caller,
    State(state): State<AppState>,
    Path(user): Path<Uuid>,
) -> Result<Json<QuotaState>, ApiError> {
    fetch(&state, caller, user).await?;
    let (bandwidth, period, warn_percent): (Option<i64>, String, i32) = sqlx::query_as(
        "SELECT bandwidth_bytes, quota_period, quota_warn_percent FROM proxy_users WHERE id = $1",
    )
    .bind(user)
    .fetch_one(&state.db)
    .await?;
    let period = QuotaPeriod::parse(&period).unwrap_or_default();
    let (window, start, end) = period.window(Utc::now().timestamp());
    let mut redis = state.redis.clone();
    let counted: Option<i64> = redis::cmd("GET")
        .arg(state.projector.keys().quota_used(user, &window))
        .query_async::<Option<i64>>(&mut redis)
        .await
        .ok()
        .flatten();
    let used = match counted {
        Some(used) => used,
        None => {
            let (used,): (i64,) = sqlx::query_as(
                "SELECT COALESCE(SUM(bytes_up + bytes_down), 0)::bigint FROM usage_ledger
                  WHERE user_id = $1 AND minute >= to_timestamp($2) AND minute < to_timestamp($3)",
            )
            .bind(user)
            .bind(start as f64)
            .bind(end as f64)
            .fetch_one(&state.db)
            .await?;
            used
        }
    };
    let at = |secs: i64| Utc.timestamp_opt(secs, 0).single().unwrap_or_default();
    Ok(Json(QuotaState {
        user_id: user,
        bandwidth_bytes: bandwidth,
        period: period.as_str().to_owned(),
        period_start: at(start),
        period_end: at(end),
        used_bytes: used,
        remaining_bytes: bandwidth.map(|b| (b - used).max(0)),
        warn_percent,
        warning: bandwidth
            .is_some_and(|b| i128::from(used) * 100 >= i128::from(b) * i128::from(warn_percent)),
        exhausted: bandwidth.is_some_and(|b| used >= b),
    }))
}

#[cfg(test)]
mod tests;
