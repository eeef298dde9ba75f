//! Username grammar v1: how a client asks for sessions and targeting.
//!
//! `USER[-key-value]...`, e.g. `alice-session-abc123-sesstime-30-country-de`.
//! The base user contains no `-`. Keys (lower case, each at most once):
//!
//! | key | value | meaning |
//! |---|---|---|
//! | `session` | 1–64 letters/digits | sticky: same exit for (user, session) on every superproxy |
//! | `sesstime` | minutes, 1–1440 (default 10) | how long the pin lives; needs `session` |
//! | `sessmode` | `soft` (default) or `hard` | when the pinned exit is lost: re-pin (preferring an exit like the lost one), or fail with 502 |
//! | `sessidle` | minutes, 1–1440 | the pin also ends once no tunnel was opened through it for that long; needs `session` |
//! | `country` | ISO 3166-1 alpha-2 | exits in that country |
//! | `continent` | `af`, `an`, `as`, `eu`, `na`, `oc`, `sa` | exits whose country is on that continent ([`crate::continent`]) |
//! | `state` (or its synonym `region`) | ISO 3166-2 subdivision, `cc-xxx` (`de-by`, `us-ca`) | exits that declare that subdivision |
//! | `city` | 1–64 of `a-z 0-9 _` | exits in that city |
//! | `asn` | 1–4294967295 | exits announced by that AS |
//! | `type` | `dc`, `isp`, `res`, `mobile` | exits of that source type |
//! | `channel` | `owned`, `leased`, `isp`, `sdk`, `extension`, `sharing`, `reseller` | exits whose source acquired its addresses that way |
//! | `exit` | an exit id, 32 hex digits without dashes | exactly that exit |
//! | `notexit` | an exit id, as for `exit` | any exit but that one |
//! | `ipversion` | `4` or `6` | exits with an egress address of that family; names leave from it |
//! | `rotate` | `request` (default) or `tunnel` | without a session: `request` picks a fresh exit for every tunnel and every absolute-form request; `tunnel` keeps the exit a kept-alive client connection's last absolute-form request used for its next ones (while it stays eligible, healthy and matching) |
//!
//! The `state` value is the one that spans two `-`-separated parts
//! (`alice-state-de-by`): the country, then the subdivision (1–3 letters
//! or digits). Contradictions are errors too: `state` and `region` together,
//! `exit` and `notexit` naming the same exit, a `state` or `continent`
//! outside the `country` asked for, `rotate` with `session`.
//!
//! Anything else — unknown keys, duplicates, missing or bad values, more than
//! 256 bytes — is an error with a precise reason, never silently ignored.
//! docs/username.md is the user-facing copy of this table.
//!
//! Written once, here: the superproxy parses every login with [`parse`], and
//! the control-api checks stored allow-list options with [`parse_options`]
//! and new base usernames with [`is_base_username`].

pub use crate::continent::Continent;
use proxynet_store::{Channel, SourceType};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;

/// Longest username accepted (RFC 1929 caps SOCKS at 255 anyway).
pub const MAX_USERNAME_BYTES: usize = 256;
pub const DEFAULT_SESSION_MINUTES: u32 = 10;
pub const MAX_SESSION_MINUTES: u32 = 1440;

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

/// ISO 3166-1 alpha-2 codes currently assigned.
const COUNTRIES: &str = "AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ \
CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR \
GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP \
KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT \
MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW \
SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG \
UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW";

pub fn is_country_code(code: &str) -> bool {
    code.len() == 2 && COUNTRIES.split(' ').any(|c| c == code)
}

/// The base-username rule: 1–64 of `A-Z a-z 0-9 _ .` (no `-`, which starts
/// the grammar). A name outside it cannot exist, so it never reaches Redis
/// as a key.
pub fn is_base_username(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= MAX_BASE_USERNAME_BYTES
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// Longest base username.
pub const MAX_BASE_USERNAME_BYTES: usize = 64;

/// Longest option string stored for allow-listed logins.
pub const MAX_OPTIONS_BYTES: usize = 200;

/// An allow-listed user's stored options (`country-de-type-dc`), which stand
/// in for the grammar of a username it never sends: parsed as the login
/// parses them, `user-options`, so options the API accepted always parse at
/// login.
pub fn parse_options(user: &str, options: &str) -> Result<ParsedUsername, UsernameError> {
    if options.is_empty() {
        return parse(user);
    }
    parse(&format!("{user}-{options}"))
}

pub fn parse(raw: &str) -> Result<ParsedUsername, UsernameError> {
    if raw.len() > MAX_USERNAME_BYTES {
        return Err(UsernameError::TooLong);
    }
    if raw.is_empty() {
        return Err(UsernameError::Empty);
    }
    let mut tokens = raw.split('-');
    let user = tokens.next().unwrap_or_default();
    if !is_base_username(user) {
        return Err(UsernameError::BadUser);
    }
    let mut session_id: Option<String> = None;
    let mut sesstime: Option<u32> = None;
    let mut sessmode: Option<SessionMode> = None;
    let mut sessidle: Option<u32> = None;
    let mut rotate: Option<Rotate> = None;
    // Which of the synonyms `state` / `region` set the subdivision.
    let mut region_key: Option<&'static str> = None;
    let mut targeting = Targeting::default();

    while let Some(key) = tokens.next() {
        // The one key without a value.
        if key == "dedicated" {
            if targeting.dedicated {
                return Err(UsernameError::Duplicate("dedicated"));
            }
            targeting.dedicated = true;
            continue;
        }
        let value = tokens
            .next()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| UsernameError::MissingValue(truncated(key)))?;
        match key {
            "session" => {
                set_once(&mut session_id, "session", || {
                    (value.len() <= 64 && value.bytes().all(|b| b.is_ascii_alphanumeric()))
                        .then(|| value.to_owned())
                        .ok_or(UsernameError::BadValue {
                            key: "session",
                            reason: "1-64 letters or digits",
                        })
                })?;
            }
            "sesstime" => {
                set_once(&mut sesstime, "sesstime", || minutes("sesstime", value))?;
            }
            "sessidle" => {
                set_once(&mut sessidle, "sessidle", || minutes("sessidle", value))?;
            }
            "rotate" => {
                set_once(&mut rotate, "rotate", || match value {
                    "request" => Ok(Rotate::Request),
                    "tunnel" => Ok(Rotate::Tunnel),
                    _ => Err(UsernameError::BadValue {
                        key: "rotate",
                        reason: "request or tunnel",
                    }),
                })?;
            }
            "continent" => {
                set_once(&mut targeting.continent, "continent", || {
                    Continent::parse(value).ok_or(UsernameError::BadValue {
                        key: "continent",
                        reason: "af, an, as, eu, na, oc or sa",
                    })
                })?;
            }
            key @ ("state" | "region") => {
                let key = if key == "state" { "state" } else { "region" };
                match region_key {
                    Some(earlier) if earlier == key => return Err(UsernameError::Duplicate(key)),
                    Some(_) => return Err(UsernameError::Synonyms("state", "region")),
                    None => {}
                }
                // The code's own `-` splits it into two of our parts.
                let subdivision = tokens.next().unwrap_or_default();
                targeting.region = Some(subdivision_code(value, subdivision).ok_or(
                    UsernameError::BadValue {
                        key,
                        reason: "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
                    },
                )?);
                region_key = Some(key);
            }
            "sessmode" => {
                set_once(&mut sessmode, "sessmode", || match value {
                    "soft" => Ok(SessionMode::Soft),
                    "hard" => Ok(SessionMode::Hard),
                    _ => Err(UsernameError::BadValue {
                        key: "sessmode",
                        reason: "soft or hard",
                    }),
                })?;
            }
            "country" => {
                set_once(&mut targeting.country, "country", || {
                    let code = value.to_ascii_uppercase();
                    is_country_code(&code)
                        .then_some(code)
                        .ok_or(UsernameError::BadValue {
                            key: "country",
                            reason: "an ISO 3166-1 alpha-2 code",
                        })
                })?;
            }
            "city" => {
                set_once(&mut targeting.city, "city", || {
                    (value.len() <= 64
                        && value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                    .then(|| value.to_ascii_lowercase())
                    .ok_or(UsernameError::BadValue {
                        key: "city",
                        reason: "1-64 of a-z 0-9 _",
                    })
                })?;
            }
            "asn" => {
                set_once(&mut targeting.asn, "asn", || {
                    value
                        .parse::<u32>()
                        .ok()
                        .filter(|a| *a > 0 && value.bytes().all(|b| b.is_ascii_digit()))
                        .ok_or(UsernameError::BadValue {
                            key: "asn",
                            reason: "a number from 1 to 4294967295",
                        })
                })?;
            }
            "type" => {
                set_once(&mut targeting.source_type, "type", || {
                    SourceType::parse(value).ok_or(UsernameError::BadValue {
                        key: "type",
                        reason: "dc, isp, res or mobile",
                    })
                })?;
            }
            "channel" => {
                set_once(&mut targeting.channel, "channel", || {
                    Channel::parse(value).ok_or(UsernameError::BadValue {
                        key: "channel",
                        reason: "owned, leased, isp, sdk, extension, sharing or reseller",
                    })
                })?;
            }
            "exit" => {
                set_once(&mut targeting.exit, "exit", || exit_id("exit", value))?;
            }
            "notexit" => {
                set_once(&mut targeting.not_exit, "notexit", || {
                    exit_id("notexit", value)
                })?;
            }
            "ipversion" => {
                set_once(&mut targeting.ip_version, "ipversion", || match value {
                    "4" => Ok(IpVersion::V4),
                    "6" => Ok(IpVersion::V6),
                    _ => Err(UsernameError::BadValue {
                        key: "ipversion",
                        reason: "4 or 6",
                    }),
                })?;
            }
            "ip" => {
                set_once(&mut targeting.ip, "ip", || {
                    // An IPv6 address may be written with `_` for `:`: a
                    // Basic credential ends its username at the first `:`.
                    value.replace('_', ":").parse().map_err(|_| UsernameError::BadValue {
                        key: "ip",
                        reason:
                            "an IPv4 or IPv6 address (one of the account's dedicated addresses)",
                    })
                })?;
                targeting.dedicated = true;
            }
            other => return Err(UsernameError::UnknownKey(truncated(other))),
        }
    }

    let session = match session_id {
        Some(_) if rotate.is_some() => {
            return Err(UsernameError::Contradiction(
                "rotate is for logins without a session: a session keeps its exit",
            ))
        }
        Some(id) => Some(Session {
            id,
            ttl: Duration::from_secs(u64::from(sesstime.unwrap_or(DEFAULT_SESSION_MINUTES)) * 60),
            mode: sessmode.unwrap_or_default(),
            idle: sessidle.map(|m| Duration::from_secs(u64::from(m) * 60)),
        }),
        None if sesstime.is_some() => return Err(UsernameError::NeedsSession("sesstime")),
        None if sessmode.is_some() => return Err(UsernameError::NeedsSession("sessmode")),
        None if sessidle.is_some() => return Err(UsernameError::NeedsSession("sessidle")),
        None => None,
    };
    contradictions(&targeting)?;
    Ok(ParsedUsername {
        user: user.to_owned(),
        session,
        targeting,
        rotate: rotate.unwrap_or_default(),
    })
}

/// Asks that each parse but can never be met together: refused with the
/// reason rather than answered with a 503 that hides it.
fn contradictions(targeting: &Targeting) -> Result<(), UsernameError> {
    if targeting.exit.is_some() && targeting.exit == targeting.not_exit {
        return Err(UsernameError::Contradiction(
            "exit and notexit name the same exit",
        ));
    }
    // The region's own country part is an assigned code (checked when parsed).
    let region_country = targeting.region.as_deref().and_then(|r| r.get(..2));
    if let (Some(country), Some(region_country)) = (targeting.country.as_deref(), region_country) {
        if country != region_country {
            return Err(UsernameError::Contradiction(
                "the state/region is not in the country asked for",
            ));
        }
    }
    if let Some(continent) = targeting.continent {
        let off = |country: &str| Continent::of_country(country) != Some(continent);
        if targeting.country.as_deref().is_some_and(off) {
            return Err(UsernameError::Contradiction(
                "the country asked for is not on the continent asked for",
            ));
        }
        if region_country.is_some_and(off) {
            return Err(UsernameError::Contradiction(
                "the state/region asked for is not on the continent asked for",
            ));
        }
    }
    Ok(())
}

/// `sesstime` / `sessidle`: whole minutes from 1 to 1440, digits only.
fn minutes(key: &'static str, value: &str) -> Result<u32, UsernameError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|m| {
            (1..=MAX_SESSION_MINUTES).contains(m) && value.bytes().all(|b| b.is_ascii_digit())
        })
        .ok_or(UsernameError::BadValue {
            key,
            reason: "minutes from 1 to 1440",
        })
}

/// `exit` / `notexit`: an exit id as 32 hex digits without dashes.
fn exit_id(key: &'static str, value: &str) -> Result<Uuid, UsernameError> {
    value
        .parse::<Uuid>()
        .ok()
        .filter(|_| value.len() == 32)
        .ok_or(UsernameError::BadValue {
            key,
            reason: "an exit id: 32 hex digits, no dashes",
        })
}

/// An ISO 3166-2 code from its two parts (`de`, `by`), upper case
/// (`DE-BY`): an assigned country, then 1–3 letters or digits.
pub fn subdivision_code(country: &str, subdivision: &str) -> Option<String> {
    let country = country.to_ascii_uppercase();
    (is_country_code(&country)
        && (1..=3).contains(&subdivision.len())
        && subdivision.bytes().all(|b| b.is_ascii_alphanumeric()))
    .then(|| format!("{country}-{}", subdivision.to_ascii_uppercase()))
}

/// A whole ISO 3166-2 code (`de-by`, `US-CA`) in upper case, as exits
/// declare theirs; `None` when it is not one.
pub fn parse_subdivision(code: &str) -> Option<String> {
    let (country, subdivision) = code.split_once('-')?;
    subdivision_code(country, subdivision)
}

fn set_once<T>(
    slot: &mut Option<T>,
    key: &'static str,
    value: impl FnOnce() -> Result<T, UsernameError>,
) -> Result<(), UsernameError> {
    if slot.is_some() {
        return Err(UsernameError::Duplicate(key));
    }
    *slot = Some(value()?);
    Ok(())
}

/// Echoing user input in an error: bounded, printable.
fn truncated(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn username_rules() {
        assert!(is_base_username("alice.b_2"));
        assert!(!is_base_username("alice-session-1"));
        assert!(!is_base_username(""));
        assert!(!is_base_username(&"a".repeat(65)));
        assert!(!is_base_username("a:b"));
    }

    #[test]
    fn stored_options_parse_as_the_login_parses_them() {
        let parsed = parse_options("alice", "country-de-type-dc").unwrap();
        assert_eq!(parsed.user, "alice");
        assert_eq!(parsed.targeting.country.as_deref(), Some("DE"));
        assert_eq!(parse_options("alice", "").unwrap().user, "alice");
        assert_eq!(
            parse_options("alice", "country-de-country-fr").unwrap_err(),
            UsernameError::Duplicate("country")
        );
        // The login's string is `user-options`: with the longest base name the
        // options' room is what the username bound leaves.
        let long_user = "u".repeat(MAX_BASE_USERNAME_BYTES);
        let options = format!("session-{}", "s".repeat(64));
        assert!(parse_options(&long_user, &options).is_ok());
        assert_eq!(
            parse_options(&long_user, &"city-x-".repeat(30)).unwrap_err(),
            UsernameError::TooLong
        );
    }

    #[test]
    fn dedicated_is_a_key_without_a_value_and_ip_names_one_address() {
        let p = parse("alice-dedicated-country-de").unwrap();
        assert!(p.targeting.dedicated);
        assert_eq!(p.targeting.country.as_deref(), Some("DE"));
        let p = parse("alice-ip-2001:db8::7-session-s1").unwrap();
        assert!(p.targeting.dedicated, "ip- implies dedicated");
        assert_eq!(p.targeting.ip, Some("2001:db8::7".parse().unwrap()));
        assert!(p.session.is_some());
        assert_eq!(
            parse("alice-ip-2001_db8__7").unwrap().targeting.ip,
            Some("2001:db8::7".parse().unwrap())
        );
        assert_eq!(
            parse("alice-dedicated-dedicated").unwrap_err(),
            UsernameError::Duplicate("dedicated")
        );
        assert!(matches!(
            parse("alice-ip-nope").unwrap_err(),
            UsernameError::BadValue { key: "ip", .. }
        ));
        assert!(!parse("alice-dedicated").unwrap().targeting.is_empty());
        assert_eq!(
            parse("alice-dedicated-ip-192.0.2.7")
                .unwrap()
                .targeting
                .to_string(),
            "dedicated ip=192.0.2.7"
        );
    }

    #[test]
    fn plain_user_rotates() {
        let p = parse("alice").unwrap();
        assert_eq!(p.user, "alice");
        assert!(p.session.is_none());
        assert!(p.targeting.is_empty());
    }

    #[test]
    fn full_grammar() {
        let id = Uuid::new_v4();
        let p = parse(&format!("alice-session-abc123-sesstime-30-sessmode-hard-country-de-city-new_york-asn-7922-type-res-exit-{}-ipversion-6", id.simple())).unwrap();
        let s = p.session.unwrap();
        assert_eq!(
            (s.id.as_str(), s.ttl, s.mode),
            ("abc123", Duration::from_secs(1800), SessionMode::Hard)
        );
        assert_eq!(p.targeting.country.as_deref(), Some("DE"));
        assert_eq!(p.targeting.city.as_deref(), Some("new_york"));
        assert_eq!(p.targeting.asn, Some(7922));
        assert_eq!(p.targeting.source_type, Some(SourceType::Res));
        assert_eq!(p.targeting.exit, Some(id));
        assert_eq!(p.targeting.ip_version, Some(IpVersion::V6));
        assert_eq!(
            parse("alice-session-x").unwrap().session.unwrap().ttl,
            Duration::from_secs(600)
        );
    }

    #[test]
    fn errors_are_precise() {
        use UsernameError::*;
        let cases: &[(&str, UsernameError)] = &[
            ("", Empty),
            ("-session-x", BadUser),
            ("al ice", BadUser),
            ("alice-session", MissingValue("session".into())),
            ("alice-session-", MissingValue("session".into())),
            ("alice-foo-bar", UnknownKey("foo".into())),
            ("alice-Session-x", UnknownKey("Session".into())),
            ("alice-session-a-session-b", Duplicate("session")),
            (
                "alice-session-a_b",
                BadValue {
                    key: "session",
                    reason: "1-64 letters or digits",
                },
            ),
            (
                "alice-session-a-sesstime-0",
                BadValue {
                    key: "sesstime",
                    reason: "minutes from 1 to 1440",
                },
            ),
            (
                "alice-session-a-sesstime-1441",
                BadValue {
                    key: "sesstime",
                    reason: "minutes from 1 to 1440",
                },
            ),
            (
                "alice-session-a-sesstime-+5",
                BadValue {
                    key: "sesstime",
                    reason: "minutes from 1 to 1440",
                },
            ),
            ("alice-sesstime-5", NeedsSession("sesstime")),
            ("alice-sessmode-hard", NeedsSession("sessmode")),
            (
                "alice-session-a-sessmode-firm",
                BadValue {
                    key: "sessmode",
                    reason: "soft or hard",
                },
            ),
            (
                "alice-country-xx",
                BadValue {
                    key: "country",
                    reason: "an ISO 3166-1 alpha-2 code",
                },
            ),
            (
                "alice-country-deu",
                BadValue {
                    key: "country",
                    reason: "an ISO 3166-1 alpha-2 code",
                },
            ),
            (
                "alice-type-cloud",
                BadValue {
                    key: "type",
                    reason: "dc, isp, res or mobile",
                },
            ),
            (
                "alice-asn-0",
                BadValue {
                    key: "asn",
                    reason: "a number from 1 to 4294967295",
                },
            ),
            (
                "alice-ipversion-5",
                BadValue {
                    key: "ipversion",
                    reason: "4 or 6",
                },
            ),
            (
                "alice-ipversion-v6",
                BadValue {
                    key: "ipversion",
                    reason: "4 or 6",
                },
            ),
            ("alice-ipversion-4-ipversion-6", Duplicate("ipversion")),
            ("alice-ipversion", MissingValue("ipversion".into())),
            (
                "alice-exit-123",
                BadValue {
                    key: "exit",
                    reason: "an exit id: 32 hex digits, no dashes",
                },
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input).as_ref().err(), Some(expected), "{input}");
        }
        assert_eq!(parse(&"a".repeat(300)), Err(TooLong));
    }

    #[test]
    fn ipversion_asks_for_a_family_and_is_named_in_the_targeting() {
        let p = parse("alice-session-x1-ipversion-6").unwrap();
        assert_eq!(p.targeting.ip_version, Some(IpVersion::V6));
        assert_eq!(p.session.unwrap().id, "x1");
        let v4 = parse("alice-ipversion-4").unwrap().targeting;
        assert_eq!(v4.ip_version, Some(IpVersion::V4));
        assert!(!v4.is_empty());
        assert_eq!(v4.to_string(), "ipversion=4");
        let both = parse("alice-country-de-ipversion-6").unwrap().targeting;
        assert_eq!(both.to_string(), "country=DE ipversion=6");
        assert!(IpVersion::V6.matches("2001:db8::1".parse().unwrap()));
        assert!(!IpVersion::V6.matches("192.0.2.1".parse().unwrap()));
        assert!(IpVersion::V4.matches("192.0.2.1".parse().unwrap()));
        assert_eq!(IpVersion::V6.to_string(), "IPv6");
        // Allow-listed users store the same grammar.
        let stored = parse_options("alice", "ipversion-6").unwrap();
        assert_eq!(stored.targeting.ip_version, Some(IpVersion::V6));
    }

    #[test]
    fn finer_targeting_parses_and_is_named_in_the_targeting() {
        let (id, other) = (Uuid::new_v4(), Uuid::new_v4());
        let p = parse(&format!(
            "alice-continent-eu-state-de-by-notexit-{}-country-de",
            id.simple()
        ))
        .unwrap();
        let t = &p.targeting;
        assert_eq!(t.continent, Some(Continent::Eu));
        assert_eq!(t.region.as_deref(), Some("DE-BY"));
        assert_eq!(t.not_exit, Some(id));
        assert_eq!(
            t.to_string(),
            format!("country=DE continent=eu region=DE-BY notexit={id}")
        );
        // `region` is `state`'s synonym; any case; a subdivision of up to 3.
        let r = parse("alice-region-US-ca").unwrap().targeting;
        assert_eq!(r.region.as_deref(), Some("US-CA"));
        assert_eq!(
            parse("alice-state-gb-eng-type-dc")
                .unwrap()
                .targeting
                .region
                .as_deref(),
            Some("GB-ENG")
        );
        assert_eq!(
            parse("alice-continent-AS").unwrap().targeting.continent,
            Some(Continent::As)
        );
        // exit and notexit may name different exits.
        let both = parse(&format!(
            "alice-exit-{}-notexit-{}",
            id.simple(),
            other.simple()
        ))
        .unwrap();
        assert_eq!(both.targeting.exit, Some(id));
        assert_eq!(both.targeting.not_exit, Some(other));
        assert_eq!(parse_subdivision("de-by").as_deref(), Some("DE-BY"));
        assert_eq!(parse_subdivision("xx-by"), None);
        assert_eq!(parse_subdivision("de-bayern"), None);
        assert_eq!(parse_subdivision("deby"), None);
    }

    #[test]
    fn rotate_and_sessidle() {
        assert_eq!(
            parse("alice").unwrap().rotate,
            Rotate::Request,
            "v1 default"
        );
        assert_eq!(parse("alice-rotate-tunnel").unwrap().rotate, Rotate::Tunnel);
        assert_eq!(
            parse("alice-rotate-request").unwrap().rotate,
            Rotate::Request
        );
        assert!(parse("alice-rotate-tunnel").unwrap().targeting.is_empty());
        let s = parse("alice-session-s1-sessidle-1-sesstime-60")
            .unwrap()
            .session
            .unwrap();
        assert_eq!(s.idle, Some(Duration::from_secs(60)));
        assert_eq!(s.ttl, Duration::from_secs(3600));
        assert_eq!(
            parse("alice-session-s1").unwrap().session.unwrap().idle,
            None
        );
        // A preference is not a constraint.
        let preferring = Targeting {
            prefer: Some(Uuid::new_v4()),
            ..Targeting::default()
        };
        assert!(preferring.is_empty());
        assert_eq!(preferring.to_string(), "");
        // Nor are the exits a retry avoids.
        let avoiding = Targeting {
            avoid: vec![Uuid::new_v4()],
            ..Targeting::default()
        };
        assert!(avoiding.is_empty());
        assert_eq!(avoiding.to_string(), "");
    }

    #[test]
    fn finer_targeting_errors_are_precise() {
        use UsernameError::*;
        let id = Uuid::new_v4().simple().to_string();
        let cases: Vec<(String, UsernameError)> = vec![
            (
                "alice-continent-europe".into(),
                BadValue {
                    key: "continent",
                    reason: "af, an, as, eu, na, oc or sa",
                },
            ),
            (
                "alice-continent-eu-continent-as".into(),
                Duplicate("continent"),
            ),
            ("alice-continent".into(), MissingValue("continent".into())),
            ("alice-state".into(), MissingValue("state".into())),
            (
                "alice-state-de".into(),
                BadValue {
                    key: "state",
                    reason:
                        "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
                },
            ),
            (
                "alice-state-de-".into(),
                BadValue {
                    key: "state",
                    reason:
                        "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
                },
            ),
            (
                // Without the subdivision the next key is taken for it.
                "alice-region-us-session-x".into(),
                BadValue {
                    key: "region",
                    reason:
                        "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
                },
            ),
            (
                "alice-state-xx-by".into(),
                BadValue {
                    key: "state",
                    reason:
                        "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
                },
            ),
            ("alice-state-de-by-state-de-be".into(), Duplicate("state")),
            (
                "alice-region-de-by-region-de-be".into(),
                Duplicate("region"),
            ),
            (
                "alice-state-de-by-region-de-by".into(),
                Synonyms("state", "region"),
            ),
            (
                "alice-region-de-by-state-de-by".into(),
                Synonyms("state", "region"),
            ),
            (
                "alice-notexit-123".into(),
                BadValue {
                    key: "notexit",
                    reason: "an exit id: 32 hex digits, no dashes",
                },
            ),
            (
                format!("alice-notexit-{id}-notexit-{id}"),
                Duplicate("notexit"),
            ),
            (
                format!("alice-exit-{id}-notexit-{id}"),
                Contradiction("exit and notexit name the same exit"),
            ),
            (
                "alice-rotate-connection".into(),
                BadValue {
                    key: "rotate",
                    reason: "request or tunnel",
                },
            ),
            (
                "alice-rotate-tunnel-rotate-request".into(),
                Duplicate("rotate"),
            ),
            (
                "alice-session-a-rotate-tunnel".into(),
                Contradiction("rotate is for logins without a session: a session keeps its exit"),
            ),
            ("alice-sessidle-5".into(), NeedsSession("sessidle")),
            (
                "alice-session-a-sessidle-0".into(),
                BadValue {
                    key: "sessidle",
                    reason: "minutes from 1 to 1440",
                },
            ),
            (
                "alice-session-a-sessidle-1441".into(),
                BadValue {
                    key: "sessidle",
                    reason: "minutes from 1 to 1440",
                },
            ),
            (
                "alice-session-a-sessidle-1-sessidle-2".into(),
                Duplicate("sessidle"),
            ),
            (
                "alice-country-fr-state-de-by".into(),
                Contradiction("the state/region is not in the country asked for"),
            ),
            (
                "alice-continent-as-country-de".into(),
                Contradiction("the country asked for is not on the continent asked for"),
            ),
            (
                "alice-continent-na-state-de-by".into(),
                Contradiction("the state/region asked for is not on the continent asked for"),
            ),
        ];
        for (input, expected) in &cases {
            assert_eq!(parse(input).as_ref().err(), Some(expected), "{input}");
        }
        // Each error says what to fix, as the client sees it.
        assert_eq!(
            Synonyms("state", "region").to_string(),
            "state and region are the same key; give one of them"
        );
        assert_eq!(
            parse(&format!("alice-exit-{id}-notexit-{id}"))
                .unwrap_err()
                .to_string(),
            "exit and notexit name the same exit"
        );
        // Allow-listed users store the same grammar.
        assert_eq!(
            parse_options("alice", "continent-eu-state-de-by")
                .unwrap()
                .targeting
                .region
                .as_deref(),
            Some("DE-BY")
        );
    }

    #[test]
    fn country_list_is_complete_and_well_formed() {
        let codes: Vec<&str> = COUNTRIES.split(' ').collect();
        assert_eq!(codes.len(), 249);
        let mut sorted = codes.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, codes, "sorted and unique");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,300}") {
            let _ = parse(&s);
        }

        #[test]
        fn parser_never_panics_on_near_valid_input(
            parts in prop::collection::vec(prop::sample::select(vec![
                "alice", "session", "sesstime", "sessmode", "country", "city", "asn", "type", "exit",
                "ipversion", "abc", "10", "hard", "de", "res", "", "-", "0", "4", "6", "99999999999",
                "continent", "state", "region", "notexit", "rotate", "sessidle", "eu", "by",
                "tunnel", "request", "0123456789abcdef0123456789abcdef",
            ]), 0..12)
        ) {
            let _ = parse(&parts.join("-"));
        }
    }
}
