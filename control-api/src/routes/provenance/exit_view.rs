//! The exit's provenance as its viewer may see it: operators everything,
//! an account the customer view of an exit that carried its traffic.

use super::*;

#[derive(sqlx::FromRow)]
pub(super) struct ProvenanceRow {
    source_type: String,
    country: String,
    asn: Option<i64>,
    withdrawn_at: Option<DateTime<Utc>>,
    source_name: Option<String>,
    channel: Option<String>,
    supplier: Option<String>,
    agreement_ref: Option<String>,
    notice_description: Option<String>,
    source_opt_out: Option<String>,
    liable_party: Option<String>,
    abuse_contact: Option<String>,
    consent_required: Option<bool>,
    consent_state: Option<String>,
    granted_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    notice_version: Option<String>,
    notice_sha256: Option<String>,
    consent_method: Option<String>,
    consent_opt_out: Option<String>,
    evidence_ref: Option<String>,
    egress_verification: String,
    behind_nat: bool,
    /// The public addresses the reflector last saw, one per declared egress.
    observed_egress: Vec<String>,
}

/// `GET /v1/exits/{id}/provenance`: operators see everything; an account
/// key sees the customer view of an exit that carried its traffic (404 for
/// any other), never contracts or evidence references.
pub(crate) async fn exit_provenance(
    caller: Caller,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(account) = caller.scope() {
        let carried: Option<(i32,)> = sqlx::query_as(
            "SELECT 1 FROM usage_ledger WHERE account_id = $1 AND exit_id = $2 LIMIT 1",
        )
        .bind(account)
        .bind(exit)
        .fetch_optional(&state.db)
        .await?;
        if carried.is_none() {
            return Err(ApiError::NotFound("exit"));
        }
    }
    let row: ProvenanceRow = sqlx::query_as(
        "SELECT e.source_type, e.country, e.asn, e.withdrawn_at, s.name AS source_name, s.channel,
                s.supplier, s.agreement_ref, s.notice_description, s.opt_out AS source_opt_out,
                s.liable_party, s.abuse_contact, s.consent_required,
                c.state AS consent_state, c.granted_at, c.expires_at, c.revoked_at, c.notice_version,
                c.notice_sha256, c.method AS consent_method, c.opt_out AS consent_opt_out, c.evidence_ref,
                e.egress_verification, e.behind_nat,
                ARRAY(SELECT DISTINCT ON (o.egress) host(o.observed_ip) FROM exit_egress_observations o
                       WHERE o.exit_id = e.id ORDER BY o.egress, o.first_seen DESC, o.id DESC) AS observed_egress
           FROM exits e LEFT JOIN sources s ON s.id = e.source_id
           LEFT JOIN LATERAL (SELECT * FROM consent_records WHERE exit_id = e.id ORDER BY version DESC LIMIT 1) c ON true
          WHERE e.id = $1",
    )
    .bind(exit)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("exit"))?;
    let record = state.projector.exit_record(exit).await.ok().flatten();
    let now_ms = Utc::now().timestamp_millis();
    let blocked = record.as_ref().and_then(|r| r.provenance_block(now_ms));
    let consent_status = match (row.consent_required, row.consent_state.as_deref()) {
        (Some(false) | None, _) => "not_required",
        (Some(true), None) => "missing",
        (Some(true), Some("revoked")) => "revoked",
        (Some(true), Some(_)) if row.expires_at.is_some_and(|e| e <= Utc::now()) => "expired",
        (Some(true), Some(_)) => "granted",
    };
    let mut observed = row.observed_egress.clone();
    observed.sort_unstable();
    observed.dedup();
    let mut view = serde_json::json!({
        "exit_id": exit,
        "source_type": row.source_type,
        "channel": row.channel,
        "country": row.country,
        "asn": row.asn,
        "routable": blocked.is_none() && record.is_some(),
        "blocked": blocked.map(|b| b.as_str()),
        "withdrawn_at": row.withdrawn_at,
        // The public address(es) the world sees this exit's traffic come
        // from, as our reflector observed them, and whether they agree with
        // what the exit declared (`verified`, `behind_nat`, `unobserved`,
        // `mismatch`).
        "egress": {
            "verification": row.egress_verification,
            "behind_nat": row.behind_nat,
            "observed": observed,
        },
        "consent": {
            "status": consent_status,
            "granted_at": row.granted_at,
            "expires_at": row.expires_at,
            "revoked_at": row.revoked_at,
            "notice_version": row.notice_version,
            "notice_sha256": row.notice_sha256,
        },
    });
    if caller == Caller::Operator {
        view["source"] = serde_json::json!({
            "name": row.source_name,
            "supplier": row.supplier,
            "agreement_ref": row.agreement_ref,
            "notice_description": row.notice_description,
            "opt_out": row.source_opt_out,
            "liable_party": row.liable_party,
            "abuse_contact": row.abuse_contact,
        });
        view["consent"]["method"] = serde_json::json!(row.consent_method);
        view["consent"]["opt_out"] = serde_json::json!(row.consent_opt_out);
        view["consent"]["evidence_ref"] = serde_json::json!(row.evidence_ref);
    }
    Ok(Json(view))
}
