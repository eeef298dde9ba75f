//! The data plane's one error type.
//!
//! A [`ProxyError`] records what went wrong ([`ErrorKind`]), which side it came
//! from ([`Source`]) and a short detail for humans. The kind alone decides the
//! HTTP status, the RFC 9209 `Proxy-Status` error token, the SOCKS5 reply code
//! and whether the tunnel may be retried on another exit — so every ingress
//! answers the same failure the same way. docs/errors.md is the catalogue.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use proxynet_wire::link::Outcome;
use std::borrow::Cow;

/// Name this gateway uses in `Proxy-Status` (RFC 9209 §2).
pub const PROXY_NAME: &str = "proxynet";

/// Where a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Client,
    ExitLink,
    Target,
    Policy,
    Internal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Missing, malformed or wrong proxy credentials (identical for unknown user).
    AuthRequired,
    /// The request itself is malformed.
    BadRequest,
    /// The request head exceeds the size or field-count limit.
    HeaderTooLarge,
    /// A rate limit (failed authentications, new tunnels) is exceeded.
    TooManyRequests,
    /// The user's bandwidth quota for the current period is used up.
    QuotaExhausted,
    /// The username asks for a source type or country the user may not use.
    TargetingNotAllowed,
    /// This instance is at its client-connection limit.
    ConnectionLimit,
    /// The method is not something a forward proxy does (TRACE, origin-form).
    MethodNotAllowed,
    /// The egress policy forbids the target.
    DestinationProhibited,
    /// A traffic policy (the user's, the account's or the operator's)
    /// refuses the target's domain or port.
    TargetDenied,
    /// No live exit matches the request.
    NoExit,
    /// The exit link failed before the target was contacted (retry-safe).
    ExitUnavailable,
    /// The exit link broke after the target may have been contacted.
    ExitLinkLost,
    /// A `sessmode=hard` session's pinned exit is gone.
    SessionExitLost,
    /// The tunnel asked for the account's dedicated addresses and none is on
    /// a live exit (no silent fallback to shared addresses).
    DedicatedUnavailable,
    /// The target refused the connection.
    ConnectionRefused,
    /// The target's network or host is unreachable.
    DestinationUnreachable,
    /// The target did not answer within the connect budget.
    ConnectionTimeout,
    /// The target's HTTP response was malformed or cut short.
    BadResponse,
    /// The target name did not resolve.
    DnsError,
    /// Redis is unreachable and nothing cached can answer.
    StoreUnavailable,
    /// A bug or resource exhaustion on our side.
    Internal,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 22] = [
        ErrorKind::AuthRequired,
        ErrorKind::BadRequest,
        ErrorKind::HeaderTooLarge,
        ErrorKind::TooManyRequests,
        ErrorKind::QuotaExhausted,
        ErrorKind::TargetingNotAllowed,
        ErrorKind::ConnectionLimit,
        ErrorKind::MethodNotAllowed,
        ErrorKind::DestinationProhibited,
        ErrorKind::TargetDenied,
        ErrorKind::NoExit,
        ErrorKind::ExitUnavailable,
        ErrorKind::ExitLinkLost,
        ErrorKind::SessionExitLost,
        ErrorKind::DedicatedUnavailable,
        ErrorKind::ConnectionRefused,
        ErrorKind::DestinationUnreachable,
        ErrorKind::ConnectionTimeout,
        ErrorKind::BadResponse,
        ErrorKind::DnsError,
        ErrorKind::StoreUnavailable,
        ErrorKind::Internal,
    ];

    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::AuthRequired => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::HeaderTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::QuotaExhausted | ErrorKind::TargetingNotAllowed => StatusCode::FORBIDDEN,
            ErrorKind::ConnectionLimit => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::DestinationProhibited | ErrorKind::TargetDenied => StatusCode::FORBIDDEN,
            ErrorKind::NoExit | ErrorKind::ExitUnavailable | ErrorKind::StoreUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::ExitLinkLost
            | ErrorKind::SessionExitLost
            | ErrorKind::DedicatedUnavailable
            | ErrorKind::ConnectionRefused
            | ErrorKind::DestinationUnreachable
            | ErrorKind::BadResponse
            | ErrorKind::DnsError => StatusCode::BAD_GATEWAY,
            ErrorKind::ConnectionTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// RFC 9209 §2.3 error type.
    pub fn proxy_status_error(self) -> &'static str {
        match self {
            ErrorKind::AuthRequired
            | ErrorKind::MethodNotAllowed
            | ErrorKind::TooManyRequests
            | ErrorKind::QuotaExhausted
            | ErrorKind::TargetingNotAllowed
            | ErrorKind::TargetDenied => "http_request_denied",
            ErrorKind::BadRequest | ErrorKind::HeaderTooLarge => "http_request_error",
            ErrorKind::ConnectionLimit => "connection_limit_reached",
            ErrorKind::BadResponse => "http_protocol_error",
            ErrorKind::DestinationProhibited => "destination_ip_prohibited",
            ErrorKind::NoExit | ErrorKind::ExitUnavailable => "destination_unavailable",
            ErrorKind::ExitLinkLost => "connection_terminated",
            ErrorKind::SessionExitLost | ErrorKind::DedicatedUnavailable => {
                "destination_unavailable"
            }
            ErrorKind::ConnectionRefused => "connection_refused",
            ErrorKind::DestinationUnreachable => "destination_ip_unroutable",
            ErrorKind::ConnectionTimeout => "connection_timeout",
            ErrorKind::DnsError => "dns_error",
            ErrorKind::StoreUnavailable => "proxy_internal_error",
            ErrorKind::Internal => "proxy_internal_error",
        }
    }

    /// RFC 1928 §6 reply code.
    pub fn socks_reply(self) -> u8 {
        match self {
            ErrorKind::DestinationProhibited
            | ErrorKind::TargetDenied
            | ErrorKind::AuthRequired
            | ErrorKind::TooManyRequests
            | ErrorKind::QuotaExhausted
            | ErrorKind::TargetingNotAllowed => 0x02,
            ErrorKind::NoExit | ErrorKind::ExitUnavailable | ErrorKind::DedicatedUnavailable => {
                0x03
            }
            ErrorKind::DestinationUnreachable
            | ErrorKind::DnsError
            | ErrorKind::SessionExitLost => 0x04,
            ErrorKind::ConnectionRefused => 0x05,
            ErrorKind::ConnectionTimeout => 0x06,
            ErrorKind::MethodNotAllowed => 0x07,
            ErrorKind::BadRequest
            | ErrorKind::HeaderTooLarge
            | ErrorKind::ConnectionLimit
            | ErrorKind::BadResponse
            | ErrorKind::ExitLinkLost
            | ErrorKind::StoreUnavailable
            | ErrorKind::Internal => 0x01,
        }
    }

    pub fn source(self) -> Source {
        match self {
            ErrorKind::AuthRequired
            | ErrorKind::BadRequest
            | ErrorKind::HeaderTooLarge
            | ErrorKind::TooManyRequests
            | ErrorKind::QuotaExhausted
            | ErrorKind::TargetingNotAllowed
            | ErrorKind::MethodNotAllowed => Source::Client,
            ErrorKind::DestinationProhibited | ErrorKind::TargetDenied => Source::Policy,
            ErrorKind::ExitUnavailable
            | ErrorKind::ExitLinkLost
            | ErrorKind::SessionExitLost
            | ErrorKind::DedicatedUnavailable => Source::ExitLink,
            ErrorKind::ConnectionRefused
            | ErrorKind::DestinationUnreachable
            | ErrorKind::ConnectionTimeout
            | ErrorKind::BadResponse
            | ErrorKind::DnsError => Source::Target,
            ErrorKind::NoExit
            | ErrorKind::ConnectionLimit
            | ErrorKind::StoreUnavailable
            | ErrorKind::Internal => Source::Internal,
        }
    }

    /// True when nothing reached the target, so another exit may be tried.
    pub fn retry_safe(self) -> bool {
        matches!(self, ErrorKind::ExitUnavailable)
    }

    /// How a typed agent outcome is reported to the client.
    pub fn from_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Connected => ErrorKind::Internal,
            Outcome::Refused => ErrorKind::ConnectionRefused,
            Outcome::TimedOut => ErrorKind::ConnectionTimeout,
            Outcome::Unreachable => ErrorKind::DestinationUnreachable,
            Outcome::DnsError => ErrorKind::DnsError,
            Outcome::PolicyDenied => ErrorKind::DestinationProhibited,
            // The agent refused before dialling (a version it does not speak
            // counts), or the partner gateway of an upstream exit refused
            // before reaching the target: another exit may take the same
            // tunnel.
            Outcome::EgressUnavailable
            | Outcome::Draining
            | Outcome::Capacity
            | Outcome::BadRequest
            | Outcome::UpstreamRefused => ErrorKind::ExitUnavailable,
        }
    }
}

/// An answer to the client, and why. `kind` and `detail` are what the client
/// is told (status, `Proxy-Status` token and details, the body); `cause` is
/// what went wrong inside (a library's error text, an address of the stack)
/// and goes to the log only — `Display` shows it, the wire never does.
#[derive(Debug, Clone)]
pub struct ProxyError {
    pub kind: ErrorKind,
    /// Client-safe: names the problem in the client's terms.
    pub detail: Cow<'static, str>,
    /// Seconds for `Retry-After` on 429/503.
    pub retry_after: Option<u32>,
    cause: Option<std::sync::Arc<str>>,
}

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.proxy_status_error(), self.detail)?;
        match &self.cause {
            Some(cause) => write!(f, " ({cause})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for ProxyError {}

impl ProxyError {
    pub fn new(kind: ErrorKind, detail: impl Into<Cow<'static, str>>) -> Self {
        // Every 503 and 429 tells the client when to come back (429s that know
        // better set their own value).
        let retry_after = matches!(
            kind.status(),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        )
        .then_some(1);
        Self {
            kind,
            detail: detail.into(),
            retry_after,
            cause: None,
        }
    }

    /// Records the internal cause, for the log only.
    pub fn caused_by(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(cause.to_string().into());
        self
    }

    /// The internal cause, if one was recorded (never sent to the client).
    pub fn cause(&self) -> Option<&str> {
        self.cause.as_deref()
    }

    pub fn auth_required() -> Self {
        Self::new(ErrorKind::AuthRequired, "proxy authentication required")
    }

    /// The `Proxy-Status` field value: `proxynet; error=TOKEN; details="..."`.
    pub fn proxy_status(&self) -> String {
        format!(
            "{PROXY_NAME}; error={}; details=\"{}\"",
            self.kind.proxy_status_error(),
            sf_string_escape(&self.detail)
        )
    }

    /// The HTTP answer for this error: status, `Proxy-Status`, plain-text body.
    pub fn to_response(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(format!("{}\n", self.detail))));
        *response.status_mut() = self.kind.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Ok(v) = HeaderValue::from_str(&self.proxy_status()) {
            headers.insert("proxy-status", v);
        }
        if self.kind == ErrorKind::AuthRequired {
            headers.insert(
                header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"proxynet\", charset=\"UTF-8\""),
            );
        }
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// The same answer as [`Self::to_response`], serialised for a connection
    /// hyper does not own (the head guard, the connection limit). It closes
    /// the connection, as nothing more will be read from it.
    pub fn to_wire(&self) -> Vec<u8> {
        self.wire(true)
    }

    /// [`Self::to_wire`] for a connection that stays open for the next
    /// request, as hyper sends it (the first-CONNECT path's refusals).
    pub fn to_wire_kept_alive(&self) -> Vec<u8> {
        self.wire(false)
    }

    fn wire(&self, close: bool) -> Vec<u8> {
        let response = self.to_response();
        let body = format!("{}\n", self.detail);
        let mut headers = response.headers().clone();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        if close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        serialize_response(response.status(), &headers, body.as_bytes())
    }
}

/// An HTTP/1.1 response as bytes: status line, `headers` in their order, a
/// blank line, `body` (for connections whose answers hyper does not write).
pub fn serialize_response(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
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

/// Escapes text for an RFC 8941 sf-string: printable ASCII only, `"` and `\` escaped.
fn sf_string_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().take(256) {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_reaches_the_log_but_never_the_client() {
        let error = ProxyError::new(ErrorKind::ExitLinkLost, "the exit link failed")
            .caused_by("h2 protocol error: 10.0.0.7:9000 reset");
        let wire = String::from_utf8(error.to_wire()).unwrap();
        assert!(!wire.contains("10.0.0.7"), "{wire}");
        assert!(!error.proxy_status().contains("h2 protocol"));
        assert!(error.to_string().contains("10.0.0.7:9000 reset"));
        assert_eq!(
            error.cause(),
            Some("h2 protocol error: 10.0.0.7:9000 reset")
        );
    }

    #[test]
    fn proxy_status_escapes_details() {
        let e = ProxyError::new(ErrorKind::ConnectionRefused, "say \"no\"\r\n\\");
        assert_eq!(
            e.proxy_status(),
            "proxynet; error=connection_refused; details=\"say \\\"no\\\"??\\\\\""
        );
    }

    #[test]
    fn auth_errors_carry_proxy_authenticate() {
        let r = ProxyError::auth_required().to_response();
        assert_eq!(r.status(), 407);
        assert!(r.headers().contains_key(header::PROXY_AUTHENTICATE));
        assert!(r.headers().contains_key("proxy-status"));
    }

    #[test]
    fn retry_safety_is_one_rule() {
        // An agent outcome is retried exactly when the target was not touched.
        for o in Outcome::ALL
            .into_iter()
            .filter(|o| *o != Outcome::Connected)
        {
            assert_eq!(
                ErrorKind::from_outcome(o).retry_safe(),
                o.target_untouched(),
                "{o:?}"
            );
        }
    }

    #[test]
    fn every_503_and_429_carries_retry_after() {
        for kind in ErrorKind::ALL {
            let r = ProxyError::new(kind, "x").to_response();
            if matches!(r.status().as_u16(), 503 | 429) {
                assert!(r.headers().contains_key(header::RETRY_AFTER), "{kind:?}");
            }
        }
    }

    #[test]
    fn wire_form_matches_the_response() {
        let wire = String::from_utf8(ProxyError::auth_required().to_wire()).unwrap();
        assert!(wire.starts_with("HTTP/1.1 407 Proxy Authentication Required\r\n"));
        assert!(wire.contains("proxy-authenticate: Basic"), "{wire}");
        assert!(wire.contains("proxy-status: proxynet; error=http_request_denied"));
        assert!(wire.ends_with("\r\n\r\nproxy authentication required\n"));
    }
}
