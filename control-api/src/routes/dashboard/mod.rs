//! `/dashboard`: the built-in operator console.
//!
//! Server-rendered HTML, small scripts and hand-drawn SVG charts — no CDN,
//! no front-end build; the stylesheet and scripts are files under
//! `control-api/assets/dashboard/`. Data comes from the control-api's own
//! fleet sampler (`observe.rs`) and the database, so the pages work without
//! Prometheus.
//!
//! Pages: the fleet ([`fleet`]: counts, rates, errors, top accounts and
//! domains, a paged exit table), one exit ([`exit`]: provenance, consent,
//! egress, charts, state changes), usage, accounts and a user's sessions ([`accounts`]),
//! target sites and the exits cooled for each ([`sites`]).
//! Operators act in place ([`actions`]): drain, disable, revoke consent,
//! revoke a key, end a session, disable a user, lift a site cooldown —
//! through the REST handlers themselves, so checks and audit entries are theirs.
//!
//! Login: an API key (or the admin token) posted once from a form becomes a
//! random session id in an `HttpOnly; SameSite=Strict` cookie (`Secure`
//! behind TLS) — never a token in a URL. Operator sessions see everything;
//! account sessions their own account, usage and users' sessions (403 or
//! 404 elsewhere) and no action buttons.
//!
//! Hardening: every state-changing request (login, logout, actions) must
//! come from this origin (`Origin`/`Sec-Fetch-Site`); every action also
//! carries the session's own CSRF token; every page forbids framing and
//! caching and runs only the dashboard's own scripts (CSP by their hashes);
//! failed logins are throttled per address; a session is bound to the key it
//! logged in with and ends within [`SESSION_RECHECK`] of that key's
//! revocation; a key holds at most [`MAX_SESSIONS_PER_KEY`] sessions.
//!
//! [`sessions`] holds the login sessions and who may see what, [`security`]
//! the origin checks and response headers, [`format`] units, times, charts
//! and action forms.

mod accounts;
mod actions;
mod exit;
mod fleet;
mod format;
mod security;
mod sessions;
mod sites;

pub(crate) use accounts::*;
pub(crate) use actions::*;
pub(crate) use exit::*;
pub(crate) use fleet::*;
pub(super) use format::*;
pub(crate) use security::*;
pub(crate) use sessions::*;
pub(crate) use sites::*;

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

/// On every page: keeps relative times ("12 s ago") current.
pub(super) const COMMON_SCRIPT: &str = include_str!("../../../assets/dashboard/common.js");
/// The fleet page's exit table (paged, sorted and filtered by the server).
pub(super) const TABLE_SCRIPT: &str = include_str!("../../../assets/dashboard/fleet.js");
/// Every script a page may run: the CSP allows exactly these, by hash.
pub(super) const SCRIPTS: [&str; 2] = [COMMON_SCRIPT, TABLE_SCRIPT];

fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{t} — proxynet</title><style>{STYLE}</style></head>",
        t = esc(title)
    )
}

/// A page without a known viewer (refusals).
fn page(title: &str, body: &str) -> Html<String> {
    Html(format!(
        "{}<body><nav class=\"top\"><a href=\"/dashboard\">Fleet</a><a href=\"/dashboard/usage\">Usage</a>\
<form method=\"post\" action=\"/dashboard/logout\" class=\"inline\"><button>Log out</button></form></nav>\
<main><h1>{t}</h1>{body}</main></body></html>",
        head(title),
        t = esc(title)
    ))
}

/// A page for `v`: its navigation, `body`, the common script and `extra`
/// scripts (each one of [`SCRIPTS`]).
fn page_for(v: &Viewer, title: &str, body: &str, extra: &[&str]) -> Html<String> {
    let nav = match v.caller {
        Caller::Operator => "<a href=\"/dashboard\">Fleet</a><a href=\"/dashboard/accounts\">Accounts</a><a href=\"/dashboard/sites\">Sites</a><a href=\"/dashboard/usage\">Usage</a>".to_owned(),
        Caller::Account(id) => format!("<a href=\"/dashboard/accounts/{id}\">Account</a><a href=\"/dashboard/usage\">Usage</a>"),
    };
    let who = match v.caller {
        Caller::Operator => "operator",
        Caller::Account(_) => "account",
    };
    let mut scripts = format!("<script>{COMMON_SCRIPT}</script>");
    for s in extra {
        scripts.push_str("<script>");
        scripts.push_str(s);
        scripts.push_str("</script>");
    }
    Html(format!(
        "{}<body data-viewer=\"{who}\"><nav class=\"top\">{nav}<span class=\"who\">signed in as {who}</span>\
<form method=\"post\" action=\"/dashboard/logout\" class=\"inline\"><button>Log out</button></form></nav>\
<main><h1>{t}</h1>{body}</main>{scripts}</body></html>",
        head(title),
        t = esc(title)
    ))
}

// ---- login -------------------------------------------------------------------

pub(crate) async fn login_form() -> Html<String> {
    Html(format!(
        "{}<body><main><h1>proxynet dashboard</h1><form method=\"post\" action=\"/dashboard/login\">\
<label>API key or admin token <input type=\"password\" name=\"key\" id=\"key\" autocomplete=\"off\" size=\"70\"></label> \
<button type=\"submit\" id=\"login\">Log in</button></form></main></body></html>",
        head("Log in")
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
