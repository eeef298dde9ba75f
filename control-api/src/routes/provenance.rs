//! Exit provenance and consent (docs/provenance.md).
//!
//! Sources answer the four questions for the exits that belong to them;
//! consent records, append-only and versioned, cover exits whose address is
//! someone else's; notices are the texts those people saw, stored and served
//! by version and SHA-256. Every change is audited in its transaction and
//! re-projected at once, so superproxies route (or stop routing) through the
//! exit within a second; expiry needs no event at all (the projected record
//! carries the instant).

use crate::extract::{Json, Path};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use proxynet_protocol::secret::{constant_time_eq, sha256_hex};
use proxynet_protocol::store::{Channel, SourceType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::auth::{bearer, Caller, Operator};
use crate::error::{conflict_on_unique, ApiError};
use crate::{audit, AppState};

// ---- sources ----------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceBody {
    name: String,
    source_type: String,
    channel: String,
    #[serde(default)]
    supplier: String,
    #[serde(default)]
    agreement_ref: String,
    #[serde(default)]
    notice_description: String,
    #[serde(default)]
    opt_out: String,
    #[serde(default)]
    liable_party: String,
    #[serde(default)]
    abuse_contact: String,
    #[serde(default)]
    countries: Vec<String>,
    /// Default: required for res/mobile and for channels that borrow someone
    /// else's line; optional (default off) for isp; never for dc.
    consent_required: Option<bool>,
}

#[derive(Serialize, sqlx::FromRow)]
pub struct Source {
    id: Uuid,
    name: String,
    source_type: String,
    channel: String,
    supplier: String,
    agreement_ref: String,
    notice_description: String,
    opt_out: String,
    liable_party: String,
    abuse_contact: String,
    countries: Vec<String>,
    consent_required: bool,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Serialize)]
pub struct SourceView {
    #[serde(flatten)]
    source: Source,
    /// Whether the source answers the four questions (consent aside).
    complete: bool,
    /// Which answers are missing.
    missing: Vec<&'static str>,
}

const SOURCE_COLUMNS: &str = "id, name, source_type, channel, supplier, agreement_ref, \
     notice_description, opt_out, liable_party, abuse_contact, countries, consent_required, \
     created_at, updated_at";

impl SourceBody {
    /// Validates shapes (completeness is reported, not required: an
    /// incomplete source may exist, its exits just carry nothing).
    fn validate(&self) -> Result<(SourceType, Channel, bool), ApiError> {
        if self.name.trim().is_empty() || self.name.len() > 200 {
            return Err(ApiError::BadRequest("name: 1 to 200 characters".into()));
        }
        let source_type = SourceType::parse(&self.source_type).ok_or_else(|| {
            ApiError::BadRequest("source_type: one of dc, isp, res, mobile".into())
        })?;
        let channel = Channel::parse(&self.channel).ok_or_else(|| {
            ApiError::BadRequest(
                "channel: one of owned, leased, isp, sdk, extension, sharing, reseller".into(),
            )
        })?;
        for (field, value) in [
            ("supplier", &self.supplier),
            ("agreement_ref", &self.agreement_ref),
            ("notice_description", &self.notice_description),
            ("opt_out", &self.opt_out),
            ("liable_party", &self.liable_party),
            ("abuse_contact", &self.abuse_contact),
        ] {
            if value.len() > 2000 {
                return Err(ApiError::BadRequest(format!(
                    "{field}: at most 2000 characters"
                )));
            }
        }
        for c in &self.countries {
            if c.len() != 2 || !c.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ApiError::BadRequest(format!(
                    "countries: {c:?} is not an upper-case ISO 3166-1 alpha-2 code"
                )));
            }
        }
        let must = matches!(source_type, SourceType::Res | SourceType::Mobile)
            || channel.borrows_someone_elses_line();
        let consent_required = match self.consent_required {
            Some(false) if must => {
                return Err(ApiError::BadRequest(
                    "consent_required: always true for res/mobile sources and for sdk, extension and sharing channels".into(),
                ))
            }
            Some(true) if source_type == SourceType::Dc => {
                return Err(ApiError::BadRequest(
                    "consent_required: not for dc sources (the addresses are ours or leased)".into(),
                ))
            }
            Some(v) => v,
            None => must,
        };
        Ok((source_type, channel, consent_required))
    }
}

fn source_view(source: Source) -> SourceView {
    let mut missing = Vec::new();
    for (name, value) in [
        ("supplier", &source.supplier),
        ("agreement_ref", &source.agreement_ref),
        ("notice_description", &source.notice_description),
        ("opt_out", &source.opt_out),
        ("liable_party", &source.liable_party),
        ("abuse_contact", &source.abuse_contact),
    ] {
        if value.trim().is_empty() {
            missing.push(name);
        }
    }
    if source.countries.is_empty() {
        missing.push("countries");
    }
    SourceView {
        complete: missing.is_empty(),
        missing,
        source,
    }
}

pub async fn create_source(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<SourceBody>,
) -> Result<(StatusCode, Json<SourceView>), ApiError> {
    let (_, _, consent_required) = body.validate()?;
    let mut tx = state.db.begin().await?;
    let source: Source = sqlx::query_as(&format!(
        "INSERT INTO sources (id, name, source_type, channel, supplier, agreement_ref, notice_description,
                              opt_out, liable_party, abuse_contact, countries, consent_required)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING {SOURCE_COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(body.name.trim())
    .bind(&body.source_type)
    .bind(&body.channel)
    .bind(body.supplier.trim())
    .bind(body.agreement_ref.trim())
    .bind(body.notice_description.trim())
    .bind(body.opt_out.trim())
    .bind(body.liable_party.trim())
    .bind(body.abuse_contact.trim())
    .bind(&body.countries)
    .bind(consent_required)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| conflict_on_unique(e, "name: a source of that name exists"))?;
    audit::record(
        &mut tx,
        "operator",
        "source.create",
        &source.id.to_string(),
        serde_json::json!({"name": source.name, "source_type": source.source_type, "channel": source.channel}),
    )
    .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(source_view(source))))
}

pub async fn list_sources(
    _: Operator,
    State(state): State<AppState>,
) -> Result<Json<Vec<SourceView>>, ApiError> {
    let rows: Vec<Source> = sqlx::query_as(&format!(
        "SELECT {SOURCE_COLUMNS} FROM sources ORDER BY name LIMIT 10000"
    ))
    .fetch_all(&state.db)
    .await?;
    Ok(Json(rows.into_iter().map(source_view).collect()))
}

pub async fn get_source(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<SourceView>, ApiError> {
    let row: Source = sqlx::query_as(&format!(
        "SELECT {SOURCE_COLUMNS} FROM sources WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("source"))?;
    Ok(Json(source_view(row)))
}

/// `PUT /v1/sources/{id}`: replaces the source's answers (its exits follow at once).
pub async fn replace_source(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    Json(body): Json<SourceBody>,
) -> Result<Json<SourceView>, ApiError> {
    let (_, _, consent_required) = body.validate()?;
    let mut tx = state.db.begin().await?;
    let source: Source = sqlx::query_as(&format!(
        "UPDATE sources SET name = $2, source_type = $3, channel = $4, supplier = $5, agreement_ref = $6,
                notice_description = $7, opt_out = $8, liable_party = $9, abuse_contact = $10,
                countries = $11, consent_required = $12, updated_at = now()
          WHERE id = $1 RETURNING {SOURCE_COLUMNS}"
    ))
    .bind(id)
    .bind(body.name.trim())
    .bind(&body.source_type)
    .bind(&body.channel)
    .bind(body.supplier.trim())
    .bind(body.agreement_ref.trim())
    .bind(body.notice_description.trim())
    .bind(body.opt_out.trim())
    .bind(body.liable_party.trim())
    .bind(body.abuse_contact.trim())
    .bind(&body.countries)
    .bind(consent_required)
    .fetch_optional(&mut *tx)
    .await
    .map_err(|e| conflict_on_unique(e, "name: a source of that name exists"))?
    .ok_or(ApiError::NotFound("source"))?;
    sqlx::query(
        "UPDATE exits SET provenance_changed_at = now(), source_type = $2, owner = $3 WHERE source_id = $1",
    )
    .bind(id)
    .bind(&source.source_type)
    .bind(&source.supplier)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        "operator",
        "source.update",
        &id.to_string(),
        serde_json::json!({"name": source.name, "channel": source.channel, "countries": source.countries}),
    )
    .await?;
    tx.commit().await?;
    state.projector.source_exits(id).await;
    Ok(Json(source_view(source)))
}

// ---- notices ----------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoticeBody {
    version: String,
    body: String,
}

#[derive(Serialize)]
pub struct Notice {
    version: String,
    sha256: String,
}

pub async fn create_notice(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<NoticeBody>,
) -> Result<(StatusCode, Json<Notice>), ApiError> {
    if body.version.is_empty()
        || body.version.len() > 64
        || !body
            .version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(ApiError::BadRequest(
            "version: 1 to 64 of A-Z a-z 0-9 . _ -".into(),
        ));
    }
    if body.body.trim().is_empty() || body.body.len() > 200_000 {
        return Err(ApiError::BadRequest(
            "body: the notice text, 1 to 200000 bytes".into(),
        ));
    }
    let sha256 = hex::encode(Sha256::digest(body.body.as_bytes()));
    let mut tx = state.db.begin().await?;
    sqlx::query("INSERT INTO consent_notices (version, sha256, body) VALUES ($1, $2, $3)")
        .bind(&body.version)
        .bind(&sha256)
        .bind(&body.body)
        .execute(&mut *tx)
        .await
        .map_err(|e| conflict_on_unique(e, "version: that version (or that exact text) exists"))?;
    audit::record(
        &mut tx,
        "operator",
        "consent_notice.create",
        &body.version,
        serde_json::json!({"sha256": sha256}),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(Notice {
            version: body.version,
            sha256,
        }),
    ))
}

/// `GET /v1/consent-notices/{version}`: the text itself, public, so anyone
/// can check what a person was shown (`Proxynet-Notice-Sha256` names it).
pub async fn get_notice(
    State(state): State<AppState>,
    Path(version): Path<String>,
) -> Result<Response, ApiError> {
    let row: (String, String) =
        sqlx::query_as("SELECT sha256, body FROM consent_notices WHERE version = $1")
            .bind(&version)
            .fetch_optional(&state.db)
            .await?
            .ok_or(ApiError::NotFound("consent notice"))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&row.0) {
        headers.insert("proxynet-notice-sha256", v);
    }
    Ok((headers, row.1).into_response())
}

// ---- consent ----------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantConsent {
    /// When the person agreed (default: now).
    granted_at: Option<DateTime<Utc>>,
    /// `in_app_opt_in`, `click_through_terms` or `signed_contract`.
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeConsent {
    reason: String,
}

#[derive(Serialize, sqlx::FromRow)]
pub struct ConsentRecord {
    version: i32,
    state: String,
    granted_at: DateTime<Utc>,
    method: String,
    notice_version: String,
    notice_sha256: String,
    evidence_ref: String,
    opt_out: String,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    revoked_reason: Option<String>,
    recorded_at: DateTime<Utc>,
    recorded_by: String,
}

const CONSENT_COLUMNS: &str = "version, state, granted_at, method, notice_version, notice_sha256, \
     evidence_ref, opt_out, expires_at, revoked_at, revoked_reason, recorded_at, recorded_by";

async fn exit_exists(state: &AppState, exit: Uuid) -> Result<(), ApiError> {
    let found: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM exits WHERE id = $1")
        .bind(exit)
        .fetch_optional(&state.db)
        .await?;
    found.map(|_| ()).ok_or(ApiError::NotFound("exit"))
}

/// Appends a version to the exit's consent history (the table refuses
/// UPDATE and DELETE), touches the exit so its projection moves, audits.
async fn append_consent(
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
    tx.commit().await?;
    state.projector.exit(exit).await;
    Ok(record)
}

/// What else a consent append does in its transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Append {
    /// Only the new consent version.
    Record,
    /// Also lifts the exit's withdrawal: only a fresh grant may do that.
    Reinstate,
}

pub struct ConsentInsert {
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

pub async fn grant_consent(
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
pub async fn reinstate(
    _: Operator,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
    Json(body): Json<GrantConsent>,
) -> Result<(StatusCode, Json<ConsentRecord>), ApiError> {
    grant(state, exit, body, Append::Reinstate).await
}

async fn grant(
    state: AppState,
    exit: Uuid,
    body: GrantConsent,
    mode: Append,
) -> Result<(StatusCode, Json<ConsentRecord>), ApiError> {
    if !["in_app_opt_in", "click_through_terms", "signed_contract"].contains(&body.method.as_str())
    {
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
fn revocation(latest: Option<ConsentRecord>, reason: String) -> Result<ConsentInsert, ApiError> {
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

pub async fn revoke_consent(
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

pub async fn consent_history(
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

// ---- the exit's provenance, as its viewer may see it -------------------------

#[derive(sqlx::FromRow)]
struct ProvenanceRow {
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
}

/// `GET /v1/exits/{id}/provenance`: operators see everything; an account
/// key sees the customer view of an exit that carried its traffic (404 for
/// any other), never contracts or evidence references.
pub async fn exit_provenance(
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
                c.notice_sha256, c.method AS consent_method, c.opt_out AS consent_opt_out, c.evidence_ref
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
    let mut view = serde_json::json!({
        "exit_id": exit,
        "source_type": row.source_type,
        "channel": row.channel,
        "country": row.country,
        "asn": row.asn,
        "routable": blocked.is_none() && record.is_some(),
        "blocked": blocked.map(|b| b.as_str()),
        "withdrawn_at": row.withdrawn_at,
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

// ---- withdrawal from the exit side -------------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OptOut {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Serialize)]
pub struct OptedOut {
    withdrawn_at: DateTime<Utc>,
}

/// `POST /v1/agent/exits/{id}/opt-out` (the agent's own credential): the
/// person behind the exit withdraws it. Marks the exit withdrawn, revokes its
/// consent if it has one, audits, re-projects; idempotent (the agent retries
/// until it hears back), and never needs the operator.
pub async fn agent_opt_out(
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
    tx.commit().await?;
    state.projector.exit(exit).await;
    tracing::info!(exit = %exit, "exit withdrawn by its owner");
    Ok(Json(OptedOut { withdrawn_at: at }))
}
