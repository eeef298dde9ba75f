//! Limits and the ceilings an operator puts over them.
//!
//! A user's [`Limits`] (tunnels at once, new tunnels a second, bandwidth per
//! period, which exits it may use) are set by whoever manages the user. What
//! an operator sets is a ceiling for the account's own keys: on a user (its
//! `ceilings`, the limits the operator last wrote) and on an account (its
//! [`Entitlements`]). An account key may lower a limit below a ceiling,
//! never raise or remove it: [`fit_under`] fills what it leaves out from the
//! user's ceiling and refuses what exceeds either, naming the field (403).
//! The superproxy enforces the stricter of account and user (the projection
//! writes both into the user's record).

use proxynet_store::{Channel, QuotaPeriod, SourceType};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Per-user (or, as entitlements, per-account) limits. `null` or absent: no
/// limit of that kind (under a ceiling: the ceiling's).
// The kinds are kept as strings (what is stored); their schemas are those of
// the types `validate` parses them into, so the document lists the values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_tunnels: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_new_tunnels_per_second: Option<i32>,
    /// Bytes (up + down) per `period`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub bandwidth_bytes: Option<i64>,
    /// `daily` or `monthly` (UTC calendar); default monthly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<QuotaPeriod>")]
    pub period: Option<String>,
    /// Soft warning threshold, percent of `bandwidth_bytes` (default 80).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub warn_percent: Option<i32>,
    /// Exit source types the user may use (default: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<SourceType>>")]
    pub allowed_source_types: Option<Vec<String>>,
    /// Exit countries (ISO 3166-1 alpha-2, upper case) the user may use (default: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(regex(pattern = "^[A-Z]{2}$")))]
    pub allowed_countries: Option<Vec<String>>,
    /// Acquisition channels of exit sources the user may use (default: any),
    /// e.g. `["owned", "leased"]` for datacenter addresses we own or lease only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<Channel>>")]
    pub allowed_channels: Option<Vec<String>>,
}

impl Limits {
    pub(crate) fn validate(&self) -> Result<(), ApiError> {
        for (field, value) in [
            ("limits.max_concurrent_tunnels", self.max_concurrent_tunnels),
            (
                "limits.max_new_tunnels_per_second",
                self.max_new_tunnels_per_second,
            ),
        ] {
            if value.is_some_and(|v| v <= 0) {
                return Err(ApiError::BadRequest(format!(
                    "{field}: must be a positive number"
                )));
            }
        }
        if self.bandwidth_bytes.is_some_and(|v| v <= 0) {
            return Err(ApiError::BadRequest(
                "limits.bandwidth_bytes: must be a positive number".into(),
            ));
        }
        if self.warn_percent.is_some_and(|w| !(1..=100).contains(&w)) {
            return Err(ApiError::BadRequest("limits.warn_percent: 1 to 100".into()));
        }
        for t in self.allowed_source_types.iter().flatten() {
            if SourceType::parse(t).is_none() {
                return Err(ApiError::BadRequest(format!(
                    "limits.allowed_source_types: {t:?} is not dc, isp, res or mobile"
                )));
            }
        }
        for c in self.allowed_countries.iter().flatten() {
            if c.len() != 2 || !c.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ApiError::BadRequest(format!(
                    "limits.allowed_countries: {c:?} is not an upper-case alpha-2 code"
                )));
            }
        }
        for c in self.allowed_channels.iter().flatten() {
            if Channel::parse(c).is_none() {
                return Err(ApiError::BadRequest(format!(
                    "limits.allowed_channels: {c:?} is not owned, leased, isp, sdk, extension, sharing or reseller"
                )));
            }
        }
        if let Some(p) = &self.period {
            if QuotaPeriod::parse(p).is_none() {
                return Err(ApiError::BadRequest(
                    "limits.period: daily or monthly".into(),
                ));
            }
        }
        Ok(())
    }

    /// The quota period, defaulted.
    pub(crate) fn period(&self) -> QuotaPeriod {
        self.period
            .as_deref()
            .and_then(QuotaPeriod::parse)
            .unwrap_or_default()
    }

    /// Whether any limit of the account-wide kind is set.
    pub(crate) fn has_totals(&self) -> bool {
        self.max_concurrent_tunnels.is_some()
            || self.max_new_tunnels_per_second.is_some()
            || self.bandwidth_bytes.is_some()
    }
}

/// How wide an account's allow-listed networks may be (operator-set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AllowlistRules {
    /// Shortest IPv4 prefix allowed (default [`MIN_PREFIX_V4`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        range(min = 0, max = 32),
        description = "Shortest IPv4 prefix allowed",
        extend("default" = MIN_PREFIX_V4)
    )]
    pub min_prefix_v4: Option<u8>,
    /// Shortest IPv6 prefix allowed (default [`MIN_PREFIX_V6`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        range(min = 0, max = 128),
        description = "Shortest IPv6 prefix allowed",
        extend("default" = MIN_PREFIX_V6)
    )]
    pub min_prefix_v6: Option<u8>,
    /// Allow special-purpose ranges (private, loopback, multicast, ...).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub special_ranges: bool,
    /// Most networks the account's users may hold together (default
    /// [`MAX_NETWORKS`]): a squatter cannot claim other people's space at
    /// scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        description = "Most networks the account's users may hold together",
        extend("default" = MAX_NETWORKS)
    )]
    pub max_networks: Option<u32>,
}

impl AllowlistRules {
    /// Whether `cidr` is within these rules; the reason when not.
    pub(crate) fn permits(&self, cidr: &proxynet_common::egress::Cidr) -> Result<(), String> {
        let (min, family) = match cidr.network() {
            std::net::IpAddr::V4(_) => (self.min_prefix_v4.unwrap_or(MIN_PREFIX_V4), "IPv4"),
            std::net::IpAddr::V6(_) => (self.min_prefix_v6.unwrap_or(MIN_PREFIX_V6), "IPv6"),
        };
        if cidr.prefix_len() < min {
            return Err(format!(
                "{cidr} is wider than this account may allow-list ({family} /{min} or narrower; an operator can allow more in the account's entitlements)"
            ));
        }
        if !self.special_ranges && cidr.touches_special_range() {
            return Err(format!(
                "{cidr} is in a private, loopback, multicast or other special-purpose range (an operator can allow these in the account's entitlements)"
            ));
        }
        Ok(())
    }

    pub(crate) fn max_networks(&self) -> u32 {
        self.max_networks.unwrap_or(MAX_NETWORKS)
    }
}

/// Default most allow-listed networks per account.
pub(crate) const MAX_NETWORKS: u32 = 256;

/// Default shortest allow-listed IPv4 prefix: one /24 is a site; anything
/// wider is a claim on other people's addresses.
pub(crate) const MIN_PREFIX_V4: u8 = 24;
/// Default shortest allow-listed IPv6 prefix: a /48 is one site's assignment.
pub(crate) const MIN_PREFIX_V6: u8 = 48;

/// What an operator grants an account (`PUT /v1/accounts/{id}/entitlements`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entitlements {
    /// Account-wide totals (tunnels at once, new tunnels a second, bytes per
    /// period, summed over every user of the account) and restrictions
    /// (source types, countries, channels) every user of the account is held
    /// to; each also bounds what an account key may set on a user.
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub allowlist: AllowlistRules,
}

impl Entitlements {
    pub(crate) fn validate(&self) -> Result<(), ApiError> {
        self.limits.validate().map_err(|e| match e {
            ApiError::BadRequest(m) => ApiError::BadRequest(format!("entitlements.{m}")),
            other => other,
        })?;
        if self.allowlist.min_prefix_v4.is_some_and(|p| p > 32) {
            return Err(ApiError::BadRequest(
                "entitlements.allowlist.min_prefix_v4: 0 to 32".into(),
            ));
        }
        if self.allowlist.min_prefix_v6.is_some_and(|p| p > 128) {
            return Err(ApiError::BadRequest(
                "entitlements.allowlist.min_prefix_v6: 0 to 128".into(),
            ));
        }
        Ok(())
    }
}

/// Whose ceiling a refusal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ceiling {
    /// The limits an operator set on this user: absent fields take them.
    User,
    /// The account's entitlements: checked, not copied (they already bound
    /// the account as a whole).
    Account,
}

impl Ceiling {
    fn whose(self) -> &'static str {
        match self {
            Ceiling::User => "the operator's ceiling for this user",
            Ceiling::Account => "the account's entitlement",
        }
    }
}

fn over(field: &str, ceiling: Ceiling, allowed: impl std::fmt::Display) -> ApiError {
    ApiError::Forbidden(format!(
        "limits.{field}: {} is {allowed}; an account key may lower it, not raise or remove it",
        ceiling.whose()
    ))
}

/// Fits `limits` (what an account key asked for) under `ceiling`: refuses
/// anything above it (403 naming the field) and, for [`Ceiling::User`],
/// takes the ceiling's value where the request left a field out.
pub(crate) fn fit_under(
    limits: &mut Limits,
    ceiling: &Limits,
    kind: Ceiling,
) -> Result<(), ApiError> {
    fn number<T: Copy + PartialOrd + std::fmt::Display>(
        field: &str,
        value: &mut Option<T>,
        ceiling: Option<T>,
        kind: Ceiling,
    ) -> Result<(), ApiError> {
        let Some(max) = ceiling else { return Ok(()) };
        match *value {
            Some(v) if v > max => Err(over(field, kind, max)),
            Some(_) => Ok(()),
            None if kind == Ceiling::User => {
                *value = Some(max);
                Ok(())
            }
            None => Ok(()),
        }
    }
    fn subset(
        field: &str,
        value: &mut Option<Vec<String>>,
        ceiling: &Option<Vec<String>>,
        kind: Ceiling,
    ) -> Result<(), ApiError> {
        let Some(allowed) = ceiling else {
            return Ok(());
        };
        match value {
            Some(asked) => match asked.iter().find(|a| !allowed.contains(a)) {
                Some(extra) => Err(ApiError::Forbidden(format!(
                    "limits.{field}: {extra:?} is outside {} ({}); an account key may narrow it, not widen it",
                    kind.whose(),
                    allowed.join(", ")
                ))),
                None => Ok(()),
            },
            None if kind == Ceiling::User => {
                *value = Some(allowed.clone());
                Ok(())
            }
            None => Ok(()),
        }
    }
    number(
        "max_concurrent_tunnels",
        &mut limits.max_concurrent_tunnels,
        ceiling.max_concurrent_tunnels,
        kind,
    )?;
    number(
        "max_new_tunnels_per_second",
        &mut limits.max_new_tunnels_per_second,
        ceiling.max_new_tunnels_per_second,
        kind,
    )?;
    let comparable = kind == Ceiling::User
        || limits.bandwidth_bytes.is_none()
        || limits.period() == ceiling.period();
    if ceiling.bandwidth_bytes.is_some() && comparable {
        // A daily and a monthly quota cannot be compared: a user ceiling
        // keeps its period; an account total of another period is enforced
        // on its own (the account's counter).
        let asked = limits.period.as_deref().map(QuotaPeriod::parse);
        let period = ceiling.period();
        if asked.is_some_and(|p| p != Some(period)) && limits.bandwidth_bytes.is_some() {
            return Err(over("period", kind, period.as_str()));
        }
        number(
            "bandwidth_bytes",
            &mut limits.bandwidth_bytes,
            ceiling.bandwidth_bytes,
            kind,
        )?;
        if kind == Ceiling::User || limits.bandwidth_bytes.is_some() {
            limits.period = Some(period.as_str().to_owned());
        }
    }
    subset(
        "allowed_source_types",
        &mut limits.allowed_source_types,
        &ceiling.allowed_source_types,
        kind,
    )?;
    subset(
        "allowed_countries",
        &mut limits.allowed_countries,
        &ceiling.allowed_countries,
        kind,
    )?;
    subset(
        "allowed_channels",
        &mut limits.allowed_channels,
        &ceiling.allowed_channels,
        kind,
    )?;
    Ok(())
}

/// The stricter of two sets of limits, field by field (a bandwidth ceiling
/// of another period stays `a`'s: the two cannot be compared).
pub(crate) fn stricter(a: &Limits, b: &Limits) -> Limits {
    let same_period =
        a.bandwidth_bytes.is_none() || b.bandwidth_bytes.is_none() || a.period() == b.period();
    Limits {
        max_concurrent_tunnels: min_some(a.max_concurrent_tunnels, b.max_concurrent_tunnels),
        max_new_tunnels_per_second: min_some(
            a.max_new_tunnels_per_second,
            b.max_new_tunnels_per_second,
        ),
        bandwidth_bytes: if same_period {
            min_some(a.bandwidth_bytes, b.bandwidth_bytes)
        } else {
            a.bandwidth_bytes
        },
        period: if a.bandwidth_bytes.is_some() || !same_period {
            a.period.clone()
        } else {
            b.period.clone()
        },
        warn_percent: a.warn_percent.or(b.warn_percent),
        allowed_source_types: intersect(
            a.allowed_source_types.as_deref(),
            b.allowed_source_types.as_deref(),
        ),
        allowed_countries: intersect(
            a.allowed_countries.as_deref(),
            b.allowed_countries.as_deref(),
        ),
        allowed_channels: intersect(a.allowed_channels.as_deref(), b.allowed_channels.as_deref()),
    }
}

/// Where both restrict, what both allow; where one does, that one.
pub(crate) fn intersect(a: Option<&[String]>, b: Option<&[String]>) -> Option<Vec<String>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.iter().filter(|x| b.contains(x)).cloned().collect()),
        (Some(one), None) | (None, Some(one)) => Some(one.to_vec()),
        (None, None) => None,
    }
}

/// The stricter of two optional numbers.
/// A user's bandwidth quota as the superproxy enforces it: its own limit in
/// its own period, bounded by a ceiling of the same period (a ceiling of
/// another period is the account's total's business). The projection and
/// the quota notices both use this, so they cannot disagree.
pub(crate) fn user_bandwidth(
    own: Option<i64>,
    period: QuotaPeriod,
    ceiling: Option<i64>,
    ceiling_period: QuotaPeriod,
) -> Option<i64> {
    match ceiling {
        Some(c) if ceiling_period == period => min_some(own, Some(c)),
        _ => own,
    }
}

pub(crate) fn min_some<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (one, None) | (None, one) => one,
    }
}

#[cfg(test)]
mod tests;
