//! Proxy users: the credentials customers put in `curl -x`.
//!
//! Every change bumps the user's `version` (a database trigger takes the next
//! number of the projection sequence) and is projected to Redis at once, so
//! superproxies see revocations and password rotations without waiting for a
//! cache to expire.

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use proxynet_protocol::secret::Secret;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{conflict_on_unique, ApiError};
use crate::passwords::{validate_password, validate_username};
use crate::routes::page::{finish, PageQuery};
use crate::{audit, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    username: String,
    password: Secret,
    #[serde(default)]
    limits: Limits,
}

/// Per-user limits, enforced across all superproxies. `null` removes a limit.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    max_concurrent_tunnels: Option<i32>,
    max_new_tunnels_per_second: Option<i32>,
    /// Bytes (up + down) per `period`.
    bandwidth_bytes: Option<i64>,
    /// `daily` or `monthly` (UTC calendar); default monthly.
    period: Option<String>,
    /// Soft warning threshold, percent of `bandwidth_bytes` (default 80).
    warn_percent: Option<i32>,
    /// Exit source types the user may use (default: any).
    allowed_source_types: Option<Vec<String>>,
    /// Exit countries (ISO 3166-1 alpha-2, upper case) the user may use (default: any).
    allowed_countries: Option<Vec<String>>,
    /// Acquisition channels of exit sources the user may use (default: any),
    /// e.g. `["owned", "leased"]` for datacenter addresses we own or lease only.
    allowed_channels: Option<Vec<String>>,
}

impl Limits {
    fn validate(&self) -> Result<(), ApiError> {
        for (field, value) in [
            ("limits.max_concurrent_tunnels", self.max_concurrent_tunnels),
            (
                "limits.max_new_tunnels_per_second",
                self.max_new_tunnels_per_second,
            ),
        ] {
            if value.is_some_and(|v| v <= 0) {
                return Err(ApiError::BadRequest(format!(
                    "{field}: must be a positive number"
                )));
            }
        }
        if self.bandwidth_bytes.is_some_and(|v| v <= 0) {
            return Err(ApiError::BadRequest(
                "limits.bandwidth_bytes: must be a positive number".into(),
            ));
        }
        if self.warn_percent.is_some_and(|w| !(1..=100).contains(&w)) {
            return Err(ApiError::BadRequest("limits.warn_percent: 1 to 100".into()));
        }
        for t in self.allowed_source_types.iter().flatten() {
            if proxynet_protocol::store::SourceType::parse(t).is_none() {
                return Err(ApiError::BadRequest(format!(
                    "limits.allowed_source_types: {t:?} is not dc, isp, res or mobile"
                )));
            }
        }
        for c in self.allowed_countries.iter().flatten() {
            if c.len() != 2 || !c.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ApiError::BadRequest(format!(
                    "limits.allowed_countries: {c:?} is not an upper-case alpha-2 code"
                )));
            }
        }
        for c in self.allowed_channels.iter().flatten() {
            if proxynet_protocol::store::Channel::parse(c).is_none() {
                return Err(ApiError::BadRequest(format!(
                    "limits.allowed_channels: {c:?} is not owned, leased, isp, sdk, extension, sharing or reseller"
                )));
            }
        }
        if let Some(p) = &self.period {
            if proxynet_protocol::store::QuotaPeriod::parse(p).is_none() {
                return Err(ApiError::BadRequest(
                    "limits.period: daily or monthly".into(),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateUser {
    enabled: Option<bool>,
    password: Option<Secret>,
    /// Replaces all limits when present.
    limits: Option<Limits>,
}

#[derive(Serialize, sqlx::FromRow)]
pub struct User {
    id: Uuid,
    account_id: Uuid,
    username: String,
    enabled: bool,
    version: i64,
    max_concurrent_tunnels: Option<i32>,
    max_new_tunnels_per_second: Option<i32>,
    bandwidth_bytes: Option<i64>,
    quota_period: String,
    quota_warn_percent: i32,
    allowed_source_types: Option<Vec<String>>,
    allowed_countries: Option<Vec<String>>,
    allowed_channels: Option<Vec<String>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

const USER_COLUMNS: &str = "id, account_id, username, enabled, version, max_concurrent_tunnels, \
     max_new_tunnels_per_second, bandwidth_bytes, quota_period, quota_warn_percent, \
     allowed_source_types, allowed_countries, allowed_channels, created_at, updated_at";

pub async fn create(
    caller: Caller,
    State(state): State<AppState>,
    Path(account_id): Path<Uuid>,
    Json(body): Json<CreateUser>,
) -> Result<(StatusCode, Json<User>), ApiError> {
    caller.check_account(account_id)?;
    validate_username(&body.username)?;
    validate_password(body.password.expose())?;
    body.limits.validate()?;
    super::accounts::ensure_exists(&state, account_id).await?;
    let hash = state.hashing.hash(body.password).await?;
    let mut tx = state.db.begin().await?;
    let user: User = sqlx::query_as(&format!(
        "INSERT INTO proxy_users (id, account_id, username, password_hash, max_concurrent_tunnels,
                                  max_new_tunnels_per_second, bandwidth_bytes, quota_period, quota_warn_percent,
                                  allowed_source_types, allowed_countries, allowed_channels)
         VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, 'monthly'), COALESCE($9, 80), $10, $11, $12) RETURNING {USER_COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(account_id)
    .bind(&body.username)
    .bind(&hash)
    .bind(body.limits.max_concurrent_tunnels)
    .bind(body.limits.max_new_tunnels_per_second)
    .bind(body.limits.bandwidth_bytes)
    .bind(&body.limits.period)
    .bind(body.limits.warn_percent)
    .bind(&body.limits.allowed_source_types)
    .bind(&body.limits.allowed_countries)
    .bind(&body.limits.allowed_channels)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| conflict_on_unique(e, "username: already taken"))?;
    audit::record(
        &mut tx,
        &actor(caller),
        "user.create",
        &user.id.to_string(),
        serde_json::json!({"username": user.username}),
    )
    .await?;
    tx.commit().await?;
    state.projector.user(&user.username).await;
    Ok((StatusCode::CREATED, Json(user)))
}

/// `GET /v1/accounts/{id}/users?limit=&after=USERNAME`, by username.
pub async fn list(
    caller: Caller,
    State(state): State<AppState>,
    Path(account_id): Path<Uuid>,
    Query(page): Query<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<User>>), ApiError> {
    caller.check_account(account_id)?;
    let limit = page.limit()?;
    let users: Vec<User> = sqlx::query_as(&format!(
        "SELECT {USER_COLUMNS} FROM proxy_users
          WHERE account_id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR username > $2)
          ORDER BY username LIMIT $3"
    ))
    .bind(account_id)
    .bind(&page.after)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (headers, users) = finish(
        users,
        limit,
        &format!("/v1/accounts/{account_id}/users"),
        |u| u.username.clone(),
    );
    Ok((headers, Json(users)))
}

pub async fn get_one(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<User>, ApiError> {
    fetch(&state, caller, id).await.map(Json)
}

/// A user the caller may see (`None` for another account's user).
pub async fn fetch(state: &AppState, caller: Caller, id: Uuid) -> Result<User, ApiError> {
    sqlx::query_as(&format!(
        "SELECT {USER_COLUMNS} FROM proxy_users
          WHERE id = $1 AND deleted_at IS NULL AND ($2::uuid IS NULL OR account_id = $2)"
    ))
    .bind(id)
    .bind(caller.scope())
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("user"))
}

pub async fn update(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    Json(body): Json<UpdateUser>,
) -> Result<Json<User>, ApiError> {
    if let Some(limits) = &body.limits {
        limits.validate()?;
    }
    let new_hash = match body.password {
        Some(password) => {
            validate_password(password.expose())?;
            Some(state.hashing.hash(password).await?)
        }
        None => None,
    };
    let mut tx = state.db.begin().await?;
    let user: User = sqlx::query_as(&format!(
        "UPDATE proxy_users
            SET enabled = COALESCE($2, enabled),
                password_hash = COALESCE($3, password_hash),
                max_concurrent_tunnels = CASE WHEN $4 THEN $5 ELSE max_concurrent_tunnels END,
                max_new_tunnels_per_second = CASE WHEN $4 THEN $6 ELSE max_new_tunnels_per_second END,
                bandwidth_bytes = CASE WHEN $4 THEN $8 ELSE bandwidth_bytes END,
                quota_period = CASE WHEN $4 THEN COALESCE($9, 'monthly') ELSE quota_period END,
                quota_warn_percent = CASE WHEN $4 THEN COALESCE($10, 80) ELSE quota_warn_percent END,
                allowed_source_types = CASE WHEN $4 THEN $11 ELSE allowed_source_types END,
                allowed_countries = CASE WHEN $4 THEN $12 ELSE allowed_countries END,
                allowed_channels = CASE WHEN $4 THEN $13 ELSE allowed_channels END,
                updated_at = now()
          WHERE id = $1 AND deleted_at IS NULL AND ($7::uuid IS NULL OR account_id = $7)
        RETURNING {USER_COLUMNS}"
    ))
    .bind(id)
    .bind(body.enabled)
    .bind(new_hash.as_deref())
    .bind(body.limits.is_some())
    .bind(body.limits.as_ref().and_then(|l| l.max_concurrent_tunnels))
    .bind(body.limits.as_ref().and_then(|l| l.max_new_tunnels_per_second))
    .bind(caller.scope())
    .bind(body.limits.as_ref().and_then(|l| l.bandwidth_bytes))
    .bind(body.limits.as_ref().and_then(|l| l.period.clone()))
    .bind(body.limits.as_ref().and_then(|l| l.warn_percent))
    .bind(body.limits.as_ref().and_then(|l| l.allowed_source_types.clone()))
    .bind(body.limits.as_ref().and_then(|l| l.allowed_countries.clone()))
    .bind(body.limits.as_ref().and_then(|l| l.allowed_channels.clone()))
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(ApiError::NotFound("user"))?;
    let detail = serde_json::json!({
        "enabled": body.enabled,
        "password_rotated": new_hash.is_some(),
        "limits_changed": body.limits.is_some(),
    });
    audit::record(
        &mut tx,
        &actor(caller),
        "user.update",
        &id.to_string(),
        detail,
    )
    .await?;
    tx.commit().await?;
    state.projector.user(&user.username).await;
    Ok(Json(user))
}

pub async fn delete(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    let row: Option<(String,)> = sqlx::query_as(
        "UPDATE proxy_users SET deleted_at = now(), enabled = false, updated_at = now()
          WHERE id = $1 AND deleted_at IS NULL AND ($2::uuid IS NULL OR account_id = $2) RETURNING username",
    )
    .bind(id)
    .bind(caller.scope())
    .fetch_optional(&mut *tx)
    .await?;
    let (username,) = row.ok_or(ApiError::NotFound("user"))?;
    audit::record(
        &mut tx,
        &actor(caller),
        "user.delete",
        &id.to_string(),
        serde_json::json!({"username": username}),
    )
    .await?;
    tx.commit().await?;
    state.projector.user(&username).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Who the audit log names for a change.
pub fn actor(caller: Caller) -> String {
    match caller {
        Caller::Operator => "operator".to_owned(),
        Caller::Account(id) => format!("account:{id}"),
    }
}
