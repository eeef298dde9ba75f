//! `quota.warning` and `quota.exhausted`, decided by the ledger writer in
//! the transaction that records each usage batch.
//!
//! For every quota the batch's bytes count against — the user's own (its
//! period, bounded by its operator ceiling of the same period, as the
//! projection computes it) and the account's total — the batch's bytes are
//! added to that owner's running total for the window (`quota_usage`,
//! started from the ledger's sum the first time, so a quota set mid-period
//! counts what came before). When the total reaches the warning percent or
//! the limit, a `quota_notices` row is inserted — its primary key makes each
//! event once per owner and window — and the event emitted with it. A batch
//! recorded twice is skipped before this runs (its id), so nothing counts
//! twice; a rolled-back batch takes its events with it.
//!
//! The ledger counts the bytes the superproxies moved, which is what their
//! budgets cap: a quota that ran out on the data plane shows as exhausted
//! here when the batch carrying its last bytes is recorded (one flush and
//! the stream's lag later).

use proxynet_store::{QuotaPeriod, UsageRow};
use serde_json::{json, Value};
use sqlx::{Postgres, Transaction};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

use super::EventType;

/// Warning threshold when none is set, percent.
const DEFAULT_WARN_PERCENT: i32 = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Owner {
    User(Uuid),
    Account(Uuid),
}

impl Owner {
    fn kind(self) -> &'static str {
        match self {
            Owner::User(_) => "user",
            Owner::Account(_) => "account",
        }
    }
    fn id(self) -> Uuid {
        match self {
            Owner::User(id) | Owner::Account(id) => id,
        }
    }
}

/// One bandwidth quota.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Quota {
    account: Uuid,
    /// With its name, for a user quota.
    user: Option<(Uuid, String)>,
    limit: i64,
    period: QuotaPeriod,
    warn_percent: i32,
}

/// A user as the quota check reads it.
#[derive(sqlx::FromRow)]
struct UserQuotaRow {
    id: Uuid,
    account_id: Uuid,
    username: String,
    bandwidth_bytes: Option<i64>,
    quota_period: String,
    quota_warn_percent: i32,
    ceilings: sqlx::types::Json<Value>,
    entitlements: sqlx::types::Json<Value>,
}

/// `limits.bandwidth_bytes`, its period and warning percent from a JSON
/// limits object (read leniently: this check must never fail a batch over
/// a field it does not need).
fn limits_quota(limits: &Value) -> (Option<i64>, QuotaPeriod, Option<i32>) {
    let bandwidth = limits["bandwidth_bytes"].as_i64().filter(|b| *b > 0);
    let period = limits["period"]
        .as_str()
        .and_then(QuotaPeriod::parse)
        .unwrap_or_default();
    let warn = limits["warn_percent"]
        .as_i64()
        .and_then(|w| i32::try_from(w).ok())
        .filter(|w| (1..=100).contains(w));
    (bandwidth, period, warn)
}

/// The user's own quota as the superproxy enforces it: its limit (or its
/// ceiling's) in its period, bounded by a ceiling of the same period.
fn user_quota(row: &UserQuotaRow) -> Option<Quota> {
    let period = QuotaPeriod::parse(&row.quota_period).unwrap_or_default();
    let (ceiling, ceiling_period, _) = limits_quota(&row.ceilings.0);
    let limit =
        crate::ceilings::user_bandwidth(row.bandwidth_bytes, period, ceiling, ceiling_period)?;
    Some(Quota {
        account: row.account_id,
        user: Some((row.id, row.username.clone())),
        limit,
        period,
        warn_percent: row.quota_warn_percent,
    })
}

/// The account's total, from its entitlements.
fn account_quota(row: &UserQuotaRow) -> Option<Quota> {
    let (limit, period, warn) = limits_quota(&row.entitlements.0["limits"]);
    Some(Quota {
        account: row.account_id,
        user: None,
        limit: limit?,
        period,
        warn_percent: warn.unwrap_or(DEFAULT_WARN_PERCENT),
    })
}

/// Which thresholds `used` has reached.
fn reached(quota: &Quota, used: i64) -> Vec<EventType> {
    let mut out = Vec::new();
    if i128::from(used) * 100 >= i128::from(quota.limit) * i128::from(quota.warn_percent) {
        out.push(EventType::QuotaWarning);
    }
    if used >= quota.limit {
        out.push(EventType::QuotaExhausted);
    }
    out
}

/// Bytes per (owner, window start) in `rows`, for the owners in `quotas`.
fn deltas(rows: &[UsageRow], quotas: &HashMap<Owner, Quota>) -> BTreeMap<(Owner, i64), i64> {
    let mut out = BTreeMap::new();
    for row in rows {
        let bytes = i64::try_from(row.bytes_up.saturating_add(row.bytes_down)).unwrap_or(i64::MAX);
        for owner in [Owner::User(row.user_id), Owner::Account(row.account_id)] {
            if let Some(q) = quotas.get(&owner) {
                let (_, start, _) = q.period.window(row.minute);
                let e: &mut i64 = out.entry((owner, start)).or_default();
                *e = e.saturating_add(bytes);
            }
        }
    }
    out
}

/// Runs the check for a batch's `rows` inside the ledger's `tx`; whether it
/// emitted (wake the worker after the commit). A failure of the check
/// itself is rolled back to a savepoint and logged, never failing the batch:
/// the owners' running totals are then dropped so the next batch rebuilds
/// them from the ledger, and a missed crossing is noticed by that batch.
pub(crate) async fn after_batch(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[UsageRow],
) -> Result<bool, sqlx::Error> {
    if rows.is_empty() {
        return Ok(false);
    }
    let mut savepoint = sqlx::Connection::begin(&mut **tx).await?;
    match check(&mut savepoint, rows).await {
        Ok(emitted) => {
            savepoint.commit().await?;
            Ok(emitted)
        }
        Err(e) => {
            savepoint.rollback().await?;
            tracing::warn!(error = %e, "quota webhook check failed; the batch is recorded without it");
            let users: Vec<Uuid> = rows.iter().map(|r| r.user_id).collect();
            let accounts: Vec<Uuid> = rows.iter().map(|r| r.account_id).collect();
            sqlx::query(
                "DELETE FROM quota_usage WHERE (owner_kind = 'user' AND owner_id = ANY ($1))
                                            OR (owner_kind = 'account' AND owner_id = ANY ($2))",
            )
            .bind(&users)
            .bind(&accounts)
            .execute(&mut **tx)
            .await?;
            Ok(false)
        }
    }
}

async fn check(tx: &mut Transaction<'_, Postgres>, rows: &[UsageRow]) -> Result<bool, sqlx::Error> {
    let mut users: Vec<Uuid> = rows.iter().map(|r| r.user_id).collect();
    users.sort_unstable();
    users.dedup();
    let found: Vec<UserQuotaRow> = sqlx::query_as(
        "SELECT u.id, u.account_id, u.username, u.bandwidth_bytes, u.quota_period,
                u.quota_warn_percent, u.ceilings, a.entitlements
           FROM proxy_users u JOIN accounts a ON a.id = u.account_id
          WHERE u.id = ANY ($1)",
    )
    .bind(&users)
    .fetch_all(&mut **tx)
    .await?;
    let mut quotas: HashMap<Owner, Quota> = HashMap::new();
    for row in &found {
        if let Some(q) = user_quota(row) {
            quotas.insert(Owner::User(row.id), q);
        }
        if let Some(q) = account_quota(row) {
            quotas.insert(Owner::Account(row.account_id), q);
        }
    }
    if quotas.is_empty() {
        return Ok(false);
    }
    let mut emitted = false;
    for ((owner, start), delta) in deltas(rows, &quotas) {
        let Some(quota) = quotas.get(&owner) else {
            continue;
        };
        let (_, _, end) = quota.period.window(start);
        let used = add_usage(tx, owner, start, end, delta).await?;
        for event in reached(quota, used) {
            let noted = sqlx::query(
                "INSERT INTO quota_notices (owner_kind, owner_id, window_start, event, limit_bytes, used_bytes)
                 VALUES ($1, $2, to_timestamp($3), $4, $5, $6) ON CONFLICT DO NOTHING",
            )
            .bind(owner.kind())
            .bind(owner.id())
            .bind(start as f64)
            .bind(event.as_str())
            .bind(quota.limit)
            .bind(used)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if noted == 1 {
                super::emit(
                    tx,
                    event,
                    Some(quota.account),
                    payload(quota, start, end, used),
                )
                .await?;
                emitted = true;
            }
        }
    }
    Ok(emitted)
}

/// Adds `delta` to the owner's total for the window `[start, end)`; the
/// new total. The first time, the total is the ledger's sum (this batch's
/// rows included).
async fn add_usage(
    tx: &mut Transaction<'_, Postgres>,
    owner: Owner,
    start: i64,
    end: i64,
    delta: i64,
) -> Result<i64, sqlx::Error> {
    let updated: Option<(i64,)> = sqlx::query_as(
        "UPDATE quota_usage SET used_bytes = used_bytes + $4
          WHERE owner_kind = $1 AND owner_id = $2 AND window_start = to_timestamp($3)
         RETURNING used_bytes",
    )
    .bind(owner.kind())
    .bind(owner.id())
    .bind(start as f64)
    .bind(delta)
    .fetch_optional(&mut **tx)
    .await?;
    if let Some((used,)) = updated {
        return Ok(used);
    }
    let column = match owner {
        Owner::User(_) => "user_id",
        Owner::Account(_) => "account_id",
    };
    // Another batch of the same owner may insert first: then ours adds to it.
    let (used,): (i64,) = sqlx::query_as(&format!(
        "INSERT INTO quota_usage (owner_kind, owner_id, window_start, used_bytes)
         SELECT $1, $2, to_timestamp($3), COALESCE(SUM(bytes_up + bytes_down), 0)::bigint
           FROM usage_ledger WHERE {column} = $2 AND minute >= to_timestamp($3) AND minute < to_timestamp($4)
         ON CONFLICT (owner_kind, owner_id, window_start)
         DO UPDATE SET used_bytes = quota_usage.used_bytes + $5
         RETURNING used_bytes"
    ))
    .bind(owner.kind())
    .bind(owner.id())
    .bind(start as f64)
    .bind(end as f64)
    .bind(delta)
    .fetch_one(&mut **tx)
    .await?;
    Ok(used)
}

fn payload(quota: &Quota, start: i64, end: i64, used: i64) -> Value {
    let at = |secs: i64| chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default();
    json!({
        "scope": if quota.user.is_some() { "user" } else { "account" },
        "account_id": quota.account,
        "user_id": quota.user.as_ref().map(|(id, _)| id),
        "username": quota.user.as_ref().map(|(_, name)| name),
        "period": quota.period.as_str(),
        "period_start": at(start),
        "period_end": at(end),
        "limit_bytes": quota.limit,
        "used_bytes": used,
        "warn_percent": quota.warn_percent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        bandwidth: Option<i64>,
        period: &str,
        ceilings: Value,
        entitlements: Value,
    ) -> UserQuotaRow {
        UserQuotaRow {
            id: Uuid::from_u128(1),
            account_id: Uuid::from_u128(2),
            username: "u".into(),
            bandwidth_bytes: bandwidth,
            quota_period: period.into(),
            quota_warn_percent: 80,
            ceilings: sqlx::types::Json(ceilings),
            entitlements: sqlx::types::Json(entitlements),
        }
    }

    #[test]
    fn a_user_quota_is_the_one_the_superproxy_enforces() {
        let own = row(Some(1000), "daily", json!({}), json!({}));
        assert_eq!(user_quota(&own).map(|q| q.limit), Some(1000));
        // A ceiling of the same period bounds it, or stands in for it.
        let capped = row(
            Some(1000),
            "daily",
            json!({"bandwidth_bytes": 500, "period": "daily"}),
            json!({}),
        );
        assert_eq!(user_quota(&capped).map(|q| q.limit), Some(500));
        let only_ceiling = row(None, "monthly", json!({"bandwidth_bytes": 700}), json!({}));
        assert_eq!(user_quota(&only_ceiling).map(|q| q.limit), Some(700));
        // A ceiling of another period is not the user's quota.
        let other = row(
            Some(1000),
            "daily",
            json!({"bandwidth_bytes": 10, "period": "monthly"}),
            json!({}),
        );
        assert_eq!(user_quota(&other).map(|q| q.limit), Some(1000));
        assert_eq!(user_quota(&row(None, "daily", json!({}), json!({}))), None);
    }

    #[test]
    fn an_account_total_comes_from_its_entitlements_read_leniently() {
        let r = row(
            None,
            "daily",
            json!({}),
            json!({"limits": {"bandwidth_bytes": 9000, "period": "daily", "warn_percent": 50}, "unknown": 1}),
        );
        let q = account_quota(&r).unwrap();
        assert_eq!(
            (q.limit, q.period, q.warn_percent, q.user),
            (9000, QuotaPeriod::Daily, 50, None)
        );
        let r = row(
            None,
            "daily",
            json!({}),
            json!({"limits": {"bandwidth_bytes": 9000}}),
        );
        assert_eq!(
            account_quota(&r).map(|q| (q.period, q.warn_percent)),
            Some((QuotaPeriod::Monthly, 80))
        );
        assert_eq!(
            account_quota(&row(None, "daily", json!({}), json!({}))),
            None
        );
    }

    #[test]
    fn thresholds_are_the_warning_percent_and_the_limit() {
        let q = Quota {
            account: Uuid::nil(),
            user: None,
            limit: 1000,
            period: QuotaPeriod::Daily,
            warn_percent: 80,
        };
        assert!(reached(&q, 799).is_empty());
        assert_eq!(reached(&q, 800), vec![EventType::QuotaWarning]);
        assert_eq!(
            reached(&q, 1000),
            vec![EventType::QuotaWarning, EventType::QuotaExhausted]
        );
        assert_eq!(reached(&q, i64::MAX).len(), 2);
    }

    #[test]
    fn a_batch_is_split_by_owner_and_window() {
        let (user, account) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut quotas = HashMap::new();
        let q = |period| Quota {
            account,
            user: None,
            limit: 10,
            period,
            warn_percent: 80,
        };
        quotas.insert(Owner::User(user), q(QuotaPeriod::Daily));
        quotas.insert(Owner::Account(account), q(QuotaPeriod::Monthly));
        let day = 86_400 * 20_000; // 2024-10-04, mid-month
                                   // From JSON, as the stream carries it (fields added later default).
        let usage = |minute: i64, up: u64, down: u64| -> UsageRow {
            serde_json::from_value(json!({
                "account_id": account, "user_id": user, "exit_id": Uuid::nil(),
                "minute": minute, "bytes_up": up, "bytes_down": down,
            }))
            .unwrap()
        };
        let rows = [
            usage(day + 60, 1, 2),
            usage(day + 120, 3, 4),
            usage(day + 86_400, 5, 0),
        ];
        let d = deltas(&rows, &quotas);
        assert_eq!(d[&(Owner::User(user), day)], 10);
        assert_eq!(d[&(Owner::User(user), day + 86_400)], 5);
        let (_, month, _) = QuotaPeriod::Monthly.window(day);
        assert_eq!(d[&(Owner::Account(account), month)], 15);
        assert_eq!(d.len(), 3);
    }
}
