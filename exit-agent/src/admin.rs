//! Admin listener: `/healthz` (process alive) and `/readyz` (a link is up and
//! we are not draining).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::tunnel::TunnelContext;

pub fn router(ctx: Arc<TunnelContext>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(ctx)
}

async fn readyz(State(ctx): State<Arc<TunnelContext>>) -> (StatusCode, String) {
    let links = ctx.links_up.load(Ordering::Relaxed);
    let active = ctx.active.load(Ordering::Relaxed);
    if ctx.draining.load(Ordering::Relaxed) {
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
