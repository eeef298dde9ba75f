//! The HTTP `CONNECT` handshake with a partner's gateway, and what its
//! answer means for the tunnel.

use super::{gateway_failed, Target, MAX_HEAD_BYTES};
use base64::Engine as _;
use proxynet_wire::link::Outcome;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(super) async fn http_connect(
    stream: &mut TcpStream,
    username: &str,
    password: &str,
    target: &Target,
    port: u16,
    sent: &AtomicBool,
) -> Result<(), Outcome> {
    let authority = target.authority(port);
    let credential =
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    let request = format!(
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Basic {credential}\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(gateway_failed)?;
    sent.store(true, Ordering::Relaxed);
    let head = read_head(stream).await?;
    let (status, headers) = parse_head(&head)?;
    http_outcome(status, &headers)
}

/// Reads the response head, up to and including its blank line, and not a
/// byte more: whatever the gateway sent after it (a target that speaks
/// first) belongs to the tunnel. It peeks, then takes from the socket only
/// the bytes the head used.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Outcome> {
    const END: &[u8] = b"\r\n\r\n";
    let mut head: Vec<u8> = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    loop {
        let room = MAX_HEAD_BYTES - head.len();
        if room == 0 {
            return Err(Outcome::UpstreamRefused);
        }
        let want = room.min(buf.len());
        let peeked = stream
            .peek(&mut buf[..want])
            .await
            .map_err(gateway_failed)?;
        if peeked == 0 {
            return Err(Outcome::UpstreamRefused); // closed before the head ended
        }
        let before = head.len();
        head.extend_from_slice(&buf[..peeked]);
        // The blank line may straddle what was held and what was peeked;
        // `head[..before]` holds no complete one.
        let from = before.saturating_sub(END.len() - 1);
        let end = head[from..]
            .windows(END.len())
            .position(|w| w == END)
            .map(|at| from + at + END.len());
        let take = end.map_or(peeked, |end| end - before);
        head.truncate(before + take);
        stream
            .read_exact(&mut buf[..take])
            .await
            .map_err(gateway_failed)?;
        if end.is_some() {
            return Ok(head);
        }
    }
}

/// The status and the headers (names lower-cased) of a response head.
pub(super) fn parse_head(head: &[u8]) -> Result<(u16, Vec<(String, String)>), Outcome> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.")
        || code.len() != 3
        || !code.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(Outcome::UpstreamRefused);
    }
    let status = code.parse::<u16>().map_err(|_| Outcome::UpstreamRefused)?;
    let mut headers = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(Outcome::UpstreamRefused)?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok((status, headers))
}

/// What a gateway's status (and for 502–504 its detail) means; see
/// [`connect_through`].
pub(super) fn http_outcome(status: u16, headers: &[(String, String)]) -> Result<(), Outcome> {
    match status {
        // RFC 9110 §9.3.6: a 2xx to CONNECT carries no body; one that
        // says it does is a gateway page, not a tunnel.
        200..=299
            if headers.iter().any(|(name, value)| {
                name == "transfer-encoding" || (name == "content-length" && value.trim() != "0")
            }) =>
        {
            Err(Outcome::UpstreamRefused)
        }
        200..=299 => Ok(()),
        // Our credential, or the account's limits, at the partner.
        407 => Err(Outcome::UpstreamRefused),
        403 => Err(Outcome::PolicyDenied),
        // The partner's own limits and authentication: its refusal of us.
        401 | 429 => Err(Outcome::UpstreamRefused),
        // The partner refusing what this tunnel asked (an unknown city, a
        // malformed target): about the request, not the exit's health.
        400..=499 => Err(Outcome::Unreachable),
        502..=504 => Err(failure_detail(headers).unwrap_or(if status == 504 {
            Outcome::TimedOut
        } else {
            Outcome::UpstreamRefused
        })),
        _ => Err(Outcome::UpstreamRefused),
    }
}

/// What the gateway says happened at the target, if it says.
fn failure_detail(headers: &[(String, String)]) -> Option<Outcome> {
    headers
        .iter()
        .find_map(|(name, value)| match name.as_str() {
            "x-squid-error" => squid_error(value),
            "proxy-status" => proxy_status_error(value),
            _ => None,
        })
}

/// Squid's `X-Squid-Error: ERR_CONNECT_FAIL 111` (the errno of the connect).
fn squid_error(value: &str) -> Option<Outcome> {
    let mut words = value.split_whitespace();
    let code = words.next()?;
    let errno = words.next().and_then(|w| w.parse::<u32>().ok());
    match code {
        "ERR_DNS_FAIL" => Some(Outcome::DnsError),
        "ERR_CONNECT_FAIL" => Some(match errno {
            Some(110) => Outcome::TimedOut,          // ETIMEDOUT
            Some(101 | 113) => Outcome::Unreachable, // ENETUNREACH, EHOSTUNREACH
            _ => Outcome::Refused,
        }),
        _ => None,
    }
}

/// RFC 9209 `Proxy-Status: gw; error=connection_refused; details="..."`;
/// the first known `error` wins (the member nearest the target comes first).
fn proxy_status_error(value: &str) -> Option<Outcome> {
    split_unquoted(value).into_iter().find_map(|param| {
        let (key, token) = param.split_once('=')?;
        if !key.trim().eq_ignore_ascii_case("error") {
            return None;
        }
        match token.trim().trim_matches('"') {
            "connection_refused" => Some(Outcome::Refused),
            "dns_error" | "dns_timeout" => Some(Outcome::DnsError),
            "connection_timeout" => Some(Outcome::TimedOut),
            "destination_ip_unroutable" | "destination_unavailable" => Some(Outcome::Unreachable),
            "destination_ip_prohibited" => Some(Outcome::PolicyDenied),
            _ => None,
        }
    })
}

/// Splits a structured-field list at `;` and `,` outside quoted strings, so a
/// `details="...; error=..."` cannot pass for a parameter.
fn split_unquoted(value: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' | ',' if !quoted => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}
