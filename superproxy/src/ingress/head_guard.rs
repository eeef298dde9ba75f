//! A strict gate in front of hyper for HTTP/1.1 request framing.
//!
//! Forward proxies get smuggled through framing that two parsers read
//! differently. hyper is lenient where the RFCs allow leniency (bare LF line
//! ends, for one); a proxy must not be. [`HeadGuard`] wraps the client
//! connection, holds each request head until it is complete, validates it
//! strictly ([`validate_head`]) and only then lets hyper see it. It follows the
//! body's framing (Content-Length or chunked, validated as it passes) to find
//! the next head, and steps aside once a CONNECT tunnel is established.
//!
//! A bad head is answered here with `400` (or `431` when too large) carrying
//! `Proxy-Status`, and the connection is closed; hyper never parses it.
//!
//! Rejected: bare LF or lone CR, obs-fold, empty or invalid header names,
//! control characters in values, CR/LF/space in the request target, unknown
//! HTTP versions, `Content-Length` together with `Transfer-Encoding`,
//! differing `Content-Length` values, a `Transfer-Encoding` that does not end
//! in `chunked`, bodies on CONNECT, heads over the size or field-count limit.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::{ErrorKind, ProxyError};

/// How a validated request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    NoBody,
    ContentLength(u64),
    Chunked,
    /// CONNECT: what follows is either the next head (if the tunnel was
    /// refused) or tunnel bytes (if it was established).
    Connect,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    TooLarge,
    TooManyFields,
    Malformed(&'static str),
}

impl HeadError {
    pub fn to_proxy_error(&self) -> ProxyError {
        match self {
            HeadError::TooLarge => {
                ProxyError::new(ErrorKind::HeaderTooLarge, "request head too large")
            }
            HeadError::TooManyFields => {
                ProxyError::new(ErrorKind::HeaderTooLarge, "too many header fields")
            }
            HeadError::Malformed(why) => {
                ProxyError::new(ErrorKind::BadRequest, format!("malformed request: {why}"))
            }
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Validates one complete request head (request line through the empty line,
/// CRLF CRLF included) and says how its body is framed.
pub fn validate_head(head: &[u8], max_fields: usize) -> Result<Framing, HeadError> {
    let mut rest = head;
    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request line.
    while let Some(r) = rest.strip_prefix(b"\r\n") {
        rest = r;
    }
    let mut lines = Lines { rest };
    let request_line = lines
        .next_line()?
        .ok_or(HeadError::Malformed("empty request"))?;
    let mut parts = request_line.split(|b| *b == b' ');
    let method = parts.next().unwrap_or_default();
    let target = parts
        .next()
        .ok_or(HeadError::Malformed("request line has no target"))?;
    let version = parts
        .next()
        .ok_or(HeadError::Malformed("request line has no version"))?;
    if parts.next().is_some() {
        return Err(HeadError::Malformed("request line has extra spaces"));
    }
    if method.is_empty() || !method.iter().all(|b| is_tchar(*b)) {
        return Err(HeadError::Malformed("invalid method"));
    }
    if target.is_empty() || !target.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(HeadError::Malformed("invalid request target"));
    }
    let http10 = match version {
        b"HTTP/1.1" => false,
        b"HTTP/1.0" => true,
        _ => return Err(HeadError::Malformed("unsupported HTTP version")),
    };

    let mut fields = 0usize;
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding: Option<Vec<u8>> = None;
    loop {
        let line = lines
            .next_line()?
            .ok_or(HeadError::Malformed("head does not end with an empty line"))?;
        if line.is_empty() {
            break;
        }
        fields += 1;
        if fields > max_fields {
            return Err(HeadError::TooManyFields);
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(HeadError::Malformed("obsolete line folding"));
        }
        let colon = line
            .iter()
            .position(|b| *b == b':')
            .ok_or(HeadError::Malformed("header line without a colon"))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() {
            return Err(HeadError::Malformed("empty header name"));
        }
        if !name.iter().all(|b| is_tchar(*b)) {
            return Err(HeadError::Malformed("invalid header name"));
        }
        if value
            .iter()
            .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
        {
            return Err(HeadError::Malformed("control character in a header value"));
        }
        let value = trim_ows(value);
        if name.eq_ignore_ascii_case(b"content-length") {
            for item in value.split(|b| *b == b',') {
                let item = trim_ows(item);
                if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
                    return Err(HeadError::Malformed("invalid Content-Length"));
                }
                let n: u64 = std::str::from_utf8(item)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or(HeadError::Malformed("invalid Content-Length"))?;
                match content_length {
                    Some(previous) if previous != n => {
                        return Err(HeadError::Malformed("conflicting Content-Length values"))
                    }
                    _ => content_length = Some(n),
                }
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let te = transfer_encoding.get_or_insert_with(Vec::new);
            if !te.is_empty() {
                te.push(b',');
            }
            te.extend_from_slice(value);
        }
    }

    if method == b"CONNECT" {
        if content_length.is_some_and(|n| n > 0) || transfer_encoding.is_some() {
            return Err(HeadError::Malformed("CONNECT must not carry a body"));
        }
        return Ok(Framing::Connect);
    }
    match (transfer_encoding, content_length) {
        (Some(_), Some(_)) => Err(HeadError::Malformed(
            "both Content-Length and Transfer-Encoding",
        )),
        (Some(_), None) if http10 => Err(HeadError::Malformed(
            "Transfer-Encoding in an HTTP/1.0 request",
        )),
        (Some(te), None) => {
            let last = te
                .rsplit(|b| *b == b',')
                .next()
                .map(trim_ows)
                .unwrap_or_default();
            if last.eq_ignore_ascii_case(b"chunked") {
                Ok(Framing::Chunked)
            } else {
                Err(HeadError::Malformed(
                    "Transfer-Encoding must end with chunked",
                ))
            }
        }
        (None, Some(0)) | (None, None) => Ok(Framing::NoBody),
        (None, Some(n)) => Ok(Framing::ContentLength(n)),
    }
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Splits on CRLF only; a bare LF or lone CR is an error.
struct Lines<'a> {
    rest: &'a [u8],
}

impl<'a> Lines<'a> {
    fn next_line(&mut self) -> Result<Option<&'a [u8]>, HeadError> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        for i in 0..self.rest.len() {
            match self.rest[i] {
                b'\n' => return Err(HeadError::Malformed("bare LF")),
                b'\r' => {
                    if self.rest.get(i + 1) != Some(&b'\n') {
                        return Err(HeadError::Malformed("CR without LF"));
                    }
                    let line = &self.rest[..i];
                    self.rest = &self.rest[i + 2..];
                    return Ok(Some(line));
                }
                _ => {}
            }
        }
        Err(HeadError::Malformed("unterminated line"))
    }
}

/// Validates chunked framing byte by byte and finds where the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    Size {
        digits: u8,
        value: u64,
        in_ext: bool,
    },
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf {
        empty: bool,
    },
    Done,
}

impl Chunked {
    const START: Chunked = Chunked::Size {
        digits: 0,
        value: 0,
        in_ext: false,
    };

    /// Consumes bytes from `data`; returns how many were consumed (fewer than
    /// `data.len()` only when the body ended).
    fn feed(&mut self, data: &[u8]) -> Result<usize, HeadError> {
        let bad = HeadError::Malformed("invalid chunked framing");
        let mut i = 0;
        while i < data.len() {
            if let Chunked::Data { remaining } = *self {
                let take = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len() - i);
                i += take;
                let left = remaining - take as u64;
                *self = if left == 0 {
                    Chunked::DataCr
                } else {
                    Chunked::Data { remaining: left }
                };
                continue;
            }
            let b = data[i];
            i += 1;
            *self = match *self {
                Chunked::Size {
                    digits,
                    value,
                    in_ext,
                } => match b {
                    b'\r' if digits > 0 => Chunked::SizeLf { value },
                    _ if in_ext => {
                        if b == b'\n' || (b < 0x20 && b != b'\t') {
                            return Err(bad);
                        }
                        Chunked::Size {
                            digits,
                            value,
                            in_ext,
                        }
                    }
                    b';' if digits > 0 => Chunked::Size {
                        digits,
                        value,
                        in_ext: true,
                    },
                    _ => {
                        let d = (b as char).to_digit(16).ok_or(bad.clone())?;
                        if digits >= 15 {
                            return Err(bad);
                        }
                        Chunked::Size {
                            digits: digits + 1,
                            value: value * 16 + u64::from(d),
                            in_ext,
                        }
                    }
                },
                Chunked::SizeLf { value } => match b {
                    b'\n' if value == 0 => Chunked::TrailerStart,
                    b'\n' => Chunked::Data { remaining: value },
                    _ => return Err(bad),
                },
                Chunked::DataCr => match b {
                    b'\r' => Chunked::DataLf,
                    _ => return Err(bad),
                },
                Chunked::DataLf => match b {
                    b'\n' => Chunked::START,
                    _ => return Err(bad),
                },
                Chunked::TrailerStart => match b {
                    b'\r' => Chunked::TrailerLf { empty: true },
                    b'\n' | b' ' | b'\t' => return Err(bad),
                    _ => Chunked::TrailerLine,
                },
                Chunked::TrailerLine => match b {
                    b'\r' => Chunked::TrailerLf { empty: false },
                    b'\n' => return Err(bad),
                    _ => Chunked::TrailerLine,
                },
                Chunked::TrailerLf { empty } => match b {
                    b'\n' if empty => Chunked::Done,
                    b'\n' => Chunked::TrailerStart,
                    _ => return Err(bad),
                },
                Chunked::Data { .. } | Chunked::Done => return Err(bad),
            };
            if *self == Chunked::Done {
                return Ok(i);
            }
        }
        Ok(i)
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Head,
    Body { remaining: u64 },
    ChunkedBody(Chunked),
    AfterConnect,
    Passthrough,
}

/// Limits the guard enforces on each head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_head_bytes: usize,
    pub max_fields: usize,
}

/// Set by the CONNECT handler just before it answers 2xx: from then on the
/// connection carries tunnel bytes, not HTTP.
#[derive(Debug, Clone, Default)]
pub struct TunnelSwitch(Arc<AtomicBool>);

impl TunnelSwitch {
    pub fn engage(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn engaged(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

pub struct HeadGuard<IO> {
    io: IO,
    limits: HeadLimits,
    phase: Phase,
    /// Bytes of the head being collected.
    head: Vec<u8>,
    /// Validated bytes not yet handed to the reader.
    ready: Vec<u8>,
    ready_pos: usize,
    /// Bytes read but not yet scanned (after a head ended mid-read).
    unscanned: Vec<u8>,
    /// An error answer being written before the connection closes.
    rejecting: Option<(Vec<u8>, usize)>,
    switch: TunnelSwitch,
}

impl<IO> HeadGuard<IO> {
    pub fn new(io: IO, limits: HeadLimits, switch: TunnelSwitch) -> Self {
        Self {
            io,
            limits,
            phase: Phase::Head,
            head: Vec::new(),
            ready: Vec::new(),
            ready_pos: 0,
            unscanned: Vec::new(),
            rejecting: None,
            switch,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Runs `data` through the framing state machine, moving validated bytes
    /// to `ready`.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), HeadError> {
        while !data.is_empty() {
            match self.phase {
                Phase::Passthrough => {
                    self.ready.extend_from_slice(data);
                    return Ok(());
                }
                Phase::AfterConnect => {
                    if self.switch.engaged() {
                        self.phase = Phase::Passthrough;
                        // A tunnel may idle for hours: keep no head buffer for it.
                        self.head = Vec::new();
                    } else {
                        self.phase = Phase::Head;
                    }
                }
                Phase::Body { remaining } => {
                    let take = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    self.ready.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let left = remaining - take as u64;
                    self.phase = if left == 0 {
                        Phase::Head
                    } else {
                        Phase::Body { remaining: left }
                    };
                }
                Phase::ChunkedBody(mut chunked) => {
                    let used = chunked.feed(data)?;
                    self.ready.extend_from_slice(&data[..used]);
                    data = &data[used..];
                    self.phase = if chunked == Chunked::Done {
                        Phase::Head
                    } else {
                        Phase::ChunkedBody(chunked)
                    };
                }
                Phase::Head => {
                    let start = self.head.len();
                    self.head.extend_from_slice(data);
                    let search_from = start.saturating_sub(3);
                    let end = self.head[search_from..]
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map(|p| search_from + p + 4);
                    // Bare LF is caught as it arrives, not only once a head
                    // ends; bytes after the head's end are not the head's.
                    let scanned_to = end.unwrap_or(self.head.len());
                    for i in start.max(1)..scanned_to {
                        if self.head[i] == b'\n' && self.head[i - 1] != b'\r' {
                            return Err(HeadError::Malformed("bare LF"));
                        }
                    }
                    if start == 0 && self.head.first() == Some(&b'\n') {
                        return Err(HeadError::Malformed("bare LF"));
                    }
                    let Some(end) = end else {
                        if self.head.len() > self.limits.max_head_bytes {
                            return Err(HeadError::TooLarge);
                        }
                        return Ok(());
                    };
                    if end > self.limits.max_head_bytes {
                        return Err(HeadError::TooLarge);
                    }
                    let framing = validate_head(&self.head[..end], self.limits.max_fields)?;
                    let leftover = self.head.split_off(end);
                    self.ready.append(&mut self.head);
                    self.phase = match framing {
                        Framing::NoBody => Phase::Head,
                        Framing::ContentLength(n) => Phase::Body { remaining: n },
                        Framing::Chunked => Phase::ChunkedBody(Chunked::START),
                        Framing::Connect => Phase::AfterConnect,
                    };
                    if leftover.is_empty() {
                        return Ok(());
                    }
                    if matches!(self.phase, Phase::AfterConnect) {
                        // Decided only once the CONNECT is answered.
                        self.unscanned = leftover;
                        return Ok(());
                    }
                    self.unscanned = leftover;
                    let pending = std::mem::take(&mut self.unscanned);
                    return self.scan(&pending);
                }
            }
        }
        Ok(())
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for HeadGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some((response, written)) = &mut this.rejecting {
                while *written < response.len() {
                    let n = ready!(Pin::new(&mut this.io).poll_write(cx, &response[*written..]))?;
                    if n == 0 {
                        break;
                    }
                    *written += n;
                }
                let _ = ready!(Pin::new(&mut this.io).poll_shutdown(cx));
                return Poll::Ready(Ok(()));
            }
            if this.ready_pos < this.ready.len() {
                let n = (this.ready.len() - this.ready_pos).min(buf.remaining());
                buf.put_slice(&this.ready[this.ready_pos..this.ready_pos + n]);
                this.ready_pos += n;
                if this.ready_pos == this.ready.len() {
                    if matches!(this.phase, Phase::Passthrough) {
                        this.ready = Vec::new();
                    } else {
                        this.ready.clear();
                    }
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if matches!(this.phase, Phase::Passthrough) && this.unscanned.is_empty() {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            let data = if this.unscanned.is_empty() {
                let mut chunk = [0u8; 8192];
                let mut read_buf = ReadBuf::new(&mut chunk);
                ready!(Pin::new(&mut this.io).poll_read(cx, &mut read_buf))?;
                let filled = read_buf.filled();
                if filled.is_empty() {
                    return Poll::Ready(Ok(())); // EOF
                }
                filled.to_vec()
            } else {
                std::mem::take(&mut this.unscanned)
            };
            let in_body = matches!(this.phase, Phase::Body { .. } | Phase::ChunkedBody(_));
            if let Err(e) = this.scan(&data) {
                if in_body {
                    // hyper is mid-body; it cannot take a new answer now.
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "invalid request body framing",
                    )));
                }
                tracing::debug!(error = ?e, "request head rejected");
                this.rejecting = Some((error_response(&e.to_proxy_error()), 0));
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HeadGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Serialises an error answer for a connection hyper never saw a head on.
pub fn error_response(error: &ProxyError) -> Vec<u8> {
    let body = format!("{}\n", error.detail);
    let status = error.kind.status();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\nproxy-status: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        error.proxy_status(),
        body.len(),
        body
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 100;

    fn v(head: &str) -> Result<Framing, HeadError> {
        validate_head(head.as_bytes(), MAX)
    }

    #[test]
    fn accepts_well_formed_heads() {
        assert_eq!(
            v("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Framing::NoBody)
        );
        assert_eq!(
            v("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"),
            Ok(Framing::Connect)
        );
        assert_eq!(
            v("POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            Ok(Framing::ContentLength(5))
        );
        assert_eq!(
            v("POST http://a/ HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"),
            Ok(Framing::ContentLength(5))
        );
        assert_eq!(
            v("POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(v("\r\nGET http://a/ HTTP/1.0\r\n\r\n"), Ok(Framing::NoBody));
    }

    #[test]
    fn rejects_ambiguous_or_malformed_heads() {
        for bad in [
            "GET http://a/ HTTP/1.1\nHost: a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\n: empty\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\x01b\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "CONNECT a:1 HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
            "GET http://a/ HTTP/2.0\r\n\r\n",
            "GET  http://a/ HTTP/1.1\r\n\r\n",
            "GET http://a/\x7f HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(v(bad), Err(HeadError::Malformed(_))),
                "{bad:?} → {:?}",
                v(bad)
            );
        }
        let many: String = (0..=MAX).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            v(&format!("GET http://a/ HTTP/1.1\r\n{many}\r\n")),
            Err(HeadError::TooManyFields)
        );
    }

    #[test]
    fn chunked_framing_finds_the_end_and_rejects_bare_lf() {
        let mut c = Chunked::START;
        let body = b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let used = c.feed(body).unwrap();
        assert_eq!(&body[used..], b"NEXT");
        assert_eq!(c, Chunked::Done);
        let mut c = Chunked::START;
        assert!(c.feed(b"5\nhello").is_err());
        let mut c = Chunked::START;
        assert!(c.feed(b"zz\r\n").is_err());
    }

    async fn through_guard(input: &[u8], engage: bool) -> (Vec<u8>, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let switch = TunnelSwitch::default();
        if engage {
            switch.engage();
        }
        let mut guard = HeadGuard::new(
            server,
            HeadLimits {
                max_head_bytes: 1024,
                max_fields: MAX,
            },
            switch,
        );
        let mut passed = Vec::new();
        guard.read_to_end(&mut passed).await.unwrap();
        drop(guard);
        let mut answered = Vec::new();
        client.read_to_end(&mut answered).await.unwrap();
        (passed, answered)
    }

    #[tokio::test]
    async fn guard_passes_pipelined_requests_and_bodies() {
        let input = b"POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nGET http://b/ HTTP/1.1\r\n\r\n";
        let (passed, answered) = through_guard(input, false).await;
        assert_eq!(passed, input.to_vec());
        assert!(answered.is_empty());
    }

    #[tokio::test]
    async fn guard_answers_bad_heads_itself() {
        let (passed, answered) = through_guard(b"GET http://a/ HTTP/1.1\nHost: a\n\n", false).await;
        assert!(passed.is_empty());
        let answered = String::from_utf8(answered).unwrap();
        assert!(answered.starts_with("HTTP/1.1 400 "), "{answered}");
        assert!(
            answered.contains("proxy-status: proxynet; error=http_request_error"),
            "{answered}"
        );

        let big = format!("GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(2000));
        let (passed, answered) = through_guard(big.as_bytes(), false).await;
        assert!(passed.is_empty());
        assert!(String::from_utf8(answered)
            .unwrap()
            .starts_with("HTTP/1.1 431 "));
    }

    #[tokio::test]
    async fn guard_steps_aside_for_an_established_tunnel() {
        let input = b"CONNECT a:1 HTTP/1.1\r\n\r\n\x16\x03\x01binary\n\n";
        let (passed, answered) = through_guard(input, true).await;
        assert_eq!(passed, input.to_vec());
        assert!(answered.is_empty());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn http_ish() -> impl Strategy<Value = Vec<u8>> {
        // Mostly plausible heads, mutated: more interesting than uniform noise.
        let pieces = prop::sample::select(vec![
            &b"GET http://a/ HTTP/1.1"[..],
            b"CONNECT a:1 HTTP/1.1",
            b"POST http://a/ HTTP/1.1",
            b"\r\n",
            b"\n",
            b"\r",
            b"Host: a",
            b"Content-Length: 3",
            b"Content-Length: 99999999999999999999",
            b"Transfer-Encoding: chunked",
            b" folded",
            b": x",
            b"abc",
            b"0\r\n\r\n",
            b"5\r\nhello\r\n",
            b"\x00",
            b"\xff",
        ]);
        prop::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn validate_head_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = validate_head(&bytes, 100);
        }

        #[test]
        fn validate_head_never_panics_on_http_like_input(bytes in http_ish()) {
            let _ = validate_head(&bytes, 100);
        }

        #[test]
        fn chunked_tracker_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut c = Chunked::START;
            let _ = c.feed(&bytes);
        }

        /// Whatever arrives, the guard passes on an unmodified prefix of it or
        /// answers with an error itself; it never invents or reorders bytes.
        #[test]
        fn guard_output_is_a_prefix_of_its_input(bytes in http_ish(), split in 0usize..64) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (mut client, server) = tokio::io::duplex(1 << 16);
                let cut = split.min(bytes.len());
                client.write_all(&bytes[..cut]).await.unwrap();
                client.write_all(&bytes[cut..]).await.unwrap();
                client.shutdown().await.unwrap();
                let mut guard = HeadGuard::new(server, HeadLimits { max_head_bytes: 4096, max_fields: 100 }, TunnelSwitch::default());
                let mut passed = Vec::new();
                let _ = guard.read_to_end(&mut passed).await;
                prop_assert!(bytes.starts_with(&passed));
                Ok(())
            })?;
        }
    }
}
