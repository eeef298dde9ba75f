//! Site cooldowns: the fleet's shared memory of which exit a target site
//! refuses (docs/health.md, "Health per target site"). Written by the
//! superproxies that see the refusals, read by every superproxy (held in
//! memory, kept current by change events) and by the control-api (`GET
//! /v1/sites`, `DELETE /v1/sites/{site}/cooldowns/{exit}`).
//!
//! In Redis, all under one hash tag (`{sites}`) so one script reads and
//! writes them together:
//! - [`Keys::site_cooldowns`]: a hash, field [`field`]`(exit, site)` →
//!   [`Cooldown::encode`] (`"UNTIL_MS LEVEL"`, Redis clock);
//! - [`Keys::site_backoff`]: a sorted set of the same fields scored by the
//!   instant their back-off level is forgotten (the level doubles a repeat
//!   offender's next cooldown; a quiet exit starts again from the base);
//! - [`Keys::site_cooldowns_of_exit`]: per exit, a sorted set of its cooled
//!   sites scored by until (the per-exit bound evicts the soonest to end).
//!
//! Changes are announced on [`Keys::events`] as [`Announcement`]s, which
//! carry everything a receiver needs, so applying one costs no Redis read.

use uuid::Uuid;

use crate::Keys;

impl Keys {
    /// `EXIT SITE` → `UNTIL_MS LEVEL`: every live cooldown of the fleet.
    pub fn site_cooldowns(&self) -> String {
        format!("{}{{sites}}:cool", self.prefix())
    }

    /// `EXIT SITE` scored by when its back-off level is forgotten.
    pub fn site_backoff(&self) -> String {
        format!("{}{{sites}}:backoff", self.prefix())
    }

    /// One exit's cooled sites, scored by until.
    pub fn site_cooldowns_of_exit(&self, exit: Uuid) -> String {
        format!("{}{{sites}}:exit:{exit}", self.prefix())
    }
}

/// The hash field of one (exit, site) pair. Sites never hold a space (a
/// registrable domain, or an address block such as `198.51.100.0/24`).
pub fn field(exit: Uuid, site: &str) -> String {
    format!("{exit} {site}")
}

/// Splits a field back into its exit and site.
pub fn parse_field(field: &str) -> Option<(Uuid, &str)> {
    let (exit, site) = field.split_once(' ')?;
    if site.is_empty() || site.contains(' ') {
        return None;
    }
    Some((exit.parse().ok()?, site))
}

/// One stored cooldown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cooldown {
    /// When it ends, Redis clock, Unix milliseconds.
    pub until_ms: i64,
    /// How many cooldowns in a row this pair has had (0 the first).
    pub level: u32,
}

impl Cooldown {
    pub fn encode(&self) -> String {
        format!("{} {}", self.until_ms, self.level)
    }

    pub fn parse(value: &str) -> Option<Self> {
        let (until, level) = value.split_once(' ')?;
        Some(Self {
            until_ms: until.parse().ok()?,
            level: level.parse().ok()?,
        })
    }
}

/// A change to the fleet's cooldowns, as announced on the events channel.
/// A receiver applies it to its own clock (`remaining_ms` from now), so the
/// superproxies' clocks need not agree with Redis's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Announcement {
    /// `cool:EXIT SITE REMAINING_MS LEVEL`
    Cooled {
        exit: Uuid,
        site: String,
        remaining_ms: u64,
        level: u32,
    },
    /// `uncool:EXIT SITE` (an operator lifted it, or it was evicted)
    Lifted { exit: Uuid, site: String },
}

impl Announcement {
    pub fn encode(&self) -> String {
        match self {
            Self::Cooled {
                exit,
                site,
                remaining_ms,
                level,
            } => format!("cool:{exit} {site} {remaining_ms} {level}"),
            Self::Lifted { exit, site } => format!("uncool:{exit} {site}"),
        }
    }

    /// The announcement an event payload carries, if it is one.
    pub fn parse(payload: &str) -> Option<Self> {
        if let Some(rest) = payload.strip_prefix("cool:") {
            let mut parts = rest.split(' ');
            let exit = parts.next()?.parse().ok()?;
            let site = parts.next().filter(|s| !s.is_empty())?.to_owned();
            let remaining_ms = parts.next()?.parse().ok()?;
            let level = parts.next()?.parse().ok()?;
            if parts.next().is_some() {
                return None;
            }
            return Some(Self::Cooled {
                exit,
                site,
                remaining_ms,
                level,
            });
        }
        let rest = payload.strip_prefix("uncool:")?;
        let (exit, site) = parse_field(rest)?;
        Some(Self::Lifted {
            exit,
            site: site.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_cooldowns_and_announcements_round_trip() {
        let exit = Uuid::new_v4();
        for site in ["example.com", "198.51.100.0/24", "2001:db8:1:2::/64"] {
            assert_eq!(parse_field(&field(exit, site)), Some((exit, site)));
            for a in [
                Announcement::Cooled {
                    exit,
                    site: site.into(),
                    remaining_ms: 60_000,
                    level: 2,
                },
                Announcement::Lifted {
                    exit,
                    site: site.into(),
                },
            ] {
                assert_eq!(Announcement::parse(&a.encode()), Some(a));
            }
        }
        let c = Cooldown {
            until_ms: 1_700_000_000_000,
            level: 3,
        };
        assert_eq!(Cooldown::parse(&c.encode()), Some(c));
        for bad in [
            "cool:",
            "cool:x y 1 1",
            "uncool:",
            "exit:abc",
            "cool:{exit} a 1 1 1",
        ] {
            assert_eq!(Announcement::parse(bad), None, "{bad}");
        }
        assert_eq!(parse_field(&format!("{exit} ")), None);
    }
}
