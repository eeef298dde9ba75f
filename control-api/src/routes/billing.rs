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
use chrono::{DateTime, Datelike, TimeZone, Utc};
use proxynet_store::{QuotaPeriod, SourceType};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::error::{conflict_on_unique, ApiError};
use crate::routes::users::fetch;
use crate::{audit, AppState};

const BYTES_PER_GB: i128 = 1_000_000_000;

/// Replacements a month a plan allows when it does not say (the column's
/// default too).
const DEFAULT_DEDICATED_REPLACEMENTS_PER_MONTH: i32 = 2;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreatePlan {
    name: String,
    /// Cents per GB by source type (`dc`, `isp`, `res`, `mobile`).
    prices: BTreeMap<String, i64>,
    /// Cents per dedicated address per calendar month (default 0).
    #[serde(default)]
    dedicated_ip_price_cents: Option<i64>,
    /// Cents per dedicated IPv6 /64 per calendar month (default 0).
    #[serde(default)]
    dedicated_prefix_price_cents: Option<i64>,
    /// Replacements of a dedicated address an account may make per calendar
    /// month (default 2).
    #[serde(default)]
    dedicated_replacements_per_month: Option<i32>,
    /// Dedicated addresses (and prefixes) an account on this plan may hold
    /// at once by its own key (default 0: only an operator allocates).
    #[serde(default)]
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

#[derive(Deserialize)]
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

/// One dedicated allocation interval, clipped to the invoice's month.
#[derive(Debug, Serialize)]
pub(super) struct DedicatedLine {
    /// The address, or the prefix with its length (`2001:db8:0:1::/64`).
    ip: String,
    prefix: bool,
    exit_id: Uuid,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    address_days: i64,
    cents_per_month: i64,
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

/// A `dedicated_ips` row as the invoice reads it.
#[derive(sqlx::FromRow)]
struct DedicatedInterval {
    address: String,
    is_prefix: bool,
    exit_id: Uuid,
    allocated_at: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
    cents_per_month: i64,
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The part of `[allocated_at, released_at)` inside `[month_start,
/// month_end)`, an open interval ending `now`; `None` when nothing of it is
/// (an interval that ends where the month starts, or one not begun by now).
fn clip_to_month(
    allocated_at: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    month_start: DateTime<Utc>,
    month_end: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let from = allocated_at.max(month_start);
    let to = released_at.unwrap_or(now).min(month_end);
    (to > from).then_some((from, to))
}

/// Whole days from `from` to `to`, a started day counting as one (Postgres
/// keeps microseconds: a microsecond into a day starts it). 0 when `to` is
/// not after `from`.
fn address_days(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    // Past ±292,000 years microseconds overflow: no allocation spans that.
    let micros = (to - from).num_microseconds().unwrap_or(i64::MAX).max(0);
    micros / MICROS_PER_DAY + i64::from(micros % MICROS_PER_DAY != 0)
}

/// `ceil(cents_per_month × address_days / days_in_month)` in integers
/// (i128: no product overflows), rounded up like a byte line: never a
/// fraction of a cent below the days' share of the month.
fn dedicated_amount(cents_per_month: i64, address_days: i64, days_in_month: i64) -> i64 {
    let numerator = i128::from(cents_per_month.max(0)) * i128::from(address_days.max(0));
    let days_in_month = i128::from(days_in_month.max(1));
    let amount = (numerator + days_in_month - 1) / days_in_month;
    i64::try_from(amount).unwrap_or(i64::MAX)
}

/// The invoice line of one allocation interval in the month
/// `[month_start, month_end)` (module doc), or `None` when it lies outside.
fn dedicated_line(
    interval: DedicatedInterval,
    now: DateTime<Utc>,
    month_start: DateTime<Utc>,
    month_end: DateTime<Utc>,
) -> Option<DedicatedLine> {
    let (from, to) = clip_to_month(
        interval.allocated_at,
        interval.released_at,
        now,
        month_start,
        month_end,
    )?;
    let days_in_month = (month_end - month_start).num_days();
    let days = address_days(from, to).min(days_in_month);
    Some(DedicatedLine {
        ip: interval.address,
        prefix: interval.is_prefix,
        exit_id: interval.exit_id,
        from,
        to,
        address_days: days,
        cents_per_month: interval.cents_per_month,
        amount_cents: dedicated_amount(interval.cents_per_month, days, days_in_month),
    })
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
mod tests {
    use super::*;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).single().unwrap()
    }

    fn interval(
        allocated_at: DateTime<Utc>,
        released_at: Option<DateTime<Utc>>,
        cents_per_month: i64,
    ) -> DedicatedInterval {
        DedicatedInterval {
            address: "192.0.2.7".into(),
            is_prefix: false,
            exit_id: Uuid::nil(),
            allocated_at,
            released_at,
            cents_per_month,
        }
    }

    #[test]
    fn a_started_day_is_a_billed_day() {
        let t = at(2026, 12, 10, 8, 0, 0);
        assert_eq!(address_days(t, t), 0);
        assert_eq!(address_days(t, t + chrono::Duration::microseconds(1)), 1);
        assert_eq!(address_days(t, t + chrono::Duration::hours(23)), 1);
        assert_eq!(address_days(t, t + chrono::Duration::days(1)), 1);
        assert_eq!(
            address_days(
                t,
                t + chrono::Duration::days(1) + chrono::Duration::seconds(1)
            ),
            2
        );
        // 47 hours across three calendar days: two days of holding, not three.
        assert_eq!(address_days(t, at(2026, 12, 12, 7, 0, 0)), 2);
        assert_eq!(
            address_days(at(2026, 12, 1, 0, 0, 0), at(2027, 1, 1, 0, 0, 0)),
            31
        );
        // Backwards is nothing, never negative.
        assert_eq!(address_days(t, t - chrono::Duration::days(3)), 0);
    }

    #[test]
    fn the_amount_is_the_days_share_of_the_month_rounded_up() {
        assert_eq!(dedicated_amount(3100, 31, 31), 3100);
        assert_eq!(dedicated_amount(3100, 2, 31), 200);
        // 1000 / 31 = 32.26 cents a day: one day bills 33.
        assert_eq!(dedicated_amount(1000, 1, 31), 33);
        assert_eq!(dedicated_amount(300, 10, 30), 100);
        assert_eq!(dedicated_amount(500, 29, 29), 500);
        assert_eq!(dedicated_amount(0, 31, 31), 0);
        assert_eq!(dedicated_amount(1000, 0, 31), 0);
        // No overflow: the product is taken in i128.
        assert_eq!(dedicated_amount(i64::MAX, 31, 31), i64::MAX);
        assert_eq!(dedicated_amount(i64::MAX, 1, 31), i64::MAX / 31 + 1);
    }

    #[test]
    fn an_interval_is_clipped_to_the_month_and_an_open_one_ends_now() {
        let (start, end) = (at(2026, 12, 1, 0, 0, 0), at(2027, 1, 1, 0, 0, 0));
        let now = at(2026, 12, 15, 12, 0, 0);
        // Held since November, still held: from the month's start to now.
        assert_eq!(
            clip_to_month(at(2026, 11, 20, 0, 0, 0), None, now, start, end),
            Some((start, now))
        );
        // Released in January: up to the month's end.
        let later = at(2027, 2, 1, 0, 0, 0);
        assert_eq!(
            clip_to_month(
                at(2026, 12, 30, 0, 0, 0),
                Some(at(2027, 1, 5, 0, 0, 0)),
                later,
                start,
                end
            ),
            Some((at(2026, 12, 30, 0, 0, 0), end))
        );
        // Released the instant the month began, or allocated as it ended.
        assert_eq!(
            clip_to_month(at(2026, 11, 1, 0, 0, 0), Some(start), now, start, end),
            None
        );
        assert_eq!(clip_to_month(end, None, later, start, end), None);
        // A month not begun yet holds nothing of an open allocation.
        assert_eq!(
            clip_to_month(
                at(2026, 11, 1, 0, 0, 0),
                None,
                at(2026, 11, 30, 0, 0, 0),
                start,
                end
            ),
            None
        );
    }

    #[test]
    fn a_line_bills_its_own_price_snapshot_for_its_days_in_the_month() {
        let (start, end) = (at(2028, 2, 1, 0, 0, 0), at(2028, 3, 1, 0, 0, 0));
        let now = at(2028, 6, 1, 0, 0, 0);
        // Held across the whole of February 2028 (29 days) and beyond.
        let line = dedicated_line(
            interval(at(2028, 1, 31, 23, 0, 0), None, 2900),
            now,
            start,
            end,
        )
        .unwrap();
        assert_eq!((line.from, line.to), (start, end));
        assert_eq!(line.address_days, 29);
        assert_eq!(line.amount_cents, 2900);
        // 47 hours: two days of 29 at 2900 a month.
        let line = dedicated_line(
            interval(
                at(2028, 2, 10, 8, 0, 0),
                Some(at(2028, 2, 12, 7, 0, 0)),
                2900,
            ),
            now,
            start,
            end,
        )
        .unwrap();
        assert_eq!(line.address_days, 2);
        assert_eq!(line.amount_cents, 200);
        assert_eq!(line.ip, "192.0.2.7");
        assert!(!line.prefix);
        // An interval of another month is no line.
        assert!(dedicated_line(
            interval(at(2028, 1, 1, 0, 0, 0), Some(at(2028, 1, 9, 0, 0, 0)), 2900),
            now,
            start,
            end
        )
        .is_none());
    }
}
