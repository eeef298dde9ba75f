//! API keys: account keys see only their account; operator keys see all.
//! A key is shown once, when created; only its SHA-256 is stored.
//!
//! Keys have lineage: each records the key that minted it, and revoking a
//! key revokes everything it minted, transitively, in one statement. So a
//! leaked key cannot leave its holder a second one behind. Dashboard
//! sessions opened with a revoked key end within seconds (`routes/dashboard/sessions.rs`).

use crate::extract::Json;
use crate::extract::{Path, Query};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use proxynet_common::secret::sha256_hex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::{new_secret, Caller, KeyCaller, Operator};
use crate::error::ApiError;
use crate::routes::page::{finish, PageQuery};
use crate::routes::users::actor;
use crate::{audit, AppState};

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateKey {
    #[serde(default)]
    #[schemars(length(max = 200))]
    name: String,
}

#[derive(Serialize)]
pub(super) struct NewKey {
    id: Uuid,
    /// `None` for an operator key.
    account_id: Option<Uuid>,
    /// The key that minted this one (`None`: the bootstrap admin token).
    minted_by: Option<Uuid>,
    /// Shown once.
    key: String,
}

/// A key as listed: never any secret material.
#[derive(Serialize, sqlx::FromRow)]
pub(super) struct KeyInfo {
    id: Uuid,
    account_id: Option<Uuid>,
    name: String,
    minted_by: Option<Uuid>,
    created_at: DateTime<Utc>,
    /// To the minute.
    last_used_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
}

/// Most keys one account may hold unrevoked: enough for every service of a
/// customer, few enough that a loop minting keys stops early.
const MAX_LIVE_KEYS_PER_ACCOUNT: i64 = 1000;

async fn insert(
    state: &AppState,
    caller: KeyCaller,
    account: Option<Uuid>,
    name: &str,
) -> Result<NewKey, ApiError> {
    if name.len() > 200 {
        return Err(ApiError::BadRequest("name: at most 200 characters".into()));
    }
    let key = new_secret("pnkey");
    let id = Uuid::new_v4();
    let mut tx = state.db.begin().await?;
    // Minting and revoking serialise on the account (or the operator): a
    // key being revoked cannot slip a child past the revocation's cascade.
    lock_lineage(&mut tx, account).await?;
    if let Some(parent) = caller.key_id {
        let (live,): (bool,) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = $1 AND revoked_at IS NULL)",
        )
        .bind(parent)
        .fetch_one(&mut *tx)
        .await?;
        if !live {
            return Err(ApiError::Unauthorized);
        }
    }
    if let Some(account) = account {
        let (live,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL",
        )
        .bind(account)
        .fetch_one(&mut *tx)
        .await?;
        if live >= MAX_LIVE_KEYS_PER_ACCOUNT {
            return Err(ApiError::Conflict(format!(
                "the account holds {live} live keys (at most {MAX_LIVE_KEYS_PER_ACCOUNT}); revoke some first"
            )));
        }
    }
    sqlx::query(
        "INSERT INTO api_keys (id, account_id, name, key_sha256, minted_by) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(account)
    .bind(name)
    .bind(sha256_hex(&key))
    .bind(caller.key_id)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        &actor(caller.caller),
        "api_key.create",
        &id.to_string(),
        serde_json::json!({"account_id": account, "name": name, "minted_by": caller.key_id}),
    )
    .await?;
    tx.commit().await?;
    Ok(NewKey {
        id,
        account_id: account,
        minted_by: caller.key_id,
        key,
    })
}

/// `POST /v1/accounts/{id}/api-keys`: a key for that account (the operator, or the account itself).
pub(super) async fn create_for_account(
    caller: KeyCaller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    body: Option<Json<CreateKey>>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    caller.caller.check_account(account)?;
    super::accounts::ensure_exists(&state, account).await?;
    let name = body.map(|Json(b)| b.name).unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(insert(&state, caller, Some(account), &name).await?),
    ))
}

/// `GET /v1/accounts/{id}/api-keys?limit=&after=ID`: the account's keys,
/// revoked ones included, by id.
pub(super) async fn list_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    Query(page): Query<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<KeyInfo>>), ApiError> {
    caller.check_account(account)?;
    super::accounts::ensure_exists(&state, account).await?;
    let limit = page.limit()?;
    let after = match &page.after {
        Some(a) => Some(
            a.parse::<Uuid>()
                .map_err(|_| ApiError::BadRequest("after: a key id".into()))?,
        ),
        None => None,
    };
    let keys: Vec<KeyInfo> = sqlx::query_as(
        "SELECT id, account_id, name, minted_by, created_at, last_used_at, revoked_at FROM api_keys
          WHERE account_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(account)
    .bind(after)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (headers, keys) = finish(
        keys,
        limit,
        &format!("/v1/accounts/{account}/api-keys"),
        |k| k.id.to_string(),
    );
    Ok((headers, Json(keys)))
}

/// `POST /v1/api-keys`: an operator key (operators only).
pub(super) async fn create_operator(
    _: Operator,
    caller: KeyCaller,
    State(state): State<AppState>,
    body: Option<Json<CreateKey>>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    let name = body.map(|Json(b)| b.name).unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(insert(&state, caller, None, &name).await?),
    ))
}

/// Takes the lock that serialises minting and revoking keys of `account`
/// (`None`: operator keys) until the transaction ends.
async fn lock_lineage(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    account: Option<Uuid>,
) -> Result<(), ApiError> {
    let scope = account.map_or_else(|| "operator".to_owned(), |a| a.to_string());
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('api-keys:' || $1))")
        .bind(scope)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// `DELETE /v1/api-keys/{id}`: revoke a key and every key it minted,
/// transitively (the operator any key, an account its own). Revoking a key
/// already revoked cascades again (and answers 204): a descendant that
/// escaped an earlier cascade is caught.
pub(super) async fn revoke(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    let found: Option<(Option<Uuid>,)> = sqlx::query_as(
        "SELECT account_id FROM api_keys WHERE id = $1 AND ($2::uuid IS NULL OR account_id = $2)",
    )
    .bind(id)
    .bind(caller.scope())
    .fetch_optional(&mut *tx)
    .await?;
    let (account,) = found.ok_or(ApiError::NotFound("api key"))?;
    lock_lineage(&mut tx, account).await?;
    let revoked: Vec<(Uuid,)> = sqlx::query_as(
        "WITH RECURSIVE lineage AS (
             SELECT id FROM api_keys
              WHERE id = $1 AND ($2::uuid IS NULL OR account_id = $2)
             UNION
             SELECT k.id FROM api_keys k JOIN lineage l ON k.minted_by = l.id
         )
         UPDATE api_keys SET revoked_at = now()
          WHERE id IN (SELECT id FROM lineage) AND revoked_at IS NULL
         RETURNING id",
    )
    .bind(id)
    .bind(caller.scope())
    .fetch_all(&mut *tx)
    .await?;
    let descendants: Vec<Uuid> = revoked.iter().map(|(r,)| *r).filter(|r| *r != id).collect();
    audit::record(
        &mut tx,
        &actor(caller),
        "api_key.revoke",
        &id.to_string(),
        serde_json::json!({"descendants_revoked": descendants}),
    )
    .await?;
    let revoked_ids: Vec<Uuid> = revoked.iter().map(|(r,)| *r).collect();
    crate::webhooks::keys_revoked(
        &mut tx,
        &revoked_ids,
        crate::webhooks::KeysRevoked::Named(id),
        &actor(caller),
    )
    .await?;
    tx.commit().await?;
    crate::webhooks::wake();
    // Dashboard sessions of these keys end now on this instance (others
    // notice within their re-check interval).
    state
        .sessions
        .end_keys(revoked.iter().map(|(r,)| *r).collect());
    Ok(StatusCode::NO_CONTENT)
}
