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

use http::{header, HeaderValue, Method, Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use proxynet_store::policy::{RetryRule, MAX_RETRIES};
use std::sync::Arc;
use std::time::Instant;

use super::hygiene::end_to_end;
use super::response::{empty_body, tunnel_headers, ProxyBody, ATTEMPTS_HEADER};
use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::pipeline::{Holds, Pipeline};
use crate::request::{Client, Ingress, TargetSpec};
use crate::usage::Meter;
use crate::username::SessionMode;
use proxynet_common::splice::{splice_until, Plain, TunnelLimits};
use uuid::Uuid;

/// Methods this proxy answers itself when `Max-Forwards` reaches zero.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, CONNECT";

/// What a kept-alive client connection remembers between its requests: the
/// user it last served, registered for revocation until the connection ends
/// or serves someone else, and the exit its last request used (for
/// `rotate-tunnel`).
#[derive(Clone, Default)]
pub struct ConnectionIdentity(Arc<std::sync::Mutex<ConnectionMemory>>);

#[derive(Default)]
struct ConnectionMemory {
    registration: Option<crate::open_tunnels::Registration>,
    last: Option<LastExit>,
}

/// The exit a connection's last request used, and the login it used it for.
struct LastExit {
    login: LoginKey,
    exit: Uuid,
}

/// How a request logged in, as far as keeping an exit goes: the full
/// username, grammar and all (`None` for an allow-listed login), and the
/// `Proxynet-Options` header, whose options replace the username's.
#[derive(Clone, PartialEq, Eq)]
struct LoginKey {
    username: Option<String>,
    options: Option<String>,
}

impl LoginKey {
    /// Whether its requests may keep their connection's exit, as far as
    /// can be told before logging in (`rotate-tunnel`, no session; an
    /// allow-listed login's stored options are only known once it is
    /// logged in, so it is asked then).
    fn may_keep(&self) -> bool {
        let Some(username) = &self.username else {
            return true;
        };
        let parsed = crate::username::parse(username).and_then(|p| match &self.options {
            Some(options) => crate::username::parse_options(&p.user, options.trim()),
            None => Ok(p),
        });
        parsed.is_ok_and(|p| keeps_exit(&p))
    }
}

impl ConnectionIdentity {
    /// The exit to keep for a request logging in as `login`: the last
    /// request's, when it logged in the same way (username and options
    /// header alike) and that login may keep one.
    fn kept_for(&self, login: &LoginKey) -> Option<Uuid> {
        let memory = self.0.lock().ok()?;
        let last = memory.last.as_ref()?;
        (last.login == *login && login.may_keep()).then_some(last.exit)
    }

    fn served(&self, registration: crate::open_tunnels::Registration, login: LoginKey, exit: Uuid) {
        if let Ok(mut memory) = self.0.lock() {
            memory.registration = Some(registration);
            memory.last = Some(LastExit { login, exit });
        }
    }
}

/// Whether a login's requests keep their connection's exit.
fn keeps_exit(request: &crate::username::ParsedUsername) -> bool {
    request.session.is_none() && request.rotate == crate::username::Rotate::Tunnel
}

pub async fn forward(
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

/// Whether a request may be sent again through another exit after a ban:
/// a safe method (GET, HEAD, OPTIONS: RFC 9110 §9.2.1) with no body at all
/// (the body streams, so only an empty one can be sent twice), another
/// exit to go to (not one asked for by name), and no `hard` session (whose
/// exit may not change; a `soft` one re-pins, as a cooled exit re-pins it).
fn repeatable(method: &Method, body: &Incoming, client: &Client) -> bool {
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
async fn forward_retrying(
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

/// Records what `answer` says of its exit for its site ([`crate::sites`]):
/// a ban when `rule` calls it one (the exit cooled for the site at once
/// when the rule says `cool`), a success for a 2xx, a 3xx or a `101`, and
/// nothing for any other answer (a 404 is the page's, a 500 the server's:
/// neither says the site refuses the exit). Whether it is a ban.
fn judge(pipeline: &Pipeline, rule: Option<&RetryRule>, answer: &Answer) -> bool {
    let status = answer.response.status();
    let headers = answer.response.headers();
    let banned =
        rule.is_some_and(|rule| rule.bans(status.as_u16(), |name| headers.contains_key(name)));
    let fine = status.is_success()
        || status.is_redirection()
        || status == http::StatusCode::SWITCHING_PROTOCOLS;
    if let Some(site) = answer.site.as_ref().filter(|_| banned || fine) {
        let cool = rule.is_some_and(|rule| rule.cool);
        pipeline
            .sites()
            .record_http(answer.meter.account_id, answer.exit, site, banned, cool);
    }
    banned
}

/// The answer as the client gets it: its end-to-end fields plus
/// `Proxynet-Exit` (and a session's expiry), and `Proxynet-Attempts` when
/// a retry rule sent the request through more than one exit (`attempts`:
/// set when one could have). After a WebSocket `101` (`upgrade`: the
/// client's side and the splice's limits), the two sides are spliced.
fn relay(
    answer: Answer,
    gate: Option<super::expect::Gate>,
    upgrade: Option<(hyper::upgrade::OnUpgrade, TunnelLimits)>,
    attempts: Option<u8>,
) -> Response<ProxyBody> {
    let Answer {
        mut response,
        mut info,
        upgraded_rx,
        ..
    } = answer;
    if let Some(gate) = &gate {
        // A final answer before any 100: the body stays back for good.
        gate.answered();
    }
    if let Some(attempts) = attempts.filter(|n| *n > 1) {
        info.insert(ATTEMPTS_HEADER, HeaderValue::from(u16::from(attempts)));
    }
    if let (Some((client_upgrade, limits)), Some(upgraded_rx)) = (
        upgrade.filter(|_| response.status() == http::StatusCode::SWITCHING_PROTOCOLS),
        upgraded_rx,
    ) {
        let origin_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(splice_upgraded(
            client_upgrade,
            origin_upgrade,
            upgraded_rx,
            limits,
        ));
        let (mut parts, _) = response.into_parts();
        parts.headers = end_to_end(&parts.headers);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts
            .headers
            .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        parts.headers.extend(info);
        return Response::from_parts(parts, empty_body());
    }
    let (mut parts, body) = response.into_parts();
    parts.headers = end_to_end(&parts.headers);
    if attempts == Some(1) {
        // Only the gateway says how many exits it tried.
        parts.headers.remove(ATTEMPTS_HEADER);
    }
    parts.headers.extend(info);
    let body: ProxyBody = match gate {
        // The origin has answered: once its answer is relayed, a body it
        // did not ask for is not sent.
        Some(gate) => super::expect::AbortOnEnd::new(body, gate)
            .map_err(Box::from)
            .boxed_unsync(),
        None => body.map_err(Box::from).boxed_unsync(),
    };
    Response::from_parts(parts, body)
}

/// What every attempt of one forwarded request shares.
struct Route<'a> {
    pipeline: &'a Pipeline,
    ingress: Ingress,
    /// The request target's `host[:port]`.
    authority: &'a str,
    ticket: &'a ConnectionTicket,
    identity: &'a ConnectionIdentity,
    /// A `Proxynet-Report` the client sent: it concerns the exit its session
    /// used before this request, so only the first attempt carries it.
    report: Option<crate::request::SiteReport>,
}

/// One attempt's upstream connection, open and ready for the request.
struct Attempt {
    sender: hyper::client::conn::http1::SendRequest<UpstreamBody>,
    exit: Uuid,
    meter: Arc<Meter>,
    /// `Proxynet-Exit` and a session's `Proxynet-Session-Expires`.
    info: http::HeaderMap,
    /// The site the answer tells about (the target's registrable domain).
    site: Option<Arc<str>>,
    /// Where the tunnel's holds arrive for the splice after a `101`.
    upgraded_rx: Option<tokio::sync::oneshot::Receiver<Holds>>,
}

/// An attempt's answer (its head; the body still streams), with what the
/// attempt keeps for relaying it.
struct Answer {
    response: Response<Incoming>,
    exit: Uuid,
    meter: Arc<Meter>,
    info: http::HeaderMap,
    site: Option<Arc<str>>,
    upgraded_rx: Option<tokio::sync::oneshot::Receiver<Holds>>,
}

impl Route<'_> {
    /// Opens one attempt: the pipeline's stages after authentication for
    /// `client`, then an HTTP/1.1 client connection over the exit stream,
    /// driven by a task that owns the tunnel's holds until it ends. The
    /// connection's memory takes the exit and the registration. `number`:
    /// the attempt's number when a retry rule may send the request through
    /// more than one exit (its meter is held until the answer is judged);
    /// `upgrade`: a WebSocket upgrade, whose splice takes the holds over.
    async fn open(
        &self,
        client: Client,
        started: Instant,
        login: LoginKey,
        number: Option<u8>,
        upgrade: bool,
    ) -> Result<Attempt, ProxyError> {
        let mut tunnel = self
            .pipeline
            .open_as(
                client,
                self.ingress,
                TargetSpec::UrlAuthority(self.authority)
                    .reported(self.report.filter(|_| number.unwrap_or(1) <= 1)),
                self.ticket,
                started,
            )
            .await?;
        let meter = tunnel.io.meter();
        if let Some(number) = number {
            // Before any byte moves: they all wait for the answer's verdict.
            meter.hold_billing();
            tunnel.holds.note_attempt(number);
        }
        let mut info = http::HeaderMap::new();
        tunnel_headers(&mut info, &tunnel);
        let mut holds = tunnel.holds;
        self.identity.served(
            self.pipeline.register_connection(&holds),
            login,
            tunnel.exit_id,
        );
        let site = holds.site().cloned();
        let (sender, connection) = hyper::client::conn::http1::Builder::new()
            .preserve_header_case(true)
            .max_headers(super::MAX_HEADERS)
            .max_buf_size(super::MAX_HEAD_BYTES + 16 * 1024)
            .handshake::<_, UpstreamBody>(TokioIo::new(tunnel.io))
            .await
            .map_err(|e| {
                // Nothing moved, and no answer will be judged.
                meter.settle_billing(true);
                ProxyError::new(ErrorKind::ExitLinkLost, "the exit stream failed").caused_by(e)
            })?;
        // After a `101` the spliced connections take the holds over (only an
        // upgrade request needs the hand-over).
        let (upgraded_tx, upgraded_rx) = upgrade.then(tokio::sync::oneshot::channel).unzip();
        tokio::spawn(async move {
            // The upstream connection outlives the response head: it holds the
            // tunnel's lease, meter and ticket until it ends or is cut.
            let cut = tokio::select! {
                result = connection.with_upgrades() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "upstream connection ended with an error");
                    }
                    false
                }
                () = holds.cut() => true,
            };
            if cut {
                holds.ended(proxynet_common::splice::End::Cut);
            } else if let Some(upgraded) = upgraded_tx {
                // Not upgraded (nobody waits): the tunnel ends with its connection.
                drop(upgraded.send(holds));
            }
        });
        Ok(Attempt {
            sender,
            exit: tunnel.exit_id,
            meter,
            info,
            site,
            upgraded_rx,
        })
    }
}

impl Attempt {
    /// Sends the request and waits for the answer's head.
    async fn send(self, upstream: Request<UpstreamBody>) -> Result<Answer, ProxyError> {
        let Attempt {
            mut sender,
            exit,
            meter,
            info,
            site,
            upgraded_rx,
        } = self;
        let response = sender.send_request(upstream).await.map_err(|e| {
            if e.is_parse_too_large() {
                // One hyper error for both limits: what it had read tells which.
                let detail = if meter.down() as usize >= super::MAX_HEAD_BYTES {
                    format!(
                        "the target's response head is larger than {} KiB",
                        super::MAX_HEAD_BYTES / 1024
                    )
                } else {
                    format!(
                        "the target's response has more than {} header fields",
                        super::MAX_HEADERS
                    )
                };
                return ProxyError::new(ErrorKind::BadResponse, detail);
            }
            ProxyError::new(
                ErrorKind::BadResponse,
                "target closed the connection or sent an invalid response",
            )
            .caused_by(e)
        })?;
        Ok(Answer {
            response,
            exit,
            meter,
            info,
            site,
            upgraded_rx,
        })
    }
}

/// A bodiless request's head, kept to send it through another exit.
struct Replay {
    method: Method,
    uri: Uri,
    headers: http::HeaderMap,
}

impl Replay {
    /// The request once more, in origin-form, with no body.
    fn request(&self) -> Request<UpstreamBody> {
        let mut request = Request::new(UpstreamBody::Empty);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = self.headers.clone();
        request
    }
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

/// Splices a WebSocket client and origin after the origin's `101`, under
/// the tunnel's holds (lease, meter, ticket, access-log line) until either
/// side closes, the tunnel idles out or it is cut.
async fn splice_upgraded(
    client: hyper::upgrade::OnUpgrade,
    origin: hyper::upgrade::OnUpgrade,
    holds: tokio::sync::oneshot::Receiver<crate::pipeline::Holds>,
    limits: TunnelLimits,
) {
    let (client, origin, holds) = tokio::join!(client, origin, holds);
    let (Ok(client), Ok(origin), Ok(mut holds)) = (client, origin, holds) else {
        tracing::debug!("a side went away before the WebSocket splice started");
        return;
    };
    let outcome = splice_until(
        Plain(TokioIo::new(client)),
        Plain(TokioIo::new(origin)),
        limits,
        holds.cut(),
    )
    .await;
    holds.ended(outcome.end);
    tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "WebSocket closed");
}

/// The request body sent upstream: the client's own, held back until the
/// origin asks for it (`Expect: 100-continue`), or none (a bodiless
/// request sent through more than one exit).
enum UpstreamBody {
    Plain(Incoming),
    Gated(super::expect::GatedBody<Incoming>),
    Empty,
}

impl hyper::body::Body for UpstreamBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        match self.get_mut() {
            UpstreamBody::Plain(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Box::from),
            UpstreamBody::Gated(b) => std::pin::Pin::new(b).poll_frame(cx),
            UpstreamBody::Empty => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Plain(b) => b.is_end_stream(),
            UpstreamBody::Gated(b) => hyper::body::Body::is_end_stream(b),
            UpstreamBody::Empty => true,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            UpstreamBody::Plain(b) => b.size_hint(),
            UpstreamBody::Gated(b) => hyper::body::Body::size_hint(b),
            UpstreamBody::Empty => hyper::body::SizeHint::with_exact(0),
        }
    }
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
