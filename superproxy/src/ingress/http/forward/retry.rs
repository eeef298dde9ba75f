//! Retry on ban (docs/health.md, "Retry on ban"): which requests may be
//! sent again through another exit ([`repeatable`]), and sending a bodiless
//! one through up to `1 + retry` exits, an answer the retry rule calls a
//! ban given up (not billed) while retries and the budget remain.

use http::{Method, Response};
use hyper::body::Incoming;
use proxynet_store::policy::{RetryRule, MAX_RETRIES};
use std::time::Instant;
use uuid::Uuid;

use super::identity::LoginKey;
use super::relay::{judge, relay};
use super::upstream::{Answer, Replay, Route};
use crate::error::ProxyError;
use crate::ingress::http::response::ProxyBody;
use crate::request::Client;
use proxynet_wire::username::SessionMode;

/// Whether a request may be sent again through another exit after a ban:
/// a safe method (GET, HEAD, OPTIONS: RFC 9110 §9.2.1) with no body at all
/// (the body streams, so only an empty one can be sent twice), another
/// exit to go to (not one asked for by name), and no `hard` session (whose
/// exit may not change; a `soft` one re-pins, as a cooled exit re-pins it).
pub(super) fn repeatable(method: &Method, body: &Incoming, client: &Client) -> bool {
    let request = &client.request;
    (method == Method::GET || method == Method::HEAD || method == Method::OPTIONS)
        && hyper::body::Body::is_end_stream(body)
        && request.targeting.exit.is_none()
        && request
            .session
            .as_ref()
            .is_none_or(|s| s.mode != SessionMode::Hard)
}

/// Sends a bodiless request through up to `1 + rule.retry` exits
/// (docs/health.md, "Retry on ban"). An answer `rule` calls a ban is given
/// up while retries and the retry budget remain: its bytes are not billed,
/// its exit is avoided, and the request goes out again through another
/// exit. The client gets the last answer, billed, with `Proxynet-Attempts`
/// when more than one exit answered; when no other exit answers (none left,
/// none opens, or its answer fails), the ban given up on, billed after all.
pub(super) async fn forward_retrying(
    route: &Route<'_>,
    client: Client,
    login: LoginKey,
    started: Instant,
    replay: &Replay,
    rule: &RetryRule,
) -> Result<Response<ProxyBody>, ProxyError> {
    let retries = rule.retry.min(MAX_RETRIES);
    let mut avoid: Vec<Uuid> = Vec::new();
    // The last ban given up on, until another exit answers.
    let mut banned: Option<Answer> = None;
    let mut answered: u8 = 0;
    loop {
        let number = answered + 1;
        let mut this = client.clone();
        this.request.targeting.avoid.clone_from(&avoid);
        // Each attempt's access-log line times its own opening.
        let started = if answered == 0 {
            started
        } else {
            Instant::now()
        };
        let attempt = match route
            .open(this, started, login.clone(), Some(number), false)
            .await
        {
            Ok(attempt) => attempt,
            Err(e) => return fall_back(banned, &e, answered).ok_or(e),
        };
        let meter = attempt.meter.clone();
        let answer = match attempt.send(replay.request()).await {
            Ok(answer) => answer,
            Err(e) => {
                // A first attempt that fails is billed as any failed
                // request; a retry's bytes are not: the client gets the
                // earlier answer.
                meter.settle_billing(banned.is_none());
                return fall_back(banned, &e, number).ok_or(e);
            }
        };
        answered = number;
        let is_ban = judge(route.pipeline, Some(rule), &answer);
        if let Some(earlier) = banned.take() {
            // Another exit answered: the earlier ban is given up for good.
            earlier.meter.settle_billing(false);
        }
        if is_ban && answered <= retries {
            if route.pipeline.withdraw_retry() {
                crate::metrics::ban_retry("retried");
                avoid.push(answer.exit);
                banned = Some(answer);
                continue;
            }
            crate::metrics::ban_retry("budget");
        } else if is_ban {
            crate::metrics::ban_retry("exhausted");
        }
        answer.meter.settle_billing(true);
        return Ok(relay(answer, None, None, Some(answered)));
    }
}

/// When a retry got no answer (`error`): the ban given up on, billed after
/// all, as the client's answer (`attempts`: the exits the request went
/// through); `None` when there is none (the first attempt failed).
fn fall_back(
    banned: Option<Answer>,
    error: &ProxyError,
    attempts: u8,
) -> Option<Response<ProxyBody>> {
    let banned = banned?;
    tracing::debug!(error = %error, "no other exit answered after a ban; relaying the ban");
    crate::metrics::ban_retry("unanswered");
    banned.meter.settle_billing(true);
    Some(relay(banned, None, None, Some(attempts)))
}
