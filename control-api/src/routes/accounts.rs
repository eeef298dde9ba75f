//! Accounts: the customers that own proxy users.

use crate::extract::Json;
use crate::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::{Caller, Operator};
use crate::error::ApiError;
use crate::{audit, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAccount {
    name: String,
}

#[derive(Serialize, sqlx::FromRow)]
pub struct Account {
    id: Uuid,
    name: String,
    created_at: DateTime<Utc>,
}

pub async fn create(
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
    let account: Account = sqlx::query_as(
        "INSERT INTO accounts (id, name) VALUES ($1, $2) RETURNING id, name, created_at",
    )
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

pub async fn get_one(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<Uuid>,
) -> Result<Json<Account>, ApiError> {
    caller.check_account(id)?;
    sqlx::query_as("SELECT id, name, created_at FROM accounts WHERE id = $1")
        .bind(id)
        .fetch_optional(&state.db)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound("account"))
}

/// 404 unless the account exists.
pub async fn ensure_exists(state: &AppState, id: Uuid) -> Result<(), ApiError> {
    let found: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM accounts WHERE id = $1")
        .bind(id)
        .fetch_optional(&state.db)
        .await?;
    found.map(|_| ()).ok_or(ApiError::NotFound("account"))
}
