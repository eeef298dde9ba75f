//! What the usage and account pages read besides their own queries: bytes
//! by day and by target domain, and the dedicated addresses an account
//! holds.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::AppState;

/// Bytes per day over the last `days` days (every day, zero ones too).
pub(super) async fn by_day(state: &AppState, account: Option<Uuid>, days: i32) -> Vec<(i64, f64)> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT extract(epoch FROM d.day)::bigint,
                COALESCE((SELECT SUM(l.bytes_up + l.bytes_down) FROM usage_ledger l
                           WHERE l.minute >= d.day AND l.minute < d.day + interval '1 day'
                             AND ($1::uuid IS NULL OR l.account_id = $1)), 0)::bigint
           FROM generate_series(date_trunc('day', now()) - make_interval(days => $2 - 1),
                                date_trunc('day', now()), interval '1 day') AS d(day)
          ORDER BY 1",
    )
    .bind(account)
    .bind(days)
    .fetch_all(&state.db)
    .await
    .unwrap_or_default();
    rows.into_iter().map(|(t, b)| (t, b as f64)).collect()
}

/// The top domains over the last `days` days: (domain, up, down).
pub(super) async fn by_domain(
    state: &AppState,
    account: Option<Uuid>,
    days: i32,
) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT COALESCE(domain, 'unknown'), SUM(bytes_up)::bigint, SUM(bytes_down)::bigint
           FROM usage_ledger
          WHERE minute >= now() - make_interval(days => $2) AND ($1::uuid IS NULL OR account_id = $1)
          GROUP BY 1 ORDER BY SUM(bytes_up + bytes_down) DESC LIMIT 25",
    )
    .bind(account)
    .bind(days)
    .fetch_all(&state.db)
    .await
    .unwrap_or_default()
}

/// A dedicated address (or IPv6 prefix) an account holds now.
#[derive(sqlx::FromRow)]
pub(super) struct HeldAddress {
    pub(super) address: String,
    pub(super) exit_id: Uuid,
    pub(super) exit_name: String,
    pub(super) country: String,
    pub(super) allocated_at: DateTime<Utc>,
    /// The users it serves, by name (a deleted one marked: its assignment
    /// stays until changed); none: every user of the account.
    pub(super) users: Vec<String>,
}

/// Most dedicated addresses the account page lists (the API lists all).
pub(super) const HELD_ADDRESSES_SHOWN: i64 = 500;
