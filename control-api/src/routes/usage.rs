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
    /// `user`, `exit`, `source_type`, `minute` or `account` (one row, the default).
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
    #[serde(skip_serializing_if = "Option::is_none")]
    source_type: Option<String>,
    /// Client → target.
    bytes_up: i64,
    /// Target → client.
    bytes_down: i64,
}

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
    let (select, group) = match query.group_by.as_deref().unwrap_or("account") {
        "account" => ("NULL::uuid AS user_id, NULL::uuid AS exit_id, NULL::timestamptz AS minute, NULL::text AS source_type", ""),
        "user" => ("l.user_id, NULL::uuid AS exit_id, NULL::timestamptz AS minute, NULL::text AS source_type", "GROUP BY l.user_id ORDER BY l.user_id"),
        "exit" => ("NULL::uuid AS user_id, l.exit_id, NULL::timestamptz AS minute, NULL::text AS source_type", "GROUP BY l.exit_id ORDER BY l.exit_id"),
        "minute" => ("NULL::uuid AS user_id, NULL::uuid AS exit_id, l.minute, NULL::text AS source_type", "GROUP BY l.minute ORDER BY l.minute"),
        "source_type" => ("NULL::uuid AS user_id, NULL::uuid AS exit_id, NULL::timestamptz AS minute, e.source_type", "GROUP BY e.source_type ORDER BY e.source_type"),
        _ => return Err(ApiError::BadRequest("group_by: one of account, user, exit, source_type, minute".into())),
    };
    let rows: Vec<UsageRow> = sqlx::query_as(&format!(
        "SELECT {select}, COALESCE(SUM(l.bytes_up), 0)::bigint AS bytes_up, COALESCE(SUM(l.bytes_down), 0)::bigint AS bytes_down
           FROM usage_ledger l LEFT JOIN exits e ON e.id = l.exit_id
          WHERE l.account_id = $1 AND l.minute >= $2 AND l.minute < $3
          {group}"
    ))
    .bind(account)
    .bind(from)
    .bind(to)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(rows))
}
