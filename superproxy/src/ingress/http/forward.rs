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

use http::{header, HeaderValue, Method, Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::sync::Arc;

use super::hygiene::end_to_end;
use super::response::{empty_body, tunnel_headers, ProxyBody};
use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::pipeline::Pipeline;
use crate::request::{Ingress, TargetSpec};
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

    let ingress = if h2 {
        Ingress::H2Forward
    } else {
        Ingress::Forward
    };
    let login = LoginKey {
        username: credentials.as_ref().map(|c| c.username.clone()),
        options,
    };
    let target = TargetSpec::UrlAuthority(&authority);
    let tunnel = match identity.kept_for(&login) {
        // The same stages, with the connection's exit preferred.
        Some(kept) => {
            let started = std::time::Instant::now();
            let mut client = pipeline
                .authenticate(
                    credentials,
                    login.options.as_deref(),
                    &ticket,
                    ingress,
                    started,
                )
                .await?;
            if keeps_exit(&client.request) {
                client.request.targeting.prefer = Some(kept);
            }
            pipeline
                .open_as(client, ingress, target, &ticket, started)
                .await?
        }
        None => {
            pipeline
                .open(
                    ingress,
                    credentials,
                    login.options.as_deref(),
                    target,
                    &ticket,
                )
                .await?
        }
    };
    let mut tunnel_info = http::HeaderMap::new();
    tunnel_headers(&mut tunnel_info, &tunnel);
    let mut holds = tunnel.holds;
    identity.served(pipeline.register_connection(&holds), login, tunnel.exit_id);
    let meter = tunnel.io.meter();
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .max_headers(super::MAX_HEADERS)
        .max_buf_size(super::MAX_HEAD_BYTES + 16 * 1024)
        .handshake::<_, UpstreamBody>(TokioIo::new(tunnel.io))
        .await
        .map_err(|e| {
            ProxyError::new(ErrorKind::ExitLinkLost, "the exit stream failed").caused_by(e)
        })?;
    // After a `101` the spliced connections take the holds over (only an
    // upgrade request needs the hand-over).
    let (upgraded_tx, upgraded_rx) = client_upgrade
        .is_some()
        .then(tokio::sync::oneshot::channel)
        .unzip();
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
    if let Some(gate) = &gate {
        // A final answer before any 100: the body stays back for good.
        gate.answered();
    }
    let mut response = response;
    if let (Some(client_upgrade), Some(upgraded_rx)) = (
        client_upgrade.filter(|_| response.status() == http::StatusCode::SWITCHING_PROTOCOLS),
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
        parts.headers.extend(tunnel_info);
        return Ok(Response::from_parts(parts, empty_body()));
    }
    let (mut parts, body) = response.into_parts();
    parts.headers = end_to_end(&parts.headers);
    parts.headers.extend(tunnel_info);
    let body: ProxyBody = match gate {
        // The origin has answered: once its answer is relayed, a body it
        // did not ask for is not sent.
        Some(gate) => super::expect::AbortOnEnd::new(body, gate)
            .map_err(Box::from)
            .boxed_unsync(),
        None => body.map_err(Box::from).boxed_unsync(),
    };
    Ok(Response::from_parts(parts, body))
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

/// The request body sent upstream: the client's own, or held back until the
/// origin asks for it (`Expect: 100-continue`).
enum UpstreamBody {
    Plain(Incoming),
    Gated(super::expect::GatedBody<Incoming>),
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Plain(b) => b.is_end_stream(),
            UpstreamBody::Gated(b) => hyper::body::Body::is_end_stream(b),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            UpstreamBody::Plain(b) => b.size_hint(),
            UpstreamBody::Gated(b) => hyper::body::Body::size_hint(b),
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
