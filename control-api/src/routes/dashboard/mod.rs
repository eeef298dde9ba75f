//! `/dashboard`: the built-in per-exit health dashboard.
//!
//! Server-rendered HTML, one small inline script and SVG plots — no CDN, no
//! front-end build. Data comes from the control-api's own fleet sampler
//! (`observe.rs`), so the pages work without Prometheus.
//!
//! Login: an API key (or the admin token) posted once from a form becomes a
//! random session id in an `HttpOnly; SameSite=Strict` cookie (`Secure`
//! behind TLS) — never a token in a URL. Operator sessions see the fleet, the
//! exit table and each exit's last hour; account sessions see their own usage
//! page only (403 elsewhere).
//!
//! Hardening: every state-changing request (login, logout) must come from
//! this origin (`Origin`/`Sec-Fetch-Site`), so another site can neither log a
//! browser in as someone else nor out; every page forbids framing and
//! caching and runs only its own script (CSP with the script's hash); failed
//! logins are throttled per address; a session is bound to the key it logged
//! in with and ends within [`SESSION_RECHECK`] of that key's revocation; a
//! key holds at most [`MAX_SESSIONS_PER_KEY`] sessions.
//!
//! [`sessions`] holds the login sessions and who may see what, [`security`]
//! the origin checks and response headers; the stylesheet and the table
//! script are files under `control-api/assets/dashboard/`.

mod security;
mod sessions;

pub(crate) use security::*;
pub(crate) use sessions::*;

use axum::extract::{Form, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

use crate::auth::{caller_for_key, Caller};
use crate::error::ApiError;
use crate::extract::{Json, Path};
use crate::observe::{ExitPoint, ExitState};
use crate::AppState;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The pages' one stylesheet (inline: the CSP allows inline styles only).
const STYLE: &str = include_str!("../../../assets/dashboard/style.css");

fn page(title: &str, body: &str) -> Html<String> {
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t} — proxynet</title>\
<style>{STYLE}</style></head><body><nav><a href=\"/dashboard\">Fleet</a><a href=\"/dashboard/usage\">Usage</a>\
<form method=\"post\" action=\"/dashboard/logout\" style=\"display:inline\"><button>Log out</button></form></nav>\
<h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    ))
}

// ---- login -------------------------------------------------------------------

pub(crate) async fn login_form() -> Html<String> {
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Log in — proxynet</title><style>{STYLE}</style></head>\
<body><h1>proxynet dashboard</h1><form method=\"post\" action=\"/dashboard/login\">\
<label>API key or admin token <input type=\"password\" name=\"key\" id=\"key\" autocomplete=\"off\" size=\"70\"></label> \
<button type=\"submit\" id=\"login\">Log in</button></form></body></html>"
    ))
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    key: String,
}

pub(crate) async fn login(
    State(state): State<AppState>,
    peer: Peer,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Err(r) = same_origin(&headers) {
        return *r;
    }
    if !state.sessions.login_allowed(peer.0) {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "60")],
            Html(
                "<p>Too many failed logins from this address; try again in a minute.</p>"
                    .to_owned(),
            ),
        )
            .into_response();
    }
    let who = caller_for_key(&state, form.key.trim()).await;
    if who.is_err() {
        state.sessions.login_failed(peer.0);
    }
    match who {
        Ok(who) => {
            let token = state.sessions.open(who.caller, who.key_id);
            let mut r = Redirect::to("/dashboard").into_response();
            if let Ok(v) = HeaderValue::from_str(&format!(
                "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age={}{}",
                SESSION_TTL.as_secs(),
                secure_attr(&state, &headers),
            )) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(_) => (
            StatusCode::UNAUTHORIZED,
            Html(
                "<p>That key is not valid. <a href=\"/dashboard/login\">Try again</a></p>"
                    .to_owned(),
            ),
        )
            .into_response(),
    }
}

pub(crate) async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = same_origin(&headers) {
        return *r;
    }
    state.sessions.close(&headers);
    let mut r = Redirect::to("/dashboard/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{COOKIE}=; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age=0{}",
        secure_attr(&state, &headers)
    )) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

// ---- fleet -------------------------------------------------------------------

/// The fleet table's script, allowed by its hash in the CSP.
pub(super) const TABLE_SCRIPT: &str = include_str!("../../../assets/dashboard/fleet.js");

pub(crate) async fn overview(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match session(&state, &headers).await {
        Err(r) => return r.into_response(),
        Ok(Caller::Account(_)) => return Redirect::to("/dashboard/usage").into_response(),
        Ok(Caller::Operator) => {}
    }
    let fleet = state.observer.fleet();
    let mut body = String::new();
    body.push_str("<p>Sampled <span id=\"sampled\">…</span> (every few seconds; the table refreshes itself).</p><div class=\"cards\">");
    for state_name in ExitState::ALL {
        let s = state_name.as_str();
        let _ = write!(
            body,
            "<div class=\"card {s}\">{s}<b id=\"card-{s}\">0</b></div>"
        );
    }
    for t in ["dc", "isp", "res", "mobile"] {
        let _ = write!(
            body,
            "<div class=\"card\">type {t}<b id=\"card-type-{t}\">0</b></div>"
        );
    }
    body.push_str("<div class=\"card\">tunnels/s<b id=\"card-tunnels_per_sec\">0</b></div>");
    body.push_str("<div class=\"card\">MB/s<b id=\"card-mbytes_per_sec\">0</b></div></div>");
    let tunnels: Vec<(i64, f64)> = fleet.iter().map(|p| (p.t, p.tunnels_per_sec)).collect();
    let bytes: Vec<(i64, f64)> = fleet.iter().map(|p| (p.t, p.bytes_per_sec / 1e6)).collect();
    let _ = write!(
        body,
        "<h2>Last hour</h2><div class=\"cards\"><div>tunnels/s{}</div><div>MB/s{}</div></div>",
        plot(&tunnels),
        plot(&bytes)
    );
    body.push_str("<h2>Errors by Proxy-Status token (per second, latest sample)</h2><table><tr><th>status:token</th><th>per second</th></tr>");
    if let Some(last) = fleet.last() {
        for (token, rate) in &last.errors_per_sec {
            let _ = write!(body, "<tr><td>{}</td><td>{rate:.2}</td></tr>", esc(token));
        }
    }
    body.push_str("</table><h2>Exits</h2><p><input id=\"filter\" placeholder=\"filter (any column)\" size=\"40\"></p><table><thead><tr>");
    for (k, label) in [
        ("name", "exit"),
        ("source_type", "type"),
        ("country", "country"),
        ("owner", "owner"),
        ("egress_ips", "egress IPs"),
        ("egress_prefixes", "egress prefixes"),
        ("observed_egress", "observed egress"),
        ("egress_verification", "egress check"),
        ("state", "state"),
        ("score", "score"),
        ("probe_rtt_ms", "probe RTT"),
        ("success", "success"),
        ("in_flight", "in flight"),
        ("bytes_per_sec", "throughput"),
        ("last_heartbeat_at", "last heartbeat"),
    ] {
        let _ = write!(body, "<th data-k=\"{k}\">{label}</th>");
    }
    let _ = write!(
        body,
        "</tr></thead><tbody id=\"exits\"></tbody></table><script>{TABLE_SCRIPT}</script>"
    );
    page("Fleet", &body).into_response()
}

/// The table's data, refreshed by the page's script.
pub(crate) async fn data(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = operator_only(&state, &headers).await {
        return r.into_response();
    }
    let mut cards = serde_json::Map::new();
    for s in ExitState::ALL {
        cards.insert(s.as_str().into(), 0.into());
    }
    for t in ["dc", "isp", "res", "mobile"] {
        cards.insert(format!("type-{t}"), 0.into());
    }
    for ((s, t), n) in state.observer.counts() {
        let add = |v: &mut serde_json::Value| *v = (v.as_u64().unwrap_or(0) + n).into();
        if let Some(v) = cards.get_mut(&s) {
            add(v);
        }
        if let Some(v) = cards.get_mut(&format!("type-{t}")) {
            add(v);
        }
    }
    let last = state.observer.fleet().pop();
    cards.insert(
        "tunnels_per_sec".into(),
        format!("{:.1}", last.as_ref().map_or(0.0, |p| p.tunnels_per_sec)).into(),
    );
    cards.insert(
        "mbytes_per_sec".into(),
        format!(
            "{:.2}",
            last.as_ref().map_or(0.0, |p| p.bytes_per_sec / 1e6)
        )
        .into(),
    );
    Json(serde_json::json!({
        "sampled_at": state.observer.sampled_at(),
        "cards": cards,
        "exits": state.observer.exits(),
    }))
    .into_response()
}

/// An SVG line plot of `(unix time, value)` points, with its range labelled.
fn plot(points: &[(i64, f64)]) -> String {
    let (w, h) = (420.0, 120.0);
    if points.len() < 2 {
        return format!(
            "<svg width=\"{w}\" height=\"{h}\"><text x=\"10\" y=\"60\">collecting…</text></svg>"
        );
    }
    let (t0, t1) = (points[0].0 as f64, points[points.len() - 1].0 as f64);
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1e-9);
    let coords: Vec<String> = points
        .iter()
        .map(|(t, v)| {
            let x = 30.0 + (*t as f64 - t0) / (t1 - t0).max(1.0) * (w - 40.0);
            let y = h - 15.0 - v / max * (h - 30.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        "<svg width=\"{w}\" height=\"{h}\" role=\"img\"><text x=\"2\" y=\"12\" font-size=\"10\">{max:.2}</text>\
<text x=\"2\" y=\"{}\" font-size=\"10\">0</text><polyline fill=\"none\" stroke=\"#1d4ed8\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        h - 4.0,
        coords.join(" ")
    )
}

pub(crate) async fn exit_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<Uuid>,
) -> Response {
    if let Err(r) = operator_only(&state, &headers).await {
        return r.into_response();
    }
    let Some((now, points, events)) = state.observer.exit(id) else {
        return (
            StatusCode::NOT_FOUND,
            page("No such exit", "<p>Unknown exit (or not sampled yet).</p>"),
        )
            .into_response();
    };
    let series = |f: fn(&ExitPoint) -> Option<f64>| -> Vec<(i64, f64)> {
        points
            .iter()
            .filter_map(|p| f(p).map(|v| (p.t, v)))
            .collect()
    };
    let drains: Vec<(DateTime<Utc>, String, String)> = sqlx::query_as(
        "SELECT at, action, actor FROM audit_log WHERE subject = $1 AND action LIKE 'exit.%' ORDER BY id DESC LIMIT 20",
    )
    .bind(id.to_string())
    .fetch_all(&state.db)
    .await
    .unwrap_or_default();
    let mut body = format!(
        "<p>State <b class=\"state {s}\" id=\"state\">{s}</b>{why} · type {t} · country {c} · owner {o} · egress {ips}{prefixes}</p>\
<p>Observed public egress <span id=\"observed-egress\">{observed}</span> · check <b id=\"egress-verification\">{check}</b></p>",
        s = now.state.as_str(),
        why = now.blocked.map(|b| format!(" ({b})")).unwrap_or_default(),
        t = esc(&now.source_type),
        c = esc(&now.country),
        o = esc(&now.owner),
        ips = esc(&now.egress_ips.join(", ")),
        prefixes = if now.egress_prefixes.is_empty() {
            String::new()
        } else {
            format!(
                " · egress prefixes <span id=\"egress-prefixes\">{}</span>",
                esc(&now.egress_prefixes.join(", "))
            )
        },
        observed = if now.observed_egress.is_empty() {
            "–".to_owned()
        } else {
            esc(&now.observed_egress.join(", "))
        },
        check = esc(&now.egress_verification),
    );
    let _ = write!(
        body,
        "<div class=\"cards\"><div>score{}</div><div>probe RTT, ms{}</div><div>connect success{}</div><div>throughput, MB/s{}</div></div>",
        plot(&series(|p| p.score)),
        plot(&series(|p| p.probe_rtt_ms)),
        plot(&series(|p| p.success)),
        plot(&series(|p| Some(p.bytes_per_sec / 1e6))),
    );
    body.push_str("<h2>Recent state changes (ejections, drains)</h2><table><tr><th>when</th><th>what</th></tr>");
    for e in events.iter().rev() {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td></tr>",
            e.at.to_rfc3339(),
            esc(&e.what)
        );
    }
    for (at, action, actor) in &drains {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{} (by {})</td></tr>",
            at.to_rfc3339(),
            esc(action),
            esc(actor)
        );
    }
    body.push_str("</table>");
    page(&format!("Exit {}", now.name), &body).into_response()
}

// ---- usage -----------------------------------------------------------------

#[derive(sqlx::FromRow)]
struct UsageRow {
    account_id: Uuid,
    account_name: String,
    username: Option<String>,
    bytes_up: i64,
    bytes_down: i64,
}

/// Usage over the last 24 hours: an account its own users; the operator all.
pub(crate) async fn usage(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let caller = match session(&state, &headers).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let rows: Result<Vec<UsageRow>, ApiError> = sqlx::query_as(
        "SELECT l.account_id, a.name AS account_name, u.username,
                SUM(l.bytes_up)::bigint AS bytes_up, SUM(l.bytes_down)::bigint AS bytes_down
           FROM usage_ledger l JOIN accounts a ON a.id = l.account_id
           LEFT JOIN proxy_users u ON u.id = l.user_id
          WHERE l.minute >= now() - interval '24 hours' AND ($1::uuid IS NULL OR l.account_id = $1)
          GROUP BY l.account_id, a.name, u.username ORDER BY a.name, u.username",
    )
    .bind(caller.scope())
    .fetch_all(&state.db)
    .await
    .map_err(ApiError::from);
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => return e.into_response(),
    };
    let mut body = String::from("<p>Bytes through the gateway in the last 24 hours, from the ledger.</p><table id=\"usage\"><tr><th>account</th><th>user</th><th>up</th><th>down</th></tr>");
    for r in &rows {
        let _ = write!(
            body,
            "<tr data-account-id=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.account_id,
            esc(&r.account_name),
            esc(r.username.as_deref().unwrap_or("–")),
            r.bytes_up,
            r.bytes_down
        );
    }
    body.push_str("</table>");
    page("Usage", &body).into_response()
}
