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
    /// Source networks (CIDR, IPv4 or IPv6) whose requests without proxy
    /// credentials are this user: IP allow-list login. Never overlapping
    /// another user's (409).
    #[serde(default)]
    allowed_source_cidrs: Vec<String>,
    /// Username-grammar options for allow-listed traffic, which carries no
    /// username (e.g. `country-de-type-dc`, `session-office1-sesstime-30`).
    #[serde(default)]
    allowlist_options: String,
}

/// Checks CIDRs (address/prefix, IPv4 or IPv6) and allow-list options.
fn validate_allowlist(cidrs: &[String], options: &str) -> Result<(), ApiError> {
    if cidrs.len() > 256 {
        return Err(ApiError::BadRequest(
            "allowed_source_cidrs: at most 256".into(),
        ));
    }
    for c in cidrs {
        c.parse::<proxynet_protocol::egress::Cidr>()
            .map_err(|e| ApiError::BadRequest(format!("allowed_source_cidrs: {e}")))?;
    }
    if options.is_empty() {
        return Ok(());
    }
    let parts: Vec<&str> = options.split('-').collect();
    if !parts.len().is_multiple_of(2) || options.len() > 200 {
        return Err(ApiError::BadRequest(
            "allowlist_options: key-value pairs of the username grammar, e.g. country-de-type-dc"
                .into(),
        ));
    }
    for pair in parts.chunks(2) {
        let known = [
            "session", "sesstime", "sessmode", "country", "city", "asn", "type", "channel", "exit",
        ];
        if !known.contains(&pair[0])
            || pair[1].is_empty()
            || !pair[1]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(ApiError::BadRequest(format!(
                "allowlist_options: {:?} is not a username-grammar option (docs/username.md)",
                pair.join("-")
            )));
        }
    }
    Ok(())
}

/// Replaces a user's allow-listed CIDRs inside `tx`; an overlap with another
/// user's is a 409.
async fn set_cidrs(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    user: Uuid,
    cidrs: &[String],
) -> Result<(), ApiError> {
    sqlx::query("DELETE FROM user_source_cidrs WHERE user_id = $1")
        .bind(user)
        .execute(&mut **tx)
        .await?;
    for c in cidrs {
        sqlx::query("INSERT INTO user_source_cidrs (user_id, cidr) VALUES ($1, $2::cidr)")
            .bind(user)
            .bind(c)
            .execute(&mut **tx)
            .await
            .map_err(|e| match &e {
                sqlx::Error::Database(db)
                    if matches!(db.code().as_deref(), Some("23P01") | Some("23505")) =>
                {
                    ApiError::Conflict(format!(
                        "allowed_source_cidrs: {c} overlaps a network already allow-listed for a user"
                    ))
                }
                _ => ApiError::from(e),
            })?;
    }
    Ok(())
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
    /// Replaces the allow-listed networks when present (`[]` removes them).
    allowed_source_cidrs: Option<Vec<String>>,
    allowlist_options: Option<String>,
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
    allowed_source_cidrs: Vec<String>,
    allowlist_options: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

const USER_COLUMNS: &str = "id, account_id, username, enabled, version, max_concurrent_tunnels, \
     max_new_tunnels_per_second, bandwidth_bytes, quota_period, quota_warn_percent, \
     allowed_source_types, allowed_countries, allowed_channels, \
     ARRAY(SELECT c.cidr::text FROM user_source_cidrs c WHERE c.user_id = proxy_users.id ORDER BY c.cidr) \
       AS allowed_source_cidrs, allowlist_options, created_at, updated_at";

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
    validate_allowlist(&body.allowed_source_cidrs, &body.allowlist_options)?;
    super::accounts::ensure_exists(&state, account_id).await?;
    let hash = state.hashing.hash(body.password).await?;
    let mut tx = state.db.begin().await?;
    let user: User = sqlx::query_as(&format!(
        "INSERT INTO proxy_users (id, account_id, username, password_hash, max_concurrent_tunnels,
                                  max_new_tunnels_per_second, bandwidth_bytes, quota_period, quota_warn_percent,
                                  allowed_source_types, allowed_countries, allowed_channels, allowlist_options)
         VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, 'monthly'), COALESCE($9, 80), $10, $11, $12, $13) RETURNING {USER_COLUMNS}"
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
    .bind(&body.allowlist_options)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| conflict_on_unique(e, "username: already taken"))?;
    let user = if body.allowed_source_cidrs.is_empty() {
        user
    } else {
        set_cidrs(&mut tx, user.id, &body.allowed_source_cidrs).await?;
        sqlx::query_as(&format!(
            "SELECT {USER_COLUMNS} FROM proxy_users WHERE id = $1"
        ))
        .bind(user.id)
        .fetch_one(&mut *tx)
        .await?
    };
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
    if !user.allowed_source_cidrs.is_empty() {
        state.projector.allowlist().await;
    }
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
    validate_allowlist(
        body.allowed_source_cidrs.as_deref().unwrap_or_default(),
        body.allowlist_options.as_deref().unwrap_or_default(),
    )?;
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
                allowlist_options = COALESCE($14, allowlist_options),
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
    .bind(body.allowlist_options.as_deref())
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(ApiError::NotFound("user"))?;
    let had_cidrs = !user.allowed_source_cidrs.is_empty();
    let user: User = match &body.allowed_source_cidrs {
        Some(cidrs) => {
            set_cidrs(&mut tx, user.id, cidrs).await?;
            sqlx::query_as(&format!(
                "SELECT {USER_COLUMNS} FROM proxy_users WHERE id = $1"
            ))
            .bind(user.id)
            .fetch_one(&mut *tx)
            .await?
        }
        None => user,
    };
    let detail = serde_json::json!({
        "enabled": body.enabled,
        "password_rotated": new_hash.is_some(),
        "limits_changed": body.limits.is_some(),
        "allowed_source_cidrs": body.allowed_source_cidrs,
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
    if had_cidrs || !user.allowed_source_cidrs.is_empty() {
        state.projector.allowlist().await;
    }
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
    let dropped = sqlx::query("DELETE FROM user_source_cidrs WHERE user_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
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
    if dropped > 0 {
        state.projector.allowlist().await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Who the audit log names for a change.
pub fn actor(caller: Caller) -> String {
    match caller {
        Caller::Operator => "operator".to_owned(),
        Caller::Account(id) => format!("account:{id}"),
    }
}
