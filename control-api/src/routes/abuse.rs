//! The abuse desk: who used an egress IP for which target, and when; and the
//! audit log, readable.
//!
//! `target_log` holds one row per (egress IP, minute, exit, user, target
//! host:port) with the number of tunnels opened, written from the usage
//! batches exactly once (docs/provenance.md estimates its volume). Nothing
//! else about a tunnel is kept: no path, no credential, no client address.
//! Rows older than `abuse_retention_days` are deleted hourly.

use crate::extract::{Json, Query};
use axum::extract::State;
use axum::http::HeaderMap;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uuid::Uuid;

use crate::auth::Operator;
use crate::error::ApiError;
use crate::routes::page::{finish, PageQuery, MAX_LIMIT};
use crate::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookupQuery {
    egress_ip: String,
    /// When the complaint says the traffic arrived (RFC 3339).
    at: DateTime<Utc>,
    /// `host` or `host:port`, as the complaint names it.
    target: Option<String>,
    /// Minutes either side of `at` (default 2, at most 60).
    window_minutes: Option<i64>,
}

#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct LookupRow {
    minute: DateTime<Utc>,
    egress_ip: String,
    exit_id: Uuid,
    account_id: Uuid,
    account_name: Option<String>,
    user_id: Uuid,
    username: Option<String>,
    target_host: String,
    target_port: i32,
    tunnels: i64,
}

/// `GET /v1/abuse/lookup?egress_ip=&at=&target=&window_minutes=`
pub(crate) async fn lookup(
    _: Operator,
    State(state): State<AppState>,
    Query(q): Query<LookupQuery>,
) -> Result<Json<Vec<LookupRow>>, ApiError> {
    let ip: IpAddr = q
        .egress_ip
        .parse()
        .map_err(|_| ApiError::BadRequest("egress_ip: an IP address".into()))?;
    let window = q.window_minutes.unwrap_or(2);
    if !(0..=60).contains(&window) {
        return Err(ApiError::BadRequest("window_minutes: 0 to 60".into()));
    }
    let (host, port) = match q.target.as_deref() {
        None | Some("") => (None, None),
        Some(t) => match t.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.ends_with(']') => (
                Some(
                    h.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_ascii_lowercase(),
                ),
                Some(
                    p.parse::<u16>()
                        .map_err(|_| ApiError::BadRequest("target: host or host:port".into()))?,
                ),
            ),
            _ => (
                Some(
                    t.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_ascii_lowercase(),
                ),
                None,
            ),
        },
    };
    let from = q.at - Duration::minutes(window + 1);
    let to = q.at + Duration::minutes(window);
    let rows: Vec<LookupRow> = sqlx::query_as(
        "SELECT t.minute, host(t.egress_ip) AS egress_ip, t.exit_id, t.account_id, a.name AS account_name,
                t.user_id, u.username, t.target_host, t.target_port, t.tunnels
           FROM target_log t
           LEFT JOIN accounts a ON a.id = t.account_id
           LEFT JOIN proxy_users u ON u.id = t.user_id
          WHERE t.egress_ip = $1::inet AND t.minute > $2 AND t.minute <= $3
            AND ($4::text IS NULL OR t.target_host = $4)
            AND ($5::int IS NULL OR t.target_port = $5)
          ORDER BY t.minute, t.tunnels DESC
          LIMIT 1000",
    )
    .bind(ip.to_string())
    .bind(from)
    .bind(to)
    .bind(host)
    .bind(port.map(i32::from))
    .fetch_all(&state.db)
    .await?;
    Ok(Json(rows))
}

/// Deletes target-log rows older than the retention, now and every hour.
pub(crate) async fn run_retention(
    db: sqlx::PgPool,
    retention: std::time::Duration,
    every: std::time::Duration,
    stop: proxynet_common::tasks::Stop,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        let deleted =
            sqlx::query("DELETE FROM target_log WHERE minute < now() - make_interval(secs => $1)")
                .bind(retention.as_secs_f64())
                .execute(&db)
                .await;
        match deleted {
            Ok(done) if done.rows_affected() > 0 => {
                tracing::info!(
                    rows = done.rows_affected(),
                    "expired abuse-lookup records deleted"
                )
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "abuse-lookup retention failed; retrying next round")
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    action: Option<String>,
    subject: Option<String>,
    actor: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: Option<i64>,
    /// Newest first: the id of the last row of the previous page.
    after: Option<String>,
}

#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct AuditRow {
    id: i64,
    at: DateTime<Utc>,
    actor: String,
    action: String,
    subject: String,
    detail: serde_json::Value,
}

/// `GET /v1/audit?action=&subject=&actor=&from=&to=&limit=&after=`, newest first.
pub(crate) async fn audit_log(
    _: Operator,
    State(state): State<AppState>,
    Query(q): Query<AuditQuery>,
) -> Result<(HeaderMap, Json<Vec<AuditRow>>), ApiError> {
    let page = PageQuery {
        limit: q.limit,
        after: q.after.clone(),
    };
    let limit = page.limit()?.min(MAX_LIMIT);
    let after: Option<i64> = match &q.after {
        Some(a) => Some(
            a.parse()
                .map_err(|_| ApiError::BadRequest("after: an audit entry id".into()))?,
        ),
        None => None,
    };
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT id, at, actor, action, subject, detail FROM audit_log
          WHERE ($1::bigint IS NULL OR id < $1)
            AND ($2::text IS NULL OR action = $2)
            AND ($3::text IS NULL OR subject = $3)
            AND ($4::text IS NULL OR actor = $4)
            AND ($5::timestamptz IS NULL OR at >= $5)
            AND ($6::timestamptz IS NULL OR at < $6)
          ORDER BY id DESC LIMIT $7",
    )
    .bind(after)
    .bind(&q.action)
    .bind(&q.subject)
    .bind(&q.actor)
    .bind(q.from)
    .bind(q.to)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let mut filters = String::new();
    for (name, value) in [
        ("action", &q.action),
        ("subject", &q.subject),
        ("actor", &q.actor),
    ] {
        if let Some(v) = value {
            filters.push_str(&format!("&{name}={}", urlencode(v)));
        }
    }
    let (headers, rows) = finish(rows, limit, "/v1/audit", |r| format!("{}{filters}", r.id));
    Ok((headers, Json(rows)))
}

/// Percent-encodes everything but unreserved characters (RFC 3986 §2.3).
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
