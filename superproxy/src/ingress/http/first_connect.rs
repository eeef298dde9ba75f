//! The first request of a client connection, when it is a well-formed
//! `CONNECT` — nearly every tunnel a proxy client opens — is answered here
//! rather than by hyper: the head the [`super::head_guard`] already validated
//! is parsed once more with httparse, the one tunnel pipeline opens the
//! tunnel, the `200` is written and the splice handed to a task of its own.
//! That saves hyper's connection state machine and its upgrade hand-off.
//!
//! Anything else goes to hyper exactly as before, with the bytes read so far
//! put back in the guard ([`HeadGuard::put_back`]): a first request that is not
//! an HTTP/1.1 `CONNECT` to an authority-form target, one that asks to close
//! the connection or carries header values hyper would not read as text, and
//! every request after a refused `CONNECT` (the connection stays open for it,
//! as hyper keeps it). The answers are byte for byte hyper's: the `200`
//! carries the same headers, a refusal the same status, `Proxy-Status` and
//! body ([`ProxyError::to_response`]).

use http::header;
use proxynet_common::secret::Secret;
use proxynet_common::splice::Plain;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::head_guard::{HeadGuard, TunnelSwitch};
use super::response::connect_established;
use super::MAX_HEADERS;
use crate::accept::ConnectionTicket;
use crate::credentials::parse_basic;
use crate::error::serialize_response;
use crate::ingress::IngressLimits;
use crate::pipeline::Pipeline;
use crate::request::{Credentials, Ingress, SiteReport, TargetSpec, OPTIONS_HEADER, REPORT_HEADER};

/// What is left of the connection for hyper, if anything.
pub(crate) enum Remaining<IO> {
    /// The connection is finished with (a tunnel is spliced, the client went
    /// away, the head timed out or the guard refused it).
    Done,
    /// Serve the rest with hyper (bytes read here were put back in the guard).
    Hyper(HeadGuard<IO>),
}

/// Reads the first request head and serves it if it is a `CONNECT`. A cut of
/// the connection ends it while the head is read or the tunnel opened; once
/// spliced, the tunnel ends on the cut itself (and accounts for its bytes).
pub(crate) async fn serve<IO>(
    pipeline: &Arc<Pipeline>,
    limits: IngressLimits,
    mut guarded: HeadGuard<IO>,
    switch: &TunnelSwitch,
    ticket: &ConnectionTicket,
) -> Remaining<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let reading = tokio::time::timeout(limits.header_read_timeout, read_head(&mut guarded));
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
        guarded.put_back(head);
        return Remaining::Hyper(guarded);
    };
    // The head carries the client's password: it does not outlive the parse
    // (a tunnel may last hours).
    drop(head);
    let opening = pipeline.open(
        Ingress::Connect,
        request.credentials,
        request.options.as_deref(),
        TargetSpec::Authority(&request.authority).reported(request.report),
        ticket,
    );
    let opened = tokio::select! {
        opened = opening => opened,
        () = ticket.cut().cancelled() => return Remaining::Done,
    };
    match opened {
        Ok(mut tunnel) => {
            let answer = {
                let (head, ()) = connect_established(&tunnel).into_parts();
                serialize_response(head.status, &head.headers, &[])
            };
            // Engaged before the answer is written, as on hyper's path: the
            // bytes the client sends after reading `200` are tunnel bytes.
            switch.engage();
            // Flushed: over TLS a written record may still sit in rustls, and
            // a client that waits for the 200 before speaking would stall.
            if guarded.write_all(&answer).await.is_err() || guarded.flush().await.is_err() {
                return Remaining::Done;
            }
            drop(answer);
            // A tunnel to an address whose domain rules wait for its first
            // bytes is judged by them in its own task, before the splice
            // (refused: dropped, which closes the connection).
            let judge = tunnel.judges_first_bytes().then(|| pipeline.clone());
            // The splice gets a small task of its own, as on hyper's path:
            // this one is sized for every ingress's state (hyper's
            // connection, TLS, SOCKS) and would hold ~10 KB per idle tunnel.
            tokio::spawn(async move {
                if let Some(pipeline) = judge {
                    if !pipeline.judge_first_bytes(&mut tunnel, &mut guarded).await {
                        return;
                    }
                }
                let outcome = tunnel.splice(Plain(guarded), limits.tunnel).await;
                tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "tunnel closed");
            });
            Remaining::Done
        }
        Err(error) => {
            tracing::debug!(error = %error, "request refused");
            // The guard held what followed the head: it is the next request,
            // which hyper serves (hyper flushes the refusal with its first
            // write of the connection).
            switch.refuse();
            if guarded
                .write_all(&error.to_wire_kept_alive())
                .await
                .is_err()
            {
                return Remaining::Done;
            }
            Remaining::Hyper(guarded)
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
    /// The `Proxynet-Options` header, read as hyper's path reads it.
    options: Option<String>,
    /// The `Proxynet-Report` header, likewise.
    report: Option<SiteReport>,
}

impl ConnectRequest {
    fn parse(head: &[u8]) -> Option<Self> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut fields);
        let httparse::Status::Complete(len) = request.parse(head).ok()? else {
            return None;
        };
        // A CONNECT head is all there is: the guard holds what follows.
        // HTTP/1.0 (answered as 1.0, closed unless asked) is left to hyper.
        if len != head.len() || request.method? != "CONNECT" || request.version? != 1 {
            return None;
        }
        // The target as hyper would read it (authority-form `host:port`);
        // anything else gets hyper's answer.
        let uri: http::Uri = request.path?.parse().ok()?;
        if uri.scheme().is_some() || uri.path_and_query().is_some() {
            return None;
        }
        let authority = uri.authority()?.as_str().to_owned();
        // Header values as hyper reads them (`HeaderValue::to_str`: visible
        // ASCII and tabs); any other byte in a value we read, or a request to
        // close the connection (hyper then answers with `connection: close`),
        // is left to hyper.
        let mut credentials = None;
        let mut options = None;
        let mut report = None;
        for field in request.headers.iter() {
            let is = |name: &header::HeaderName| field.name.eq_ignore_ascii_case(name.as_str());
            if is(&header::CONNECTION) {
                let value = visible_ascii(field.value)?;
                if value
                    .split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case("close"))
                {
                    return None;
                }
            } else if is(&header::PROXY_AUTHORIZATION) && credentials.is_none() {
                // The first one counts, as `HeaderMap::get` on hyper's path;
                // one that does not decode still counts as presented (and fails).
                let (username, password) = visible_ascii(field.value)
                    .and_then(parse_basic)
                    .unwrap_or_default();
                credentials = Some(Credentials {
                    username,
                    password: Secret::new(password),
                });
            } else if field.name.eq_ignore_ascii_case(OPTIONS_HEADER) && options.is_none() {
                // The first one counts, and bytes that are not UTF-8 fail
                // the grammar with the header named, as on hyper's path.
                options = Some(String::from_utf8_lossy(field.value).into_owned());
            } else if field.name.eq_ignore_ascii_case(REPORT_HEADER) && report.is_none() {
                // The first one counts, as on hyper's path.
                report = Some(SiteReport::from_value(field.value));
            }
        }
        Some(Self {
            authority,
            credentials,
            options,
            report,
        })
    }
}

/// A header value as hyper's `HeaderValue::from_bytes` then `to_str` read
/// it (visible ASCII and tabs), without copying it into a `HeaderValue`.
fn visible_ascii(value: &[u8]) -> Option<&str> {
    value
        .iter()
        .all(|&b| b == b'\t' || (32..127).contains(&b))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Option<ConnectRequest> {
        ConnectRequest::parse(head.as_bytes())
    }

    #[test]
    fn a_value_is_read_exactly_when_hyper_would_read_it() {
        for b in 0..=255u8 {
            let value = [b'a', b, b'z'];
            let hyper_reads = http::HeaderValue::from_bytes(&value)
                .ok()
                .is_some_and(|v| v.to_str().is_ok());
            assert_eq!(
                visible_ascii(&value).is_some(),
                hyper_reads,
                "byte {b:#04x}"
            );
        }
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
        // Undecodable credentials still count as presented.
        let r = parse("CONNECT h:1 HTTP/1.1\r\nproxy-authorization: Bearer x\r\n\r\n").unwrap();
        assert_eq!(r.credentials.unwrap().username, "");
        assert!(parse("CONNECT h:1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .credentials
            .is_none());
    }

    #[test]
    fn closing_requests_and_odd_header_bytes_are_left_to_hyper() {
        for head in [
            "CONNECT h:1 HTTP/1.0\r\n\r\n",
            "CONNECT h:1 HTTP/1.1\r\nConnection: close\r\n\r\n",
            "CONNECT h:1 HTTP/1.1\r\nConnection: keep-alive\r\nConnection: Close\r\n\r\n",
            "CONNECT h:1 HTTP/1.1\r\nConnection: foo, close\r\n\r\n",
            "CONNECT h:1 HTTP/1.1\r\nConnection: keep-alive\u{a0}\r\n\r\n",
        ] {
            assert!(parse(head).is_none(), "{head:?}");
        }
        // hyper would not read this value as text: neither do we (it counts
        // as presented and fails, instead of being trimmed into a login).
        let r = parse(
            "CONNECT h:1 HTTP/1.1\r\nProxy-Authorization: Basic YWxpY2U6cHc=\u{3000}\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.credentials.unwrap().username, "");
        // The first Proxy-Authorization counts.
        let r = parse(
            "CONNECT h:1 HTTP/1.1\r\nProxy-Authorization: Basic YWxpY2U6cHc=\r\n\
             Proxy-Authorization: Basic Ym9iOnB3\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.credentials.unwrap().username, "alice");
    }

    #[test]
    fn the_options_header_is_read_here_as_hyper_reads_it() {
        let r = parse(
            "CONNECT h:1 HTTP/1.1\r\nProxynet-Options: country-de-session-abc\r\n\
             proxynet-options: country-fr\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.options.as_deref(), Some("country-de-session-abc"));
        assert!(parse("CONNECT h:1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .options
            .is_none());
    }

    #[test]
    fn the_report_header_is_read_here_as_hyper_reads_it() {
        let r = parse(
            "CONNECT h:1 HTTP/1.1\r\nProxynet-Report:  Blocked \r\n\
             proxynet-report: nonsense\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.report, Some(SiteReport::Blocked), "the first counts");
        let r = parse("CONNECT h:1 HTTP/1.1\r\nProxynet-Report: ok\r\n\r\n").unwrap();
        assert_eq!(r.report, Some(SiteReport::Unrecognized));
        assert!(parse("CONNECT h:1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .report
            .is_none());
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
}
