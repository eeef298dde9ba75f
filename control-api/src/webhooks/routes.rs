//! `/v1/accounts/{id}/webhooks` (the operator, or an account key for its
//! own account; another account's webhooks answer 404 as absent) and
//! `/v1/webhooks` (operator webhooks: every account's events and the
//! operator-only `exit.withdrawn`). The secret is in the creation answer
//! only; lists never carry it. `PATCH …/{wid}` `{enabled}` pauses a webhook
//! or enables one its failures disabled; a webhook the operator paused only
//! an operator enables (`403` to the account's key, naming the field, as
//! for a policy the operator set).
//!
//! A URL refused for what its host resolves to names the rule to an
//! account's key, never the address (an internal name's address is the
//! operator's business): the address goes to the log, and to an operator
//! caller.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::disable::DisabledBy;
use super::{target, EventType};
use crate::auth::{new_secret, Caller, Operator};
use crate::error::ApiError;
use crate::extract::{Json, Path, Query};
use crate::routes::page::{finish, PageQuery};
use crate::{audit, AppState};

/// Most webhooks one account (or the operator) may hold.
pub(crate) const MAX_WEBHOOKS: i64 = 10;

/// docs/webhooks.md; `exit.withdrawn` on operator webhooks
/// (`/v1/webhooks`) only.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateWebhook {
    /// http(s), no credentials; a public address unless
    /// `--webhook-allow-internal`.
    #[schemars(url, length(max = target::MAX_URL_BYTES))]
    url: String,
    // Read as names and checked by `events`; described as the names it
    // accepts.
    #[schemars(with = "Vec<EventType>", length(min = 1))]
    events: Vec<String>,
}

#[derive(Serialize)]
pub(crate) struct NewWebhook {
    id: Uuid,
    account_id: Option<Uuid>,
    url: String,
    events: Vec<String>,
    /// The signing key: shown once, here.
    secret: String,
    created_at: DateTime<Utc>,
}

/// `true`: enable (its run of failures starts again; one the operator
/// paused, operators only: 403 to the account's key); `false`: pause (its
/// pending deliveries are given up).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateWebhook {
    enabled: bool,
}

/// A webhook as listed: never its secret.
#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct WebhookInfo {
    id: Uuid,
    account_id: Option<Uuid>,
    url: String,
    events: Vec<String>,
    created_at: DateTime<Utc>,
    /// False once disabled (by its failures, its owner or the operator): it
    /// gets no events.
    enabled: bool,
    disabled_at: Option<DateTime<Utc>>,
    disabled_reason: Option<String>,
    /// Who disabled it: `operator` (only an operator enables it again),
    /// `owner` or `failures`; null while enabled.
    disabled_by: Option<String>,
    /// Deliveries that ended failed since the last one delivered.
    failed_deliveries_in_row: i32,
}

/// The columns of [`WebhookInfo`].
const INFO: &str = "id, account_id, url, events, created_at, disabled_at IS NULL AS enabled,
                    disabled_at, disabled_reason, disabled_by,
                    failed_in_row AS failed_deliveries_in_row";

#[derive(Serialize, sqlx::FromRow)]
pub(crate) struct DeliveryInfo {
    /// `Proxynet-Delivery`.
    id: Uuid,
    /// The body's `id`.
    event_id: Uuid,
    event: String,
    /// `pending`, `delivered` or `failed`.
    status: String,
    attempts: i32,
    last_status_code: Option<i32>,
    last_error: Option<String>,
    /// At most 256 bytes of the receiver's last answer.
    last_response: Option<String>,
    /// When the next attempt is due (pending rows only).
    next_attempt_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    delivered_at: Option<DateTime<Utc>>,
}

/// The events asked for, known, de-duplicated and sorted; operator-only
/// ones refused on an account's webhook.
fn events(asked: &[String], operator_webhook: bool) -> Result<Vec<String>, ApiError> {
    let known = || {
        EventType::ALL
            .iter()
            .filter(|e| operator_webhook || !e.operator_only())
            .map(|e| e.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if asked.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "events: at least one of {}",
            known()
        )));
    }
    let mut out = Vec::new();
    for name in asked {
        let event = EventType::parse(name).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "events: {:?} is not one of {}",
                name.chars().take(64).collect::<String>(),
                known()
            ))
        })?;
        if event.operator_only() && !operator_webhook {
            return Err(ApiError::BadRequest(format!(
                "events: {} is an operator event; subscribe to it with an operator webhook (POST /v1/webhooks)",
                event.as_str()
            )));
        }
        out.push(event);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out.into_iter().map(|e| e.as_str().to_owned()).collect())
}

async fn create(
    state: &AppState,
    caller: Caller,
    account: Option<Uuid>,
    body: CreateWebhook,
) -> Result<(StatusCode, Json<NewWebhook>), ApiError> {
    let events = events(&body.events, account.is_none())?;
    let policy = target::policy(state.config.webhook_allow_internal, &state.protected);
    // The addresses a name resolves to are shown to operators only.
    let target = target::validate(&policy, &body.url, caller == Caller::Operator)
        .await
        .map_err(ApiError::BadRequest)?;
    let id = Uuid::new_v4();
    let secret = new_secret("pnwhsec");
    let mut tx = state.db.begin().await?;
    let scope = account.map_or_else(|| "operator".to_owned(), |a| a.to_string());
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('webhooks:' || $1))")
        .bind(&scope)
        .execute(&mut *tx)
        .await?;
    let (held,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhooks WHERE account_id IS NOT DISTINCT FROM $1")
            .bind(account)
            .fetch_one(&mut *tx)
            .await?;
    if held >= MAX_WEBHOOKS {
        return Err(ApiError::Conflict(format!(
            "{held} webhooks already (at most {MAX_WEBHOOKS}); delete one first"
        )));
    }
    let (created_at,): (DateTime<Utc>,) = sqlx::query_as(
        "INSERT INTO webhooks (id, account_id, url, events, secret) VALUES ($1, $2, $3, $4, $5)
         RETURNING created_at",
    )
    .bind(id)
    .bind(account)
    .bind(&body.url)
    .bind(&events)
    .bind(&secret)
    .fetch_one(&mut *tx)
    .await?;
    let host = target.host;
    audit::record(
        &mut tx,
        &crate::routes::users::actor(caller),
        "webhook.create",
        &id.to_string(),
        serde_json::json!({"account_id": account, "host": host, "events": events}),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(NewWebhook {
            id,
            account_id: account,
            url: body.url,
            events,
            secret,
            created_at,
        }),
    ))
}

async fn list(state: &AppState, account: Option<Uuid>) -> Result<Vec<WebhookInfo>, ApiError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {INFO} FROM webhooks
          WHERE account_id IS NOT DISTINCT FROM $1 ORDER BY created_at, id"
    ))
    .bind(account)
    .fetch_all(&state.db)
    .await?)
}

/// Enables a webhook (its run of failures starts again from nothing) or
/// pauses it (its pending deliveries are given up, as when its failures
/// disable it). Enabling an enabled one, or pausing a paused one, changes
/// nothing — except that an operator pausing a webhook its owner paused or
/// its failures disabled makes it the operator's pause. An account key
/// cannot enable a webhook the operator paused (403).
async fn update(
    state: &AppState,
    caller: Caller,
    account: Option<Uuid>,
    webhook: Uuid,
    body: UpdateWebhook,
) -> Result<Json<WebhookInfo>, ApiError> {
    let actor = crate::routes::users::actor(caller);
    let by = match caller {
        Caller::Operator => DisabledBy::Operator,
        Caller::Account(_) => DisabledBy::Owner,
    };
    let mut tx = state.db.begin().await?;
    let was: Option<(bool, Option<String>)> = sqlx::query_as(
        "SELECT disabled_at IS NULL, disabled_by FROM webhooks
          WHERE id = $1 AND account_id IS NOT DISTINCT FROM $2 FOR UPDATE",
    )
    .bind(webhook)
    .bind(account)
    .fetch_optional(&mut *tx)
    .await?;
    let (enabled, disabled_by) = was.ok_or(ApiError::NotFound("webhook"))?;
    let operators_pause = disabled_by.as_deref() == Some(DisabledBy::Operator.as_str());
    if body.enabled && !enabled && operators_pause && by != DisabledBy::Operator {
        return Err(ApiError::Forbidden(
            "enabled: the operator paused this webhook; only an operator can enable it".into(),
        ));
    }
    let take_over = !body.enabled && !enabled && by == DisabledBy::Operator && !operators_pause;
    if enabled != body.enabled || take_over {
        let given_up = if body.enabled {
            super::disable::enable(&mut tx, webhook).await?
        } else {
            super::disable::disable(&mut tx, webhook, &format!("disabled by {actor}"), by)
                .await?
                .1
        };
        audit::record(
            &mut tx,
            &actor,
            if body.enabled {
                "webhook.enable"
            } else {
                "webhook.disable"
            },
            &webhook.to_string(),
            serde_json::json!({"account_id": account, "given_up": given_up,
                               "previously_disabled_by": disabled_by}),
        )
        .await?;
    }
    let info: WebhookInfo = sqlx::query_as(&format!("SELECT {INFO} FROM webhooks WHERE id = $1"))
        .bind(webhook)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Json(info))
}

async fn delete(
    state: &AppState,
    caller: Caller,
    account: Option<Uuid>,
    webhook: Uuid,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    // Its pending deliveries go with it (ON DELETE CASCADE), and its secret.
    let gone =
        sqlx::query("DELETE FROM webhooks WHERE id = $1 AND account_id IS NOT DISTINCT FROM $2")
            .bind(webhook)
            .bind(account)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if gone == 0 {
        return Err(ApiError::NotFound("webhook"));
    }
    audit::record(
        &mut tx,
        &crate::routes::users::actor(caller),
        "webhook.delete",
        &webhook.to_string(),
        serde_json::json!({"account_id": account}),
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Newest first, `?limit=&after=DELIVERY_ID`.
async fn deliveries(
    state: &AppState,
    account: Option<Uuid>,
    webhook: Uuid,
    page: PageQuery,
    path: &str,
) -> Result<(HeaderMap, Json<Vec<DeliveryInfo>>), ApiError> {
    let found: Option<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM webhooks WHERE id = $1 AND account_id IS NOT DISTINCT FROM $2",
    )
    .bind(webhook)
    .bind(account)
    .fetch_optional(&state.db)
    .await?;
    found.ok_or(ApiError::NotFound("webhook"))?;
    let limit = page.limit()?;
    let after = match &page.after {
        Some(a) => Some(
            a.parse::<Uuid>()
                .map_err(|_| ApiError::BadRequest("after: a delivery id".into()))?,
        ),
        None => None,
    };
    let rows: Vec<DeliveryInfo> = sqlx::query_as(
        "SELECT id, event_id, event, status, attempts, last_status_code, last_error, last_response,
                CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at,
                created_at, delivered_at
           FROM webhook_deliveries
          WHERE webhook_id = $1
            AND ($2::uuid IS NULL OR (created_at, id) <
                 (SELECT created_at, id FROM webhook_deliveries WHERE id = $2 AND webhook_id = $1))
          ORDER BY created_at DESC, id DESC LIMIT $3",
    )
    .bind(webhook)
    .bind(after)
    .bind(limit + 1)
    .fetch_all(&state.db)
    .await?;
    let (headers, rows) = finish(rows, limit, path, |d| d.id.to_string());
    Ok((headers, Json(rows)))
}

// ---- handlers -----------------------------------------------------------------

/// `POST /v1/accounts/{id}/webhooks`
pub(crate) async fn create_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
    Json(body): Json<CreateWebhook>,
) -> Result<(StatusCode, Json<NewWebhook>), ApiError> {
    caller.check_account(account)?;
    crate::routes::accounts::ensure_exists(&state, account).await?;
    create(&state, caller, Some(account), body).await
}

/// `GET /v1/accounts/{id}/webhooks`
pub(crate) async fn list_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path(account): Path<Uuid>,
) -> Result<Json<Vec<WebhookInfo>>, ApiError> {
    caller.check_account(account)?;
    crate::routes::accounts::ensure_exists(&state, account).await?;
    Ok(Json(list(&state, Some(account)).await?))
}

/// `DELETE /v1/accounts/{id}/webhooks/{wid}`
pub(crate) async fn delete_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path((account, webhook)): Path<(Uuid, Uuid)>,
) -> Result<StatusCode, ApiError> {
    caller.check_account(account)?;
    delete(&state, caller, Some(account), webhook).await
}

/// `PATCH /v1/accounts/{id}/webhooks/{wid}`
pub(crate) async fn update_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path((account, webhook)): Path<(Uuid, Uuid)>,
    Json(body): Json<UpdateWebhook>,
) -> Result<Json<WebhookInfo>, ApiError> {
    caller.check_account(account)?;
    update(&state, caller, Some(account), webhook, body).await
}

/// `GET /v1/accounts/{id}/webhooks/{wid}/deliveries`
pub(crate) async fn deliveries_for_account(
    caller: Caller,
    State(state): State<AppState>,
    Path((account, webhook)): Path<(Uuid, Uuid)>,
    Query(page): Query<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<DeliveryInfo>>), ApiError> {
    caller.check_account(account)?;
    let path = format!("/v1/accounts/{account}/webhooks/{webhook}/deliveries");
    deliveries(&state, Some(account), webhook, page, &path).await
}

/// `POST /v1/webhooks` (operators)
pub(crate) async fn create_operator(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<CreateWebhook>,
) -> Result<(StatusCode, Json<NewWebhook>), ApiError> {
    create(&state, Caller::Operator, None, body).await
}

/// `GET /v1/webhooks` (operators)
pub(crate) async fn list_operator(
    _: Operator,
    State(state): State<AppState>,
) -> Result<Json<Vec<WebhookInfo>>, ApiError> {
    Ok(Json(list(&state, None).await?))
}

/// `DELETE /v1/webhooks/{wid}` (operators)
pub(crate) async fn delete_operator(
    _: Operator,
    State(state): State<AppState>,
    Path(webhook): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    delete(&state, Caller::Operator, None, webhook).await
}

/// `PATCH /v1/webhooks/{wid}` (operators)
pub(crate) async fn update_operator(
    _: Operator,
    State(state): State<AppState>,
    Path(webhook): Path<Uuid>,
    Json(body): Json<UpdateWebhook>,
) -> Result<Json<WebhookInfo>, ApiError> {
    update(&state, Caller::Operator, None, webhook, body).await
}

/// `GET /v1/webhooks/{wid}/deliveries` (operators)
pub(crate) async fn deliveries_operator(
    _: Operator,
    State(state): State<AppState>,
    Path(webhook): Path<Uuid>,
    Query(page): Query<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<DeliveryInfo>>), ApiError> {
    let path = format!("/v1/webhooks/{webhook}/deliveries");
    deliveries(&state, None, webhook, page, &path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn events_are_known_deduplicated_and_sorted() {
        assert_eq!(
            events(
                &names(&["key.revoked", "quota.warning", "key.revoked"]),
                false
            )
            .unwrap(),
            names(&["quota.warning", "key.revoked"])
        );
        assert!(events(&[], false).is_err());
        assert!(events(&names(&["quota.nope"]), false).is_err());
    }

    #[test]
    fn exit_events_are_for_operator_webhooks_only() {
        let e = events(&names(&["exit.withdrawn"]), false).unwrap_err();
        assert!(e.to_string().contains("operator"), "{e}");
        assert_eq!(
            events(&names(&["exit.withdrawn"]), true).unwrap(),
            names(&["exit.withdrawn"])
        );
    }
}
