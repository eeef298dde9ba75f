//! Accounts: the customers that own proxy users, and what the operator
//! grants each one (its entitlements).

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use proxynet_store::policy::{RetryRule, TrafficPolicy, MAX_RETRY_RULES};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::ceilings::Entitlements;
use crate::error::ApiError;
use crate::routes::page::{finish, PageQuery};
use crate::{audit, AppState};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateAccount {
    #[schemars(length(min = 1, max = 200))]
    name: String,
}

#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct Account {
    id: Uuid,
    name: String,
    plan_id: Option<Uuid>,
    entitlements: sqlx::types::Json<Entitlements>,
    /// The account's own traffic policy, bounding all of its users.
    policy: sqlx::types::Json<TrafficPolicy>,
    /// The account's ban rules, after each user's own (docs/policy.md).
    retry_rules: sqlx::types::Json<Vec<RetryRule>>,
    created_at: DateTime<Utc>,
}

const ACCOUNT_COLUMNS: &str = "id, name, plan_id, entitlements, policy, retry_rules, created_at";

// `policy` and `retry_rules` are read as JSON and checked by hand
// (`routes::policy`: unknown fields refused, entries normalised); their
// schemas are those of the types they are checked into.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateAccount {
    /// Replaces the account's traffic policy when present (`{}` clears it).
    #[schemars(with = "Option<TrafficPolicy>")]
    policy: Option<serde_json::Value>,
    /// Replaces the account's ban rules when present (`[]` clears them).
    #[schemars(with = "Option<Vec<RetryRule>>", length(max = MAX_RETRY_RULES))]
    retry_rules: Option<serde_json::Value>,
    /// Operators: route through shared addresses when none of the
    /// account's dedicated ones is usable, instead of answering 502.
    dedicated_fallback: Option<bool>,
}

pub(crate) async fn create(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<CreateAccount>,
) -> Result<(StatusCode, Json<Account>), ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(ApiError::BadRequest(
            "name: must be 1 to 200 characters".into(),
        ));
    }
    let mut tx = state.db.begin().await?;
    let account: Account = sqlx::query_as(&format!(
        "INSERT INTO accounts (id, name) VALUES ($1, $2) RETURNING {ACCOUNT_COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(name)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        "operator",
        "account.create",
        &account.id.to_string(),
        serde_json::json!({"name": name}),
    )
    .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(account)))
}

/// `GET /v1/accounts?limit=&after=ID` (operators), by id.
pub(crate) async fn list(
    _: Operator,
    State(state): State<AppState>,
    Query(page): Query<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<Account>>), ApiError> {
    let limit = page.limit()?;
    let after = match &page.after {
        Some(a) => Some(
            a.parse::<Uuid>()
                .map_err(|_| ApiError::BadRequest("after: an account id".into()))?,
        ),
        None => None,
    };
    let accounts: Vec<Account> = sqlx::query_as(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM accounts
          WHERE deleted_at IS NULL AND ($1::uuid IS NULL OR id > $1)
          ORDER BY id LIMIT $2"
    ))
    .bind(after)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (headers, accounts) = finish(accounts, limit, "/v1/accounts", |a| a.id.to_string());
    Ok((headers, Json(accounts)))
}

pub(crate) async fn get_one(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<Account>, ApiError> {
    caller.check_account(id)?;
    sqlx::query_as(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE id = $1 AND deleted_at IS NULL"
    ))
    .bind(id)
    .fetch_optional(&state.db)
    .await?
    .map(Json)
    .ok_or(ApiError::NotFound("account"))
}

/// `PATCH /v1/accounts/{id}` (the account itself or operators): replaces
/// its traffic policy and/or its ban rules, whichever the body names; every
/// user is re-projected at once and open tunnels the new rules refuse are
/// cut.
pub(crate) async fn update(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    Json(body): Json<UpdateAccount>,
) -> Result<Json<Account>, ApiError> {
    caller.check_account(id)?;
    if let Some(fallback) = body.dedicated_fallback {
        set_dedicated_fallback(caller, &state, id, fallback).await?;
    }
    let policy = body
        .policy
        .map(crate::routes::policy::customer_policy)
        .transpose()?;
    let retry_rules = body
        .retry_rules
        .map(|raw| crate::routes::policy::retry_rules("retry_rules", raw))
        .transpose()?;
    if policy.is_none() && retry_rules.is_none() {
        return get_one(caller, State(state), Path(id)).await;
    }
    let mut tx = state.db.begin().await?;
    // A policy the operator set binds the account: its own key may not
    // replace it (an abusive customer must not lift the operator's denial).
    // The operator releases it by writing `{}`. The ban rules are the
    // account's to change either way: a body without a policy passes.
    let by_operator = caller == Caller::Operator && policy.as_ref().is_some_and(|p| !p.is_empty());
    let account: Option<Account> = sqlx::query_as(&format!(
        "UPDATE accounts
            SET policy = COALESCE($2, policy),
                policy_by_operator = CASE WHEN $2 IS NULL THEN policy_by_operator ELSE $3 END,
                retry_rules = COALESCE($5, retry_rules)
          WHERE id = $1 AND deleted_at IS NULL AND ($4 OR $2 IS NULL OR NOT policy_by_operator)
         RETURNING {ACCOUNT_COLUMNS}"
    ))
    .bind(id)
    .bind(policy.as_ref().map(sqlx::types::Json))
    .bind(by_operator)
    .bind(caller == Caller::Operator)
    .bind(retry_rules.as_ref().map(sqlx::types::Json))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(account) = account else {
        crate::routes::accounts::ensure_exists(&state, id).await?;
        return Err(ApiError::Forbidden(
            "policy: the operator set this account's policy; only an operator can change it".into(),
        ));
    };
    touch_users(&mut tx, id).await?;
    let actor = crate::routes::users::actor(caller);
    if let Some(policy) = &policy {
        audit::record(
            &mut tx,
            &actor,
            "account.policy",
            &id.to_string(),
            serde_json::to_value(policy).unwrap_or_default(),
        )
        .await?;
    }
    if let Some(rules) = &retry_rules {
        audit::record(
            &mut tx,
            &actor,
            "account.retry_rules",
            &id.to_string(),
            serde_json::to_value(rules).unwrap_or_default(),
        )
        .await?;
    }
    tx.commit().await?;
    state.projector.account(id).await;
    Ok(Json(account))
}

/// `dedicated_fallback` is the operator's to set: it decides whether a
/// customer who bought dedicated addresses may silently leave from shared
/// ones.
async fn set_dedicated_fallback(
    caller: Caller,
    state: &AppState,
    id: Uuid,
    fallback: bool,
) -> Result<(), ApiError> {
    if caller != Caller::Operator {
        return Err(ApiError::Forbidden(
            "dedicated_fallback: only an operator sets it".into(),
        ));
    }
    let mut tx = state.db.begin().await?;
    let updated = sqlx::query(
        "UPDATE accounts SET dedicated_fallback = $2 WHERE id = $1 AND deleted_at IS NULL",
    )
    .bind(id)
    .bind(fallback)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 0 {
        return Err(ApiError::NotFound("account"));
    }
    touch_users(&mut tx, id).await?;
    audit::record(
        &mut tx,
        "operator",
        "account.dedicated_fallback",
        &id.to_string(),
        serde_json::json!({"dedicated_fallback": fallback}),
    )
    .await?;
    tx.commit().await?;
    state.projector.account(id).await;
    Ok(())
}

/// `PUT /v1/accounts/{id}/entitlements` (operators): replaces what the
/// account is granted. Every user of the account is re-projected (Redis has
/// the new records when this answers) and a change event sent per user; each
/// superproxy enforces the new bounds once its event arrives, a moment later.
pub(crate) async fn set_entitlements(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
    Json(body): Json<Entitlements>,
) -> Result<Json<Account>, ApiError> {
    body.validate()?;
    let mut tx = state.db.begin().await?;
    let account: Account = sqlx::query_as(&format!(
        "UPDATE accounts SET entitlements = $2 WHERE id = $1 AND deleted_at IS NULL
         RETURNING {ACCOUNT_COLUMNS}"
    ))
    .bind(id)
    .bind(sqlx::types::Json(&body))
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(ApiError::NotFound("account"))?;
    touch_users(&mut tx, id).await?;
    audit::record(
        &mut tx,
        "operator",
        "account.entitlements",
        &id.to_string(),
        serde_json::to_value(&body).unwrap_or_default(),
    )
    .await?;
    tx.commit().await?;
    state.projector.account(id).await;
    // Its allow-listed networks are judged by the new rules too.
    state.projector.allowlist().await;
    Ok(Json(account))
}

/// `DELETE /v1/accounts/{id}` (operators): the account's users are disabled
/// (and so cut on every superproxy at once), its keys revoked and its
/// allow-listed networks released; its ledger, invoices and audit trail stay.
pub(crate) async fn delete(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    let deleted =
        sqlx::query("UPDATE accounts SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if deleted == 0 {
        return Err(ApiError::NotFound("account"));
    }
    sqlx::query("UPDATE proxy_users SET enabled = false, updated_at = now() WHERE account_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let revoked: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE api_keys SET revoked_at = now() WHERE account_id = $1 AND revoked_at IS NULL
         RETURNING id",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    let revoked: Vec<Uuid> = revoked.into_iter().map(|(k,)| k).collect();
    let keys = revoked.len();
    // Each key's own event, in the same transaction: the account is
    // deleted already, so only the operator's webhooks hear of them.
    crate::webhooks::keys_revoked(
        &mut tx,
        &revoked,
        crate::webhooks::KeysRevoked::AccountDeleted,
        "operator",
    )
    .await?;
    let networks = sqlx::query(
        "DELETE FROM user_source_cidrs c USING proxy_users u
          WHERE u.id = c.user_id AND u.account_id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    // Its dedicated addresses go back to the shared pool (billing ends now).
    let exits = crate::routes::dedicated::release_all_of(&mut tx, id).await?;
    audit::record(
        &mut tx,
        "operator",
        "account.delete",
        &id.to_string(),
        serde_json::json!({"keys_revoked": keys, "networks_released": networks, "dedicated_exits": exits}),
    )
    .await?;
    tx.commit().await?;
    crate::webhooks::wake();
    state.projector.account(id).await;
    if networks > 0 {
        state.projector.allowlist().await;
    }
    crate::routes::dedicated::reproject(&state, exits).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Bumps every user of the account (their projected records carry the
/// account's entitlements and plan, and the projection is monotonic).
pub(crate) async fn touch_users(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    account: Uuid,
) -> Result<(), ApiError> {
    sqlx::query(
        "UPDATE proxy_users SET updated_at = now() WHERE account_id = $1 AND deleted_at IS NULL",
    )
    .bind(account)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// 404 unless the account exists (and is not deleted).
pub(crate) async fn ensure_exists(state: &AppState, id: Uuid) -> Result<(), ApiError> {
    let found: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM accounts WHERE id = $1 AND deleted_at IS NULL")
            .bind(id)
            .fetch_optional(&state.db)
            .await?;
    found.map(|_| ()).ok_or(ApiError::NotFound("account"))
}
