//! What a parsed username asks for: the session, the targeting and the
//! rotation, or the precise reason it is not a valid username.

use crate::provenance::{Channel, SourceType};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;

use super::rules::MAX_USERNAME_BYTES;
use crate::continent::Continent;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionMode {
    /// Re-pin to another eligible exit when the pinned one is lost.
    #[default]
    Soft,
    /// Fail with a coded 502 when the pinned exit is lost.
    Hard,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub ttl: Duration,
    pub mode: SessionMode,
    /// `sessidle`: the pin ends once no tunnel was opened through it for
    /// this long (on top of `ttl`).
    pub idle: Option<Duration>,
}

/// Without a session, how often the exit may change (`rotate-request|tunnel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rotate {
    /// A fresh exit for every tunnel, and for every absolute-form request
    /// even on one kept-alive client connection: v1's behaviour, kept as the
    /// default so v1 usernames mean what they meant.
    #[default]
    Request,
    /// A kept-alive client connection's absolute-form requests keep the
    /// exit its last request used while that exit stays eligible, healthy
    /// and matching; CONNECT and SOCKS5 tunnels each still pick afresh.
    Tunnel,
}

impl Rotate {
    pub fn as_str(self) -> &'static str {
        match self {
            Rotate::Request => "request",
            Rotate::Tunnel => "tunnel",
        }
    }
}

/// The IP family a client wants its tunnels to leave in (`ipversion-4|6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpVersion {
    V4,
    V6,
}

impl IpVersion {
    /// Whether `ip` is of this family.
    pub fn matches(self, ip: IpAddr) -> bool {
        ip.is_ipv4() == (self == IpVersion::V4)
    }

    /// The value as the username spells it: `4` or `6`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpVersion::V4 => "4",
            IpVersion::V6 => "6",
        }
    }
}

impl fmt::Display for IpVersion {
    /// `IPv4` or `IPv6`, as an error message names the family.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpVersion::V4 => "IPv4",
            IpVersion::V6 => "IPv6",
        })
    }
}

/// Constraints on which exits may serve a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Targeting {
    pub country: Option<String>,
    /// Exits whose country is on this continent.
    pub continent: Option<Continent>,
    /// ISO 3166-2 subdivision, upper case (`DE-BY`): exits declaring it.
    pub region: Option<String>,
    pub city: Option<String>,
    pub asn: Option<u32>,
    pub source_type: Option<SourceType>,
    /// Acquisition channel of the exit's source (`channel-owned`, `channel-sdk`, ...).
    pub channel: Option<Channel>,
    pub exit: Option<Uuid>,
    /// Any exit but this one.
    pub not_exit: Option<Uuid>,
    /// The family the tunnel leaves in: exits without an egress address of
    /// it are not eligible, and names are dialled in it.
    pub ip_version: Option<IpVersion>,
    /// Not from the username: the source types the account allows this user.
    pub allowed_types: Option<Vec<SourceType>>,
    /// Not from the username: the countries the account allows this user.
    pub allowed_countries: Option<Vec<String>>,
    /// The user's policy: channels it may use at all.
    pub allowed_channels: Option<Vec<Channel>>,
    /// Not from the username: the source types the account's plan prices
    /// (`None`: no plan, any type).
    pub plan_types: Option<Vec<SourceType>>,
    /// Not from the username, and no constraint: the exit this client
    /// connection's last absolute-form request used (`rotate-tunnel`),
    /// drawn first while it is usable.
    pub prefer: Option<Uuid>,
    /// Not from the username: exits this request already went through (an
    /// absolute-form request retried after a site's ban), never drawn
    /// again and costing none of its attempts.
    pub avoid: Vec<Uuid>,
    /// `dedicated`: leave only from addresses allocated to the account
    /// (the user's own record may also ask for it always).
    pub dedicated: bool,
    /// `ip-ADDRESS`: leave from this one of the account's dedicated
    /// addresses (implies `dedicated`).
    pub ip: Option<std::net::IpAddr>,
    /// Not from the username: the logged-in (account, user), which decides
    /// whose dedicated addresses a tunnel may use and which it must avoid.
    pub tenant: Option<(Uuid, Uuid)>,
    /// Not from the username: with no usable dedicated address, fall back to
    /// shared ones (an account setting) instead of refusing.
    pub dedicated_fallback: bool,
}

impl Targeting {
    /// No constraint at all (a preference or an avoided exit is none).
    pub fn is_empty(&self) -> bool {
        Targeting {
            prefer: None,
            avoid: Vec::new(),
            tenant: None,
            dedicated_fallback: false,
            ..self.clone()
        } == Targeting::default()
    }
}

impl fmt::Display for Targeting {
    /// `country=DE type=res`, naming only the constraints that are set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(c) = &self.country {
            parts.push(format!("country={c}"));
        }
        if let Some(c) = self.continent {
            parts.push(format!("continent={c}"));
        }
        if let Some(r) = &self.region {
            parts.push(format!("region={r}"));
        }
        if let Some(c) = &self.city {
            parts.push(format!("city={c}"));
        }
        if let Some(a) = self.asn {
            parts.push(format!("asn={a}"));
        }
        if let Some(t) = self.source_type {
            parts.push(format!("type={}", t.as_str()));
        }
        if let Some(c) = self.channel {
            parts.push(format!("channel={}", c.as_str()));
        }
        if let Some(e) = self.exit {
            parts.push(format!("exit={e}"));
        }
        if let Some(e) = self.not_exit {
            parts.push(format!("notexit={e}"));
        }
        if let Some(v) = self.ip_version {
            parts.push(format!("ipversion={}", v.as_str()));
        }
        if self.dedicated {
            parts.push("dedicated".to_owned());
        }
        if let Some(ip) = self.ip {
            parts.push(format!("ip={ip}"));
        }
        if let Some(types) = &self.allowed_types {
            let names: Vec<&str> = types.iter().map(|t| t.as_str()).collect();
            parts.push(format!("allowed-types={}", names.join(",")));
        }
        if let Some(countries) = &self.allowed_countries {
            parts.push(format!("allowed-countries={}", countries.join(",")));
        }
        if let Some(channels) = &self.allowed_channels {
            let names: Vec<&str> = channels.iter().map(|c| c.as_str()).collect();
            parts.push(format!("allowed-channels={}", names.join(",")));
        }
        f.write_str(&parts.join(" "))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedUsername {
    /// The account's proxy user, as created in the control-api.
    pub user: String,
    pub session: Option<Session>,
    pub targeting: Targeting,
    /// Without a session: per request (default) or per kept-alive connection.
    pub rotate: Rotate,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsernameError {
    #[error("username longer than {MAX_USERNAME_BYTES} bytes")]
    TooLong,
    #[error("username is empty")]
    Empty,
    #[error("base username must be 1-64 of A-Z a-z 0-9 _ .")]
    BadUser,
    #[error("key {0:?} has no value")]
    MissingValue(String),
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    #[error("key {0:?} given twice")]
    Duplicate(&'static str),
    #[error("bad value for {key}: {reason}")]
    BadValue {
        key: &'static str,
        reason: &'static str,
    },
    #[error("{0} needs a session key")]
    NeedsSession(&'static str),
    #[error("{0} and {1} are the same key; give one of them")]
    Synonyms(&'static str, &'static str),
    /// Keys that each parse but cannot hold together.
    #[error("{0}")]
    Contradiction(&'static str),
}
