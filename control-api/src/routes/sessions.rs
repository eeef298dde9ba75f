//! A proxy user's sticky sessions, as the superproxies pinned them in Redis.
//!
//! Ending a session deletes its pin: the next tunnel with that session id
//! picks (and pins) an exit afresh on whichever superproxy it reaches.

use crate::extract::Json;
use crate::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;

#[derive(Serialize)]
pub(super) struct SessionView {
    session: String,
    exit_id: Uuid,
    /// The egress IP the session leaves from, once a tunnel has used it.
    #[serde(skip_serializing_if = "Option::is_none")]
    egress_ip: Option<std::net::IpAddr>,
    /// Milliseconds until the pin expires.
    expires_in_ms: i64,
}

/// Most sessions listed in one answer.
const MAX_LISTED: usize = 10_000;

fn valid_session(id: &str) -> Result<(), ApiError> {
    if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "session: 1 to 64 letters or digits".into(),
        ))
    }
}

async fn user_exists(state: &AppState, caller: Caller, user: Uuid) -> Result<(), ApiError> {
    super::users::fetch(state, caller, user).await.map(|_| ())
}

async fn read(
    state: &AppState,
    key: &str,
    session: String,
) -> Result<Option<SessionView>, ApiError> {
    let mut redis = state.redis.clone();
    let (exit, ttl): (Option<String>, i64) = redis::pipe()
        .get(key)
        .pttl(key)
        .query_async(&mut redis)
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    // The pin is `EXIT_ID` or `EXIT_ID EGRESS_IP` (superproxy/src/select/sessions.rs).
    Ok(exit.filter(|_| ttl > 0).and_then(|value| {
        let mut parts = value.split(' ');
        let exit_id = parts.next()?.parse().ok()?;
        let egress_ip = parts.next().and_then(|ip| ip.parse().ok());
        Some(SessionView {
            session,
            exit_id,
            egress_ip,
            expires_in_ms: ttl,
        })
    }))
}

pub(super) async fn list(
    caller: Caller,
    State(state): State<AppState>,
    Path(user): Path<Uuid>,
) -> Result<Json<Vec<SessionView>>, ApiError> {
    user_exists(&state, caller, user).await?;
    let prefix = state.projector.keys().session(user, "");
    // Every session key of the user shares the user's hash tag.
    let keys = state
        .redis
        .scan_slot_of(&prefix, &format!("{prefix}*"), MAX_LISTED)
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    let mut sessions = Vec::with_capacity(keys.len());
    for key in keys {
        let session = key.strip_prefix(&prefix).unwrap_or_default().to_owned();
        if let Some(view) = read(&state, &key, session).await? {
            sessions.push(view);
        }
    }
    sessions.sort_by(|a, b| a.session.cmp(&b.session));
    Ok(Json(sessions))
}

pub(super) async fn get_one(
    caller: Caller,
    State(state): State<AppState>,
    Path((user, session)): Path<(Uuid, String)>,
) -> Result<Json<SessionView>, ApiError> {
    valid_session(&session)?;
    user_exists(&state, caller, user).await?;
    let key = state.projector.keys().session(user, &session);
    read(&state, &key, session)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound("session"))
}

pub(super) async fn end(
    caller: Caller,
    State(state): State<AppState>,
    Path((user, session)): Path<(Uuid, String)>,
) -> Result<StatusCode, ApiError> {
    valid_session(&session)?;
    user_exists(&state, caller, user).await?;
    let mut redis = state.redis.clone();
    let keys = state.projector.keys();
    // The pin and its entry in the user's session index (same slot): an
    // ended session no longer counts against the user's session cap.
    let (removed, _): (i64, i64) = redis::pipe()
        .del(keys.session(user, &session))
        .zrem(keys.session_index(user), &session)
        .query_async(&mut redis)
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    if removed == 0 {
        return Err(ApiError::NotFound("session"));
    }
    Ok(StatusCode::NO_CONTENT)
}
