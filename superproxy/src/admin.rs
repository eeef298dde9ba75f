//! Admin listener: liveness, readiness and the pool as this instance sees it.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use proxynet_common::tasks::Stop;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::link::registry::LinkRegistry;
use crate::select::Pool;

/// What the admin endpoints report on.
pub(crate) struct AdminState {
    /// `/metrics` (none if another recorder was installed first).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    pub superproxy_id: uuid::Uuid,
    pub pool: Arc<Pool>,
    pub links: Arc<LinkRegistry>,
    /// Set at SIGTERM: readiness goes red while the instance still serves.
    pub draining: std::sync::atomic::AtomicBool,
}

impl AdminState {
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub(crate) async fn run(listener: TcpListener, gateway: Arc<AdminState>, stop: Stop) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(respond(&gateway, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `/readyz?degraded=serve`: ready while Redis is away, as long as there is
/// a pool to serve from.
fn serves_degraded(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "degraded=serve"))
}

fn respond(gateway: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/metrics" => match &gateway.metrics {
            Some(handle) => {
                crate::metrics::publish_levels();
                let mut r = text(StatusCode::OK, proxynet_common::metrics::render(handle));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                r
            }
            None => text(StatusCode::NOT_FOUND, "metrics disabled\n".into()),
        },
        "/readyz" => {
            let view = gateway.pool.view();
            if gateway.is_draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
            } else if view.degraded
                && serves_degraded(req.uri().query())
                && !view.eligible.is_empty()
            {
                // The balancer asked for it: every superproxy of a fleet
                // shares one Redis, so a Redis outage (or a Sentinel
                // failover) would take them all out of rotation at once,
                // although each routes known users on its last pool.
                text(
                    StatusCode::OK,
                    format!(
                        "degraded: redis unreachable; serving from memory, {} eligible exits\n",
                        view.eligible.len()
                    ),
                )
            } else if view.degraded {
                // Still routing known users on the last known pool; a load
                // balancer may prefer a healthy peer.
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "degraded: redis unreachable or not yet re-projected\n".into(),
                )
            } else if let Some(since) = view.control_plane_silent_since {
                // Still 200: every superproxy sees the same silence, and a
                // load balancer that dropped them all would turn a
                // control-plane outage into a data-plane one.
                text(
                    StatusCode::OK,
                    format!(
                        "degraded: control plane silent for {} s; {} eligible exits, {} of them held by their probed links\n",
                        since.elapsed().as_secs(),
                        view.eligible.len(),
                        view.held_by_links
                    ),
                )
            } else {
                text(
                    StatusCode::OK,
                    format!("ready: {} eligible exits\n", view.eligible.len()),
                )
            }
        }
        "/v1/pool" => {
            let view = gateway.pool.view();
            let now = std::time::Instant::now();
            let eligible: Vec<_> = view
                .eligible
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "exit_id": c.record.id,
                        "name": c.record.name,
                        "egress_ips": c.record.egress_ips,
                        "egress_prefixes": c.record.egress_prefixes,
                        "dedicated": c.record.dedicated,
                        "source_type": c.record.source_type,
                        "country": c.record.country,
                        "link_version": c.link.sender.version(),
                        "health": gateway.pool.health().exit(c.record.id).view(now),
                    })
                })
                .collect();
            let blocked: Vec<_> = view
                .blocked
                .iter()
                .map(|(record, why)| {
                    serde_json::json!({"exit_id": record.id, "name": record.name, "reason": why.as_str()})
                })
                .collect();
            let body = serde_json::json!({
                "superproxy_id": gateway.superproxy_id,
                "eligible": eligible,
                "blocked": blocked,
                "live": view.live,
                "held_by_links": view.held_by_links,
                "control_plane_silent_s": view.control_plane_silent_since.map(|since| since.elapsed().as_secs()),
                "links": gateway.links.len(),
                "degraded": view.degraded,
                "panic": gateway.pool.health().in_panic(),
            });
            let mut r = text(StatusCode::OK, body.to_string());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
