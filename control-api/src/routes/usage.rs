//! Usage read from the ledger: bytes per account, grouped as asked.

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageQuery {
    /// RFC 3339; default 24 hours before `to`.
    from: Option<DateTime<Utc>>,
    /// RFC 3339, exclusive; default now.
    to: Option<DateTime<Utc>>,
    /// Comma-separated dimensions (at most three): `user`, `exit`,
    /// `source_type`, `minute`, `day`, `domain`, `country`; or `account`
    /// (one row, the default).
    group_by: Option<String>,
}

#[derive(Serialize, sqlx::FromRow)]
pub(super) struct UsageRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    minute: Option<DateTime<Utc>>,
    /// Start of the UTC day.
    #[serde(skip_serializing_if = "Option::is_none")]
    day: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_type: Option<String>,
    /// The target's registrable domain; `other` beyond the account's
    /// hourly bound, `unknown` for rows recorded before domains were.
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    /// The exit's country (ISO 3166-1 alpha-2), `unknown` for older rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    country: Option<String>,
    /// Client → target.
    bytes_up: i64,
    /// Target → client.
    bytes_down: i64,
    /// Of `bytes_up + bytes_down`, those not billed (attempts the gateway
    /// gave up on for another exit); absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    not_billable_bytes: i64,
}

/// Serde's `skip_serializing_if` for [`UsageRow::not_billable_bytes`].
fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Each dimension: its name, its output column when grouped by it, and
/// what the column is otherwise. Only these strings reach the SQL text.
const DIMENSIONS: [(&str, &str, &str); 7] = [
    ("user", "l.user_id", "NULL::uuid AS user_id"),
    ("exit", "l.exit_id", "NULL::uuid AS exit_id"),
    ("minute", "l.minute", "NULL::timestamptz AS minute"),
    (
        "day",
        "date_trunc('day', l.minute, 'UTC')",
        "NULL::timestamptz AS day",
    ),
    (
        "source_type",
        "COALESCE(l.source_type, e.source_type)",
        "NULL::text AS source_type",
    ),
    (
        "domain",
        "COALESCE(l.domain, 'unknown')",
        "NULL::text AS domain",
    ),
    (
        "country",
        "COALESCE(l.country, 'unknown')",
        "NULL::text AS country",
    ),
];

/// Most rows one answer holds; more means the period or grouping is too wide.
const MAX_ROWS: i64 = 10_000;

/// The SELECT list and GROUP BY / ORDER BY clause for a `group_by` value.
fn grouping(group_by: &str) -> Result<(String, String), ApiError> {
    let asked: Vec<&str> = match group_by {
        "account" => Vec::new(),
        list => list.split(',').map(str::trim).collect(),
    };
    let names: Vec<&str> = DIMENSIONS.iter().map(|d| d.0).collect();
    if asked.len() > 3 {
        return Err(ApiError::BadRequest(
            "group_by: at most three dimensions".into(),
        ));
    }
    for (i, a) in asked.iter().enumerate() {
        if !names.contains(a) {
            return Err(ApiError::BadRequest(format!(
                "group_by: {a:?} is not one of account, {}",
                names.join(", ")
            )));
        }
        if asked[..i].contains(a) {
            return Err(ApiError::BadRequest(format!(
                "group_by: {a:?} appears twice"
            )));
        }
    }
    let mut select = Vec::new();
    let mut grouped = Vec::new();
    for (name, column, absent) in DIMENSIONS {
        if asked.contains(&name) {
            let alias = match name {
                "user" => "user_id",
                "exit" => "exit_id",
                other => other,
            };
            select.push(format!("{column} AS {alias}"));
            grouped.push(column);
        } else {
            select.push(absent.to_owned());
        }
    }
    let clause = if grouped.is_empty() {
        String::new()
    } else {
        let g = grouped.join(", ");
        format!("GROUP BY {g} ORDER BY {g}")
    };
    Ok((select.join(", "), clause))
}

/// `GET /v1/accounts/{id}/usage?from=&to=&group_by=`: bytes from the
/// exactly-once ledger, grouped as asked (docs/usage.md).
pub(super) async fn usage(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    Query(query): Query<UsageQuery>,
) -> Result<Json<Vec<UsageRow>>, ApiError> {
    caller.check_account(account)?;
    super::accounts::ensure_exists(&state, account).await?;
    let to = query.to.unwrap_or_else(Utc::now);
    let from = query.from.unwrap_or(to - Duration::hours(24));
    if from > to {
        return Err(ApiError::BadRequest("from: must not be after to".into()));
    }
    let (select, group) = grouping(query.group_by.as_deref().unwrap_or("account"))?;
    let rows: Vec<UsageRow> = sqlx::query_as(&format!(
        "SELECT {select}, COALESCE(SUM(l.bytes_up), 0)::bigint AS bytes_up, COALESCE(SUM(l.bytes_down), 0)::bigint AS bytes_down,
                COALESCE(SUM(l.bytes_up + l.bytes_down) FILTER (WHERE NOT l.billable), 0)::bigint AS not_billable_bytes
           FROM usage_ledger l LEFT JOIN exits e ON e.id = l.exit_id
          WHERE l.account_id = $1 AND l.minute >= $2 AND l.minute < $3
          {group} LIMIT $4"
    ))
    .bind(account)
    .bind(from)
    .bind(to)
    .bind(MAX_ROWS + 1)
    .fetch_all(&state.db)
    .await?;
    if rows.len() as i64 > MAX_ROWS {
        return Err(ApiError::BadRequest(format!(
            "more than {MAX_ROWS} groups: narrow from/to or group_by"
        )));
    }
    Ok(Json(rows))
}

#[cfg(test)]
mod tests {
    use super::grouping;

    #[test]
    fn group_by_takes_known_dimensions_once_each() {
        assert!(grouping("account").unwrap().1.is_empty());
        let (select, clause) = grouping("user,domain").unwrap();
        assert!(select.contains("l.user_id AS user_id"));
        assert!(select.contains("COALESCE(l.domain, 'unknown') AS domain"));
        assert!(clause.starts_with("GROUP BY l.user_id, COALESCE(l.domain"));
        assert!(grouping("domain,domain").is_err());
        assert!(grouping("user;drop").is_err());
        assert!(grouping("user,exit,day,domain").is_err());
    }
}
