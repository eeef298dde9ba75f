//! The upstream exchange of one attempt: the pipeline's stages after the
//! login ([`Route::open`]), an HTTP/1.1 client connection over the exit
//! stream driven by a task that owns the tunnel's holds, the request sent
//! and the answer's head read ([`Attempt::send`]); and the bodies a request
//! goes upstream with ([`UpstreamBody`], [`Replay`] for another exit).

use http::{Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use super::identity::{ConnectionIdentity, LoginKey};
use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::ingress::http::expect::GatedBody;
use crate::ingress::http::response::tunnel_headers;
use crate::ingress::http::{MAX_HEADERS, MAX_HEAD_BYTES};
use crate::pipeline::{Holds, Pipeline};
use crate::request::{Client, Ingress, TargetSpec};
use crate::usage::Meter;

/// What every attempt of one forwarded request shares.
pub(super) struct Route<'a> {
    pub(super) pipeline: &'a Pipeline,
    pub(super) ingress: Ingress,
    /// The request target's `host[:port]`.
    pub(super) authority: &'a str,
    pub(super) ticket: &'a ConnectionTicket,
    pub(super) identity: &'a ConnectionIdentity,
    /// A `Proxynet-Report` the client sent: it concerns the exit its session
    /// used before this request, so only the first attempt carries it.
    pub(super) report: Option<crate::request::SiteReport>,
}

/// One attempt's upstream connection, open and ready for the request.
pub(super) struct Attempt {
    sender: hyper::client::conn::http1::SendRequest<UpstreamBody>,
    exit: Uuid,
    pub(super) meter: Arc<Meter>,
    /// `Proxynet-Exit` and a session's `Proxynet-Session-Expires`.
    info: http::HeaderMap,
    /// The site the answer tells about (the target's registrable domain).
    site: Option<Arc<str>>,
    /// Where the tunnel's holds arrive for the splice after a `101`.
    upgraded_rx: Option<tokio::sync::oneshot::Receiver<Holds>>,
}

/// An attempt's answer (its head; the body still streams), with what the
/// attempt keeps for relaying it.
pub(super) struct Answer {
    pub(super) response: Response<Incoming>,
    pub(super) exit: Uuid,
    pub(super) meter: Arc<Meter>,
    pub(super) info: http::HeaderMap,
    pub(super) site: Option<Arc<str>>,
    pub(super) upgraded_rx: Option<tokio::sync::oneshot::Receiver<Holds>>,
}

impl Route<'_> {
    /// Opens one attempt: the pipeline's stages after authentication for
    /// `client`, then an HTTP/1.1 client connection over the exit stream,
    /// driven by a task that owns the tunnel's holds until it ends. The
    /// connection's memory takes the exit and the registration. `number`:
    /// the attempt's number when a retry rule may send the request through
    /// more than one exit (its meter is held until the answer is judged);
    /// `upgrade`: a WebSocket upgrade, whose splice takes the holds over.
    pub(super) async fn open(
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
            .max_headers(MAX_HEADERS)
            .max_buf_size(MAX_HEAD_BYTES + 16 * 1024)
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
    pub(super) async fn send(self, upstream: Request<UpstreamBody>) -> Result<Answer, ProxyError> {
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
                let detail = if meter.down() as usize >= MAX_HEAD_BYTES {
                    format!(
                        "the target's response head is larger than {} KiB",
                        MAX_HEAD_BYTES / 1024
                    )
                } else {
                    format!(
                        "the target's response has more than {} header fields",
                        MAX_HEADERS
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
pub(super) struct Replay {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) headers: http::HeaderMap,
}

impl Replay {
    /// The request once more, in origin-form, with no body.
    pub(super) fn request(&self) -> Request<UpstreamBody> {
        let mut request = Request::new(UpstreamBody::Empty);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = self.headers.clone();
        request
    }
}

/// The request body sent upstream: the client's own, held back until the
/// origin asks for it (`Expect: 100-continue`), or none (a bodiless
/// request sent through more than one exit).
pub(super) enum UpstreamBody {
    Plain(Incoming),
    Gated(GatedBody<Incoming>),
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
