//! Public egress: what the exit's traffic looks like to the world.
//!
//! An agent asks our egress reflector (a superproxy's `--reflector-listen`)
//! from each declared egress address and reports the signed answers here
//! (`POST /v1/agent/exits/{id}/egress`). An answer counts only when its
//! signature holds under the reflector key in Redis, it names this exit and
//! it is fresh: the agent passes on what the reflector saw, it cannot
//! invent it. Accepted observations become history in
//! `exit_egress_observations` (the same public address again extends the
//! latest row; a new one — a residential re-dial — starts a row), which the
//! abuse desk searches (`abuse.rs`). A reflection's time has whole seconds,
//! so two rows can share a `first_seen` (a re-dial right after a start):
//! the row id, in insertion order, breaks the tie wherever "the latest" is
//! asked for, here and in the abuse desk's history.
//!
//! The verdict on the declared egress ([`verdict`]) is kept on the exit and
//! projected: `mismatch` (a declared address the reflector contradicts, no
//! NAT declared) blocks the exit as `egress_unverified` when the operator
//! runs with `--strict-egress-verification`. No observation at all is
//! `unobserved`, never a block: a reflector outage must not empty the pool.
//!
//! So are the addresses verified to be the exit's ([`verified_addresses`]):
//! the address seen for each declared egress whose latest observation lies
//! inside it. They are the only ones on which the exit's admin listener
//! enters the fleet's protected set (`agent.rs`): a declared egress is the
//! agent's word, an observation is the reflector's.

use crate::extract::{Json, Path};
use axum::extract::State;
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use proxynet_common::egress::Cidr;
use proxynet_common::secret::{constant_time_eq, sha256_hex};
use proxynet_wire::reflector::{EgressObservation, EgressReport, MAX_REPORTED};
use serde::Serialize;
use std::net::IpAddr;
use uuid::Uuid;

use crate::auth::bearer;
use crate::error::ApiError;
use crate::{audit, AppState};

/// How far a reflection's time may lie from ours: the agent reports at once
/// after asking, so anything older is a replay (or a clock far off).
const MAX_REFLECTION_AGE_SECS: i64 = 15 * 60;

/// The verdict on an exit's declared egress, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verification {
    /// A declared address is not what the reflector saw, and no NAT declared.
    Mismatch,
    /// The reflector sees another public address, as the declared NAT explains.
    BehindNat,
    /// Some declared egress has no observation yet.
    Unobserved,
    /// Every declared egress was seen as itself (inside itself, for a prefix).
    Verified,
}

impl Verification {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verification::Mismatch => "mismatch",
            Verification::BehindNat => "behind_nat",
            Verification::Unobserved => "unobserved",
            Verification::Verified => "verified",
        }
    }
}

/// Whether an exit whose stored verification is `verification` is kept out
/// of routing: only a mismatch, and only under the strict policy. The exit
/// resource and the projection both ask this.
pub(crate) fn blocks_routing(verification: &str, strict: bool) -> bool {
    strict && verification == Verification::Mismatch.as_str()
}

/// One declared egress judged by its latest observation (`None`: never observed).
pub(crate) fn judge(egress: &Cidr, latest: Option<IpAddr>, behind_nat: bool) -> Verification {
    match latest {
        None => Verification::Unobserved,
        Some(seen) if egress.contains(seen) => Verification::Verified,
        Some(_) if behind_nat => Verification::BehindNat,
        Some(_) => Verification::Mismatch,
    }
}

/// The exit's verdict: the worst of its declared egress.
pub(crate) fn verdict(
    declared: &[Cidr],
    behind_nat: bool,
    latest: &[(Cidr, IpAddr)],
) -> Verification {
    declared
        .iter()
        .map(|egress| {
            let seen = latest.iter().find(|(e, _)| e == egress).map(|(_, ip)| *ip);
            judge(egress, seen, behind_nat)
        })
        .min_by_key(|v| *v as u8)
        .unwrap_or(Verification::Unobserved)
}

/// The addresses the latest observations verify the exit holds: for each
/// declared egress seen from inside itself, the address seen (sorted, once
/// each). An egress seen elsewhere (behind NAT, a mismatch) verifies
/// nothing: the address seen there is shared or someone else's.
pub(crate) fn verified_addresses(declared: &[Cidr], latest: &[(Cidr, IpAddr)]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = latest
        .iter()
        .filter(|(egress, seen)| declared.contains(egress) && egress.contains(*seen))
        .map(|(_, seen)| *seen)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// An exit's declared egress: its egress IPs (as /32, /128) and prefixes.
pub(crate) fn declared(egress_ips: &[String], egress_prefixes: &[String]) -> Vec<Cidr> {
    egress_ips
        .iter()
        .chain(egress_prefixes)
        .filter_map(|s| s.parse::<Cidr>().ok())
        .map(|c| c.masked())
        .collect()
}

/// How an egress is written back: an egress IP as the address alone.
pub(crate) fn egress_text(egress: &Cidr) -> String {
    if egress.host_bits() == 0 {
        egress.network().to_string()
    } else {
        egress.to_string()
    }
}

#[derive(Serialize)]
pub(crate) struct Ignored {
    egress: String,
    reason: &'static str,
}

#[derive(Serialize)]
pub(crate) struct ReportAnswer {
    accepted: usize,
    /// Observations not recorded, and why.
    ignored: Vec<Ignored>,
    verification: Verification,
}

#[derive(sqlx::FromRow)]
struct ExitEgressRow {
    credential_sha256: String,
    egress_ips: Vec<String>,
    egress_prefixes: Vec<String>,
    behind_nat: bool,
    egress_verification: String,
    verified_egress: Vec<String>,
}

/// Why one observation is not recorded, if it is not.
fn refuse(
    observation: &EgressObservation,
    exit: Uuid,
    declared: &[Cidr],
    key: &[u8],
    now: i64,
) -> Option<&'static str> {
    if !declared.contains(&observation.egress.masked()) {
        return Some("not a declared egress of this exit");
    }
    if !observation.egress.contains(observation.bound) {
        return Some("the bound address is outside the egress");
    }
    let reflection = &observation.reflection;
    if reflection.exit != Some(exit) {
        return Some("the reflection names another exit");
    }
    if (now - reflection.at).abs() > MAX_REFLECTION_AGE_SECS {
        return Some("the reflection is not fresh");
    }
    if !reflection.verify(key) {
        return Some("the reflection's proof does not hold");
    }
    None
}

/// `POST /v1/agent/exits/{id}/egress` (the agent's own credential): what the
/// reflectors saw from the exit's egress addresses.
pub(crate) async fn report(
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    parts: Parts,
    Json(body): Json<EgressReport>,
) -> Result<Json<ReportAnswer>, ApiError> {
    let presented = bearer(&parts).ok_or(ApiError::Unauthorized)?;
    if body.observed.len() > MAX_REPORTED || body.unobserved.len() > MAX_REPORTED {
        return Err(ApiError::BadRequest(format!(
            "observed, unobserved: at most {MAX_REPORTED} each"
        )));
    }
    let mut tx = state.db.begin().await?;
    // Locked: two reports of one exit extend its history one after the other.
    let row: Option<ExitEgressRow> = sqlx::query_as(
        "SELECT credential_sha256, egress_ips, egress_prefixes, behind_nat, egress_verification,
                verified_egress
           FROM exits WHERE id = $1 FOR UPDATE",
    )
    .bind(exit)
    .fetch_optional(&mut *tx)
    .await?;
    let row = row.ok_or(ApiError::Unauthorized)?;
    if !constant_time_eq(
        sha256_hex(presented).as_bytes(),
        row.credential_sha256.as_bytes(),
    ) {
        return Err(ApiError::Unauthorized);
    }
    let declared = declared(&row.egress_ips, &row.egress_prefixes);
    let mut redis = state.redis.clone();
    let key = proxynet_store::reflector_key(&mut redis, state.projector.keys())
        .await
        .map_err(|e| ApiError::Unavailable(format!("cannot read the reflector key: {e}")))?;
    let now = Utc::now();
    let mut ignored = Vec::new();
    let mut accepted = 0;
    let mut seen_egress: Vec<Cidr> = Vec::with_capacity(body.observed.len());
    for observation in &body.observed {
        // One per egress per report: a report cannot write a burst of rows.
        if seen_egress.contains(&observation.egress) {
            ignored.push(Ignored {
                egress: egress_text(&observation.egress),
                reason: "one observation per egress per report",
            });
            continue;
        }
        seen_egress.push(observation.egress);
        if let Some(reason) = refuse(observation, exit, &declared, &key, now.timestamp()) {
            ignored.push(Ignored {
                egress: egress_text(&observation.egress),
                reason,
            });
            continue;
        }
        let at = DateTime::from_timestamp(observation.reflection.at, 0).unwrap_or(now);
        match record(&mut tx, exit, observation, at).await? {
            Recorded::Yes => accepted += 1,
            Recorded::Older => ignored.push(Ignored {
                egress: egress_text(&observation.egress),
                reason: "older than the latest observation",
            }),
            Recorded::TooManyChanges => ignored.push(Ignored {
                egress: egress_text(&observation.egress),
                reason: "too many public-address changes of this exit in the last hour",
            }),
        }
    }
    let latest: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT ON (egress) egress::text, host(observed_ip)
           FROM exit_egress_observations WHERE exit_id = $1
          ORDER BY egress, first_seen DESC, id DESC",
    )
    .bind(exit)
    .fetch_all(&mut *tx)
    .await?;
    let latest: Vec<(Cidr, IpAddr)> = latest
        .iter()
        .filter_map(|(e, ip)| Some((e.parse::<Cidr>().ok()?.masked(), ip.parse().ok()?)))
        .collect();
    let verification = verdict(&declared, row.behind_nat, &latest);
    // An address verifies only while it is seen: one not reflected for a
    // day (released, perhaps someone else's now) no longer protects an
    // admin listener (the projection applies the same day, projector/exits.rs).
    let recent: Vec<(String,)> = sqlx::query_as(
        "SELECT DISTINCT host(observed_ip) FROM exit_egress_observations
          WHERE exit_id = $1 AND last_seen > now() - interval '24 hours'",
    )
    .bind(exit)
    .fetch_all(&mut *tx)
    .await?;
    let recent: Vec<(Cidr, IpAddr)> = latest
        .iter()
        .filter(|(_, ip)| {
            recent
                .iter()
                .any(|(r,)| r.parse::<IpAddr>().ok() == Some(*ip))
        })
        .copied()
        .collect();
    let verified: Vec<String> = verified_addresses(&declared, &recent)
        .iter()
        .map(ToString::to_string)
        .collect();
    let unobserved: Vec<serde_json::Value> = body
        .unobserved
        .iter()
        .map(|u| {
            serde_json::json!({
                "egress": egress_text(&u.egress),
                "bound": u.bound,
                "reason": u.reason.chars().take(200).collect::<String>(),
            })
        })
        .collect();
    sqlx::query(
        "UPDATE exits SET egress_verification = $2, egress_reported_at = now(), egress_unobserved = $3,
                          verified_egress = $4
          WHERE id = $1",
    )
    .bind(exit)
    .bind(verification.as_str())
    .bind(serde_json::Value::Array(unobserved))
    .bind(&verified)
    .execute(&mut *tx)
    .await?;
    let changed = row.egress_verification != verification.as_str();
    // The heartbeat reads the verified addresses from the projected record:
    // a change there is projected at once too (the admin listener on a newly
    // verified address is protected from the exit's next beat).
    let verified_changed = row.verified_egress != verified;
    if changed {
        audit::record(
            &mut tx,
            "agent",
            "exit.egress_verification",
            &exit.to_string(),
            serde_json::json!({"from": row.egress_verification, "to": verification.as_str()}),
        )
        .await?;
    }
    tx.commit().await?;
    if changed || verified_changed {
        // The verdict is projected: with the strict policy it blocks or
        // frees the exit within the superproxies' next pool refresh.
        state.projector.exit(exit).await;
    }
    if changed {
        tracing::info!(exit = %exit, from = %row.egress_verification, to = verification.as_str(), "egress verification changed");
    }
    if verified_changed {
        tracing::info!(exit = %exit, verified = ?verified, "addresses verified to be the exit's changed");
    }
    Ok(Json(ReportAnswer {
        accepted,
        ignored,
        verification,
    }))
}

/// New history rows (public-address changes) one exit may start in an hour,
/// over all its egress. A mobile line behind carrier NAT may change its
/// address at every reconnect (the agent re-observes at most every 30 s);
/// an agent replaying two valid reflections in turn must not grow the
/// history without end.
pub(crate) const MAX_CHANGES_PER_EXIT_HOUR: i64 = 120;

/// What [`record`] did with one observation.
enum Recorded {
    Yes,
    /// Older than the latest row of its egress (a report that arrived late).
    Older,
    /// A change past [`MAX_CHANGES_PER_EXIT_HOUR`].
    TooManyChanges,
}

/// Extends the latest row of `observation`'s egress when the public address
/// is the same, else starts a row (within the hourly bound on changes).
async fn record(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    exit: Uuid,
    observation: &EgressObservation,
    at: DateTime<Utc>,
) -> Result<Recorded, sqlx::Error> {
    let egress = observation.egress.masked().to_string();
    let latest: Option<(i64, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT id, host(observed_ip), last_seen FROM exit_egress_observations
          WHERE exit_id = $1 AND egress = $2::cidr ORDER BY first_seen DESC, id DESC LIMIT 1",
    )
    .bind(exit)
    .bind(&egress)
    .fetch_optional(&mut **tx)
    .await?;
    let observed = observation.reflection.address.to_string();
    match latest {
        Some((_, _, last)) if at < last => Ok(Recorded::Older),
        Some((id, seen, _)) if seen == observed => {
            sqlx::query(
                "UPDATE exit_egress_observations SET last_seen = $2, bound_ip = $3::inet WHERE id = $1",
            )
            .bind(id)
            .bind(at)
            .bind(observation.bound.to_string())
            .execute(&mut **tx)
            .await?;
            Ok(Recorded::Yes)
        }
        _ => {
            // The exit's row is locked by the report: the count holds.
            let (changes,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM exit_egress_observations
                  WHERE exit_id = $1 AND first_seen > $2 - interval '1 hour'",
            )
            .bind(exit)
            .bind(at)
            .fetch_one(&mut **tx)
            .await?;
            if changes >= MAX_CHANGES_PER_EXIT_HOUR {
                return Ok(Recorded::TooManyChanges);
            }
            sqlx::query(
                "INSERT INTO exit_egress_observations (exit_id, egress, bound_ip, observed_ip, first_seen, last_seen)
                 VALUES ($1, $2::cidr, $3::inet, $4::inet, $5, $5)",
            )
            .bind(exit)
            .bind(&egress)
            .bind(observation.bound.to_string())
            .bind(&observed)
            .bind(at)
            .execute(&mut **tx)
            .await?;
            Ok(Recorded::Yes)
        }
    }
}

/// One declared egress as the exit resource shows it: the latest
/// observation and its judgement.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ObservedEgress {
    pub(crate) egress: String,
    pub(crate) bound: String,
    pub(crate) observed: String,
    pub(crate) first_seen: DateTime<Utc>,
    pub(crate) last_seen: DateTime<Utc>,
    pub(crate) status: Verification,
}

#[derive(sqlx::FromRow)]
struct ObservationRow {
    exit_id: Uuid,
    egress: String,
    bound: String,
    observed: String,
    first_seen: DateTime<Utc>,
    last_seen: DateTime<Utc>,
}

/// The latest observation of every declared egress of `exits`, judged.
pub(crate) async fn latest_observations(
    db: &sqlx::PgPool,
    exits: &[(Uuid, bool)],
) -> Result<Vec<(Uuid, ObservedEgress)>, sqlx::Error> {
    let ids: Vec<Uuid> = exits.iter().map(|(id, _)| *id).collect();
    let rows: Vec<ObservationRow> = sqlx::query_as(
        "SELECT DISTINCT ON (exit_id, egress) exit_id, egress::text AS egress, host(bound_ip) AS bound,
                host(observed_ip) AS observed, first_seen, last_seen
           FROM exit_egress_observations WHERE exit_id = ANY($1)
          ORDER BY exit_id, egress, first_seen DESC, id DESC",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let egress = r.egress.parse::<Cidr>().ok()?;
            let behind_nat = exits.iter().find(|(id, _)| *id == r.exit_id)?.1;
            let status = judge(&egress, r.observed.parse().ok(), behind_nat);
            Some((
                r.exit_id,
                ObservedEgress {
                    egress: egress_text(&egress),
                    bound: r.bound,
                    observed: r.observed,
                    first_seen: r.first_seen,
                    last_seen: r.last_seen,
                    status,
                },
            ))
        })
        .collect())
}

/// One exit's observation history, newest first (at most `limit` rows).
pub(crate) async fn history(
    db: &sqlx::PgPool,
    exit: Uuid,
    limit: i64,
) -> Result<Vec<serde_json::Value>, sqlx::Error> {
    let rows: Vec<ObservationRow> = sqlx::query_as(
        "SELECT exit_id, egress::text AS egress, host(bound_ip) AS bound, host(observed_ip) AS observed,
                first_seen, last_seen
           FROM exit_egress_observations WHERE exit_id = $1 ORDER BY first_seen DESC, id DESC LIMIT $2",
    )
    .bind(exit)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let egress = r
                .egress
                .parse::<Cidr>()
                .map_or(r.egress.clone(), |c| egress_text(&c));
            serde_json::json!({
                "egress": egress,
                "bound": r.bound,
                "observed": r.observed,
                "first_seen": r.first_seen,
                "last_seen": r.last_seen,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests;
