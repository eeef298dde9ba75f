//! Liveness and readiness of the control-api itself.

use axum::extract::State;
use axum::http::StatusCode;

use crate::AppState;

pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when both stores answer.
pub(super) async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let postgres = sqlx::query("SELECT 1").execute(&state.db).await.is_ok();
    let mut redis = state.redis.clone();
    let redis_ok = redis::cmd("PING")
        .query_async::<String>(&mut redis)
        .await
        .is_ok();
    let status = if postgres && redis_ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        format!("postgres: {}\nredis: {}\n", up(postgres), up(redis_ok)),
    )
}

fn up(ok: bool) -> &'static str {
    if ok {
        "up"
    } else {
        "down"
    }
}
