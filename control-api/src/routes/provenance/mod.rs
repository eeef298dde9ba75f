//! Exit provenance and consent (docs/provenance.md).
//!
//! Sources answer the four questions for the exits that belong to them;
//! consent records, append-only and versioned, cover exits whose address is
//! someone else's; notices are the texts those people saw, stored and served
//! by version and SHA-256. Every change is audited in its transaction and
//! re-projected at once, so superproxies route (or stop routing) through the
//! exit within a second; expiry needs no event at all (the projected record
//! carries the instant).
//!
//! This file holds the sources; a file each for notices, consent, the exit's
//! provenance view and the exit-side opt-out.

mod consent;
mod exit_view;
mod notices;
mod opt_out;

pub(super) use consent::*;
pub(super) use exit_view::*;
pub(super) use notices::*;
pub(super) use opt_out::*;

use crate::extract::{Json, Path};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use proxynet_common::secret::{constant_time_eq, sha256_hex};
use proxynet_store::{Channel, SourceType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::auth::{bearer, Caller, Operator};
use crate::error::{conflict_on_unique, ApiError};
use crate::{audit, AppState};

// ---- sources ----------------------------------------------------------------

/// A source's answers to the four questions (docs/provenance.md).
// `source_type` and `channel` are read as strings and parsed by `validate`;
// their schemas are those of the types they are parsed into.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Source")]
pub(super) struct SourceBody {
    name: String,
    #[schemars(with = "SourceType")]
    source_type: String,
    #[schemars(with = "Channel")]
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
    /// ISO 3166-1 alpha-2 codes, upper case.
    #[serde(default)]
    #[schemars(inner(regex(pattern = "^[A-Z]{2}$")))]
    countries: Vec<String>,
    /// Default: required for res/mobile and for channels that borrow someone
    /// else's line; optional (default off) for isp; never for dc.
    consent_required: Option<bool>,
    /// What the supplier bills per GB (both directions), in cents: the
    /// reconciliation view's cost and a plan's margin.
    #[serde(default)]
    #[schemars(range(min = 0))]
    cost_cents_per_gb: Option<i64>,
}

#[derive(Serialize, sqlx::FromRow)]
pub(super) struct Source {
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
    cost_cents_per_gb: Option<i64>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Serialize)]
pub(super) struct SourceView {
    #[serde(flatten)]
    source: Source,
    /// Whether the source answers the four questions (consent aside).
    complete: bool,
    /// Which answers are missing.
    missing: Vec<&'static str>,
}

const SOURCE_COLUMNS: &str = "id, name, source_type, channel, supplier, agreement_ref, \
     notice_description, opt_out, liable_party, abuse_contact, countries, consent_required, \
     cost_cents_per_gb, created_at, updated_at";

impl SourceBody {
    /// Validates shapes (completeness is reported, not required: an
    /// incomplete source may exist, its exits just carry nothing).
    fn validate(&self) -> Result<(SourceType, Channel, bool), ApiError> {
        if self.name.trim().is_empty() || self.name.len() > 200 {
            return Err(ApiError::BadRequest("name: 1 to 200 characters".into()));
        }
        if self.cost_cents_per_gb.is_some_and(|c| c < 0) {
            return Err(ApiError::BadRequest(
                "cost_cents_per_gb: must not be negative".into(),
            ));
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

pub(super) async fn create_source(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<SourceBody>,
) -> Result<(StatusCode, Json<SourceView>), ApiError> {
    let (_, _, consent_required) = body.validate()?;
    let mut tx = state.db.begin().await?;
    let source: Source = sqlx::query_as(&format!(
        "INSERT INTO sources (id, name, source_type, channel, supplier, agreement_ref, notice_description,
                              opt_out, liable_party, abuse_contact, countries, consent_required, cost_cents_per_gb)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING {SOURCE_COLUMNS}"
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
    .bind(body.cost_cents_per_gb)
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

pub(super) async fn list_sources(
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

pub(super) async fn get_source(
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
pub(super) async fn replace_source(
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
                countries = $11, consent_required = $12, cost_cents_per_gb = $13, updated_at = now()
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
    .bind(body.cost_cents_per_gb)
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
