//! Exits as the operator sees them: provenance, egress IPs, liveness.

use axum::extract::{Path, State};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::auth::Operator;
use crate::error::ApiError;
use crate::AppState;

#[derive(Serialize, sqlx::FromRow)]
pub struct ExitRow {
    id: Uuid,
    name: String,
    source_type: String,
    owner: String,
    country: String,
    egress_ips: Vec<String>,
    hostname: String,
    agent_version: String,
    draining: bool,
    disabled: bool,
    enrolled_at: DateTime<Utc>,
    last_heartbeat_at: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
pub struct ExitView {
    #[serde(flatten)]
    row: ExitRow,
    /// Heartbeat seen within the TTL (Redis live set).
    live: bool,
}

const COLUMNS: &str = "id, name, source_type, owner, country, egress_ips, hostname, agent_version, draining, disabled, enrolled_at, last_heartbeat_at";

pub async fn list(
    _: Operator,
    State(state): State<AppState>,
) -> Result<Json<Vec<ExitView>>, ApiError> {
    let rows: Vec<ExitRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM exits ORDER BY enrolled_at LIMIT 10000"
    ))
    .fetch_all(&state.db)
    .await?;
    let live = state
        .projector
        .live_exits()
        .await
        .map_err(|e| ApiError::Unavailable(format!("liveness unknown: {e}")))?;
    Ok(Json(
        rows.into_iter()
            .map(|row| ExitView {
                live: live.contains(&row.id),
                row,
            })
            .collect(),
    ))
}

pub async fn get_one(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ExitView>, ApiError> {
    let row: ExitRow = sqlx::query_as(&format!("SELECT {COLUMNS} FROM exits WHERE id = $1"))
        .bind(id)
        .fetch_optional(&state.db)
        .await?
        .ok_or(ApiError::NotFound("exit"))?;
    let live = state
        .projector
        .live_exits()
        .await
        .map_err(|e| ApiError::Unavailable(format!("liveness unknown: {e}")))?;
    Ok(Json(ExitView {
        live: live.contains(&row.id),
        row,
    }))
}
