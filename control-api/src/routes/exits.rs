//! Exits as the operator sees them: provenance, egress IPs and prefixes
//! (declared), the public addresses the reflector saw them leave from
//! (observed, `egress.rs`), liveness, and (one exit) its agent's admin
//! listener: the addresses every exit denies, and those claimed on egress
//! the control plane has not verified, which are ignored (`agent.rs`).

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::auth::Operator;
use crate::error::ApiError;
use crate::projector::FleetHealth;
use crate::routes::egress::ObservedEgress;
use crate::routes::page::{finish, PageQuery};
use crate::{audit, AppState};

#[derive(Serialize, sqlx::FromRow)]
pub(super) struct ExitRow {
    id: Uuid,
    name: String,
    source_type: String,
    owner: String,
    country: String,
    /// ISO 3166-2 subdivision declared on the enrollment token (`DE-BY`).
    region: Option<String>,
    egress_ips: Vec<String>,
    /// Prefixes the exit sends from any address of.
    egress_prefixes: Vec<String>,
    city: Option<String>,
    asn: Option<i64>,
    hostname: String,
    agent_version: String,
    /// Reported by the agent (SIGTERM).
    draining: bool,
    /// Set by an operator (`POST /v1/exits/{id}/drain`).
    admin_draining: bool,
    disabled: bool,
    enrolled_at: DateTime<Utc>,
    last_heartbeat_at: Option<DateTime<Utc>>,
    /// Declared at enrollment (`--behind-nat`).
    behind_nat: bool,
    #[serde(skip)]
    egress_verification: String,
    #[serde(skip)]
    egress_reported_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    egress_unobserved: sqlx::types::Json<serde_json::Value>,
    /// An upstream exit's partner gateway: `{scheme, host, port}` (the
    /// credential never leaves the agent's host).
    #[serde(serialize_with = "upstream_gateway")]
    upstream: Option<sqlx::types::Json<crate::projector::exits::UpstreamRow>>,
}

/// Only where the partner's gateway is: the countries and keys are routing
/// detail, shown in the record, not here.
fn upstream_gateway<S: serde::Serializer>(
    upstream: &Option<sqlx::types::Json<crate::projector::exits::UpstreamRow>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match upstream {
        Some(u) => serde::Serialize::serialize(
            &serde_json::json!({"scheme": u.scheme, "host": u.host, "port": u.port, "countries": u.countries}),
            s,
        ),
        None => s.serialize_none(),
    }
}

#[derive(Serialize)]
pub(super) struct ExitView {
    #[serde(flatten)]
    row: ExitRow,
    /// Heartbeat seen within the TTL (Redis live set).
    live: bool,
    /// How the superproxies see it (active probes, passive outcomes, load).
    health: Option<FleetHealth>,
    /// Declared against observed: what the reflector saw the exit's traffic
    /// leave from.
    egress: EgressView,
    /// The agent's admin listener addresses every exit is told to deny: only
    /// on addresses the reflector verified the exit holds (`GET
    /// /v1/exits/{id}` only; absent when Redis cannot say).
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_addresses: Option<Vec<std::net::SocketAddr>>,
    /// Admin addresses the agent reported on egress the control plane has
    /// not verified it holds: ignored, no exit denies them.
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_addresses_unverified: Option<Vec<std::net::SocketAddr>>,
}

#[derive(Serialize)]
pub(super) struct EgressView {
    /// `verified`, `behind_nat`, `unobserved` or `mismatch` (see `egress.rs`).
    verification: String,
    /// With `--strict-egress-verification`, a `mismatch` keeps it out of routing.
    routable: bool,
    /// When the agent last reported.
    reported_at: Option<DateTime<Utc>>,
    /// The latest observation of each declared egress: the address bound
    /// and the public one the reflector saw.
    observed: Vec<ObservedEgress>,
    /// What the last report could not observe, and why.
    unobserved: serde_json::Value,
    /// Every observation, newest first (`GET /v1/exits/{id}` only, at most
    /// [`HISTORY_SHOWN`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<Vec<serde_json::Value>>,
}

/// Observation rows shown on one exit.
const HISTORY_SHOWN: i64 = 50;

const COLUMNS: &str =
    "id, name, source_type, owner, country, region, egress_ips, egress_prefixes, city, asn, hostname, agent_version, \
     draining, admin_draining, disabled, enrolled_at, last_heartbeat_at, behind_nat, \
     egress_verification, egress_reported_at, egress_unobserved, upstream";

/// `GET /v1/exits?limit=&after=EXIT_ID`, by exit id.
pub(super) async fn list(
    _: Operator,
    State(state): State<AppState>,
    Query(page): Query<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<ExitView>>), ApiError> {
    let limit = page.limit()?;
    let after: Option<Uuid> = match &page.after {
        Some(a) => Some(
            a.parse()
                .map_err(|_| ApiError::BadRequest("after: an exit id".into()))?,
        ),
        None => None,
    };
    let rows: Vec<ExitRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM exits WHERE ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2"
    ))
    .bind(after)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (headers, rows) = finish(rows, limit, "/v1/exits", |r| r.id.to_string());
    Ok((headers, Json(views(&state, rows).await?)))
}

pub(super) async fn get_one(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ExitView>, ApiError> {
    let row: ExitRow = sqlx::query_as(&format!("SELECT {COLUMNS} FROM exits WHERE id = $1"))
        .bind(id)
        .fetch_optional(&state.db)
        .await?
        .ok_or(ApiError::NotFound("exit"))?;
    let mut views = views(&state, vec![row]).await?;
    let mut view = views.pop().ok_or(ApiError::NotFound("exit"))?;
    view.egress.history = Some(super::egress::history(&state.db, id, HISTORY_SHOWN).await?);
    match state.projector.agent_admin_of(id).await {
        Ok(entry) => {
            let entry = entry.unwrap_or_default();
            view.admin_addresses = Some(entry.protected);
            view.admin_addresses_unverified = Some(entry.unverified);
        }
        Err(e) => {
            tracing::debug!(error = %e, exit = %id, "cannot read the agent's admin addresses")
        }
    }
    Ok(Json(view))
}

/// Rows joined with liveness (required) and the fleet's health view (best effort).
async fn views(state: &AppState, rows: Vec<ExitRow>) -> Result<Vec<ExitView>, ApiError> {
    let live = state
        .projector
        .live_exits()
        .await
        .map_err(|e| ApiError::Unavailable(format!("liveness unknown: {e}")))?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let health = state.projector.fleet_health(&ids).await.ok();
    let nat: Vec<(Uuid, bool)> = rows.iter().map(|r| (r.id, r.behind_nat)).collect();
    let mut observed: std::collections::HashMap<Uuid, Vec<ObservedEgress>> = Default::default();
    for (id, o) in super::egress::latest_observations(&state.db, &nat).await? {
        observed.entry(id).or_default().push(o);
    }
    let strict = state.projector.strict_egress();
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            let mine = observed.remove(&row.id).unwrap_or_default();
            ExitView {
                live: live.contains(&row.id),
                health: health.as_ref().and_then(|h| h.get(i).cloned()),
                egress: EgressView {
                    routable: !crate::routes::egress::blocks_routing(
                        &row.egress_verification,
                        strict,
                    ),
                    verification: row.egress_verification.clone(),
                    reported_at: row.egress_reported_at,
                    observed: mine,
                    unobserved: row.egress_unobserved.0.clone(),
                    history: None,
                },
                admin_addresses: None,
                admin_addresses_unverified: None,
                row,
            }
        })
        .collect())
}

/// `POST /v1/exits/{id}/drain`: no new tunnels; open ones finish.
pub(super) async fn drain(
    op: Operator,
    state: State<AppState>,
    id: Path<Uuid>,
) -> Result<Json<ExitView>, ApiError> {
    set_flag(op, state, id, "admin_draining = true", "exit.drain").await
}

/// `POST /v1/exits/{id}/undrain`: back in rotation.
pub(super) async fn undrain(
    op: Operator,
    state: State<AppState>,
    id: Path<Uuid>,
) -> Result<Json<ExitView>, ApiError> {
    set_flag(op, state, id, "admin_draining = false", "exit.undrain").await
}

/// `POST /v1/exits/{id}/disable`: out of rotation until enabled.
pub(super) async fn disable(
    op: Operator,
    state: State<AppState>,
    id: Path<Uuid>,
) -> Result<Json<ExitView>, ApiError> {
    set_flag(op, state, id, "disabled = true", "exit.disable").await
}

/// `POST /v1/exits/{id}/enable`.
pub(super) async fn enable(
    op: Operator,
    state: State<AppState>,
    id: Path<Uuid>,
) -> Result<Json<ExitView>, ApiError> {
    set_flag(op, state, id, "disabled = false", "exit.enable").await
}

async fn set_flag(
    op: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    assignment: &'static str,
    action: &'static str,
) -> Result<Json<ExitView>, ApiError> {
    let mut tx = state.db.begin().await?;
    let updated = sqlx::query(&format!("UPDATE exits SET {assignment} WHERE id = $1"))
        .bind(id)
        .execute(&mut *tx)
        .await?;
    if updated.rows_affected() == 0 {
        return Err(ApiError::NotFound("exit"));
    }
    audit::record(
        &mut tx,
        "operator",
        action,
        &id.to_string(),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    // Projection publishes an `exit:ID` event: superproxies refresh at once.
    state.projector.exit(id).await;
    get_one(op, State(state), Path(id)).await
}
