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

const COOKIE: &str = "pn_dashboard";
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
const MAX_SESSIONS: usize = 10_000;
/// Sessions one key may hold; the oldest goes when another opens.
pub const MAX_SESSIONS_PER_KEY: usize = 16;
/// How often a session re-checks that its key is still valid: a revoked
/// key's sessions end within this (at once on the instance that revoked it).
pub const SESSION_RECHECK: Duration = Duration::from_secs(2);
/// Failed logins allowed per source address (IPv6 per /64) per minute.
const LOGIN_FAILURES_PER_MINUTE: u32 = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

struct Session {
    caller: Caller,
    /// The key it logged in with (`None`: the bootstrap admin token).
    key_id: Option<Uuid>,
    opened: Instant,
    until: Instant,
    checked: Instant,
}

/// Logged-in dashboard sessions (SHA-256 of the cookie → the session) and
/// the login throttle.
#[derive(Clone, Default)]
pub struct Sessions {
    map: Arc<Mutex<HashMap<String, Session>>>,
    /// Failed logins per source address: (window start, count).
    failures: Arc<Mutex<HashMap<std::net::IpAddr, (Instant, u32)>>>,
}

impl Sessions {
    fn open(&self, caller: Caller, key_id: Option<Uuid>) -> String {
        let token = crate::auth::new_secret("pndash");
        if let Ok(mut m) = self.map.lock() {
            let now = Instant::now();
            if m.len() >= MAX_SESSIONS {
                m.retain(|_, s| s.until > now);
            }
            // A key's sessions are bounded: the oldest gives way.
            let mut own: Vec<(String, Instant)> = m
                .iter()
                .filter(|(_, s)| s.key_id == key_id && s.caller == caller)
                .map(|(k, s)| (k.clone(), s.opened))
                .collect();
            if own.len() >= MAX_SESSIONS_PER_KEY {
                own.sort_by_key(|(_, opened)| *opened);
                for (k, _) in own.iter().take(own.len() + 1 - MAX_SESSIONS_PER_KEY) {
                    m.remove(k);
                }
            }
            m.insert(
                proxynet_protocol::secret::sha256_hex(&token),
                Session {
                    caller,
                    key_id,
                    opened: now,
                    until: now + SESSION_TTL,
                    checked: now,
                },
            );
        }
        token
    }

    /// The session's caller, if it is open and its key still valid.
    async fn caller(&self, state: &AppState, headers: &HeaderMap) -> Option<Caller> {
        let token = cookie(headers)?;
        let digest = proxynet_protocol::secret::sha256_hex(&token);
        let now = Instant::now();
        let (caller, recheck) = {
            let m = self.map.lock().ok()?;
            let s = m.get(&digest).filter(|s| s.until > now)?;
            let due = now.duration_since(s.checked) >= SESSION_RECHECK;
            (s.caller, s.key_id.filter(|_| due))
        };
        if let Some(key) = recheck {
            // Revoked (here or on another control-api): the session ends.
            // The database unreachable: refuse too (fail closed).
            let valid = crate::auth::key_is_valid(state, key).await.unwrap_or(false);
            let mut m = self.map.lock().ok()?;
            if !valid {
                m.remove(&digest);
                return None;
            }
            if let Some(s) = m.get_mut(&digest) {
                s.checked = now;
            }
        }
        Some(caller)
    }

    fn close(&self, headers: &HeaderMap) {
        if let (Some(token), Ok(mut m)) = (cookie(headers), self.map.lock()) {
            m.remove(&proxynet_protocol::secret::sha256_hex(&token));
        }
    }

    /// Ends every session opened with one of `keys` (they were revoked).
    pub fn end_keys(&self, keys: Vec<Uuid>) {
        if let Ok(mut m) = self.map.lock() {
            m.retain(|_, s| s.key_id.is_none_or(|k| !keys.contains(&k)));
        }
    }

    /// Whether `ip` may try a login now: fewer than
    /// [`LOGIN_FAILURES_PER_MINUTE`] failures in its current minute.
    /// Successes cost nothing, so operators behind one terminating proxy
    /// are not locked out by each other's logins.
    fn login_allowed(&self, ip: std::net::IpAddr) -> bool {
        let Ok(failures) = self.failures.lock() else {
            return true;
        };
        failures.get(&limit_key(ip)).is_none_or(|(since, n)| {
            since.elapsed() >= FAILURE_WINDOW || *n < LOGIN_FAILURES_PER_MINUTE
        })
    }

    /// Counts a failed login of `ip` (bounded map: old windows go first).
    fn login_failed(&self, ip: std::net::IpAddr) {
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        if failures.len() >= 100_000 {
            failures.retain(|_, (since, _)| since.elapsed() < FAILURE_WINDOW);
        }
        let entry = failures.entry(limit_key(ip)).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILURE_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

/// The throttled address: IPv4 as is, IPv6 by its /64.
fn limit_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                std::net::IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            c.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_owned)
        })
}

/// Why a page is not shown.
enum Refusal {
    /// No session: to the login form.
    Login,
    /// An account session on an operator page.
    Forbidden,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Login => Redirect::to("/dashboard/login").into_response(),
            Refusal::Forbidden => (
                StatusCode::FORBIDDEN,
                page(
                    "Forbidden",
                    "<p>This page is for operators. <a href=\"/dashboard/usage\">Your usage</a></p>",
                ),
            )
                .into_response(),
        }
    }
}

/// The session's caller, or the way to the login form.
async fn session(state: &AppState, headers: &HeaderMap) -> Result<Caller, Refusal> {
    state
        .sessions
        .caller(state, headers)
        .await
        .ok_or(Refusal::Login)
}

async fn operator_only(state: &AppState, headers: &HeaderMap) -> Result<(), Refusal> {
    match session(state, headers).await? {
        Caller::Operator => Ok(()),
        Caller::Account(_) => Err(Refusal::Forbidden),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.4em}\
table{border-collapse:collapse;width:100%}th,td{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left}\
th{cursor:pointer;background:#f4f4f4}.cards{display:flex;gap:1em;flex-wrap:wrap}.card{border:1px solid #ddd;\
padding:.6em 1em;border-radius:6px;min-width:8em}.card b{font-size:1.4em;display:block}\
.live{color:#17803d}.ejected,.down{color:#b42318}.draining{color:#b54708}.disabled,.blocked{color:#667085}\
svg{background:#fafafa;border:1px solid #eee}nav a{margin-right:1em}";

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

pub async fn login_form() -> Html<String> {
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Log in — proxynet</title><style>{STYLE}</style></head>\
<body><h1>proxynet dashboard</h1><form method=\"post\" action=\"/dashboard/login\">\
<label>API key or admin token <input type=\"password\" name=\"key\" id=\"key\" autocomplete=\"off\" size=\"70\"></label> \
<button type=\"submit\" id=\"login\">Log in</button></form></body></html>"
    ))
}

#[derive(Deserialize)]
pub struct LoginForm {
    key: String,
}

pub async fn login(
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

pub async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
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

/// The client's address (unspecified when the server was not told it).
pub struct Peer(std::net::IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip()),
        ))
    }
}

/// A state-changing dashboard request must come from a page of this origin:
/// a browser sends `Origin` (and `Sec-Fetch-Site`) with every cross-site
/// POST, so a foreign page cannot log a visitor in (login CSRF) or out.
/// Tools that send neither (curl) pass: they carry no ambient cookie.
fn same_origin(headers: &HeaderMap) -> Result<(), Box<Response>> {
    let forbidden = || {
        Box::new(
            (
                StatusCode::FORBIDDEN,
                Html("<p>Cross-site requests to the dashboard are refused.</p>".to_owned()),
            )
                .into_response(),
        )
    };
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Err(forbidden());
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => Ok(()),
        _ => Err(forbidden()),
    }
}

/// `; Secure` when the dashboard is reached over TLS: the operator says so
/// (`--dashboard-secure-cookie`), or the terminating proxy does
/// (`X-Forwarded-Proto: https`).
fn secure_attr(state: &AppState, headers: &HeaderMap) -> &'static str {
    let forwarded_tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    if state.config.dashboard_secure_cookie || forwarded_tls {
        "; Secure"
    } else {
        ""
    }
}

/// Headers on every dashboard response: no framing, no caching, and only
/// this page's own script may run.
pub async fn security_headers(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(csp()).unwrap_or(HeaderValue::from_static("default-src 'none'")),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The Content-Security-Policy: the table script by its hash, inline styles,
/// requests to this origin only, no framing.
fn csp() -> &'static str {
    static CSP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CSP.get_or_init(|| {
        use base64::Engine as _;
        use sha2::Digest as _;
        let hash = base64::engine::general_purpose::STANDARD
            .encode(sha2::Sha256::digest(TABLE_SCRIPT.as_bytes()));
        format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
             img-src 'self' data:; connect-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'"
        )
    })
}

// ---- fleet -------------------------------------------------------------------

const TABLE_SCRIPT: &str = r#"
const cols = ["name","source_type","country","owner","egress_ips","state","score","probe_rtt_ms","success","in_flight","bytes_per_sec","last_heartbeat_at"];
let rows = [], sortBy = "state", desc = false;
function fmt(k, v) {
  if (v === null || v === undefined) return "–";
  if (k === "score" || k === "success") return Number(v).toFixed(2);
  if (k === "probe_rtt_ms") return Number(v).toFixed(1) + " ms";
  if (k === "bytes_per_sec") return (v / 1e6).toFixed(2) + " MB/s";
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}
function render() {
  const f = document.getElementById("filter").value.toLowerCase();
  const shown = rows.filter(r => !f || cols.some(k => fmt(k, r[k]).toLowerCase().includes(f)))
    .sort((a, b) => { const x = a[sortBy], y = b[sortBy]; const c = x < y ? -1 : x > y ? 1 : 0; return desc ? -c : c; });
  const body = document.getElementById("exits");
  body.innerHTML = "";
  for (const r of shown) {
    const tr = document.createElement("tr");
    tr.dataset.exitId = r.id; tr.dataset.state = r.state;
    for (const k of cols) {
      const td = document.createElement("td");
      if (k === "name") { const a = document.createElement("a"); a.href = "/dashboard/exits/" + r.id; a.textContent = r.name; td.appendChild(a); }
      else td.textContent = fmt(k, r[k]);
      if (k === "state") { td.className = "state " + r.state; if (r.blocked) td.title = r.blocked; }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
async function refresh() {
  try {
    const r = await fetch("/dashboard/data.json", {credentials: "same-origin"});
    if (!r.ok) return;
    const d = await r.json();
    rows = d.exits;
    document.getElementById("sampled").textContent = d.sampled_at || "not yet";
    for (const [k, v] of Object.entries(d.cards)) { const e = document.getElementById("card-" + k); if (e) e.textContent = v; }
    render();
  } catch (e) {}
}
document.querySelectorAll("th[data-k]").forEach(th => th.onclick = () => { desc = sortBy === th.dataset.k ? !desc : false; sortBy = th.dataset.k; render(); });
document.getElementById("filter").oninput = render;
refresh(); setInterval(refresh, 2000);
"#;

pub async fn overview(State(state): State<AppState>, headers: HeaderMap) -> Response {
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
pub async fn data(State(state): State<AppState>, headers: HeaderMap) -> Response {
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

pub async fn exit_page(
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
        "<p>State <b class=\"state {s}\" id=\"state\">{s}</b>{why} · type {t} · country {c} · owner {o} · egress {ips}</p>",
        s = now.state.as_str(),
        why = now.blocked.map(|b| format!(" ({b})")).unwrap_or_default(),
        t = esc(&now.source_type),
        c = esc(&now.country),
        o = esc(&now.owner),
        ips = esc(&now.egress_ips.join(", ")),
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
pub async fn usage(State(state): State<AppState>, headers: HeaderMap) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_a_bounded_number_of_sessions_the_oldest_giving_way() {
        let sessions = Sessions::default();
        let id = Uuid::new_v4();
        let key = Some(id);
        let tokens: Vec<String> = (0..MAX_SESSIONS_PER_KEY + 1)
            .map(|_| sessions.open(Caller::Operator, key))
            .collect();
        let map = sessions.map.lock().unwrap();
        assert_eq!(map.len(), MAX_SESSIONS_PER_KEY);
        let digest = |t: &String| proxynet_protocol::secret::sha256_hex(t);
        assert!(!map.contains_key(&digest(&tokens[0])), "the oldest went");
        assert!(map.contains_key(&digest(&tokens[MAX_SESSIONS_PER_KEY])));
        drop(map);
        // Another key's sessions are its own.
        sessions.open(Caller::Operator, Some(Uuid::new_v4()));
        assert_eq!(sessions.map.lock().unwrap().len(), MAX_SESSIONS_PER_KEY + 1);
        sessions.end_keys(vec![id]);
        assert_eq!(sessions.map.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_policy_allows_the_table_script_by_its_hash_only() {
        let policy = csp();
        assert!(policy.contains("frame-ancestors 'none'"));
        assert!(policy.contains("script-src 'sha256-"));
        assert!(!policy.contains("script-src 'unsafe-inline'"));
    }
}
