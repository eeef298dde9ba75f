//! The abuse desk: who used an egress address for which target, and when;
//! the operator's export of that record; and the audit log, readable.
//!
//! `target_log` holds one row per (egress IP, minute, exit, user, target
//! host:port) with the number of tunnels opened, written from the usage
//! batches exactly once (docs/provenance.md estimates its volume). Nothing
//! else about a tunnel is kept: no path, no credential, no client address.
//! Its egress IP is the address the exit *bound*; a complaint names the one
//! the victim *saw*, which behind NAT is another. So a lookup matches either:
//! the bound address, or the public address the reflector observed for that
//! bound one (`exit_egress_observations`, `egress.rs`) at that time. An
//! observation row is taken to hold from the end of the one before it until
//! the start of the one after it (a re-dial between two observations is
//! ambiguous: both candidates are answered), widened by the window for
//! clock skew. Every lookup and export is operator-only and audited. Rows
//! older than `abuse_retention_days` are deleted hourly, with the
//! observations no remaining row needs.

use crate::extract::{Json, Query};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use futures_util::StreamExt;
use proxynet_common::egress::Cidr;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::{Caller, KeyCaller, Operator};
use crate::error::ApiError;
use crate::routes::page::{finish, PageQuery, MAX_LIMIT};
use crate::{audit, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookupQuery {
    /// The address the complaint names: an IP, or a network (e.g. an
    /// exit's /64) to match every address inside it.
    egress_ip: String,
    /// When the complaint says the traffic arrived (RFC 3339).
    at: DateTime<Utc>,
    /// `host` or `host:port`, as the complaint names it.
    target: Option<String>,
    /// Minutes either side of `at` (default 2, at most 60).
    window_minutes: Option<i64>,
}

/// One row of the record, as the desk reads it.
#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct LookupRow {
    minute: DateTime<Utc>,
    /// The address the exit bound.
    egress_ip: String,
    /// The public address the reflector saw that bound address leave from
    /// then (`None`: never observed).
    observed_ip: Option<String>,
    /// Which of the two the query matched: `bound` or `observed` (`None`
    /// in an export without `egress_ip`).
    matched: Option<String>,
    exit_id: Uuid,
    exit_name: Option<String>,
    /// The exit's provenance source (who answers for the address).
    source_id: Option<Uuid>,
    source_name: Option<String>,
    account_id: Uuid,
    account_name: Option<String>,
    user_id: Uuid,
    username: Option<String>,
    target_host: String,
    target_port: i32,
    tunnels: i64,
}

/// The record's rows in `[from, to)` matching `$5` (bound or observed; NULL:
/// every row), with the public address observed for each. `$3`/`$4` filter
/// by target (`$3`: the host's forms, [`host_forms`], matched against the
/// recorded host in lower case without a trailing dot), `$6` is the window
/// in minutes, `$7` the row limit.
const MATCHING_ROWS: &str = "
WITH t AS (
    SELECT * FROM target_log
     WHERE minute >= $1 AND minute < $2
       AND ($3::text[] IS NULL OR lower(rtrim(target_host, '.')) = ANY($3::text[]))
       AND ($4::int IS NULL OR target_port = $4)
       AND ($5::inet IS NULL OR egress_ip <<= $5::inet
            OR exit_id IN (SELECT exit_id FROM exit_egress_observations WHERE observed_ip <<= $5::inet))
), o AS MATERIALIZED (
    SELECT x.id, x.exit_id, x.egress, x.observed_ip, x.first_seen,
           COALESCE(LAG(x.last_seen) OVER w, x.first_seen) AS valid_from,
           -- The latest observation holds until a while after it was last
           -- seen (an agent that stops reporting does not keep it forever).
           COALESCE(LEAD(x.first_seen) OVER w, x.last_seen + interval '30 minutes') AS valid_to
      FROM exit_egress_observations x
     WHERE $5::inet IS NULL
        OR x.exit_id IN (SELECT exit_id FROM exit_egress_observations WHERE observed_ip <<= $5::inet)
        OR x.exit_id IN (SELECT exit_id FROM target_log
                          WHERE minute >= $1 AND minute < $2 AND egress_ip <<= $5::inet)
    WINDOW w AS (PARTITION BY x.exit_id, x.egress ORDER BY x.first_seen, x.id)
), m AS (
    SELECT DISTINCT ON (t.minute, t.egress_ip, t.exit_id, t.user_id, t.target_host, t.target_port)
           t.*, o.observed_ip
      FROM t LEFT JOIN o
        ON o.exit_id = t.exit_id AND t.egress_ip <<= o.egress
       -- An egress the reflector saw as itself (a prefix from one of its
       -- addresses) is no translation: each bound address is its own.
       AND NOT (o.observed_ip <<= o.egress)
       AND t.minute + interval '1 minute' > o.valid_from - make_interval(mins => $6)
       AND t.minute <= o.valid_to + make_interval(mins => $6)
     ORDER BY t.minute, t.egress_ip, t.exit_id, t.user_id, t.target_host, t.target_port,
              (o.observed_ip <<= $5::inet) DESC NULLS LAST, o.first_seen DESC NULLS LAST, o.id DESC NULLS LAST
)
SELECT m.minute, host(m.egress_ip) AS egress_ip, host(m.observed_ip) AS observed_ip,
       CASE WHEN $5::inet IS NULL THEN NULL
            WHEN m.egress_ip <<= $5::inet THEN 'bound' ELSE 'observed' END AS matched,
       m.exit_id, e.name AS exit_name, e.source_id, s.name AS source_name,
       m.account_id, a.name AS account_name, m.user_id, u.username,
       m.target_host, m.target_port, m.tunnels
  FROM m
  LEFT JOIN exits e ON e.id = m.exit_id
  LEFT JOIN sources s ON s.id = e.source_id
  LEFT JOIN accounts a ON a.id = m.account_id
  LEFT JOIN proxy_users u ON u.id = m.user_id
 WHERE $5::inet IS NULL OR m.egress_ip <<= $5::inet OR m.observed_ip <<= $5::inet
 ORDER BY m.minute, m.tunnels DESC, m.egress_ip, m.exit_id, m.user_id, m.target_host, m.target_port
 LIMIT $7";

/// The address or network a desk query names. A network is bounded (an
/// IPv4 /16, an IPv6 /32 at widest): the desk asks about what one victim
/// saw, not about the internet.
fn egress_query(s: &str) -> Result<Cidr, ApiError> {
    let bad = || {
        ApiError::BadRequest(
            "egress_ip: an IP address or network (IPv4 /16 to /32, IPv6 /32 to /128)".into(),
        )
    };
    let cidr: Cidr = s.parse().map_err(|_| bad())?;
    let widest = if cidr.network().is_ipv4() { 16 } else { 32 };
    if cidr.prefix_len() < widest {
        return Err(bad());
    }
    Ok(cidr.masked())
}

/// `host` or `host:port` as a complaint names it: the forms of the host to
/// match ([`host_forms`]) and the port.
fn target_filter(target: Option<&str>) -> Result<(Option<Vec<String>>, Option<u16>), ApiError> {
    let (host, port) = match target {
        None | Some("") => return Ok((None, None)),
        Some(t) => match t.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.ends_with(']') => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| ApiError::BadRequest("target: host or host:port".into()))?,
                ),
            ),
            _ => (t, None),
        },
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((Some(host_forms(host)), port))
}

/// The forms a host named in a complaint may be recorded in, each folded as
/// the query folds the recorded host (lower case, no trailing dot), so case
/// and a trailing dot never hide a row: as the superproxies record targets
/// now (normalised as policies match names, `proxynet_store::policy`: IDNA
/// to ASCII, canonical addresses), and as written (older rows kept the
/// name as the client sent it).
fn host_forms(host: &str) -> Vec<String> {
    let mut forms = vec![host.strip_suffix('.').unwrap_or(host).to_lowercase()];
    if let Ok(normalized) = proxynet_store::policy::normalize_host(host) {
        if !forms.contains(&normalized) {
            forms.push(normalized);
        }
    }
    forms
}

/// The operator using the desk, and the key it presented (audited; `None`:
/// the admin token). Checked before the query is read, so an account key
/// learns nothing from the desk's validation messages either.
pub(crate) struct DeskOperator {
    key_id: Option<Uuid>,
}

impl axum::extract::FromRequestParts<AppState> for DeskOperator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = KeyCaller::from_request_parts(parts, state).await?;
        match caller.caller {
            Caller::Operator => Ok(Self {
                key_id: caller.key_id,
            }),
            Caller::Account(_) => Err(ApiError::Forbidden(
                "this route needs an operator key".into(),
            )),
        }
    }
}

/// Records one use of the desk in the audit log (its own transaction: a
/// lookup changes nothing else).
async fn audit_use(
    state: &AppState,
    caller: &DeskOperator,
    action: &str,
    subject: &str,
    mut detail: serde_json::Value,
) -> Result<(), ApiError> {
    detail["key_id"] = serde_json::json!(caller.key_id);
    let mut tx = state.db.begin().await?;
    audit::record(&mut tx, "operator", action, subject, detail).await?;
    tx.commit().await?;
    Ok(())
}

/// `GET /v1/abuse/lookup?egress_ip=&at=&target=&window_minutes=`
pub(crate) async fn lookup(
    caller: DeskOperator,
    State(state): State<AppState>,
    Query(q): Query<LookupQuery>,
) -> Result<Json<Vec<LookupRow>>, ApiError> {
    let egress = egress_query(&q.egress_ip)?;
    let window = q.window_minutes.unwrap_or(2);
    if !(0..=60).contains(&window) {
        return Err(ApiError::BadRequest("window_minutes: 0 to 60".into()));
    }
    let (host, port) = target_filter(q.target.as_deref())?;
    let from = q.at - Duration::minutes(window + 1) + Duration::seconds(1);
    let to = q.at + Duration::minutes(window) + Duration::seconds(1);
    let rows: Vec<LookupRow> = sqlx::query_as(MATCHING_ROWS)
        .bind(from)
        .bind(to)
        .bind(&host)
        .bind(port.map(i32::from))
        .bind(egress.to_string())
        .bind(window as i32)
        .bind(1000_i64)
        .fetch_all(&state.db)
        .await?;
    audit_use(
        &state,
        &caller,
        "abuse.lookup",
        &super::egress::egress_text(&egress),
        serde_json::json!({"at": q.at, "target": q.target, "window_minutes": window, "rows": rows.len()}),
    )
    .await?;
    Ok(Json(rows))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportQuery {
    /// Start of the range (inclusive, RFC 3339).
    from: DateTime<Utc>,
    /// End of the range (exclusive); at most [`MAX_EXPORT_DAYS`] after `from`.
    to: DateTime<Utc>,
    /// `json` (default: one array) or `csv`.
    format: Option<String>,
    /// Only rows matching this address or network (bound or observed).
    egress_ip: Option<String>,
    /// `host` or `host:port`.
    target: Option<String>,
}

/// The widest range one export may span.
const MAX_EXPORT_DAYS: i64 = 31;

/// Rows gathered into one chunk of the answer's body.
const ROWS_PER_CHUNK: usize = 500;

/// The CSV export's columns, in [`LookupRow::csv`]'s order.
const CSV_HEADER: &str = "minute,egress_ip,observed_ip,matched,exit_id,exit_name,source_id,source_name,account_id,account_name,user_id,username,target_host,target_port,tunnels\n";

impl LookupRow {
    fn csv(&self) -> String {
        let text = |s: &Option<String>| csv_field(s.as_deref().unwrap_or(""));
        let id = |u: &Option<Uuid>| u.map(|u| u.to_string()).unwrap_or_default();
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            self.minute.to_rfc3339(),
            self.egress_ip,
            text(&self.observed_ip),
            text(&self.matched),
            self.exit_id,
            text(&self.exit_name),
            id(&self.source_id),
            text(&self.source_name),
            self.account_id,
            text(&self.account_name),
            self.user_id,
            text(&self.username),
            csv_field(&self.target_host),
            self.target_port,
            self.tunnels
        )
    }
}

/// A CSV field (RFC 4180): quoted when it holds a comma, quote or line
/// break; a leading `=`, `+`, `-` or `@` is prefixed with `'` so a
/// spreadsheet never runs a name someone chose as a formula.
fn csv_field(value: &str) -> String {
    let value = if value.starts_with(['=', '+', '-', '@']) {
        format!("'{value}")
    } else {
        value.to_owned()
    };
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value
    }
}

/// `GET /v1/abuse/export?from=&to=&format=json|csv&egress_ip=&target=`: the
/// record of a time range, streamed as it is read (the range is bounded to
/// [`MAX_EXPORT_DAYS`]; a database failure midway ends the body early, so
/// a cut-off export never parses as complete).
pub(crate) async fn export(
    caller: DeskOperator,
    State(state): State<AppState>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    if q.to <= q.from || q.to - q.from > Duration::days(MAX_EXPORT_DAYS) {
        return Err(ApiError::BadRequest(format!(
            "from, to: to after from, at most {MAX_EXPORT_DAYS} days apart"
        )));
    }
    let csv = match q.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(_) => return Err(ApiError::BadRequest("format: json or csv".into())),
    };
    let egress = q.egress_ip.as_deref().map(egress_query).transpose()?;
    let (host, port) = target_filter(q.target.as_deref())?;
    audit_use(
        &state,
        &caller,
        "abuse.export",
        &egress
            .map(|e| super::egress::egress_text(&e))
            .unwrap_or_else(|| "*".into()),
        serde_json::json!({"from": q.from, "to": q.to, "format": if csv { "csv" } else { "json" }, "target": q.target}),
    )
    .await?;
    let (chunks, body) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    let db = state.db.clone();
    // The query runs in its own task and hands the body chunks as it reads
    // them: memory stays at a few chunks however large the range, and a
    // client that goes away drops the receiver, which ends the query.
    tokio::spawn(async move {
        let mut rows = sqlx::query_as::<_, LookupRow>(MATCHING_ROWS)
            .bind(q.from)
            .bind(q.to)
            .bind(host)
            .bind(port.map(i32::from))
            .bind(egress.map(|e| e.to_string()))
            .bind(0_i32)
            .bind(i64::MAX)
            .fetch(&db);
        let mut chunk = String::from(if csv { CSV_HEADER } else { "[" });
        let mut first = true;
        let mut in_chunk = 0;
        while let Some(row) = rows.next().await {
            let row = match row {
                Ok(row) => row,
                Err(e) => {
                    tracing::warn!(error = %e, "abuse export failed midway");
                    let _ = chunks
                        .send(Err(std::io::Error::other("export failed")))
                        .await;
                    return;
                }
            };
            if csv {
                chunk.push_str(&row.csv());
            } else {
                if !first {
                    chunk.push(',');
                }
                chunk.push_str(&serde_json::to_string(&row).unwrap_or_default());
            }
            first = false;
            in_chunk += 1;
            if in_chunk == ROWS_PER_CHUNK {
                in_chunk = 0;
                let full = std::mem::take(&mut chunk);
                if chunks.send(Ok(full.into())).await.is_err() {
                    return;
                }
            }
        }
        if !csv {
            chunk.push(']');
        }
        let _ = chunks.send(Ok(chunk.into())).await;
    });
    let stream = futures_util::stream::unfold(body, |mut body| async move {
        body.recv().await.map(|chunk| (chunk, body))
    });
    let content_type = if csv {
        "text/csv; charset=utf-8"
    } else {
        "application/json"
    };
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Deletes target-log rows older than the retention, now and every hour,
/// and the observations no remaining row can need (never an egress's latest:
/// it still says where the exit's traffic leaves from).
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
        let observations = sqlx::query(
            "DELETE FROM exit_egress_observations o
              WHERE o.last_seen < now() - make_interval(secs => $1)
                AND EXISTS (SELECT 1 FROM exit_egress_observations n
                             WHERE n.exit_id = o.exit_id AND n.egress = o.egress
                               AND (n.first_seen, n.id) > (o.first_seen, o.id))",
        )
        .bind(retention.as_secs_f64())
        .execute(&db)
        .await;
        for (what, result) in [("records", deleted), ("egress observations", observations)] {
            match result {
                Ok(done) if done.rows_affected() > 0 => {
                    tracing::info!(
                        rows = done.rows_affected(),
                        what,
                        "expired abuse-lookup data deleted"
                    )
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, what, "abuse-lookup retention failed; retrying next round")
                }
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
    // The next page keeps the time window too.
    for (name, value) in [("from", q.from), ("to", q.to)] {
        if let Some(at) = value {
            filters.push_str(&format!("&{name}={}", urlencode(&at.to_rfc3339())));
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

#[cfg(test)]
mod tests {
    use super::target_filter;

    #[test]
    fn a_target_is_matched_whatever_its_case_and_trailing_dot() {
        let forms = |t: &str| target_filter(Some(t)).unwrap();
        assert_eq!(forms("VM."), (Some(vec!["vm".to_owned()]), None));
        assert_eq!(forms("vm:53"), (Some(vec!["vm".to_owned()]), Some(53)));
        assert_eq!(
            forms("[::FFFF:127.0.0.1]:53"),
            (
                Some(vec!["::ffff:127.0.0.1".to_owned(), "127.0.0.1".to_owned()]),
                Some(53)
            )
        );
        // An IDN as written and as recorded (ASCII).
        assert_eq!(
            forms("Пример.РФ.").0,
            Some(vec![
                "пример.рф".to_owned(),
                "xn--e1afmkfd.xn--p1ai".to_owned()
            ])
        );
        assert_eq!(forms(""), (None, None));
        assert!(target_filter(Some("vm:port")).is_err());
    }
}
