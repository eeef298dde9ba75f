//! Admin listener: `/healthz` (process alive), `/readyz` (a link is up and
//! we are not draining), `/metrics`, and `/opt-out` (the owner withdraws this
//! exit: POST to withdraw, DELETE to undo their own withdrawal, GET for the
//! state). It listens on loopback by default. Every state-changing route
//! needs the local admin token and refuses browser requests and non-loopback
//! `Host`s ([`crate::admin_token`]): the exit's controls belong to whoever
//! holds the host, not to a web page its owner happens to visit.

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::tunnel::TunnelContext;

pub(crate) fn router(ctx: Arc<TunnelContext>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/opt-out", get(opt_out_status).post(opt_out).delete(opt_in))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            guard_state_changes,
        ))
        .with_state(ctx)
}

/// Anything but GET and HEAD changes state: it needs the token, a loopback
/// `Host` and no browser origin.
async fn guard_state_changes(
    State(ctx): State<Arc<TunnelContext>>,
    request: Request,
    next: Next,
) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    match crate::admin_token::check(request.headers(), &ctx.admin_token) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::warn!(
                method = %request.method(),
                path = request.uri().path(),
                refusal = ?refusal,
                "admin request refused"
            );
            let status = match refusal {
                crate::admin_token::Refusal::BadToken => StatusCode::UNAUTHORIZED,
                _ => StatusCode::FORBIDDEN,
            };
            (status, refusal.message()).into_response()
        }
    }
}

/// Prometheus text: tunnels by outcome, active tunnels, links, DNS, state.
async fn metrics(
    State(ctx): State<Arc<TunnelContext>>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    metrics::gauge!("proxynet_agent_tunnels_active").set(ctx.active.load(Ordering::Relaxed) as f64);
    metrics::gauge!("proxynet_agent_links_up").set(ctx.links_up.load(Ordering::Relaxed) as f64);
    metrics::gauge!("proxynet_agent_draining")
        .set(f64::from(u8::from(ctx.draining.load(Ordering::Relaxed))));
    metrics::gauge!("proxynet_agent_withdrawn")
        .set(f64::from(u8::from(ctx.withdrawn.load(Ordering::Relaxed))));
    match &ctx.metrics {
        Some(handle) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
            proxynet_common::metrics::render(handle),
        ),
        None => (
            StatusCode::NOT_FOUND,
            [("content-type", "text/plain")],
            "metrics disabled\n".into(),
        ),
    }
}

async fn opt_out(
    State(ctx): State<Arc<TunnelContext>>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    let state = crate::optout::withdraw(&ctx)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(serde_json::json!({
        "withdrawn": true,
        "requested_at": state.requested_at,
        "acknowledged_at": state.acknowledged_at,
    })))
}

async fn opt_in(
    State(ctx): State<Arc<TunnelContext>>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    crate::optout::undo(&ctx).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(serde_json::json!({"withdrawn": false})))
}

async fn opt_out_status(State(ctx): State<Arc<TunnelContext>>) -> Json<serde_json::Value> {
    let state = crate::optout::status(&ctx);
    Json(serde_json::json!({
        "withdrawn": state.is_some(),
        "requested_at": state.as_ref().map(|s| s.requested_at),
        "acknowledged_at": state.as_ref().and_then(|s| s.acknowledged_at),
    }))
}

async fn readyz(State(ctx): State<Arc<TunnelContext>>) -> (StatusCode, String) {
    let links = ctx.links_up.load(Ordering::Relaxed);
    let active = ctx.active.load(Ordering::Relaxed);
    if ctx.withdrawn.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "withdrawn by its owner\n".to_owned(),
        )
    } else if ctx.draining.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("draining: {active} tunnels open\n"),
        )
    } else if links == 0 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no superproxy link up\n".to_owned(),
        )
    } else {
        (
            StatusCode::OK,
            format!("ready: {links} links, {active} tunnels\n"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::tests::context;

    #[tokio::test]
    async fn readiness_needs_a_link_and_neither_a_drain_nor_a_withdrawal() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let (status, body) = readyz(State(ctx.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "no superproxy link up\n");
        ctx.links_up.store(2, Ordering::Relaxed);
        let (status, body) = readyz(State(ctx.clone())).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "ready: 2 links, 0 tunnels\n");
        ctx.draining.store(true, Ordering::Relaxed);
        let (status, body) = readyz(State(ctx.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.starts_with("draining"), "{body}");
        ctx.withdrawn.store(true, Ordering::Relaxed);
        let (status, body) = readyz(State(ctx.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "withdrawn by its owner\n");
    }

    #[tokio::test]
    async fn the_opt_out_routes_withdraw_report_and_undo() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let Json(before) = opt_out_status(State(ctx.clone())).await;
        assert_eq!(before["withdrawn"].as_bool(), Some(false));
        let Json(withdrawn) = opt_out(State(ctx.clone())).await.unwrap();
        assert_eq!(withdrawn["withdrawn"].as_bool(), Some(true));
        let Json(during) = opt_out_status(State(ctx.clone())).await;
        assert_eq!(during["withdrawn"].as_bool(), Some(true));
        assert_eq!(during["requested_at"], withdrawn["requested_at"]);
        assert!(during["acknowledged_at"].is_null());
        let Json(undone) = opt_in(State(ctx.clone())).await.unwrap();
        assert_eq!(undone["withdrawn"].as_bool(), Some(false));
        assert!(!ctx.withdrawn.load(Ordering::Relaxed));
    }
}
