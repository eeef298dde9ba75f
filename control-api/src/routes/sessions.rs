//! A proxy user's sticky sessions, as the superproxies pinned them in Redis.
//!
//! Ending a session deletes its pin: the next tunnel with that session id
//! picks (and pins) an exit afresh on whichever superproxy it reaches.
//! Setting its time (`PATCH`, `sesstime_minutes`) moves the pin's TTL in
//! Redis to that many minutes from now, longer or shorter: superproxies read
//! the pin and its TTL from Redis for every tunnel (their local copy only
//! stands in while Redis is unreachable), so every one of them honours it
//! from its next tunnel on, and a `Proxynet-Session-Expires` answer says so.
//! A `sessidle` pin no tunnel used for its idle time is gone, here as there.

use crate::extract::Json;
use crate::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use proxynet_store::session_pin::PinValue;
use serde::{Deserialize, Serialize};
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
    /// `sessidle` pins: milliseconds until the pin ends unless a tunnel
    /// uses it first.
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_expires_in_ms: Option<i64>,
}

/// Most sessions listed in one answer.
const MAX_LISTED: usize = 10_000;

pub(super) fn valid_session(id: &str) -> Result<(), ApiError> {
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
    // Redis' clock, as the superproxies judge idle pins by it.
    let (exit, ttl, (secs, micros)): (Option<String>, i64, (i64, i64)) = redis::pipe()
        .get(key)
        .pttl(key)
        .cmd("TIME")
        .query_async(&mut redis)
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    let now_ms = secs * 1000 + micros / 1000;
    Ok(exit
        .filter(|_| ttl > 0)
        .and_then(|value| PinValue::parse(&value))
        .filter(|pin| !pin.idle_expired(now_ms))
        .map(|pin| SessionView {
            session,
            exit_id: pin.exit,
            egress_ip: pin.egress_ip,
            expires_in_ms: ttl,
            idle_expires_in_ms: pin.idle_deadline_ms.map(|d| d - now_ms),
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

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetSessionTime {
    /// The pin's remaining life from now, 1 to 1440 minutes.
    #[schemars(range(min = 1, max = proxynet_wire::username::MAX_SESSION_MINUTES))]
    sesstime_minutes: u32,
}

/// `KEYS[1]` the pin, `KEYS[2]` the user's session index; `ARGV[1]` the new
/// TTL (ms), `ARGV[2]` the session id. Moves the pin's TTL and its entry in
/// the index (which counts live sessions against the user's cap, scored by
/// expiry on Redis' clock); 0 when there is no pin.
const SET_TIME: &str = r"
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[1]), redis.call('PTTL', KEYS[2])))
return 1
";

/// `PATCH /v1/users/{id}/sessions/{session}` with `{"sesstime_minutes": N}`:
/// the pin now ends N minutes from now (extended or shortened); 404 when
/// the session has no live pin.
pub(super) async fn set_time(
    caller: Caller,
    State(state): State<AppState>,
    Path((user, session)): Path<(Uuid, String)>,
    Json(body): Json<SetSessionTime>,
) -> Result<Json<SessionView>, ApiError> {
    valid_session(&session)?;
    let max = proxynet_wire::username::MAX_SESSION_MINUTES;
    if !(1..=max).contains(&body.sesstime_minutes) {
        return Err(ApiError::BadRequest(format!(
            "sesstime_minutes: 1 to {max}"
        )));
    }
    user_exists(&state, caller, user).await?;
    let keys = state.projector.keys();
    let key = keys.session(user, &session);
    // An idle-expired pin is gone: not revived by a new time.
    if read(&state, &key, session.clone()).await?.is_none() {
        return Err(ApiError::NotFound("session"));
    }
    let mut redis = state.redis.clone();
    let set: i64 = redis::Script::new(SET_TIME)
        .key(&key)
        .key(keys.session_index(user))
        .arg(u64::from(body.sesstime_minutes) * 60_000)
        .arg(&session)
        .invoke_async(&mut redis)
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    if set == 0 {
        return Err(ApiError::NotFound("session"));
    }
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
    // Audited wherever it is ended from (REST, CLI, dashboard). The pin is
    // already gone from Redis: an audit failure is logged, not undone.
    let recorded = async {
        let mut tx = state.db.begin().await?;
        crate::audit::record(
            &mut tx,
            &crate::routes::users::actor(caller),
            "session.end",
            &user.to_string(),
            serde_json::json!({ "session": session }),
        )
        .await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = recorded {
        tracing::warn!(error = %e, user = %user, "session ended but not audited");
    }
    Ok(StatusCode::NO_CONTENT)
}
