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

use base64::Engine as _;
use proxynet_common::egress::{parse_ip_literal, EgressPolicy};
use proxynet_common::secret::Secret;
use proxynet_wire::link::Outcome;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

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

/// What a tunnel asks of the partner, rendered into the username. Values are
/// the customer's and are sanitised by [`Template::render`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UpstreamAsk {
    pub(crate) session: Option<String>,
    pub(crate) country: Option<String>,
    pub(crate) city: Option<String>,
}

/// A placeholder of the username template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    User,
    Session,
    Country,
    City,
}

const SLOT_NAMES: &str = "{user}, {session}, {country}, {city}";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Slot(Slot),
}

/// Which tunnel options a template passes on: what the exit can declare its
/// partner supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TemplateKeys {
    pub(crate) session: bool,
    pub(crate) country: bool,
    pub(crate) city: bool,
}

impl TemplateKeys {
    /// `session`, `country`, `city`: those the template uses, in that order.
    pub(crate) fn names(self) -> Vec<&'static str> {
        [
            (self.session, "session"),
            (self.country, "country"),
            (self.city, "city"),
        ]
        .into_iter()
        .filter_map(|(used, name)| used.then_some(name))
        .collect()
    }
}

/// The partner's username format, such as
/// `{user}-country-{country}-session-{session}`, parsed once.
///
/// Placeholders: `{user}` (the account named in the upstream URL, verbatim:
/// it is the operator's), `{session}`, `{country}`, `{city}` (the tunnel's
/// [`UpstreamAsk`]). Unknown placeholders, unbalanced braces, empty segments
/// and `:` or blanks in the text are refused at parse.
///
/// Rendering rule. The template is split at every `-` into *segments*. A
/// segment renders as its text with each placeholder replaced by its value.
/// A placeholder has no value when the ask leaves it out or its value is
/// empty once sanitised. When a segment holds a placeholder without a value,
/// the segment is left out; and when that placeholder is the whole segment,
/// the segment just before it is left out too if it is plain text (no
/// placeholder): that is its key. The segments kept are joined with `-`.
/// So `{user}-country-{country}-session-{session}` with no country renders
/// `acme-session-S`, with nothing but the user `acme`; `{user}-cc_{country}`
/// with no country renders `acme` (the segment carries its own key).
///
/// Sanitising: a session keeps only `[A-Za-z0-9]`; a country too, lower-cased;
/// a city too (spaces and everything else removed, case kept). A customer's
/// value can never add a segment, a `-` or a `:` (which would end the
/// username in a Basic credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    segments: Vec<Vec<Piece>>,
}

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the upstream username template is empty".into());
        }
        let segments = text
            .split('-')
            .map(|segment| {
                if segment.is_empty() {
                    Err(format!(
                        "username template {text:?} has an empty segment (two `-` in a row, or one at an end)"
                    ))
                } else {
                    parse_segment(text, segment)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Template { segments })
    }

    /// Which of session, country and city the template passes on.
    pub(crate) fn keys(&self) -> TemplateKeys {
        TemplateKeys {
            session: self.uses(Slot::Session),
            country: self.uses(Slot::Country),
            city: self.uses(Slot::City),
        }
    }

    fn uses_user(&self) -> bool {
        self.uses(Slot::User)
    }

    fn uses(&self, slot: Slot) -> bool {
        self.segments
            .iter()
            .flatten()
            .any(|piece| *piece == Piece::Slot(slot))
    }

    /// The username for one tunnel; see the type's rule for missing values.
    pub(crate) fn render(&self, user: &str, ask: &UpstreamAsk) -> String {
        let values = Values {
            user: (!user.is_empty()).then_some(user),
            session: sanitised(ask.session.as_deref(), false),
            country: sanitised(ask.country.as_deref(), true),
            city: sanitised(ask.city.as_deref(), false),
        };
        let mut kept: Vec<Option<String>> = Vec::with_capacity(self.segments.len());
        for (i, segment) in self.segments.iter().enumerate() {
            let mut out = String::new();
            let mut missing = false;
            for piece in segment {
                match piece {
                    Piece::Text(text) => out.push_str(text),
                    Piece::Slot(slot) => match values.get(*slot) {
                        Some(value) => out.push_str(value),
                        None => missing = true,
                    },
                }
            }
            if !missing {
                kept.push(Some(out));
                continue;
            }
            let alone = segment.len() == 1;
            if alone && i > 0 && is_plain_text(&self.segments[i - 1]) {
                // Its key (`country` before `{country}`) goes with it.
                if let Some(key) = kept.get_mut(i - 1) {
                    *key = None;
                }
            }
            kept.push(None);
        }
        kept.into_iter().flatten().collect::<Vec<_>>().join("-")
    }
}

fn is_plain_text(segment: &[Piece]) -> bool {
    segment.iter().all(|piece| matches!(piece, Piece::Text(_)))
}

/// One `-`-free segment: text and placeholders.
fn parse_segment(template: &str, segment: &str) -> Result<Vec<Piece>, String> {
    let unbalanced = || format!("username template {template:?} has unbalanced braces");
    let mut pieces = Vec::new();
    let mut rest = segment;
    while !rest.is_empty() {
        let Some(at) = rest.find(['{', '}']) else {
            pieces.push(checked_text(template, rest)?);
            break;
        };
        if at > 0 {
            pieces.push(checked_text(template, &rest[..at])?);
        }
        let Some(opened) = rest[at..].strip_prefix('{') else {
            return Err(unbalanced()); // a `}` with no `{`
        };
        let close = opened.find('}').ok_or_else(unbalanced)?;
        let name = &opened[..close];
        let slot = match name {
            "user" => Slot::User,
            "session" => Slot::Session,
            "country" => Slot::Country,
            "city" => Slot::City,
            _ if name.contains('{') => return Err(unbalanced()),
            _ => {
                return Err(format!(
                    "username template {template:?}: unknown placeholder {{{name}}} (known: {SLOT_NAMES})"
                ))
            }
        };
        pieces.push(Piece::Slot(slot));
        rest = &opened[close + 1..];
    }
    Ok(pieces)
}

/// Literal text of a template: printable ASCII without `:` (which would end
/// the username inside a Basic credential).
fn checked_text(template: &str, text: &str) -> Result<Piece, String> {
    if text.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        Ok(Piece::Text(text.to_owned()))
    } else {
        Err(format!(
            "username template {template:?}: its text may hold only printable ASCII without `:`"
        ))
    }
}

/// A customer's value reduced to `[A-Za-z0-9]` (lower-cased if asked);
/// nothing left is no value.
fn sanitised(value: Option<&str>, lower: bool) -> Option<String> {
    let kept: String = value?
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| if lower { c.to_ascii_lowercase() } else { c })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

struct Values<'a> {
    user: Option<&'a str>,
    session: Option<String>,
    country: Option<String>,
    city: Option<String>,
}

impl Values<'_> {
    fn get(&self, slot: Slot) -> Option<&str> {
        match slot {
            Slot::User => self.user,
            Slot::Session => self.session.as_deref(),
            Slot::Country => self.country.as_deref(),
            Slot::City => self.city.as_deref(),
        }
    }
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

async fn http_connect(
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
fn parse_head(head: &[u8]) -> Result<(u16, Vec<(String, String)>), Outcome> {
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
fn http_outcome(status: u16, headers: &[(String, String)]) -> Result<(), Outcome> {
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

async fn socks5_connect(
    stream: &mut TcpStream,
    username: &str,
    password: &str,
    target: &Target,
    port: u16,
    sent: &AtomicBool,
) -> Result<(), Outcome> {
    // RFC 1929: each 1 to 255 bytes. Checked before a byte is sent: a
    // credential we cannot send is our side's (the exit's) problem.
    let (Ok(user_len), Ok(password_len)) =
        (u8::try_from(username.len()), u8::try_from(password.len()))
    else {
        return Err(Outcome::UpstreamRefused);
    };
    if user_len == 0 || password_len == 0 {
        return Err(Outcome::UpstreamRefused);
    }

    // Greeting: version 5, one method, username/password (0x02) only.
    stream.write_all(&[5, 1, 2]).await.map_err(gateway_failed)?;
    let mut choice = [0u8; 2];
    stream
        .read_exact(&mut choice)
        .await
        .map_err(gateway_failed)?;
    if choice != [5, 2] {
        return Err(Outcome::UpstreamRefused); // 0xFF: no acceptable method
    }

    let mut auth = Vec::with_capacity(3 + username.len() + password.len());
    auth.extend_from_slice(&[1, user_len]);
    auth.extend_from_slice(username.as_bytes());
    auth.push(password_len);
    auth.extend_from_slice(password.as_bytes());
    stream.write_all(&auth).await.map_err(gateway_failed)?;
    let mut verdict = [0u8; 2];
    stream
        .read_exact(&mut verdict)
        .await
        .map_err(gateway_failed)?;
    if verdict[1] != 0 {
        return Err(Outcome::UpstreamRefused);
    }

    let mut request = vec![5, 1, 0];
    match target {
        Target::Ip(IpAddr::V4(v4)) => {
            request.push(1);
            request.extend_from_slice(&v4.octets());
        }
        Target::Ip(IpAddr::V6(v6)) => {
            request.push(4);
            request.extend_from_slice(&v6.octets());
        }
        Target::Name(name) => {
            let len = u8::try_from(name.len()).map_err(|_| Outcome::DnsError)?;
            request.extend_from_slice(&[3, len]);
            request.extend_from_slice(name.as_bytes());
        }
    }
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.map_err(gateway_failed)?;
    sent.store(true, Ordering::Relaxed);

    let mut reply = [0u8; 4];
    stream
        .read_exact(&mut reply)
        .await
        .map_err(gateway_failed)?;
    if reply[0] != 5 {
        return Err(Outcome::UpstreamRefused);
    }
    match reply[1] {
        0x00 => {}
        0x02 => return Err(Outcome::PolicyDenied),
        0x03 | 0x04 => return Err(Outcome::Unreachable),
        0x05 => return Err(Outcome::Refused),
        0x06 => return Err(Outcome::TimedOut),
        // 0x01 general failure, 0x07/0x08 unsupported command/address type.
        _ => return Err(Outcome::UpstreamRefused),
    }
    // The bound address, read in full so the tunnel starts at its first byte.
    let bound = match reply[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => usize::from(stream.read_u8().await.map_err(gateway_failed)?) + 2,
        _ => return Err(Outcome::UpstreamRefused),
    };
    let mut skip = [0u8; 255 + 2];
    stream
        .read_exact(&mut skip[..bound])
        .await
        .map_err(gateway_failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxynet_common::egress::EgressPolicyConfig;
    use std::time::Duration;
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;

    const TEMPLATE: &str = "{user}-country-{country}-session-{session}";

    fn ask(session: Option<&str>, country: Option<&str>, city: Option<&str>) -> UpstreamAsk {
        UpstreamAsk {
            session: session.map(str::to_owned),
            country: country.map(str::to_owned),
            city: city.map(str::to_owned),
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn basic(user_pass: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    }

    // ---- templates ----

    #[test]
    fn a_template_renders_every_value_it_is_given() {
        let t = Template::parse(TEMPLATE).unwrap();
        assert_eq!(
            t.render("acme", &ask(Some("s1"), Some("US"), None)),
            "acme-country-us-session-s1"
        );
    }

    #[test]
    fn a_missing_value_takes_its_key_segment_with_it() {
        let t = Template::parse(TEMPLATE).unwrap();
        assert_eq!(
            t.render("acme", &ask(Some("s1"), None, None)),
            "acme-session-s1"
        );
        assert_eq!(
            t.render("acme", &ask(None, Some("de"), None)),
            "acme-country-de"
        );
        assert_eq!(t.render("acme", &UpstreamAsk::default()), "acme");
        // A value that sanitises to nothing is no value.
        assert_eq!(t.render("acme", &ask(Some("--"), Some(" "), None)), "acme");
    }

    #[test]
    fn a_segment_with_its_own_key_goes_alone_and_a_placeholder_key_stays() {
        let t = Template::parse("{user}-zone-resi-cc_{country}-{session}").unwrap();
        assert_eq!(
            t.render("acme", &ask(Some("s1"), Some("fr"), None)),
            "acme-zone-resi-cc_fr-s1"
        );
        // `cc_{country}` carries its key; `{session}` follows a segment with a
        // placeholder, which is no key and stays.
        assert_eq!(t.render("acme", &ask(None, None, None)), "acme-zone-resi");
        let t = Template::parse("{user}-{country}").unwrap();
        assert_eq!(t.render("acme", &UpstreamAsk::default()), "acme");
    }

    #[test]
    fn values_cannot_inject_separators() {
        let t = Template::parse("{user}-country-{country}-city-{city}-session-{session}").unwrap();
        let rendered = t.render(
            "acme",
            &ask(Some("a-b:c d"), Some("U-S:"), Some("New York")),
        );
        assert_eq!(rendered, "acme-country-us-city-NewYork-session-abcd");
        assert_eq!(
            t.render("acme", &ask(None, None, Some("São Paulo"))),
            "acme-city-SoPaulo"
        );
    }

    #[test]
    fn bad_templates_are_refused_at_parse() {
        for bad in [
            "",
            "{user}-{zone}",
            "{user",
            "user}",
            "{{user}}",
            "{us-er}",
            "{user}--session-{session}",
            "-{user}",
            "{user}:x",
            "{user} x",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad:?}");
        }
        let unknown = Template::parse("{user}-{zone}").unwrap_err();
        assert!(unknown.contains("{zone}"), "{unknown}");
    }

    #[test]
    fn a_template_says_which_options_it_passes_on() {
        let keys = Template::parse(TEMPLATE).unwrap().keys();
        assert_eq!(
            keys,
            TemplateKeys {
                session: true,
                country: true,
                city: false
            }
        );
        assert_eq!(keys.names(), ["session", "country"]);
        let none = Template::parse("{user}").unwrap().keys();
        assert!(none.names().is_empty());
    }

    // ---- upstream URLs ----

    #[test]
    fn upstream_urls_name_a_scheme_a_host_and_a_port() {
        let up = Upstream::parse(
            "http://acme@gw.partner.example:3128",
            TEMPLATE,
            Some("s3cret\n".into()),
        )
        .unwrap();
        assert_eq!(up.scheme, Scheme::Http);
        assert_eq!((up.host(), up.port()), ("gw.partner.example", 3128));
        assert_eq!(up.user, "acme");
        assert_eq!(up.password.expose(), "s3cret");
        assert_eq!(up.to_string(), "http://gw.partner.example:3128");

        let up = Upstream::parse(
            "socks5://acme@gw.partner.example:1080/",
            TEMPLATE,
            Some("p".into()),
        )
        .unwrap();
        assert_eq!(up.scheme, Scheme::Socks5h);

        let up = Upstream::parse(
            "SOCKS5H://acme@[2001:db8::1]:1080",
            TEMPLATE,
            Some("p".into()),
        )
        .unwrap();
        assert_eq!((up.host(), up.port()), ("2001:db8::1", 1080));
        assert_eq!(up.to_string(), "socks5h://[2001:db8::1]:1080");

        // No user is fine when the template does not use one.
        let up =
            Upstream::parse("http://gw:3128", "customer7-{session}", Some("p".into())).unwrap();
        assert_eq!(
            up.template.render(&up.user, &ask(Some("x"), None, None)),
            "customer7-x"
        );
    }

    #[test]
    fn what_an_upstream_url_must_not_be_is_refused_clearly() {
        let parse = |url: &str| Upstream::parse(url, TEMPLATE, Some("p".into())).unwrap_err();
        assert!(parse("https://acme@gw:443").contains("not supported yet"));
        let with_password = parse("http://acme:hunter2@gw:3128");
        assert!(
            with_password.contains("--upstream-password-file"),
            "{with_password}"
        );
        assert!(!with_password.contains("hunter2"), "{with_password}");
        assert!(parse("http://acme@gw").contains("port"));
        assert!(parse("http://acme@gw:0").contains("port"));
        assert!(parse("http://acme@2001:db8::1:3128").contains("brackets"));
        assert!(parse("http://acme@[2001:db8::1]").contains("port"));
        assert!(parse("http://acme@gw:3128/path").contains("path"));
        assert!(parse("ftp://acme@gw:21").contains("not supported"));
        assert!(parse("acme@gw:3128").contains("scheme"));
        assert!(parse("http://gw:3128").contains("{user}"));
        let no_password = Upstream::parse("http://acme@gw:3128", TEMPLATE, None).unwrap_err();
        assert!(no_password.contains("--upstream-password-file"));
        assert!(Upstream::parse("http://acme@gw:3128", TEMPLATE, Some("\n".into())).is_err());
        assert!(Upstream::parse("http://acme@gw:3128", "{user}-{zone}", Some("p".into())).is_err());
    }

    #[test]
    fn the_password_is_never_debug_printed() {
        let up = Upstream::parse("http://acme@gw:3128", TEMPLATE, Some("hunter2".into())).unwrap();
        let printed = format!("{up:?} {up}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("acme"), "{printed}");
    }

    // ---- egress policy ----

    #[test]
    fn targets_are_vetted_without_resolving_names() {
        let policy = EgressPolicy::new(EgressPolicyConfig::default());
        for (host, port) in [
            ("127.0.0.1", 80),
            ("127.1", 80),
            ("0x7f.1", 80),
            ("[::1]", 80),
            ("10.0.0.1", 443),
            ("localhost", 443),
            ("LOCALHOST.", 443),
            ("api.localhost", 443),
            ("printer.local", 631),
            ("metadata.google.internal", 80),
            ("nas.home.arpa", 443),
            ("intranet", 80),
            ("example.com", 25),
            ("93.184.215.14", 25),
        ] {
            assert_eq!(
                vet_target(&policy, host, port),
                Err(Outcome::PolicyDenied),
                "{host}:{port}"
            );
        }
        for (host, port) in [
            ("example.com", 443),
            ("example.com.", 80),
            ("93.184.215.14", 443),
            ("[2606:4700::1111]", 443),
        ] {
            assert_eq!(vet_target(&policy, host, port), Ok(()), "{host}:{port}");
        }
    }

    // ---- HTTP answers ----

    fn judge(head: &str) -> Result<(), Outcome> {
        let (status, headers) = parse_head(head.as_bytes())?;
        http_outcome(status, &headers)
    }

    #[test]
    fn gateway_answers_map_to_outcomes() {
        use Outcome::*;
        let cases: &[(&str, Result<(), Outcome>)] = &[
            ("HTTP/1.1 200 Connection established\r\n\r\n", Ok(())),
            ("HTTP/1.0 200\r\n\r\n", Ok(())),
            ("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n", Err(UpstreamRefused)),
            ("HTTP/1.1 403 Forbidden\r\n\r\n", Err(PolicyDenied)),
            ("HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\n\r\n", Err(Refused)),
            ("HTTP/1.1 503 Service Unavailable\r\nx-squid-error: ERR_CONNECT_FAIL 110\r\n\r\n", Err(TimedOut)),
            ("HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 113\r\n\r\n", Err(Unreachable)),
            ("HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_DNS_FAIL 0\r\n\r\n", Err(DnsError)),
            ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=connection_refused\r\n\r\n", Err(Refused)),
            ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=dns_timeout\r\n\r\n", Err(DnsError)),
            ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=dns_error; rcode=NXDOMAIN\r\n\r\n", Err(DnsError)),
            ("HTTP/1.1 504 Gateway Timeout\r\nProxy-Status: gw; error=connection_timeout\r\n\r\n", Err(TimedOut)),
            ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=destination_ip_unroutable\r\n\r\n", Err(Unreachable)),
            // A quoted detail is no parameter; the real one follows.
            ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; details=\"x; error=dns_error\", edge; error=destination_unavailable\r\n\r\n", Err(Unreachable)),
            ("HTTP/1.1 504 Gateway Timeout\r\n\r\n", Err(TimedOut)),
            ("HTTP/1.1 502 Bad Gateway\r\n\r\n", Err(UpstreamRefused)),
            ("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\n\r\n", Err(UpstreamRefused)),
            // Detail counts only on 502-504.
            ("HTTP/1.1 500 Internal Server Error\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\n\r\n", Err(UpstreamRefused)),
            ("HTTP/1.1 429 Too Many Requests\r\n\r\n", Err(UpstreamRefused)),
            ("HTTP/1.1 301 Moved\r\n\r\n", Err(UpstreamRefused)),
            // Not an HTTP answer at all.
            ("SSH-2.0-OpenSSH_9.6\r\n\r\n", Err(UpstreamRefused)),
            ("HTTP/1.1 2000 OK\r\n\r\n", Err(UpstreamRefused)),
            ("HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", Err(UpstreamRefused)),
        ];
        for (head, expected) in cases {
            assert_eq!(judge(head), *expected, "{head:?}");
        }
    }

    // ---- fake partners on loopback ----

    /// Echoes until the peer closes.
    async fn echo(conn: &mut TcpStream) {
        let mut buf = [0u8; 1024];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// A partner's HTTP gateway: takes one connection, reads the request
    /// head, sends `answer` (its chunks a moment apart), then echoes until
    /// the tunnel closes. Gives back the head it read.
    async fn http_partner(answer: Vec<&'static str>) -> (SocketAddr, JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(conn.read_u8().await.unwrap());
            }
            for (i, chunk) in answer.into_iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                conn.write_all(chunk.as_bytes()).await.unwrap();
            }
            echo(&mut conn).await;
            String::from_utf8(head).unwrap()
        });
        (addr, task)
    }

    fn http_upstream(addr: SocketAddr, template: &str) -> Upstream {
        Upstream::parse(
            &format!("http://acme@{addr}"),
            template,
            Some("s3cret".into()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn http_connect_authenticates_and_leaves_the_tunnels_bytes_unread() {
        // The blank line ending the head is split across two writes, and the
        // target's first bytes come right behind it.
        let (addr, partner) =
            http_partner(vec!["HTTP/1.1 200 Connection established\r\n\r", "\nearly"]).await;
        let upstream = http_upstream(addr, TEMPLATE);
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut tunnel = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &ask(Some("s1"), Some("US"), None),
            soon(),
        )
        .await
        .unwrap();
        let mut early = [0u8; 5];
        tunnel.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"early");
        tunnel.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        tunnel.read_exact(&mut pong).await.unwrap();
        assert_eq!(&pong, b"ping");
        drop(tunnel);
        let head = partner.await.unwrap();
        assert_eq!(
            head,
            format!(
                "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic("acme-country-us-session-s1:s3cret")
            )
        );
    }

    #[tokio::test]
    async fn http_connect_names_ip_targets_canonically_and_ipv6_in_brackets() {
        let (addr, partner) = http_partner(vec!["HTTP/1.1 200 OK\r\n\r\n"]).await;
        let upstream = http_upstream(addr, TEMPLATE);
        let stream = TcpStream::connect(addr).await.unwrap();
        let tunnel = connect_through(
            &upstream,
            stream,
            "[2606:4700:0::1111]",
            8443,
            &UpstreamAsk::default(),
            soon(),
        )
        .await
        .unwrap();
        drop(tunnel);
        let head = partner.await.unwrap();
        assert!(
            head.starts_with(
                "CONNECT [2606:4700::1111]:8443 HTTP/1.1\r\nHost: [2606:4700::1111]:8443\r\n"
            ),
            "{head}"
        );
        assert!(
            head.contains(&format!("Basic {}\r\n", basic("acme:s3cret"))),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_407_is_the_upstreams_refusal() {
        let (addr, partner) = http_partner(vec![
            "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"gw\"\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let upstream = http_upstream(addr, TEMPLATE);
        let stream = TcpStream::connect(addr).await.unwrap();
        let result = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &UpstreamAsk::default(),
            soon(),
        )
        .await;
        assert_eq!(result.err(), Some(Outcome::UpstreamRefused));
        partner.await.unwrap();
    }

    #[tokio::test]
    async fn a_squid_connect_failure_is_the_targets_refusal() {
        let (addr, partner) = http_partner(vec![
            "HTTP/1.1 503 Service Unavailable\r\nServer: squid\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let upstream = http_upstream(addr, TEMPLATE);
        let stream = TcpStream::connect(addr).await.unwrap();
        let result = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &UpstreamAsk::default(),
            soon(),
        )
        .await;
        assert_eq!(result.err(), Some(Outcome::Refused));
        partner.await.unwrap();
    }

    /// An HTTP gateway silent after our CONNECT may be waiting on the
    /// target: the budget running out is the target's timeout, not the
    /// exit's fault (a customer aiming at a black hole must not get upstream
    /// exits ejected). A SOCKS5 gateway that never greets is the gateway's.
    #[tokio::test]
    async fn a_gateway_silent_after_the_request_is_a_timeout_before_it_its_fault() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(conn);
        });
        let upstream = http_upstream(addr, TEMPLATE);
        let stream = TcpStream::connect(addr).await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(100);
        let result = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &UpstreamAsk::default(),
            deadline,
        )
        .await;
        assert_eq!(result.err(), Some(Outcome::TimedOut));
        silent.abort();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mute = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(conn);
        });
        let upstream = Upstream::parse(
            &format!("socks5h://partner@{addr}"),
            TEMPLATE,
            Some("secret".to_owned()),
        )
        .unwrap();
        let stream = TcpStream::connect(addr).await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(100);
        let result = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &UpstreamAsk::default(),
            deadline,
        )
        .await;
        assert_eq!(result.err(), Some(Outcome::UpstreamRefused));
        mute.abort();
    }

    /// What a fake SOCKS5 gateway was told.
    #[derive(Debug)]
    struct SocksSeen {
        methods: Vec<u8>,
        user: String,
        password: String,
        atyp: u8,
        addr: Vec<u8>,
        port: u16,
    }

    /// A partner's SOCKS5 gateway: takes one connection, accepts any
    /// username/password, answers the CONNECT with `reply` (success with a
    /// domain-typed bound address, so its length byte is exercised), then
    /// echoes until the tunnel closes.
    async fn socks_partner(reply: u8) -> (SocketAddr, JoinHandle<SocksSeen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut hello = [0u8; 2];
            conn.read_exact(&mut hello).await.unwrap();
            assert_eq!(hello[0], 5);
            let mut methods = vec![0u8; usize::from(hello[1])];
            conn.read_exact(&mut methods).await.unwrap();
            conn.write_all(&[5, 2]).await.unwrap();

            assert_eq!(conn.read_u8().await.unwrap(), 1);
            let mut user = vec![0u8; usize::from(conn.read_u8().await.unwrap())];
            conn.read_exact(&mut user).await.unwrap();
            let mut password = vec![0u8; usize::from(conn.read_u8().await.unwrap())];
            conn.read_exact(&mut password).await.unwrap();
            conn.write_all(&[1, 0]).await.unwrap();

            let mut request = [0u8; 4];
            conn.read_exact(&mut request).await.unwrap();
            assert_eq!(&request[..3], &[5, 1, 0]);
            let atyp = request[3];
            let len = match atyp {
                1 => 4,
                4 => 16,
                3 => usize::from(conn.read_u8().await.unwrap()),
                other => panic!("address type {other}"),
            };
            let mut target = vec![0u8; len];
            conn.read_exact(&mut target).await.unwrap();
            let port = conn.read_u16().await.unwrap();
            if reply == 0 {
                conn.write_all(&[5, 0, 0, 3, 2, b'g', b'w', 0x04, 0x38])
                    .await
                    .unwrap();
                echo(&mut conn).await;
            } else {
                conn.write_all(&[5, reply, 0, 1, 0, 0, 0, 0, 0, 0])
                    .await
                    .unwrap();
            }
            SocksSeen {
                methods,
                user: String::from_utf8(user).unwrap(),
                password: String::from_utf8(password).unwrap(),
                atyp,
                addr: target,
                port,
            }
        });
        (addr, task)
    }

    fn socks_upstream(addr: SocketAddr) -> Upstream {
        Upstream::parse(
            &format!("socks5h://acme@{addr}"),
            "{user}-session-{session}",
            Some("s3cret".into()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn socks5_authenticates_and_sends_names_as_names() {
        let (addr, partner) = socks_partner(0).await;
        let upstream = socks_upstream(addr);
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut tunnel = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &ask(Some("s1"), Some("us"), None),
            soon(),
        )
        .await
        .unwrap();
        tunnel.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        tunnel.read_exact(&mut pong).await.unwrap();
        assert_eq!(&pong, b"ping");
        drop(tunnel);
        let seen = partner.await.unwrap();
        assert_eq!(seen.methods, [2]);
        assert_eq!(seen.user, "acme-session-s1");
        assert_eq!(seen.password, "s3cret");
        assert_eq!(seen.atyp, 3);
        assert_eq!(seen.addr, b"example.com");
        assert_eq!(seen.port, 443);
    }

    #[tokio::test]
    async fn socks5_sends_ip_literals_as_addresses() {
        let (addr, partner) = socks_partner(0).await;
        let upstream = socks_upstream(addr);
        let stream = TcpStream::connect(addr).await.unwrap();
        let tunnel = connect_through(
            &upstream,
            stream,
            "93.184.215.14",
            80,
            &UpstreamAsk::default(),
            soon(),
        )
        .await
        .unwrap();
        drop(tunnel);
        let seen = partner.await.unwrap();
        assert_eq!(seen.user, "acme");
        assert_eq!(seen.atyp, 1);
        assert_eq!(seen.addr, [93, 184, 215, 14]);
        assert_eq!(seen.port, 80);
    }

    #[tokio::test]
    async fn a_socks5_refusal_is_the_targets() {
        let (addr, partner) = socks_partner(0x05).await;
        let upstream = socks_upstream(addr);
        let stream = TcpStream::connect(addr).await.unwrap();
        let result = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &UpstreamAsk::default(),
            soon(),
        )
        .await;
        assert_eq!(result.err(), Some(Outcome::Refused));
        partner.await.unwrap();
    }

    #[tokio::test]
    async fn a_socks5_gateway_refusing_our_method_is_the_upstreams_refusal() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let partner = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut hello = [0u8; 3];
            conn.read_exact(&mut hello).await.unwrap();
            conn.write_all(&[5, 0xff]).await.unwrap();
        });
        let upstream = socks_upstream(addr);
        let stream = TcpStream::connect(addr).await.unwrap();
        let result = connect_through(
            &upstream,
            stream,
            "example.com",
            443,
            &UpstreamAsk::default(),
            soon(),
        )
        .await;
        assert_eq!(result.err(), Some(Outcome::UpstreamRefused));
        partner.await.unwrap();
    }
}
