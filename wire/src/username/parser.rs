//! The parser: a username (or an allow-listed user's stored options) into
//! a [`ParsedUsername`], key by key, refusing anything it does not know.

use crate::provenance::{Channel, SourceType};
use std::time::Duration;
use uuid::Uuid;

use super::rules::{
    is_base_username, is_country_code, subdivision_code, DEFAULT_SESSION_MINUTES,
    MAX_SESSION_MINUTES, MAX_USERNAME_BYTES,
};
use super::types::{
    IpVersion, ParsedUsername, Rotate, Session, SessionMode, Targeting, UsernameError,
};
use crate::continent::Continent;

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
