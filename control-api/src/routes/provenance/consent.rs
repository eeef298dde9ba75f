//! Consent records: append-only and versioned per exit; grant, revoke,
//! reinstate and history, each audited and re-projected in its transaction.

use super::*;

/// How consent may have been given.
const CONSENT_METHODS: [&str; 3] = ["in_app_opt_in", "click_through_terms", "signed_contract"];

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GrantConsent {
    /// When the person agreed (default: now).
    granted_at: Option<DateTime<Utc>>,
    /// `in_app_opt_in`, `click_through_terms` or `signed_contract`.
    #[schemars(extend("enum" = CONSENT_METHODS))]
    method: String,
    notice_version: String,
    /// If given, must equal the stored notice's SHA-256 (what the device saw).
    notice_sha256: Option<String>,
    /// Where the evidence is kept (operator-only).
    evidence_ref: String,
    /// How this person opts out (URL or instruction).
    opt_out: String,
    expires_at: Option<DateTime<Utc>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevokeConsent {
    reason: String,
}

#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct ConsentRecord {
    pub(super) version: i32,
    pub(super) state: String,
    pub(super) granted_at: DateTime<Utc>,
    pub(super) method: String,
    pub(super) notice_version: String,
    pub(super) notice_sha256: String,
    pub(super) evidence_ref: String,
    pub(super) opt_out: String,
    pub(super) expires_at: Option<DateTime<Utc>>,
    pub(super) revoked_at: Option<DateTime<Utc>>,
    pub(super) revoked_reason: Option<String>,
    pub(super) recorded_at: DateTime<Utc>,
    pub(super) recorded_by: String,
}

pub(super) const CONSENT_COLUMNS: &str =
    "version, state, granted_at, method, notice_version, notice_sha256, \
     evidence_ref, opt_out, expires_at, revoked_at, revoked_reason, recorded_at, recorded_by";

pub(super) async fn exit_exists(state: &AppState, exit: Uuid) -> Result<(), ApiError> {
    let found: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM exits WHERE id = $1")
        .bind(exit)
        .fetch_optional(&state.db)
        .await?;
    found.map(|_| ()).ok_or(ApiError::NotFound("exit"))
}

/// Appends a version to the exit's consent history (the table refuses
/// UPDATE and DELETE), touches the exit so its projection moves, audits.
pub(super) async fn append_consent(
    state: &AppState,
    exit: Uuid,
    actor: &str,
    mode: Append,
    next: impl FnOnce(Option<ConsentRecord>) -> Result<ConsentInsert, ApiError>,
) -> Result<ConsentRecord, ApiError> {
    let mut tx = state.db.begin().await?;
    // Serialise writers of one exit's history.
    let (withdrawn,): (bool,) =
        sqlx::query_as("SELECT withdrawn_at IS NOT NULL FROM exits WHERE id = $1 FOR UPDATE")
            .bind(exit)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(ApiError::NotFound("exit"))?;
    match mode {
        Append::Record => {}
        Append::Reinstate if !withdrawn => {
            return Err(ApiError::Conflict(
                "the exit is not withdrawn; grant consent instead".into(),
            ))
        }
        Append::Reinstate => {
            sqlx::query("UPDATE exits SET withdrawn_at = NULL WHERE id = $1")
                .bind(exit)
                .execute(&mut *tx)
                .await?;
            audit::record(
                &mut tx,
                actor,
                "exit.reinstate",
                &exit.to_string(),
                serde_json::json!({}),
            )
            .await?;
        }
    }
    let latest: Option<ConsentRecord> = sqlx::query_as(&format!(
        "SELECT {CONSENT_COLUMNS} FROM consent_records WHERE exit_id = $1 ORDER BY version DESC LIMIT 1"
    ))
    .bind(exit)
    .fetch_optional(&mut *tx)
    .await?;
    let version = latest.as_ref().map_or(1, |l| l.version + 1);
    let new = next(latest)?;
    let record: ConsentRecord = sqlx::query_as(&format!(
        "INSERT INTO consent_records (exit_id, version, state, granted_at, method, notice_version, notice_sha256,
                                      evidence_ref, opt_out, expires_at, revoked_at, revoked_reason, recorded_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING {CONSENT_COLUMNS}"
    ))
    .bind(exit)
    .bind(version)
    .bind(new.state)
    .bind(new.granted_at)
    .bind(&new.method)
    .bind(&new.notice_version)
    .bind(&new.notice_sha256)
    .bind(&new.evidence_ref)
    .bind(&new.opt_out)
    .bind(new.expires_at)
    .bind(new.revoked_at)
    .bind(&new.revoked_reason)
    .bind(actor)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("UPDATE exits SET provenance_changed_at = now() WHERE id = $1")
        .bind(exit)
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        actor,
        if record.state == "revoked" {
            "consent.revoke"
        } else {
            "consent.grant"
        },
        &exit.to_string(),
        serde_json::json!({
            "version": record.version,
            "notice_version": record.notice_version,
            "expires_at": record.expires_at,
            "revoked_reason": record.revoked_reason,
        }),
    )
    .await?;
    // A revoked consent withdraws the exit. The owner's own opt-out (actor
    // "agent") revokes through here too, and emits once, with its withdrawal.
    let revoked = record.state == "revoked" && actor != "agent";
    if revoked {
        crate::webhooks::exit_withdrawn(
            &mut tx,
            exit,
            crate::webhooks::Withdrawal::ConsentRevoked,
            record.revoked_reason.as_deref(),
        )
        .await?;
    }
    tx.commit().await?;
    if revoked {
        crate::webhooks::wake();
    }
    state.projector.exit(exit).await;
    Ok(record)
}

/// What else a consent append does in its transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Append {
    /// Only the new consent version.
    Record,
    /// Also lifts the exit's withdrawal: only a fresh grant may do that.
    Reinstate,
}

pub(crate) struct ConsentInsert {
    state: &'static str,
    granted_at: DateTime<Utc>,
    method: String,
    notice_version: String,
    notice_sha256: String,
    evidence_ref: String,
    opt_out: String,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    revoked_reason: Option<String>,
}

pub(crate) async fn grant_consent(
    _: Operator,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    Json(body): Json<GrantConsent>,
) -> Result<(StatusCode, Json<ConsentRecord>), ApiError> {
    grant(state, exit, body, Append::Record).await
}

/// `POST /v1/exits/{id}/reinstate` (operators): brings back an exit its owner
/// withdrew, only together with a fresh consent record (same body as a
/// grant) in one transaction. The agent itself stays withdrawn until its
/// owner runs `exit-agent opt-in` on the host: both sides must agree.
pub(crate) async fn reinstate(
    _: Operator,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    Json(body): Json<GrantConsent>,
) -> Result<(StatusCode, Json<ConsentRecord>), ApiError> {
    grant(state, exit, body, Append::Reinstate).await
}

pub(super) async fn grant(
    state: AppState,
    exit: Uuid,
    body: GrantConsent,
    mode: Append,
) -> Result<(StatusCode, Json<ConsentRecord>), ApiError> {
    if !CONSENT_METHODS.contains(&body.method.as_str()) {
        return Err(ApiError::BadRequest(
            "method: in_app_opt_in, click_through_terms or signed_contract".into(),
        ));
    }
    for (field, value) in [
        ("evidence_ref", &body.evidence_ref),
        ("opt_out", &body.opt_out),
    ] {
        if value.trim().is_empty() || value.len() > 500 {
            return Err(ApiError::BadRequest(format!(
                "{field}: 1 to 500 characters"
            )));
        }
    }
    let granted_at = body.granted_at.unwrap_or_else(Utc::now);
    if body.expires_at.is_some_and(|e| e <= granted_at) {
        return Err(ApiError::BadRequest("expires_at: after granted_at".into()));
    }
    let (sha256,): (String,) =
        sqlx::query_as("SELECT sha256 FROM consent_notices WHERE version = $1")
            .bind(&body.notice_version)
            .fetch_optional(&state.db)
            .await?
            .ok_or_else(|| ApiError::BadRequest("notice_version: no such notice".into()))?;
    if let Some(claimed) = &body.notice_sha256 {
        if !constant_time_eq(claimed.to_ascii_lowercase().as_bytes(), sha256.as_bytes()) {
            return Err(ApiError::BadRequest(
                "notice_sha256: does not match the stored notice text".into(),
            ));
        }
    }
    let record = append_consent(&state, exit, "operator", mode, |_| {
        Ok(ConsentInsert {
            state: "granted",
            granted_at,
            method: body.method,
            notice_version: body.notice_version,
            notice_sha256: sha256,
            evidence_ref: body.evidence_ref.trim().to_owned(),
            opt_out: body.opt_out.trim().to_owned(),
            expires_at: body.expires_at,
            revoked_at: None,
            revoked_reason: None,
        })
    })
    .await?;
    Ok((StatusCode::CREATED, Json(record)))
}

/// A revocation copies the granted terms it ends and records when and why.
pub(super) fn revocation(
    latest: Option<ConsentRecord>,
    reason: String,
) -> Result<ConsentInsert, ApiError> {
    let latest = latest.ok_or_else(|| ApiError::Conflict("no consent to revoke".into()))?;
    if latest.state == "revoked" {
        return Err(ApiError::Conflict("consent is already revoked".into()));
    }
    Ok(ConsentInsert {
        state: "revoked",
        granted_at: latest.granted_at,
        method: latest.method,
        notice_version: latest.notice_version,
        notice_sha256: latest.notice_sha256,
        evidence_ref: latest.evidence_ref,
        opt_out: latest.opt_out,
        expires_at: latest.expires_at,
        revoked_at: Some(Utc::now()),
        revoked_reason: Some(reason),
    })
}

pub(crate) async fn revoke_consent(
    _: Operator,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    Json(body): Json<RevokeConsent>,
) -> Result<Json<ConsentRecord>, ApiError> {
    if body.reason.trim().is_empty() || body.reason.len() > 500 {
        return Err(ApiError::BadRequest("reason: 1 to 500 characters".into()));
    }
    let reason = body.reason.trim().to_owned();
    let record = append_consent(&state, exit, "operator", Append::Record, |latest| {
        revocation(latest, reason)
    })
    .await?;
    Ok(Json(record))
}

pub(crate) async fn consent_history(
    _: Operator,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
) -> Result<Json<Vec<ConsentRecord>>, ApiError> {
    exit_exists(&state, exit).await?;
    let rows: Vec<ConsentRecord> = sqlx::query_as(&format!(
        "SELECT {CONSENT_COLUMNS} FROM consent_records WHERE exit_id = $1 ORDER BY version"
    ))
    .bind(exit)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(rows))
}
