//! The first request of a client connection, when it is a well-formed
//! `CONNECT` — nearly every tunnel a proxy client opens — is answered here
//! rather than by hyper: the head the [`super::head_guard`] already validated
//! is parsed once more with httparse, the one tunnel pipeline opens the
//! tunnel, and the `200` and the splice run on this task. That saves hyper's
//! connection state machine, its upgrade hand-off and a task per tunnel.
//!
//! Anything else goes to hyper exactly as before, with the bytes read so far
//! put back in front of the stream ([`Rewound`]): a first request that is not
//! `CONNECT`, an unusual request line, and every request after a refused
//! `CONNECT` on a kept-alive connection. The answers are the same either way:
//! the `200` carries the same headers, a refusal the same status,
//! `Proxy-Status` and body ([`ProxyError::to_response`]).

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use proxynet_protocol::secret::Secret;
use proxynet_protocol::splice::Plain;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::head_guard::{HeadGuard, TunnelSwitch};
use super::response::tunnel_headers;
use super::MAX_HEADERS;
use crate::accept::ConnectionTicket;
use crate::authenticate::parse_basic;
use crate::error::ProxyError;
use crate::pipeline::{Credentials, Ingress, Pipeline, TargetSpec};

/// What is left of the connection for hyper, if anything.
pub enum Remaining<IO> {
    /// The connection is finished with (a tunnel ran and ended, the client
    /// went away, the head timed out or the guard refused it).
    Done,
    /// Serve the rest with hyper; `prefix` was read and must be seen first.
    Hyper {
        guarded: HeadGuard<IO>,
        prefix: Vec<u8>,
    },
}

/// Reads the first request head and serves it if it is a `CONNECT`. A cut of
/// the connection ends it while the head is read or the tunnel opened; once
/// spliced, the tunnel ends on the cut itself (and accounts for its bytes).
pub async fn serve<IO>(
    pipeline: &Arc<Pipeline>,
    mut guarded: HeadGuard<IO>,
    switch: &TunnelSwitch,
    ticket: &ConnectionTicket,
) -> Remaining<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let reading = tokio::time::timeout(
        pipeline.config.header_read_timeout(),
        read_head(&mut guarded),
    );
    let head = tokio::select! {
        read = reading => match read {
            Ok(Ok(Some(head))) => head,
            // EOF (or the guard answered a bad head and closed), an I/O
            // error, or the header-read timeout: the connection is done.
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return Remaining::Done,
        },
        () = ticket.cut().cancelled() => return Remaining::Done,
    };
    let Some(request) = ConnectRequest::parse(&head) else {
        return Remaining::Hyper {
            guarded,
            prefix: head,
        };
    };
    let opening = pipeline.open(
        Ingress::Connect,
        request.credentials,
        TargetSpec::Authority(&request.authority),
        ticket,
    );
    let opened = tokio::select! {
        opened = opening => opened,
        () = ticket.cut().cancelled() => return Remaining::Done,
    };
    match opened {
        Ok(tunnel) => {
            let mut headers = HeaderMap::new();
            tunnel_headers(&mut headers, &tunnel);
            let answer = serialize(http::StatusCode::OK, &headers, &[]);
            // Engaged before the answer is written, as on hyper's path: the
            // bytes the client sends after reading `200` are tunnel bytes.
            switch.engage();
            if guarded.write_all(&answer).await.is_err() {
                return Remaining::Done;
            }
            let outcome = tunnel
                .splice(Plain(guarded), pipeline.config.tunnel_limits())
                .await;
            tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "tunnel closed");
            Remaining::Done
        }
        Err(error) => {
            tracing::debug!(error = %error, "request refused");
            // The guard held what followed the head: it is the next request.
            switch.refuse();
            if request.keep_alive {
                if guarded.write_all(&refusal(&error)).await.is_err() {
                    return Remaining::Done;
                }
                Remaining::Hyper {
                    guarded,
                    prefix: Vec::new(),
                }
            } else {
                let _ = guarded.write_all(&error.to_wire()).await;
                let _ = guarded.shutdown().await;
                Remaining::Done
            }
        }
    }
}

/// Reads until a whole head is in hand. The guard hands a head on only once
/// it is complete and valid (and holds what follows a `CONNECT` head), so
/// this never reads past the head of a `CONNECT`; for other requests the
/// extra bytes (a body's start) stay in the returned buffer for hyper.
async fn read_head<IO>(guarded: &mut HeadGuard<IO>) -> io::Result<Option<Vec<u8>>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = Vec::with_capacity(1024);
    loop {
        if buf.len() >= 4 && buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Some(buf));
        }
        if guarded.read_buf(&mut buf).await? == 0 {
            return Ok(None);
        }
    }
}

/// A `CONNECT` this module serves itself: everything unusual is left to hyper.
struct ConnectRequest {
    authority: String,
    credentials: Option<Credentials>,
    keep_alive: bool,
}

impl ConnectRequest {
    fn parse(head: &[u8]) -> Option<Self> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut fields);
        let httparse::Status::Complete(len) = request.parse(head).ok()? else {
            return None;
        };
        // A CONNECT head is all there is: the guard holds what follows.
        if len != head.len() || request.method? != "CONNECT" {
            return None;
        }
        // The target as hyper would read it (authority-form `host:port`);
        // anything else gets hyper's answer.
        let uri: http::Uri = request.path?.parse().ok()?;
        if uri.scheme().is_some() || uri.path_and_query().is_some() {
            return None;
        }
        let authority = uri.authority()?.as_str().to_owned();
        let field = |name: &header::HeaderName| {
            request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name.as_str()))
                .map(|h| h.value)
        };
        // As on hyper's path: a header that does not decode still counts as
        // presented (and fails).
        let credentials = field(&header::PROXY_AUTHORIZATION).map(|value| {
            let (username, password) = std::str::from_utf8(value)
                .ok()
                .and_then(parse_basic)
                .unwrap_or_default();
            Credentials {
                username,
                password: Secret::new(password),
            }
        });
        let connection = field(&header::CONNECTION)
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or("");
        let has_token = |token: &str| {
            connection
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        let keep_alive = match request.version? {
            1 => !has_token("close"),
            0 => has_token("keep-alive"),
            _ => return None,
        };
        Some(Self {
            authority,
            credentials,
            keep_alive,
        })
    }
}

/// The refusal as hyper sends it on a kept-alive connection.
fn refusal(error: &ProxyError) -> Vec<u8> {
    let response = error.to_response();
    let body: Bytes = format!("{}\n", error.detail).into();
    let mut headers = response.headers().clone();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    serialize(response.status(), &headers, &body)
}

fn serialize(status: http::StatusCode, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// `inner` with `prefix` read first: bytes this module read before handing
/// the connection to hyper.
pub struct Rewound<IO> {
    prefix: Vec<u8>,
    position: usize,
    inner: IO,
}

impl<IO> Rewound<IO> {
    pub fn new(prefix: Vec<u8>, inner: IO) -> Self {
        Self {
            prefix,
            position: 0,
            inner,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewound<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.position < this.prefix.len() {
            let n = (this.prefix.len() - this.position).min(buf.remaining());
            buf.put_slice(&this.prefix[this.position..this.position + n]);
            this.position += n;
            if this.position == this.prefix.len() {
                this.prefix = Vec::new();
                this.position = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewound<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Option<ConnectRequest> {
        ConnectRequest::parse(head.as_bytes())
    }

    #[test]
    fn plain_connects_are_served_here_with_their_credentials() {
        let r = parse(
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\
             Proxy-Authorization: Basic YWxpY2U6cHc=\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.authority, "example.com:443");
        let creds = r.credentials.unwrap();
        assert_eq!(creds.username, "alice");
        assert_eq!(creds.password.expose(), "pw");
        assert!(r.keep_alive);
        // Undecodable credentials still count as presented.
        let r = parse("CONNECT h:1 HTTP/1.1\r\nproxy-authorization: Bearer x\r\n\r\n").unwrap();
        assert_eq!(r.credentials.unwrap().username, "");
        assert!(parse("CONNECT h:1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .credentials
            .is_none());
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_header() {
        assert!(
            !parse("CONNECT h:1 HTTP/1.1\r\nConnection: close\r\n\r\n")
                .unwrap()
                .keep_alive
        );
        assert!(!parse("CONNECT h:1 HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(
            parse("CONNECT h:1 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
                .unwrap()
                .keep_alive
        );
    }

    #[test]
    fn everything_unusual_is_left_to_hyper() {
        for head in [
            "GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n",
            "CONNECT /path HTTP/1.1\r\n\r\n",
            "CONNECT http://h:1/ HTTP/1.1\r\n\r\n",
            "CONNECT h:1 HTTP/1.1\r\n\r\nextra",
            "CONNECT h:1 HTTP/1.1\r\n",
        ] {
            assert!(parse(head).is_none(), "{head:?}");
        }
    }

    #[tokio::test]
    async fn rewound_reads_the_prefix_first() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b" world").await.unwrap();
        drop(a);
        let mut r = Rewound::new(b"hello".to_vec(), b);
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}
