//! API keys: account keys see only their account; operator keys see all.
//! A key is shown once, when created; only its SHA-256 is stored.

use crate::extract::Json;
use crate::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use proxynet_protocol::secret::sha256_hex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::{new_secret, Caller, Operator};
use crate::error::ApiError;
use crate::routes::users::actor;
use crate::{audit, AppState};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    #[serde(default)]
    name: String,
}

#[derive(Serialize)]
pub struct NewKey {
    id: Uuid,
    /// `None` for an operator key.
    account_id: Option<Uuid>,
    /// Shown once.
    key: String,
}

async fn insert(
    state: &AppState,
    caller: Caller,
    account: Option<Uuid>,
    name: &str,
) -> Result<NewKey, ApiError> {
    if name.len() > 200 {
        return Err(ApiError::BadRequest("name: at most 200 characters".into()));
    }
    let key = new_secret("pnkey");
    let id = Uuid::new_v4();
    let mut tx = state.db.begin().await?;
    sqlx::query("INSERT INTO api_keys (id, account_id, name, key_sha256) VALUES ($1, $2, $3, $4)")
        .bind(id)
        .bind(account)
        .bind(name)
        .bind(sha256_hex(&key))
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        &actor(caller),
        "api_key.create",
        &id.to_string(),
        serde_json::json!({"account_id": account, "name": name}),
    )
    .await?;
    tx.commit().await?;
    Ok(NewKey {
        id,
        account_id: account,
        key,
    })
}

/// `POST /v1/accounts/{id}/api-keys`: a key for that account (the operator, or the account itself).
pub async fn create_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    body: Option<Json<CreateKey>>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    caller.check_account(account)?;
    super::accounts::ensure_exists(&state, account).await?;
    let name = body.map(|Json(b)| b.name).unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(insert(&state, caller, Some(account), &name).await?),
    ))
}

/// `POST /v1/api-keys`: an operator key (operators only).
pub async fn create_operator(
    _: Operator,
    State(state): State<AppState>,
    body: Option<Json<CreateKey>>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    let name = body.map(|Json(b)| b.name).unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(insert(&state, Caller::Operator, None, &name).await?),
    ))
}

/// `DELETE /v1/api-keys/{id}`: revoke (the operator any key, an account its own).
pub async fn revoke(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    let revoked = sqlx::query(
        "UPDATE api_keys SET revoked_at = now()
          WHERE id = $1 AND revoked_at IS NULL AND ($2::uuid IS NULL OR account_id = $2)",
    )
    .bind(id)
    .bind(caller.scope())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if revoked == 0 {
        return Err(ApiError::NotFound("api key"));
    }
    audit::record(
        &mut tx,
        &actor(caller),
        "api_key.revoke",
        &id.to_string(),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
