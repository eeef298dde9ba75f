//! What a tunnel request is made of, as plain data: the ingress it came in
//! on, the credentials and target the ingress read off the wire, and — once
//! the pipeline has logged it in — the [`Client`] it runs for.
//!
//! A leaf: every stage reads these types, none of them reaches back into a
//! stage.

use proxynet_common::egress::Cidr;
use proxynet_common::secret::Secret;
use proxynet_store::{AccountLimits, QuotaPeriod};
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::target::Target;
use proxynet_wire::username::ParsedUsername;

/// Which client protocol a tunnel came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ingress {
    Connect,
    Forward,
    Socks5,
    /// A `CONNECT` stream of an HTTP/2 connection (RFC 9113 §8.5).
    H2Connect,
    /// An absolute-URI request on an HTTP/2 connection.
    H2Forward,
    /// A SOCKS5 UDP association (RFC 1928 §7).
    Socks5Udp,
}

impl Ingress {
    /// Every ingress, in declaration order (`ingress as usize` indexes it).
    pub(crate) const ALL: [Ingress; 6] = [
        Ingress::Connect,
        Ingress::Forward,
        Ingress::Socks5,
        Ingress::H2Connect,
        Ingress::H2Forward,
        Ingress::Socks5Udp,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ingress::Connect => "connect",
            Ingress::Forward => "forward",
            Ingress::Socks5 => "socks5",
            Ingress::H2Connect => "h2_connect",
            Ingress::H2Forward => "h2_forward",
            Ingress::Socks5Udp => "socks5_udp",
        }
    }
}

/// The request header carrying username-grammar options without the base
/// user (`country-de-session-abc`), for clients that cannot put them in a
/// username (allow-listed addresses, browsers, SDKs): they replace the
/// username's options (docs/username.md, "Options by header"). Read on
/// CONNECT, absolute-form and HTTP/2 requests; never forwarded.
pub(crate) const OPTIONS_HEADER: &str = "proxynet-options";

/// The request header by which a client says the site it asks for refused
/// the exit its session last used (`Proxynet-Report: blocked`): that exit
/// is cooled for the site in the account's routing before the exit is
/// chosen, so the session moves (docs/health.md, "Reports by header").
/// Read on CONNECT, absolute-form and HTTP/2 requests; never forwarded.
pub(crate) const REPORT_HEADER: &str = "proxynet-report";

/// What a `Proxynet-Report` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SiteReport {
    /// `blocked`: the site refused the session's exit.
    Blocked,
    /// Any other value: ignored (and counted), never a refusal, so a
    /// client's typo cannot fail its requests.
    Unrecognized,
}

impl SiteReport {
    /// The header's value, read as the grammar's words are: ASCII, case
    /// and surrounding blanks ignored.
    pub(crate) fn from_value(value: &[u8]) -> Self {
        if value.trim_ascii().eq_ignore_ascii_case(b"blocked") {
            SiteReport::Blocked
        } else {
            SiteReport::Unrecognized
        }
    }
}

/// Proxy credentials as the client presented them.
pub(crate) struct Credentials {
    /// The full proxy username, grammar and all (`alice-session-x1`).
    pub username: String,
    pub password: Secret,
}

/// The destination as the ingress read it, parsed by the pipeline.
pub(crate) enum TargetSpec<'a> {
    /// CONNECT's authority-form `host:port` (the port is required).
    Authority(&'a str),
    /// An absolute-form URL's authority (`host[:port]`, port 80 when absent).
    UrlAuthority(&'a str),
    /// Already structured (SOCKS5).
    Parsed(Target),
}

/// A target as the ingress read it, with what its client reported about
/// the target's site (the `Proxynet-Report` header), if anything. A
/// [`TargetSpec`] is one without a report.
pub(crate) struct TargetAsk<'a> {
    pub spec: TargetSpec<'a>,
    pub report: Option<SiteReport>,
}

impl<'a> From<TargetSpec<'a>> for TargetAsk<'a> {
    fn from(spec: TargetSpec<'a>) -> Self {
        Self { spec, report: None }
    }
}

impl<'a> TargetSpec<'a> {
    /// This target with the client's report on its site (`None`: the
    /// request carried no `Proxynet-Report`).
    pub(crate) fn reported(self, report: Option<SiteReport>) -> TargetAsk<'a> {
        TargetAsk { spec: self, report }
    }
}

impl TargetSpec<'_> {
    pub(crate) fn parse(self) -> Result<Target, ProxyError> {
        let parsed = match self {
            TargetSpec::Authority(a) => Target::parse_authority(a),
            TargetSpec::UrlAuthority(a) => Target::parse_url_authority(a, 80),
            TargetSpec::Parsed(t) => return Ok(t),
        };
        parsed.map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("bad target: {e}")))
    }
}

/// Who is asking: the authenticated user and what their username asked for,
/// already bounded by what the account allows (only the pipeline's
/// authorize stage makes one; a copy is the same authenticated client, for
/// another attempt of one request).
#[derive(Clone)]
pub(crate) struct Client {
    pub user_id: Uuid,
    pub account_id: Uuid,
    /// The base username (no grammar, never the password).
    pub username: String,
    pub credential_digest: [u8; 32],
    pub limits: UserLimits,
    pub request: ParsedUsername,
    /// The allow-listed network it logged in by (no credentials).
    pub network: Option<Cidr>,
    /// The record it was authorized by: its and its account's traffic
    /// policies are read from it by the target-policy stage.
    pub record: std::sync::Arc<proxynet_store::UserRecord>,
}

/// The limits of one user, from their record.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UserLimits {
    pub max_concurrent_tunnels: Option<u32>,
    pub max_new_tunnels_per_second: Option<u32>,
    /// Bytes (up + down) per period.
    pub bandwidth: Option<(u64, QuotaPeriod)>,
    /// The account's totals over all its users (its entitlements).
    pub account: Option<AccountLimits>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_says_blocked_or_nothing_the_gateway_acts_on() {
        for blocked in [&b"blocked"[..], b"Blocked", b" BLOCKED\t"] {
            assert_eq!(SiteReport::from_value(blocked), SiteReport::Blocked);
        }
        for other in [&b"ok"[..], b"", b"blocked, slow", b"\xffblocked"] {
            assert_eq!(SiteReport::from_value(other), SiteReport::Unrecognized);
        }
        let asked: TargetAsk<'_> = TargetSpec::Authority("h:1").into();
        assert_eq!(asked.report, None);
        let asked = TargetSpec::Authority("h:1").reported(Some(SiteReport::Blocked));
        assert_eq!(asked.report, Some(SiteReport::Blocked));
    }
}
