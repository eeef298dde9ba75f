//! Upstream exits: tunnels opened through a partner's backconnect gateway.
//!
//! An upstream exit does not dial targets itself. For each tunnel it connects
//! to a partner's gateway (HTTP `CONNECT` or SOCKS5, both with a username and
//! password) and asks it for the target; the partner's own exit carries the
//! bytes. The username is rendered per tunnel from a [`Template`], which is
//! how such gateways take their options (`acme-country-us-session-s1`).
//!
//! What this module provides, for the tunnel code to call in order:
//! - [`Upstream::parse`]: the gateway, from `--upstream` and friends;
//! - [`vet_target`]: the agent's own egress policy on the target, before the
//!   partner is asked (an IP literal fully, a name by what it says: the name
//!   is never resolved here, DNS stays at the partner);
//! - [`connect_through`]: the handshake on a stream the caller already
//!   connected to the gateway (the caller dials, so it binds and times the
//!   dial as it does for any target), giving the stream back ready to carry
//!   the tunnel's bytes.
//!
//! Every failure is a typed [`Outcome`]. The partner's own refusals (its
//! authentication, its capacity, its errors, a garbled or missing answer) are
//! [`Outcome::UpstreamRefused`]: the exit's fault, nothing reached the target,
//! so the superproxy may retry on another exit. What the partner reports about
//! the target itself maps to the outcome the agent would have given had it
//! dialled: refused, timed out, unreachable, DNS error, denied.
//!
//! The password never leaves a [`Secret`] except into the handshake bytes; it
//! is never logged. The rendered username is logged at debug level at most.
//! `http://` and `socks5h://` carry the credential in clear text to the
//! partner, as those gateways expect; `https://` is not supported yet.

use proxynet_common::egress::{parse_ip_literal, EgressPolicy};
use proxynet_common::secret::Secret;
use proxynet_wire::link::Outcome;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpStream;
use tokio::time::Instant;

mod http;
mod socks5;
mod template;
#[cfg(test)]
mod tests;

use http::http_connect;
use socks5::socks5_connect;
pub(crate) use template::{Template, UpstreamAsk};

/// Largest HTTP response head accepted from a gateway: a `CONNECT` answer is
/// a status line and a few headers; anything longer is not one.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How the gateway is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// HTTP/1.1 `CONNECT` with `Proxy-Authorization: Basic`.
    Http,
    /// SOCKS5 with username/password (RFC 1928/1929), names sent as names
    /// (`socks5h`: the partner resolves). `socks5://` is read as this too:
    /// this agent never resolves a target for the partner.
    Socks5h,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Socks5h => "socks5h",
        }
    }
}

/// A partner's gateway and how to authenticate to it.
#[derive(Clone)]
pub(crate) struct Upstream {
    scheme: Scheme,
    /// A name or an IP address, IPv6 without brackets.
    host: String,
    port: u16,
    /// The account at the partner; what `{user}` renders to.
    user: String,
    password: Secret,
    template: Template,
}

// By hand: the password is left out altogether (not even its length).
impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("scheme", &self.scheme)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("template", &self.template)
            .finish_non_exhaustive()
    }
}

/// `scheme://host:port`, without the user: what a log line names.
impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.scheme.as_str();
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

impl Upstream {
    /// Reads `http://[user@]host:port` or `socks5h://[user@]host:port`
    /// (`socks5://` is taken as `socks5h://`; an IPv6 host goes in brackets),
    /// the username template, and the password (the content of
    /// `--upstream-password-file`; a trailing newline is dropped).
    ///
    /// Refused: `https://` (not supported yet), a password inside the URL (it
    /// would show on a command line and in the process list), a missing port,
    /// a path, query or fragment, a template that uses `{user}` when the URL
    /// names no user, and a missing or empty password. Error messages never
    /// repeat the URL: it may carry a password.
    pub(crate) fn parse(
        url: &str,
        template: &str,
        password: Option<String>,
    ) -> Result<Upstream, String> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(
                "the upstream URL needs a scheme: http://user@host:port or socks5h://user@host:port"
                    .into(),
            );
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "socks5h" | "socks5" => Scheme::Socks5h,
            "https" => {
                return Err(
                    "an https:// upstream (TLS to the partner's gateway) is not supported yet: use http:// or socks5h://"
                        .into(),
                )
            }
            other if other.bytes().all(|b| b.is_ascii_alphanumeric()) => {
                return Err(format!(
                    "upstream scheme {other}:// is not supported: use http:// or socks5h://"
                ))
            }
            _ => return Err("the upstream URL's scheme is not http:// or socks5h://".into()),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(
                "the upstream URL is scheme://[user@]host:port, without a path, query or fragment"
                    .into(),
            );
        }
        let (user, host_port) = rest.rsplit_once('@').unwrap_or(("", rest));
        if user.contains(':') {
            return Err(
                "the upstream URL carries a password: put it in the file --upstream-password-file names instead, so it never shows on a command line"
                    .into(),
            );
        }
        check_user(user)?;
        let (host, port) = split_host_port(host_port)?;

        let password = password
            .map(|p| p.trim_end_matches(['\r', '\n']).to_owned())
            .filter(|p| !p.is_empty())
            .ok_or(
                "an upstream exit needs the partner's password: give --upstream-password-file",
            )?;
        if scheme == Scheme::Socks5h && password.len() > 255 {
            return Err("the upstream password is longer than SOCKS5 allows (255 bytes)".into());
        }

        let template = Template::parse(template)?;
        if template.uses_user() && user.is_empty() {
            return Err(
                "the username template uses {user} but the upstream URL names no user (scheme://user@host:port)"
                    .into(),
            );
        }
        Ok(Upstream {
            scheme,
            host,
            port,
            user: user.to_owned(),
            password: Secret::new(password),
            template,
        })
    }

    /// The gateway's host: a name or an IP address (IPv6 without brackets),
    /// ready for `TcpStream::connect((host, port))`.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// What the control plane is told at enrollment: where the gateway is,
    /// the countries it serves (as given; the token's own is added there)
    /// and which targeting keys the template carries. Never the password.
    pub(crate) fn declaration(&self, countries: &[String]) -> crate::control::UpstreamDeclaration {
        crate::control::UpstreamDeclaration {
            scheme: self.scheme.as_str(),
            host: self.host.clone(),
            port: self.port,
            countries: countries
                .iter()
                .map(|c| c.trim().to_ascii_uppercase())
                .filter(|c| !c.is_empty())
                .collect(),
            keys: self.template.keys().names(),
        }
    }
}

/// The account name goes into a Basic credential (`user:password`) and a
/// URL: no `:` and nothing that would end the URL's user part.
fn check_user(user: &str) -> Result<(), String> {
    let fits = user.bytes().all(|b| {
        b.is_ascii_graphic()
            && !matches!(
                b,
                b':' | b'@' | b'/' | b'?' | b'#' | b'[' | b']' | b'%' | b'{' | b'}'
            )
    });
    if fits {
        Ok(())
    } else {
        Err("the upstream user may hold only printable ASCII, without : @ / ? # [ ] % { }".into())
    }
}

/// `host:port` or `[v6]:port`; the port is required.
fn split_host_port(host_port: &str) -> Result<(String, u16), String> {
    let needs_port = || "the upstream URL needs a port: scheme://user@host:port".to_owned();
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (inner, after) = bracketed
            .split_once(']')
            .ok_or("the upstream host opens a [ it never closes")?;
        inner
            .parse::<Ipv6Addr>()
            .map_err(|_| format!("upstream host [{inner}] is not an IPv6 address"))?;
        (
            inner.to_owned(),
            after.strip_prefix(':').ok_or_else(needs_port)?,
        )
    } else {
        let (host, port) = host_port.rsplit_once(':').ok_or_else(needs_port)?;
        if host.contains(':') {
            return Err(
                "an IPv6 upstream host goes in brackets: http://user@[2001:db8::1]:3128".into(),
            );
        }
        let is_name = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !is_name {
            return Err(format!(
                "upstream host {host:?} is not a host name or address"
            ));
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("upstream port {port:?} is not a port number (1-65535)"))?;
    Ok((host, port))
}

/// The agent's egress policy on a target before the partner is asked.
///
/// An IP literal (any spelling [`parse_ip_literal`] understands: `127.1` is
/// loopback) is judged like an address the agent would dial. A name is not
/// resolved — DNS stays at the partner — so it is judged by what it says:
/// `localhost`, a name under `.localhost`, `.local`, `.internal` or
/// `.home.arpa`, and a single label (`intranet`) are refused, and so is a
/// denied port. Everything else is the partner's to reach.
pub(crate) fn vet_target(policy: &EgressPolicy, host: &str, port: u16) -> Result<(), Outcome> {
    if let Some(ip) = parse_ip_literal(host) {
        return policy.check(SocketAddr::new(ip, port)).map_err(|denial| {
            tracing::info!(target = %host, port, reason = %denial, "egress policy denied upstream target");
            Outcome::PolicyDenied
        });
    }
    if policy.config().denied_ports.contains(&port) {
        tracing::info!(target = %host, port, "egress policy denied upstream target's port");
        return Err(Outcome::PolicyDenied);
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    // A name ending in a number is an address in disguise to some resolver
    // (`0000…0177.0.0.1`, `127.1`, `0x7f.1`): the partner's might read it
    // as one we would deny. No public name ends in a numeric label.
    let numeric_tail = name.rsplit('.').next().is_some_and(|label| {
        label.bytes().all(|b| b.is_ascii_digit())
            || (label.starts_with("0x") && label[2..].bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if numeric_tail {
        tracing::info!(target = %host, port, "upstream target is a numeric name");
        return Err(Outcome::PolicyDenied);
    }
    let local = !name.contains('.')
        || name == "localhost"
        || [".localhost", ".local", ".internal", ".home.arpa"]
            .iter()
            .any(|suffix| name.ends_with(*suffix));
    if local {
        tracing::info!(target = %host, port, "upstream target names a local host");
        return Err(Outcome::PolicyDenied);
    }
    Ok(())
}

/// A target as the partner is told it: IP literals in their canonical form
/// (so the partner cannot read `0x7f.1` differently from us), names as given.
enum Target {
    Ip(IpAddr),
    Name(String),
}

impl Target {
    /// A name that no resolver would answer (wrong characters, too long) is a
    /// DNS error, as it would be had the agent looked it up itself.
    fn of(host: &str) -> Result<Target, Outcome> {
        if let Some(ip) = parse_ip_literal(host) {
            return Ok(Target::Ip(ip));
        }
        let is_name = !host.is_empty()
            && host.len() <= 255
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if is_name {
            Ok(Target::Name(host.to_owned()))
        } else {
            Err(Outcome::DnsError)
        }
    }

    /// `host:port` for a `CONNECT` line, an IPv6 address in brackets.
    fn authority(&self, port: u16) -> String {
        match self {
            Target::Ip(ip) => SocketAddr::new(*ip, port).to_string(),
            Target::Name(name) => format!("{name}:{port}"),
        }
    }
}

/// Asks the partner's gateway, on `stream` (already connected to it), for a
/// tunnel to `target_host:target_port`, and gives the stream back carrying
/// the tunnel: no byte after the gateway's answer has been read.
///
/// Outcomes (HTTP): 2xx is success; 407 (the partner refused our
/// credential), any other status, a garbled or cut-off answer are
/// `upstream_refused`; 403 is `policy_denied` (the partner refuses the
/// target); 502, 503 and 504 are read for the partner's detail —
/// `X-Squid-Error: ERR_CONNECT_FAIL <errno>` (110: `timed_out`, 101/113:
/// `unreachable`, else `refused`), `ERR_DNS_FAIL` (`dns_error`), or a
/// `Proxy-Status` `error=` of `connection_refused` (`refused`),
/// `dns_error`/`dns_timeout` (`dns_error`), `connection_timeout`
/// (`timed_out`), `destination_ip_unroutable`/`destination_unavailable`
/// (`unreachable`), `destination_ip_prohibited` (`policy_denied`) — and
/// without one a 504 is `timed_out`, a 502 or 503 `upstream_refused`.
///
/// Outcomes (SOCKS5): the partner not accepting username/password or our
/// credential is `upstream_refused`; reply 0x02 is `policy_denied`, 0x03 and
/// 0x04 `unreachable`, 0x05 `refused`, 0x06 `timed_out`, anything else
/// `upstream_refused`.
///
/// `deadline` bounds the whole handshake. Reaching it is `upstream_refused`:
/// the partner did not answer in time, which is its fault (had it tried the
/// target and timed out, it would have said so, and that is `timed_out`).
pub(crate) async fn connect_through(
    upstream: &Upstream,
    mut stream: TcpStream,
    target_host: &str,
    target_port: u16,
    ask: &UpstreamAsk,
    deadline: Instant,
) -> Result<TcpStream, Outcome> {
    let target = Target::of(target_host)?;
    let username = upstream.template.render(&upstream.user, ask);
    // The username says which session and place a customer asked for: debug
    // level only. The password is never logged.
    tracing::debug!(upstream = %upstream, %username, "asking the upstream gateway for a tunnel");
    // Set once the request naming the target has gone out: a gateway slow
    // after that may be waiting on the target, which is not its fault.
    let sent = AtomicBool::new(false);
    let handshake = async {
        match upstream.scheme {
            Scheme::Http => {
                http_connect(
                    &mut stream,
                    &username,
                    upstream.password.expose(),
                    &target,
                    target_port,
                    &sent,
                )
                .await
            }
            Scheme::Socks5h => {
                socks5_connect(
                    &mut stream,
                    &username,
                    upstream.password.expose(),
                    &target,
                    target_port,
                    &sent,
                )
                .await
            }
        }
    };
    let answered = tokio::time::timeout_at(deadline, handshake).await;
    match answered {
        Ok(Ok(())) => Ok(stream),
        Ok(Err(outcome)) => {
            tracing::debug!(upstream = %upstream, outcome = outcome.as_str(), "the upstream gateway refused the tunnel");
            Err(outcome)
        }
        // Before the request went out the gateway itself is slow (its
        // fault); after, it may be waiting on the target: a target that
        // never answers must not get the exit ejected.
        Err(_) if sent.load(Ordering::Relaxed) => Err(Outcome::TimedOut),
        Err(_) => {
            tracing::debug!(upstream = %upstream, "the upstream gateway did not answer in time");
            Err(Outcome::UpstreamRefused)
        }
    }
}

/// Any i/o failure talking to the gateway is the gateway's failure.
fn gateway_failed(_: std::io::Error) -> Outcome {
    Outcome::UpstreamRefused
}
