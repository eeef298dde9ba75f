//! Admin listener: `/healthz` (process alive), `/readyz` (a link is up and
//! we are not draining), and `/opt-out` (the owner withdraws this exit: POST
//! to withdraw, GET for the state). It listens on loopback by default: the
//! host's own users are the ones who may withdraw it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Json;
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::tunnel::TunnelContext;

pub fn router(ctx: Arc<TunnelContext>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/opt-out", get(opt_out_status).post(opt_out))
        .route("/metrics", get(metrics))
        .with_state(ctx)
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
            proxynet_protocol::metrics::render(handle),
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
