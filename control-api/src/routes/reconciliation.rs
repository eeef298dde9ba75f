//! Reconciliation of an exit's traffic against its supplier's invoice:
//! the bytes the ledger recorded through the exit, per UTC day, both
//! directions, with what they cost at the source's price per GB and what
//! the customers were billed for them — the view an operator sets beside a
//! partner's invoice for an upstream exit (docs/provenance.md, "Upstream
//! exits"). Every byte comes from the ledger, so the view sums exactly to
//! it. What a partner adds on top (its own TLS and CONNECT handshakes) is
//! not in the ledger; docs/usage.md says how to account for it.

use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use chrono::{NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Operator;
use crate::error::ApiError;
use crate::extract::Json;
use crate::AppState;

/// Longest range one request covers, in days.
const MAX_DAYS: i64 = 366;
const BYTES_PER_GB: i128 = 1_000_000_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Range {
    /// First day, `YYYY-MM-DD` (UTC); default: 30 days before `to`.
    from: Option<String>,
    /// Last day, inclusive; default: today.
    to: Option<String>,
}

#[derive(Serialize, sqlx::FromRow)]
pub(super) struct Day {
    day: NaiveDate,
    bytes_up: i64,
    bytes_down: i64,
    /// What customers were billed for these bytes (their plans' prices).
    billed_cents: i64,
    #[sqlx(skip)]
    cost_cents: i64,
}

#[derive(Serialize)]
pub(super) struct Reconciliation {
    exit_id: Uuid,
    from: NaiveDate,
    to: NaiveDate,
    /// What the exit's source costs per GB, when the operator set it.
    cost_cents_per_gb: Option<i64>,
    days: Vec<Day>,
    bytes_up: i64,
    bytes_down: i64,
    cost_cents: i64,
    billed_cents: i64,
    margin_cents: i64,
}

fn parse_day(what: &str, value: &str) -> Result<NaiveDate, ApiError> {
    NaiveDate::parse_from_str(value, "%Y-%m-%d")
        .map_err(|_| ApiError::BadRequest(format!("{what}: YYYY-MM-DD")))
}

/// `cents_per_gb` × bytes, rounded up (never a fraction lost).
fn cents_for(bytes: i128, cents_per_gb: i64) -> i64 {
    let cents = bytes
        .saturating_mul(i128::from(cents_per_gb))
        .saturating_add(BYTES_PER_GB - 1)
        / BYTES_PER_GB;
    i64::try_from(cents).unwrap_or(i64::MAX)
}

/// `GET /v1/exits/{id}/reconciliation?from=&to=` (operators): JSON, or CSV
/// with `Accept: text/csv`.
pub(super) async fn reconciliation(
    _: Operator,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    Query(range): Query<Range>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let to = match &range.to {
        Some(to) => parse_day("to", to)?,
        None => Utc::now().date_naive(),
    };
    let out_of_range = || ApiError::BadRequest("from, to: dates out of range".into());
    let from = match &range.from {
        Some(from) => parse_day("from", from)?,
        None => to
            .checked_sub_signed(chrono::Duration::days(29))
            .ok_or_else(out_of_range)?,
    };
    if from > to || (to - from).num_days() >= MAX_DAYS {
        return Err(ApiError::BadRequest(format!(
            "from, to: from on or before to, at most {MAX_DAYS} days"
        )));
    }
    let cost: Option<(Option<i64>,)> = sqlx::query_as(
        "SELECT s.cost_cents_per_gb FROM exits e LEFT JOIN sources s ON s.id = e.source_id WHERE e.id = $1",
    )
    .bind(exit)
    .fetch_optional(&state.db)
    .await?;
    let (cost_cents_per_gb,) = cost.ok_or(ApiError::NotFound("exit"))?;
    let start = Utc.from_utc_datetime(&from.and_hms_opt(0, 0, 0).unwrap_or_default());
    let end = Utc.from_utc_datetime(
        &to.checked_add_signed(chrono::Duration::days(1))
            .ok_or_else(out_of_range)?
            .and_hms_opt(0, 0, 0)
            .unwrap_or_default(),
    );
    // Each ledger row billed at its own price, rounded up per row group
    // exactly as invoices round: per (day, price).
    let mut days: Vec<Day> = sqlx::query_as(
        "SELECT day, SUM(up)::bigint AS bytes_up, SUM(down)::bigint AS bytes_down,
                SUM(CEIL((up + down)::numeric * price / 1e9))::bigint AS billed_cents
           FROM (SELECT (l.minute AT TIME ZONE 'UTC')::date AS day, SUM(l.bytes_up) AS up,
                        SUM(l.bytes_down) AS down,
                        CASE WHEN l.billable THEN COALESCE(l.cents_per_gb, 0) ELSE 0 END AS price
                   FROM usage_ledger l
                  WHERE l.exit_id = $1 AND l.minute >= $2 AND l.minute < $3
                  GROUP BY 1, 4) per_price
          GROUP BY day ORDER BY day",
    )
    .bind(exit)
    .bind(start)
    .bind(end)
    .fetch_all(&state.db)
    .await?;
    for day in &mut days {
        let bytes = i128::from(day.bytes_up) + i128::from(day.bytes_down);
        day.cost_cents = cost_cents_per_gb.map_or(0, |c| cents_for(bytes, c));
    }
    let bytes_up = days
        .iter()
        .map(|d| d.bytes_up)
        .fold(0i64, i64::saturating_add);
    let bytes_down = days
        .iter()
        .map(|d| d.bytes_down)
        .fold(0i64, i64::saturating_add);
    let cost_cents = days
        .iter()
        .map(|d| d.cost_cents)
        .fold(0i64, i64::saturating_add);
    let billed_cents = days
        .iter()
        .map(|d| d.billed_cents)
        .fold(0i64, i64::saturating_add);
    let view = Reconciliation {
        exit_id: exit,
        from,
        to,
        cost_cents_per_gb,
        bytes_up,
        bytes_down,
        cost_cents,
        billed_cents,
        margin_cents: billed_cents.saturating_sub(cost_cents),
        days,
    };
    let wants_csv = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"));
    if !wants_csv {
        return Ok(Json(view).into_response());
    }
    let mut csv = String::from("day,bytes_up,bytes_down,bytes,cost_cents,billed_cents\n");
    for d in &view.days {
        csv.push_str(&format!(
            "{},{},{},{},{},{}\n",
            d.day,
            d.bytes_up,
            d.bytes_down,
            i128::from(d.bytes_up) + i128::from(d.bytes_down),
            d.cost_cents,
            d.billed_cents
        ));
    }
    csv.push_str(&format!(
        "total,{},{},{},{},{}\n",
        view.bytes_up,
        view.bytes_down,
        i128::from(view.bytes_up) + i128::from(view.bytes_down),
        view.cost_cents,
        view.billed_cents
    ));
    Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_round_up_and_never_overflow() {
        assert_eq!(cents_for(1, 100), 1);
        assert_eq!(cents_for(1_000_000_000, 250), 250);
        assert_eq!(cents_for(1_500_000_000, 3), 5);
        assert_eq!(cents_for(0, 999), 0);
        assert_eq!(cents_for(i128::from(i64::MAX) * 4, i64::MAX), i64::MAX);
    }
}
