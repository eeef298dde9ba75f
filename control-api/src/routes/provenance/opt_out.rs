//! Withdrawal from the exit side: the agent's own credential withdraws its
//! exit, idempotently, without the operator.

use super::*;

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OptOut {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct OptedOut {
    withdrawn_at: DateTime<Utc>,
}

/// `POST /v1/agent/exits/{id}/opt-out` (the agent's own credential): the
/// person behind the exit withdraws it. Marks the exit withdrawn, revokes its
/// consent if it has one, audits, re-projects; idempotent (the agent retries
/// until it hears back), and never needs the operator.
pub(crate) async fn agent_opt_out(
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    parts: axum::http::request::Parts,
    body: Option<Json<OptOut>>,
) -> Result<Json<OptedOut>, ApiError> {
    let presented = bearer(&parts).ok_or(ApiError::Unauthorized)?;
    let row: Option<(String, Option<DateTime<Utc>>)> =
        sqlx::query_as("SELECT credential_sha256, withdrawn_at FROM exits WHERE id = $1")
            .bind(exit)
            .fetch_optional(&state.db)
            .await?;
    let (stored, withdrawn) = row.ok_or(ApiError::Unauthorized)?;
    if !constant_time_eq(sha256_hex(presented).as_bytes(), stored.as_bytes()) {
        return Err(ApiError::Unauthorized);
    }
    if let Some(at) = withdrawn {
        return Ok(Json(OptedOut { withdrawn_at: at }));
    }
    let reason = body
        .and_then(|Json(b)| b.reason)
        .map(|r| r.chars().take(500).collect::<String>())
        .unwrap_or_else(|| "withdrawn by the exit's owner (exit-agent opt-out)".into());
    let revoked = append_consent(
        &state,
        exit,
        "agent",
        Append::Record,
        |latest| match latest {
            Some(l) if l.state == "granted" => revocation(Some(l), reason.clone()),
            _ => Err(ApiError::Conflict("no consent to revoke".into())),
        },
    )
    .await;
    if let Err(e) = revoked {
        if !matches!(e, ApiError::Conflict(_)) {
            return Err(e);
        }
    }
    let mut tx = state.db.begin().await?;
    let (at,): (DateTime<Utc>,) = sqlx::query_as(
        "UPDATE exits SET withdrawn_at = COALESCE(withdrawn_at, now()), provenance_changed_at = now()
          WHERE id = $1 RETURNING withdrawn_at",
    )
    .bind(exit)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        "agent",
        "exit.opt_out",
        &exit.to_string(),
        serde_json::json!({"reason": reason}),
    )
    .await?;
    crate::webhooks::exit_withdrawn(
        &mut tx,
        exit,
        crate::webhooks::Withdrawal::OptOut,
        Some(&reason),
    )
    .await?;
    tx.commit().await?;
    crate::webhooks::wake();
    // The agent announces the withdrawal in its heartbeats too, but one may
    // be in flight from before: liveness says "draining" now, so an operator's
    // reinstatement cannot route the exit before its owner opts in again.
    if let Err(e) = state
        .projector
        .heartbeat(exit, true, state.config.heartbeat_ttl())
        .await
    {
        tracing::warn!(exit = %exit, error = %e, "cannot mark the withdrawn exit draining; its next heartbeat does");
    }
    state.projector.exit(exit).await;
    tracing::info!(exit = %exit, "exit withdrawn by its owner");
    Ok(Json(OptedOut { withdrawn_at: at }))
}
