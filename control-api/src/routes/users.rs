//! Proxy users: the credentials customers put in `curl -x`.
//!
//! Every change bumps the user's `version` (a database trigger takes the next
//! number of the projection sequence) and is projected to Redis at once, so
//! superproxies see revocations and password rotations without waiting for a
//! cache to expire.
//!
//! Limits an operator writes become the user's ceilings; an account key's
//! writes are fitted under them and under the account's entitlements
//! ([`crate::ceilings`]). Allow-listed networks obey the account's
//! [`AllowlistRules`](crate::ceilings::AllowlistRules) and never overlap
//! another user's.

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use proxynet_common::secret::Secret;
use proxynet_store::policy::{RetryRule, TrafficPolicy, MAX_RETRY_RULES};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Caller;
use crate::ceilings::Limits;
use crate::error::{conflict_on_unique, ApiError};
use crate::passwords::{validate_password, validate_username};
use crate::routes::page::{finish, PageQuery};
use crate::{audit, AppState};

mod allowlist;
mod limits;

use allowlist::{check_network_count, set_cidrs, validate_allowlist};
pub(crate) use limits::entitlements;
use limits::limits_to_store;

/// A base username: 1 to 64 of letters, digits, `_` and `.`
/// ([`validate_username`]).
const USERNAME_PATTERN: &str = "^[A-Za-z0-9_.]{1,64}$";
/// Allow-list options: username-grammar key-value pairs, at most 200 bytes.
const ALLOWLIST_OPTIONS_PATTERN: &str = "^[A-Za-z0-9_-]{0,200}$";

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateUser {
    #[schemars(regex(pattern = USERNAME_PATTERN))]
    username: String,
    /// 8 to 255 bytes, no control characters.
    #[schemars(with = "String", length(min = 8, max = 255))]
    password: Secret,
    #[serde(default)]
    limits: Limits,
    /// Source networks (CIDR, IPv4 or IPv6) whose requests without proxy
    /// credentials are this user: IP allow-list login. Never overlapping
    /// another user's (409).
    #[serde(default)]
    #[schemars(length(max = 256))]
    allowed_source_cidrs: Vec<String>,
    /// Username-grammar options for allow-listed traffic, which carries no
    /// username (e.g. `country-de-type-dc`, `session-office1-sesstime-30`).
    #[serde(default)]
    #[schemars(regex(pattern = ALLOWLIST_OPTIONS_PATTERN))]
    allowlist_options: String,
}

// `policy` and `retry_rules` are read as JSON and checked by hand
// (`routes::policy`: unknown fields refused, entries normalised); their
// schemas are those of the types they are checked into.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateUser {
    enabled: Option<bool>,
    /// 8 to 255 bytes, no control characters.
    #[schemars(with = "Option<String>", length(min = 8, max = 255))]
    password: Option<Secret>,
    /// Replaces the allow-listed networks when present (`[]` removes them).
    #[schemars(length(max = 256))]
    allowed_source_cidrs: Option<Vec<String>>,
    #[schemars(regex(pattern = ALLOWLIST_OPTIONS_PATTERN))]
    allowlist_options: Option<String>,
    /// Replaces all limits when present.
    limits: Option<Limits>,
    /// Replaces the user's traffic policy when present (`{}` clears it);
    /// it may narrow the account's, never widen it.
    #[schemars(with = "Option<TrafficPolicy>")]
    policy: Option<serde_json::Value>,
    /// Replaces the user's ban rules when present (`[]` clears them);
    /// they come before the account's and the operator's (docs/policy.md).
    #[schemars(with = "Option<Vec<RetryRule>>", length(max = MAX_RETRY_RULES))]
    retry_rules: Option<serde_json::Value>,
    /// Always route through the account's dedicated addresses, as if every
    /// username said `-dedicated` (docs/dedicated.md).
    dedicated_only: Option<bool>,
}

#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct User {
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
    /// The limits an operator set: an account key may not exceed them.
    ceilings: sqlx::types::Json<Limits>,
    /// Disabled by an operator: an account key cannot enable it again.
    disabled_by_operator: bool,
    /// The user's own traffic policy (docs/policy.md).
    policy: sqlx::types::Json<TrafficPolicy>,
    /// The policy was written by an operator: an account key cannot change
    /// or clear it (nor delete the user to shed it).
    policy_by_operator: bool,
    /// The user's own ban rules (docs/policy.md, "Retry rules").
    retry_rules: sqlx::types::Json<Vec<RetryRule>>,
    /// Always through the account's dedicated addresses.
    dedicated_only: bool,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

const USER_COLUMNS: &str = "id, account_id, username, enabled, version, max_concurrent_tunnels, \
     max_new_tunnels_per_second, bandwidth_bytes, quota_period, quota_warn_percent, \
     allowed_source_types, allowed_countries, allowed_channels, \
     ARRAY(SELECT c.cidr::text FROM user_source_cidrs c WHERE c.user_id = proxy_users.id ORDER BY c.cidr) \
       AS allowed_source_cidrs, allowlist_options, ceilings, disabled_by_operator, policy, policy_by_operator, \
       retry_rules, dedicated_only, created_at, updated_at";

/// The answer to an account key that tries to change a policy an operator
/// wrote on its user (an abusive customer must not lift the operator's
/// denial); the same words as for the account's own policy.
fn policy_set_by_operator() -> ApiError {
    ApiError::Forbidden(
        "policy: the operator set this user's policy; only an operator can change it".into(),
    )
}

pub(crate) async fn create(
    caller: Caller,
    State(state): State<AppState>,
    Path(account_id): Path<Uuid>,
    Json(body): Json<CreateUser>,
) -> Result<(StatusCode, Json<User>), ApiError> {
    caller.check_account(account_id)?;
    validate_username(&body.username)?;
    validate_password(body.password.expose())?;
    body.limits.validate()?;
    let entitled = entitlements(&state.db, account_id).await?;
    validate_allowlist(
        &body.username,
        &body.allowed_source_cidrs,
        &body.allowlist_options,
        &entitled.allowlist,
    )?;
    let (limits, ceilings) = limits_to_store(caller, body.limits, &Limits::default(), &entitled)?;
    let hash = state.hashing.hash(body.password).await?;
    let mut tx = state.db.begin().await?;
    let user: User = sqlx::query_as(&format!(
        "INSERT INTO proxy_users (id, account_id, username, password_hash, max_concurrent_tunnels,
                                  max_new_tunnels_per_second, bandwidth_bytes, quota_period, quota_warn_percent,
                                  allowed_source_types, allowed_countries, allowed_channels, allowlist_options,
                                  ceilings)
         VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, 'monthly'), COALESCE($9, 80), $10, $11, $12, $13, $14)
         RETURNING {USER_COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(account_id)
    .bind(&body.username)
    .bind(&hash)
    .bind(limits.max_concurrent_tunnels)
    .bind(limits.max_new_tunnels_per_second)
    .bind(limits.bandwidth_bytes)
    .bind(&limits.period)
    .bind(limits.warn_percent)
    .bind(&limits.allowed_source_types)
    .bind(&limits.allowed_countries)
    .bind(&limits.allowed_channels)
    .bind(&body.allowlist_options)
    .bind(sqlx::types::Json(&ceilings))
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
pub(crate) async fn list(
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

pub(crate) async fn get_one(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<User>, ApiError> {
    fetch(&state, caller, id).await.map(Json)
}

/// A user the caller may see (`None` for another account's user).
pub(crate) async fn fetch(state: &AppState, caller: Caller, id: Uuid) -> Result<User, ApiError> {
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

pub(crate) async fn update(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    Json(body): Json<UpdateUser>,
) -> Result<Json<User>, ApiError> {
    if let Some(limits) = &body.limits {
        limits.validate()?;
    }
    // Who the user belongs to and what bounds it (404 for another account's).
    let (account_id, ceilings, username) = {
        let current = fetch(&state, caller, id).await?;
        if matches!(caller, Caller::Account(_))
            && current.disabled_by_operator
            && body.enabled == Some(true)
        {
            return Err(ApiError::Forbidden(
                "enabled: an operator disabled this user; only an operator can enable it".into(),
            ));
        }
        if matches!(caller, Caller::Account(_))
            && current.policy_by_operator
            && body.policy.is_some()
        {
            return Err(policy_set_by_operator());
        }
        (current.account_id, current.ceilings.0, current.username)
    };
    let entitled = entitlements(&state.db, account_id).await?;
    validate_allowlist(
        &username,
        body.allowed_source_cidrs.as_deref().unwrap_or_default(),
        body.allowlist_options.as_deref().unwrap_or_default(),
        &entitled.allowlist,
    )?;
    if let Some(cidrs) = &body.allowed_source_cidrs {
        check_network_count(
            &state.db,
            account_id,
            Some(id),
            cidrs.len(),
            &entitled.allowlist,
        )
        .await?;
    }
    let stored = match body.limits {
        Some(limits) => Some(limits_to_store(caller, limits, &ceilings, &entitled)?),
        None => None,
    };
    let policy = match body.policy {
        Some(raw) => {
            let policy = crate::routes::policy::customer_policy(raw)?;
            let bound = crate::routes::policy::account_policy(&state.db, account_id).await?;
            crate::routes::policy::within_account(&policy, &bound)?;
            Some(policy)
        }
        None => None,
    };
    let retry_rules = body
        .retry_rules
        .map(|raw| crate::routes::policy::retry_rules("retry_rules", raw))
        .transpose()?;
    let new_hash = match body.password {
        Some(password) => {
            validate_password(password.expose())?;
            Some(state.hashing.hash(password).await?)
        }
        None => None,
    };
    let limits = stored.as_ref().map(|(limits, _)| limits);
    let mut tx = state.db.begin().await?;
    let user: Option<User> = sqlx::query_as(&format!(
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
                ceilings = CASE WHEN $4 THEN $15 ELSE ceilings END,
                disabled_by_operator = CASE WHEN $16 THEN COALESCE(NOT $2, disabled_by_operator)
                                            ELSE disabled_by_operator END,
                policy = COALESCE($17, policy),
                policy_by_operator = CASE WHEN $17 IS NULL THEN policy_by_operator
                                          ELSE $16 AND $18 END,
                retry_rules = COALESCE($19, retry_rules),
                dedicated_only = COALESCE($20, dedicated_only),
                updated_at = now()
          WHERE id = $1 AND deleted_at IS NULL AND ($7::uuid IS NULL OR account_id = $7)
            -- an operator's policy written meanwhile still binds this key
            AND ($16 OR $17 IS NULL OR NOT policy_by_operator)
        RETURNING {USER_COLUMNS}"
    ))
    .bind(id)
    .bind(body.enabled)
    .bind(new_hash.as_deref())
    .bind(limits.is_some())
    .bind(limits.and_then(|l| l.max_concurrent_tunnels))
    .bind(limits.and_then(|l| l.max_new_tunnels_per_second))
    .bind(caller.scope())
    .bind(limits.and_then(|l| l.bandwidth_bytes))
    .bind(limits.and_then(|l| l.period.clone()))
    .bind(limits.and_then(|l| l.warn_percent))
    .bind(limits.and_then(|l| l.allowed_source_types.clone()))
    .bind(limits.and_then(|l| l.allowed_countries.clone()))
    .bind(limits.and_then(|l| l.allowed_channels.clone()))
    .bind(body.allowlist_options.as_deref())
    .bind(sqlx::types::Json(
        stored.as_ref().map(|(_, c)| c.clone()).unwrap_or_default(),
    ))
    .bind(caller == Caller::Operator)
    .bind(policy.as_ref().map(sqlx::types::Json))
    // An operator's non-empty policy binds the account; `{}` releases it.
    .bind(policy.as_ref().is_some_and(|p| !p.is_empty()))
    .bind(retry_rules.as_ref().map(sqlx::types::Json))
    .bind(body.dedicated_only)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(user) = user else {
        // Gone, or an operator's policy landed between the check and here.
        fetch(&state, caller, id).await?;
        return Err(policy_set_by_operator());
    };
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
        "limits_changed": stored.is_some(),
        "allowed_source_cidrs": body.allowed_source_cidrs,
        "policy": policy,
        "retry_rules": retry_rules,
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

pub(crate) async fn delete(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    // Deleting and re-creating a user must not shed what the operator set.
    // The row is locked while this is judged, so an operator's write landing
    // between the look and the delete is seen (it waits, then binds).
    if let Caller::Account(_) = caller {
        let user: User = sqlx::query_as(&format!(
            "SELECT {USER_COLUMNS} FROM proxy_users
              WHERE id = $1 AND deleted_at IS NULL AND account_id = $2 FOR UPDATE"
        ))
        .bind(id)
        .bind(caller.scope())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(ApiError::NotFound("user"))?;
        if user.ceilings.0 != Limits::default()
            || user.disabled_by_operator
            || user.policy_by_operator
        {
            return Err(ApiError::Forbidden(
                "the operator set limits or a policy on this user (or disabled it): only an operator can delete it"
                    .into(),
            ));
        }
    }
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
pub(crate) fn actor(caller: Caller) -> String {
    match caller {
        Caller::Operator => "operator".to_owned(),
        Caller::Account(id) => format!("account:{id}"),
    }
}
