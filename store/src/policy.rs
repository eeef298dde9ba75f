//! Traffic policy by target: which hosts a customer's or the operator's rules
//! refuse, and the per-domain limits they set. Written once, here: the
//! control-api validates and normalises what it stores with these functions,
//! and the superproxy matches every tunnel's target with them.
//!
//! A *domain entry* is a host name (`example.com`, matching it and every
//! name under it; a leading `*.` or `.` means the same) or an IP network
//! (`10.0.0.0/8`, `2001:db8::/32`, a bare address), which matches IP-literal
//! targets only. Names are compared after IDNA (UTS 46) mapping to ASCII,
//! lower-casing and removal of one trailing dot, so `Пример.рф.`,
//! `xn--e1afmkfd.xn--p1ai` and `XN--E1AFMKFD.xn--p1ai` are one name.
//! A name is matched as written: what it resolves to is the egress policy's
//! business (at the exit), not this one's.
//!
//! Here: the policies themselves ([`TrafficPolicy`], [`OperatorPolicy`])
//! and why they refuse ([`Refusal`]). Beside them, each in its file: the
//! target ([`PolicyTarget`]), entries and their normalisation
//! ([`normalize_entry`]), matching ([`entry_matches`]), and retry rules
//! ([`RetryRule`]).

mod entries;
mod matcher;
mod retry;
mod target;

pub use entries::{entry_within, normalize_entry, normalize_host, normalize_list, MAX_ENTRIES};
pub use matcher::entry_matches;
pub use retry::{
    normalize_retry_rules, rule_for, RetryRule, MAX_RETRIES, MAX_RETRY_RULES, MAX_RULE_SITES,
};
pub use target::{registrable_domain, PolicyTarget};

use matcher::{Compiled, Matcher};
use serde::{Deserialize, Serialize};

/// A customer's rules for its traffic: on an account (bounding every user of
/// it) and on a user (narrowing the account's, never widening them).
/// Unknown fields are ignored here (a newer control-api may add some); the
/// control-api refuses them on input ([`TrafficPolicy::FIELDS`]), which is
/// what its schema says (`additionalProperties: false`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(
    deny_unknown_fields,
    description = "A customer's rules by target (docs/policy.md): entries are host names \
        (covering their subdomains) or IP networks"
)]
pub struct TrafficPolicy {
    /// When not empty: only targets matching an entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ENTRIES))]
    pub allowed_domains: Vec<String>,
    /// Targets matching an entry are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ENTRIES))]
    pub denied_domains: Vec<String>,
    /// New tunnels per second to one registrable domain (all superproxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DOMAIN_LIMIT))]
    pub domain_new_tunnels_per_second: Option<u32>,
    /// Tunnels open at once to one registrable domain (all superproxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DOMAIN_LIMIT))]
    pub domain_max_concurrent_tunnels: Option<u32>,
    /// `denied_domains` and `allowed_domains` made ready for matching.
    #[serde(skip)]
    matchers: Compiled<[Matcher; 2]>,
}

impl TrafficPolicy {
    pub const FIELDS: [&'static str; 4] = [
        "allowed_domains",
        "denied_domains",
        "domain_new_tunnels_per_second",
        "domain_max_concurrent_tunnels",
    ];

    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Whether the target may be reached under these rules; the refusal
    /// names the rule.
    pub fn permits(&self, target: &PolicyTarget<'_>) -> Result<(), Refusal> {
        self.denies(target)?;
        let [_, allowed] = self.matchers();
        if !self.allowed_domains.is_empty() && allowed.first(target).is_none() {
            return Err(Refusal::NotAllowed);
        }
        Ok(())
    }

    /// Whether `denied_domains` refuses the target, the allow-list aside:
    /// for a name learnt after the target itself was judged (the server
    /// name a TLS client sends through a tunnel to an address, which the
    /// allow-list already let through).
    pub fn denies(&self, target: &PolicyTarget<'_>) -> Result<(), Refusal> {
        let [denied, _] = self.matchers();
        match denied.first(target) {
            Some(i) => Err(Refusal::Denied(self.denied_domains[i].clone())),
            None => Ok(()),
        }
    }

    /// `denied_domains` and `allowed_domains`, made ready on first use.
    fn matchers(&self) -> &[Matcher; 2] {
        self.matchers.get(|| {
            [
                Matcher::new(&self.denied_domains),
                Matcher::new(&self.allowed_domains),
            ]
        })
    }

    /// Whether the domain limits set anything (a Redis round trip is only
    /// spent when they do).
    pub fn has_domain_limits(&self) -> bool {
        self.domain_new_tunnels_per_second.is_some() || self.domain_max_concurrent_tunnels.is_some()
    }
}

/// The operator's rules for every account: refused domains and ports, and
/// aggregate per-domain limits over all accounts and superproxies (the guard
/// that keeps the network from becoming one domain's flood). Unknown fields
/// are ignored here, as in [`TrafficPolicy`]; the control-api refuses them
/// on input ([`OperatorPolicy::FIELDS`]), as its schema says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(
    deny_unknown_fields,
    description = "Rules for every account (docs/policy.md); domain limits count all accounts together"
)]
pub struct OperatorPolicy {
    #[serde(default)]
    #[schemars(length(max = MAX_ENTRIES))]
    pub denied_domains: Vec<String>,
    /// Refused target ports, besides the egress policy's built-in 25/465/587.
    #[serde(default)]
    #[schemars(length(max = MAX_ENTRIES), inner(range(min = 1)))]
    pub denied_ports: Vec<u16>,
    /// Limits for the named domains (the most specific entry applies).
    #[serde(default)]
    #[schemars(length(max = MAX_ENTRIES))]
    pub domain_limits: Vec<DomainLimit>,
    /// The limit for any other registrable domain; none unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_domain_limit: Option<Limit>,
    /// Ban rules for every account, after the user's and the account's own.
    #[serde(default)]
    #[schemars(length(max = MAX_RETRY_RULES))]
    pub retry_rules: Vec<RetryRule>,
    /// `denied_domains` and the `domain_limits` entries made ready for
    /// matching.
    #[serde(skip)]
    matchers: Compiled<[Matcher; 2]>,
}

impl OperatorPolicy {
    pub const FIELDS: [&'static str; 5] = [
        "denied_domains",
        "denied_ports",
        "domain_limits",
        "default_domain_limit",
        "retry_rules",
    ];

    /// Whether the target (host and port) may be reached at all.
    pub fn permits(&self, target: &PolicyTarget<'_>, port: u16) -> Result<(), Refusal> {
        if self.denied_ports.contains(&port) {
            return Err(Refusal::Port(port));
        }
        match self.matchers().0.first(target) {
            Some(i) => Err(Refusal::Operator(self.denied_domains[i].clone())),
            None => Ok(()),
        }
    }

    fn matchers(&self) -> (&Matcher, &Matcher) {
        let [denied, limited] = self.matchers.get(|| {
            let limited: Vec<String> = self
                .domain_limits
                .iter()
                .map(|l| l.domain.clone())
                .collect();
            [Matcher::new(&self.denied_domains), Matcher::new(&limited)]
        });
        (denied, limited)
    }

    /// The aggregate limit that applies to the target and the key it is
    /// counted under: the most specific matching entry (counted as that
    /// entry, so every name under it shares one budget), else the default
    /// (counted per registrable domain).
    pub fn limit_for(&self, target: &PolicyTarget<'_>) -> Option<(String, Limit)> {
        let best = self
            .matchers()
            .1
            .most_specific(target)
            .map(|i| &self.domain_limits[i]);
        match best {
            Some(l) => Some((l.domain.clone(), l.limit)),
            None => self
                .default_domain_limit
                .filter(|l| l.is_set())
                .map(|l| (target.registrable_domain(), l)),
        }
    }
}

/// One operator limit entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
// The control-api refuses unknown fields of an entry on input: so does the
// schema (serde itself ignores them, as for the policies).
#[schemars(deny_unknown_fields)]
pub struct DomainLimit {
    pub domain: String,
    #[serde(flatten)]
    pub limit: Limit,
}

/// A rate and a concurrency bound; either may be absent.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
// Refused unknown fields as `default_domain_limit` (by the control-api), as
// the schema says; its name in the document is the one it always had.
#[schemars(rename = "DomainLimitValues", deny_unknown_fields)]
pub struct Limit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DOMAIN_LIMIT))]
    pub new_tunnels_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DOMAIN_LIMIT))]
    pub max_concurrent_tunnels: Option<u32>,
}

/// The largest per-domain rate or concurrency a policy may name (the
/// control-api refuses more).
pub const MAX_DOMAIN_LIMIT: u32 = 1_000_000;

impl Limit {
    pub fn is_set(&self) -> bool {
        self.new_tunnels_per_second.is_some() || self.max_concurrent_tunnels.is_some()
    }
}

/// Why a policy refuses a target; `Display` is the detail a client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A customer's `denied_domains` entry.
    Denied(String),
    /// A customer's `allowed_domains` does not list the target.
    NotAllowed,
    /// The operator's `denied_domains` entry.
    Operator(String),
    /// The operator's `denied_ports`.
    Port(u16),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Denied(rule) => write!(f, "denied_domains entry {rule:?}"),
            Refusal::NotAllowed => f.write_str("not in allowed_domains"),
            Refusal::Operator(rule) => write!(f, "the operator's denied_domains entry {rule:?}"),
            Refusal::Port(port) => write!(f, "the operator's denied_ports ({port})"),
        }
    }
}

#[cfg(test)]
mod tests;
