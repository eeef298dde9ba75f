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
//!
//! The limits and code lists are in `rules`, the parsed result's types in
//! `types`, the parser in `parser`.

pub use crate::continent::Continent;

mod parser;
mod rules;
mod types;

pub use parser::{parse, parse_options};
pub use rules::{
    is_base_username, is_country_code, parse_subdivision, subdivision_code,
    DEFAULT_SESSION_MINUTES, MAX_BASE_USERNAME_BYTES, MAX_OPTIONS_BYTES, MAX_SESSION_MINUTES,
    MAX_USERNAME_BYTES,
};
pub use types::{
    IpVersion, ParsedUsername, Rotate, Session, SessionMode, Targeting, UsernameError,
};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties;
