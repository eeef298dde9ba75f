//! Usage read from the ledger: bytes per account, grouped as asked.

use axum::extract::{Path, Query, State};
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// RFC 3339; default 24 hours before `to`.
    from: Option<DateTime<Utc>>,
    /// RFC 3339, exclusive; default now.
    to: Option<DateTime<Utc>>,
    /// `user`, `exit`, `minute` or `account` (one row, the default).
    group_by: Option<String>,
}

#[derive(Serialize, sqlx::FromRow)]
pub struct UsageRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    minute: Option<DateTime<Utc>>,
    /// Client → target.
    bytes_up: i64,
    /// Target → client.
    bytes_down: i64,
}

pub async fn usage(
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
        "account" => (
            "NULL::uuid AS user_id, NULL::uuid AS exit_id, NULL::timestamptz AS minute",
            "",
        ),
        "user" => (
            "user_id, NULL::uuid AS exit_id, NULL::timestamptz AS minute",
            "GROUP BY user_id ORDER BY user_id",
        ),
        "exit" => (
            "NULL::uuid AS user_id, exit_id, NULL::timestamptz AS minute",
            "GROUP BY exit_id ORDER BY exit_id",
        ),
        "minute" => (
            "NULL::uuid AS user_id, NULL::uuid AS exit_id, minute",
            "GROUP BY minute ORDER BY minute",
        ),
        _ => {
            return Err(ApiError::BadRequest(
                "group_by: one of account, user, exit, minute".into(),
            ))
        }
    };
    let rows: Vec<UsageRow> = sqlx::query_as(&format!(
        "SELECT {select}, COALESCE(SUM(bytes_up), 0)::bigint AS bytes_up, COALESCE(SUM(bytes_down), 0)::bigint AS bytes_down
           FROM usage_ledger
          WHERE account_id = $1 AND minute >= $2 AND minute < $3
          {group}"
    ))
    .bind(account)
    .bind(from)
    .bind(to)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(rows))
}
