//! Strict validation of one HTTP/1.1 request head.
//!
//! Two kinds of rule live here. Rules hyper does not enforce (it is lenient
//! where the RFCs allow leniency, a proxy must not be): bare LF or lone CR,
//! obs-fold, control characters in values, `Content-Length` with
//! `Transfer-Encoding`, differing lengths, a `Transfer-Encoding` that does not
//! end in `chunked`, bodies on CONNECT. And hyper's own parse (httparse, the
//! URI and method checks), run first here so that whatever hyper would refuse
//! is answered by us with `Proxy-Status` instead of by hyper with a bare 400.

use crate::error::{ErrorKind, ProxyError};

/// Longest request target hyper accepts (`MAX_URI_LEN` in hyper's h1 role).
const MAX_TARGET_LEN: usize = (u16::MAX - 1) as usize;

/// How a validated request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    NoBody,
    ContentLength(u64),
    Chunked,
    /// CONNECT: what follows is either the next head (if the tunnel was
    /// refused) or tunnel bytes (if it was established).
    Connect,
    /// A bodiless HTTP/1.1 request with an `Upgrade` field: after a `101`
    /// what follows is the new protocol's, otherwise the next head.
    Upgrade,
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
    let mut upgrade = false;
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
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            upgrade = true;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let te = transfer_encoding.get_or_insert_with(Vec::new);
            if !te.is_empty() {
                te.push(b',');
            }
            te.extend_from_slice(value);
        }
    }

    // What hyper itself would refuse is refused here first, so the client
    // gets our answer (with Proxy-Status), never hyper's bare 400.
    hyper_would_accept(head, max_fields)?;
    let uri = http::Uri::try_from(target)
        .map_err(|_| HeadError::Malformed("request target is not a valid URI"))?;

    if method == b"CONNECT" {
        // RFC 9110 §9.3.6: authority-form only.
        if uri.scheme().is_some() || uri.path_and_query().is_some() || uri.authority().is_none() {
            return Err(HeadError::Malformed("CONNECT target must be host:port"));
        }
        if content_length.is_some_and(|n| n > 0) || transfer_encoding.is_some() {
            return Err(HeadError::Malformed("CONNECT must not carry a body"));
        }
        return Ok(Framing::Connect);
    }
    // Any request that may switch protocols waits for its answer (the
    // handler decides for every request, so a wider net only waits).
    if upgrade && !http10 && transfer_encoding.is_none() && content_length.unwrap_or(0) == 0 {
        return Ok(Framing::Upgrade);
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

pub(super) fn trim_ows(mut s: &[u8]) -> &[u8] {
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

/// Runs hyper's request parse over the head: httparse with hyper's default
/// configuration, then the method and URI constructors hyper calls.
fn hyper_would_accept(head: &[u8], max_fields: usize) -> Result<(), HeadError> {
    let mut headers = vec![httparse::EMPTY_HEADER; max_fields];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(HeadError::Malformed("incomplete request head"))
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyFields),
        Err(_) => return Err(HeadError::Malformed("request head does not parse")),
    }
    let (Some(method), Some(path)) = (request.method, request.path) else {
        return Err(HeadError::Malformed("request line does not parse"));
    };
    if path.len() > MAX_TARGET_LEN {
        return Err(HeadError::TooLarge);
    }
    http::Method::from_bytes(method.as_bytes())
        .map_err(|_| HeadError::Malformed("invalid method"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 100;

    fn v(head: &str) -> Result<Framing, HeadError> {
        validate_head(head.as_bytes(), MAX)
    }

    #[test]
    fn a_bodiless_upgrade_request_waits_for_its_answer() {
        assert_eq!(
            v("GET http://a/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
            Ok(Framing::Upgrade)
        );
        assert_eq!(
            v("POST http://a/ HTTP/1.1\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\n"),
            Ok(Framing::ContentLength(3))
        );
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
    fn targets_hyper_refuses_are_refused_here() {
        for target in [
            "CONNECT 127.0.0.1%0d%0aX:80",
            "CONNECT %zz:80",
            "CONNECT a^b:80",
            "GET http://[::1/",
            "CONNECT http://a:80/",
            "CONNECT /path",
        ] {
            let head = format!("{target} HTTP/1.1\r\nHost: a\r\n\r\n");
            assert!(
                matches!(v(&head), Err(HeadError::Malformed(_))),
                "{target} → {:?}",
                v(&head)
            );
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn http_ish() -> impl Strategy<Value = Vec<u8>> {
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

        /// Whatever target the guard accepts, hyper's URI parser accepts too.
        #[test]
        fn accepted_targets_parse_for_hyper(target in "[!-~]{1,40}", connect in any::<bool>()) {
            let method = if connect { "CONNECT" } else { "GET" };
            let head = format!("{method} {target} HTTP/1.1\r\n\r\n");
            if validate_head(head.as_bytes(), 100).is_ok() {
                prop_assert!(http::Uri::try_from(target.as_str()).is_ok());
            }
        }
    }
}
