//! Absolute-form HTTP/1.1 (`GET http://host/path`): forward one request
//! through an exit.
//!
//! Each request gets its own tunnel, so rotating users leave from a new exit per
//! request while the client keeps its connection alive (`rotate-request`, the
//! default). A `rotate-tunnel` login instead keeps the exit the connection's
//! last request used: the next request with the same login on that
//! connection draws it first while it stays eligible, matching, healthy and
//! below capacity, and another exit only when it is not ([`ConnectionIdentity`]).
//! Sessions keep their pin either way. Bodies stream both ways
//! (hyper re-frames them: `Content-Length` when known, chunked otherwise);
//! nothing is buffered whole. The request goes out in origin-form with `Host`
//! taken from the request target (RFC 9112 §3.2.2) and hop-by-hop fields removed.
//! `Expect: 100-continue` is forwarded and honoured end to end ([`super::expect`]).
//! The origin's response head may be as large as a client's request head
//! ([`super::MAX_HEAD_BYTES`], [`super::MAX_HEADERS`]); beyond, a 502 names
//! the limit.
//!
//! WebSocket (RFC 6455) is the one upgrade forwarded: a `GET` with
//! `Upgrade: websocket` keeps its `Upgrade` and `Connection: upgrade` (RFC
//! 9110 §7.8 lets an intermediary forward an upgrade it supports), and after
//! the origin's `101` the two connections are spliced like a tunnel, under
//! the same holds. An origin that refuses answers as it likes, relayed as is.
//!
//! Every answer tells the request's site something of its exit
//! ([`crate::sites`]): a 2xx, 3xx or `101` is a success; an answer the
//! request's retry rule calls a ban (docs/policy.md, "Retry rules") is a
//! ban, cooling the exit for the site at once when the rule says `cool`.
//! When the rule says `retry` and the request is safe to send again (GET,
//! HEAD or OPTIONS, no body, no upgrade, no `Expect`, no exit asked for by
//! name, no hard session: `repeatable`), a ban is given up — its bytes not
//! billed — and the request goes out again through another exit, at most
//! `retry` times, within the opener's retry budget; the client gets the
//! last answer, with `Proxynet-Attempts` (`forward_retrying`;
//! docs/health.md, "Retry on ban"). Without a rule nothing of this costs a
//! copy: the request streams as before.
//!
//! This file reads and rewrites the request; `identity` is what the
//! connection remembers between requests, `upstream` one attempt's exchange
//! with the exit, `relay` the answer's way back, `retry` the retry on ban.

mod identity;
mod relay;
mod retry;
mod upstream;

use http::{header, HeaderValue, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::Instant;

use super::hygiene::end_to_end;
use super::response::{empty_body, ProxyBody};
use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::pipeline::Pipeline;
use crate::request::{Ingress, TargetSpec};
use identity::{keeps_exit, LoginKey};
use proxynet_common::splice::TunnelLimits;
use relay::{judge, relay};
use retry::{forward_retrying, repeatable};
use upstream::{Replay, Route, UpstreamBody};

pub(crate) use identity::ConnectionIdentity;

/// Methods this proxy answers itself when `Max-Forwards` reaches zero.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, CONNECT";

pub(crate) async fn forward(
    pipeline: Arc<Pipeline>,
    limits: TunnelLimits,
    h2: bool,
    ticket: ConnectionTicket,
    identity: ConnectionIdentity,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if req.method() == Method::TRACE {
        // TRACE would echo our customers' credentials and cookies back through a cache.
        return Err(ProxyError::new(
            ErrorKind::MethodNotAllowed,
            "TRACE is not allowed",
        ));
    }
    let uri = req.uri().clone();
    // `ws://` is how WebSocket clients (aiohttp's `ws_connect(proxy=…)`)
    // spell the same upgrade request a browser sends as `http://` (RFC 6455
    // §3); `wss://` is TLS to the origin, which only a CONNECT tunnel carries.
    match uri.scheme_str() {
        Some("http" | "ws") => {}
        Some("wss") => {
            return Err(ProxyError::new(
                ErrorKind::BadRequest,
                "wss:// URLs cannot be forwarded; use CONNECT for wss",
            ))
        }
        _ => {
            return Err(ProxyError::new(
                ErrorKind::BadRequest,
                "only http:// and ws:// URLs can be forwarded; use CONNECT for https",
            ))
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "request target has no host"))?;
    if authority.as_str().contains('@') {
        return Err(ProxyError::new(
            ErrorKind::BadRequest,
            "request target must not carry userinfo",
        ));
    }

    // An HTTP/2 stream cannot switch protocols (RFC 9113 §8.6).
    let websocket = !h2 && is_websocket_upgrade(&req);
    // Read before the hop-by-hop fields go: the options header is one.
    let options = super::header_options(&req);
    let report = super::header_report(req.headers());
    let mut headers = end_to_end(req.headers());
    let client_upgrade = if websocket {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        Some(hyper::upgrade::on(&mut req))
    } else {
        None
    };
    if req.method() == Method::OPTIONS {
        if let Some(max) = max_forwards(&headers)? {
            if max == 0 {
                let mut response = Response::new(empty_body());
                response
                    .headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
                return Ok(response);
            }
            headers.insert(
                header::HeaderName::from_static("max-forwards"),
                HeaderValue::from(max - 1),
            );
        }
    }
    let host = HeaderValue::from_str(authority.as_str()).map_err(|_| {
        ProxyError::new(
            ErrorKind::BadRequest,
            "request target host is not a valid header value",
        )
    })?;
    headers.insert(header::HOST, host);

    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let origin_form: Uri = path
        .parse()
        .map_err(|_| ProxyError::new(ErrorKind::BadRequest, "request target path is invalid"))?;
    let authority = authority.as_str().to_owned();
    let credentials = super::credentials(&req);
    // The client's body waits for the origin's go-ahead when it asked to.
    let gate = super::expect::expects_continue(&headers).then(super::expect::Gate::new);
    let (parts, body) = req.into_parts();

    let ingress = if h2 {
        Ingress::H2Forward
    } else {
        Ingress::Forward
    };
    let login = LoginKey {
        username: credentials.as_ref().map(|c| c.username.clone()),
        options,
    };
    let route = Route {
        pipeline: &pipeline,
        ingress,
        authority: &authority,
        ticket: &ticket,
        identity: &identity,
        report,
    };
    // The stages of `Pipeline::open`, with the login checked once for every
    // attempt, and a `rotate-tunnel` login's connection exit preferred.
    let started = Instant::now();
    let kept = identity.kept_for(&login);
    let mut client = pipeline
        .authenticate(
            credentials,
            login.options.as_deref(),
            &ticket,
            ingress,
            started,
        )
        .await?;
    if let Some(kept) = kept.filter(|_| keeps_exit(&client.request)) {
        client.request.targeting.prefer = Some(kept);
    }
    let rule = pipeline.retry_rule(&client, TargetSpec::UrlAuthority(&authority));
    let retrying = rule
        .as_ref()
        .filter(|r| r.retry > 0 && !websocket && gate.is_none())
        .filter(|_| repeatable(&parts.method, &body, &client));
    if let Some(rule) = retrying {
        // Nothing of the client's is left to send: each attempt sends the
        // same head and no body.
        drop(body);
        let replay = Replay {
            method: parts.method,
            uri: origin_form,
            headers,
        };
        return forward_retrying(&route, client, login, started, &replay, rule).await;
    }

    let body = match &gate {
        Some(gate) => UpstreamBody::Gated(super::expect::GatedBody::new(body, gate.clone())),
        None => UpstreamBody::Plain(body),
    };
    let mut upstream = Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = origin_form;
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = headers;
    if let Some(gate) = &gate {
        let gate = gate.clone();
        hyper::ext::on_informational(&mut upstream, move |response| {
            if response.status() == http::StatusCode::CONTINUE {
                gate.open();
            }
        });
    }
    let attempt = route
        .open(client, started, login, None, client_upgrade.is_some())
        .await?;
    let answer = attempt.send(upstream).await?;
    judge(&pipeline, rule.as_ref(), &answer);
    Ok(relay(
        answer,
        gate,
        client_upgrade.map(|upgrade| (upgrade, limits)),
        None,
    ))
}

/// `GET` asking to switch to WebSocket (`Upgrade: websocket` named by
/// `Connection`).
fn is_websocket_upgrade<B>(req: &Request<B>) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    req.method() == Method::GET
        && super::may_upgrade(req)
        && has_token(header::UPGRADE, "websocket")
        && has_token(header::CONNECTION, "upgrade")
}

fn max_forwards(headers: &header::HeaderMap) -> Result<Option<u32>, ProxyError> {
    match headers.get("max-forwards") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .map(Some)
            .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "Max-Forwards is not a number")),
    }
}
