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

use proxynet_common::egress::{parse_ip_literal, Cidr};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::OnceLock;

/// Most entries in one list (allowed, denied, limits).
pub const MAX_ENTRIES: usize = 1000;
/// The longest host name DNS can carry.
const MAX_NAME: usize = 253;

/// A customer's rules for its traffic: on an account (bounding every user of
/// it) and on a user (narrowing the account's, never widening them).
/// Unknown fields are ignored here (a newer control-api may add some); the
/// control-api refuses them on input ([`TrafficPolicy::FIELDS`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficPolicy {
    /// When not empty: only targets matching an entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_domains: Vec<String>,
    /// Targets matching an entry are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_domains: Vec<String>,
    /// New tunnels per second to one registrable domain (all superproxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_new_tunnels_per_second: Option<u32>,
    /// Tunnels open at once to one registrable domain (all superproxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
/// that keeps the network from becoming one domain's flood).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorPolicy {
    #[serde(default)]
    pub denied_domains: Vec<String>,
    /// Refused target ports, besides the egress policy's built-in 25/465/587.
    #[serde(default)]
    pub denied_ports: Vec<u16>,
    /// Limits for the named domains (the most specific entry applies).
    #[serde(default)]
    pub domain_limits: Vec<DomainLimit>,
    /// The limit for any other registrable domain; none unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_domain_limit: Option<Limit>,
    /// Ban rules for every account, after the user's and the account's own
    /// ([`rule_for`]).
    #[serde(default)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainLimit {
    pub domain: String,
    #[serde(flatten)]
    pub limit: Limit,
}

/// A rate and a concurrency bound; either may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tunnels_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_tunnels: Option<u32>,
}

impl Limit {
    pub fn is_set(&self) -> bool {
        self.new_tunnels_per_second.is_some() || self.max_concurrent_tunnels.is_some()
    }
}

/// Most retry rules in one list (a user's, an account's, the operator's).
pub const MAX_RETRY_RULES: usize = 20;
/// Most other exits one rule may try after the first answer.
pub const MAX_RETRIES: u8 = 3;
/// Most site entries in one retry rule.
pub const MAX_RULE_SITES: usize = 100;
/// The longest response header name a rule may name.
const MAX_HEADER_NAME: usize = 64;

/// A ban rule (docs/policy.md, "Retry rules"): an answer from one of
/// `sites` whose status is one of `statuses` and which carries `header`
/// (each criterion that is given must hold, at least one is given) means
/// the exit is refused by that site; the gateway then tries up to `retry`
/// other exits (for requests safe to repeat) and, with `cool`, cools the
/// exit for the site.
///
/// Set on users and accounts (`PATCH`, `"retry_rules": [...]`) and by the
/// operator (`PUT /v1/policy`); [`rule_for`] picks the one that applies.
/// Unknown fields are ignored here, as in [`TrafficPolicy`] (a newer
/// control-api may add some, and a record an older superproxy cannot read
/// would lock its user out); the control-api refuses them on input
/// ([`RetryRule::FIELDS`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRule {
    /// Domain entries as in the policies (a name covers the names under
    /// it, a network IP-literal targets); empty: every site.
    #[serde(default)]
    pub sites: Vec<String>,
    /// Response statuses that mean a ban; empty: any status.
    #[serde(default)]
    pub statuses: Vec<u16>,
    /// A response header (lower case) whose presence means a ban, e.g.
    /// `cf-mitigated`; none: any headers.
    #[serde(default)]
    pub header: Option<String>,
    /// How many other exits to try after a ban, 0 to [`MAX_RETRIES`].
    #[serde(default)]
    pub retry: u8,
    /// Whether a ban cools the exit for the site at once.
    #[serde(default)]
    pub cool: bool,
}

impl RetryRule {
    pub const FIELDS: [&'static str; 5] = ["sites", "statuses", "header", "retry", "cool"];

    /// Whether the rule applies to the target: no sites, or one covering it
    /// as a policy's domain entry would ([`entry_matches`]).
    pub fn covers(&self, target: &PolicyTarget<'_>) -> bool {
        self.sites.is_empty() || self.sites.iter().any(|e| entry_matches(e, target))
    }

    /// Whether an answer with `status`, carrying the headers `has_header`
    /// says it carries (asked with a lower-case name), is a ban under this
    /// rule.
    pub fn bans(&self, status: u16, has_header: impl Fn(&str) -> bool) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&status))
            && self.header.as_deref().is_none_or(has_header)
    }

    /// [`RetryRule::covers`] the target and [`RetryRule::bans`] the answer.
    pub fn matches(
        &self,
        target: &PolicyTarget<'_>,
        status: u16,
        has_header: impl Fn(&str) -> bool,
    ) -> bool {
        self.covers(target) && self.bans(status, has_header)
    }

    /// The rule as stored: sites normalised like policy entries
    /// ([`normalize_list`]), statuses checked and de-duplicated, the header
    /// name lower-cased and checked, `retry` bounded. `Err` names the field.
    pub fn normalized(mut self, field: &str) -> Result<Self, String> {
        if self.sites.len() > MAX_RULE_SITES {
            return Err(format!("{field}.sites: at most {MAX_RULE_SITES} entries"));
        }
        self.sites = normalize_list(&format!("{field}.sites"), &self.sites)?;
        // A ban is an error answer: a rule that called a 200 a ban would
        // send every request to the target up to four times and throw away
        // answers that worked.
        if let Some(bad) = self.statuses.iter().find(|s| !(400..=599).contains(*s)) {
            return Err(format!(
                "{field}.statuses: {bad} is not an error status (400 to 599): only an error answer can be a ban"
            ));
        }
        let mut seen = Vec::with_capacity(self.statuses.len());
        self.statuses.retain(|s| {
            let first = !seen.contains(s);
            seen.push(*s);
            first
        });
        if let Some(header) = self.header.take() {
            let name = header.trim().to_ascii_lowercase();
            if !is_header_name(&name) {
                return Err(format!(
                    "{field}.header: {header:?} is not a header name (1 to {MAX_HEADER_NAME} of \
                     a-z 0-9 and !#$%&'*+-.^_`|~)"
                ));
            }
            self.header = Some(name);
        }
        if self.statuses.is_empty() {
            return Err(format!(
                "{field}.statuses: which error statuses are a ban (400 to 599; a header narrows them)"
            ));
        }
        if self.retry > MAX_RETRIES {
            return Err(format!("{field}.retry: from 0 to {MAX_RETRIES}"));
        }
        Ok(self)
    }
}

/// Whether `name` is a lower-case HTTP field name (RFC 9110 §5.1: a token)
/// of reasonable length.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HEADER_NAME
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// A whole list of retry rules as stored ([`RetryRule::normalized`] each,
/// at most [`MAX_RETRY_RULES`]); `field` names the list in errors.
pub fn normalize_retry_rules(field: &str, rules: Vec<RetryRule>) -> Result<Vec<RetryRule>, String> {
    if rules.len() > MAX_RETRY_RULES {
        return Err(format!("{field}: at most {MAX_RETRY_RULES} rules"));
    }
    rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| rule.normalized(&format!("{field}[{i}]")))
        .collect()
}

/// The retry rule that applies to a target: the first in the user's list
/// that covers it, else the first in the account's, else the first in the
/// operator's. The first covering rule decides even when it does not ban
/// the answer at hand or asks for nothing (`retry` 0, no `cool`): a user
/// or an account can so opt a site out of the rules below its own.
pub fn rule_for<'a>(
    user: &'a [RetryRule],
    account: &'a [RetryRule],
    operator: &'a [RetryRule],
    target: &PolicyTarget<'_>,
) -> Option<&'a RetryRule> {
    user.iter()
        .chain(account)
        .chain(operator)
        .find(|rule| rule.covers(target))
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

/// A target as policies see it: a normalised name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyTarget<'a> {
    Name(&'a str),
    Ip(IpAddr),
}

impl<'a> PolicyTarget<'a> {
    /// A host already passed through [`normalize_host`].
    pub fn from_normalized(host: &'a str) -> Self {
        match host.parse::<IpAddr>() {
            Ok(ip) => PolicyTarget::Ip(ip),
            Err(_) => PolicyTarget::Name(host),
        }
    }

    /// The registrable domain (public suffix plus one label) the target's
    /// per-domain limits and usage rows count it under: `a.b.example.co.uk`
    /// → `example.co.uk`; a name that is itself a suffix (`localhost`) and an
    /// IP literal count as themselves.
    pub fn registrable_domain(&self) -> String {
        match self {
            // An IPv6 literal counts as its /64 (what one host controls), so
            // walking a prefix makes neither fresh limits nor fresh rows.
            PolicyTarget::Ip(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => {
                let s = v6.segments();
                let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
            PolicyTarget::Ip(ip) => ip.to_canonical().to_string(),
            PolicyTarget::Name(name) => registrable_domain(name).to_owned(),
        }
    }
}

/// See [`PolicyTarget::registrable_domain`]; `name` must be normalised.
pub fn registrable_domain(name: &str) -> &str {
    psl::domain_str(name).unwrap_or(name)
}

/// A host as written by a client, normalised for matching: IP literals as
/// their canonical address, names through IDNA to lower-case ASCII without
/// the trailing dot. `Err` for what cannot be a host name.
pub fn normalize_host(raw: &str) -> Result<String, &'static str> {
    if let Some(ip) = parse_ip_literal(raw) {
        return Ok(ip.to_canonical().to_string());
    }
    let raw = raw.strip_suffix('.').unwrap_or(raw);
    if raw.is_empty() {
        return Err("an empty host name");
    }
    // One trailing dot is the root; more (`localhost..`) is an empty label,
    // which no resolver takes and no rule may be dodged by.
    if raw.ends_with('.') {
        return Err("not a valid host name");
    }
    let ascii = idna::domain_to_ascii(raw).map_err(|_| "not a valid host name")?;
    // IDNA maps other full stops (U+3002, U+FF0E) to `.`: the root dot may
    // appear only now.
    let ascii = match ascii.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => ascii,
    };
    if ascii.ends_with('.') {
        return Err("not a valid host name");
    }
    if ascii.is_empty() || ascii.len() > MAX_NAME || ascii.starts_with('.') || ascii.contains("..")
    {
        return Err("not a valid host name");
    }
    Ok(ascii)
}

/// One list entry as stored: a name normalised like a host (a leading `*.`
/// or `.` dropped: every entry covers the names under it), or a network in
/// canonical `addr/prefix` form.
pub fn normalize_entry(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let (addr, prefix) = match raw.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (raw, None),
    };
    if let Some(ip) = parse_ip_literal(addr) {
        let ip = ip.to_canonical();
        let cidr: Cidr = match prefix {
            Some(p) => format!("{ip}/{p}").parse()?,
            None => format!("{ip}").parse()?,
        };
        // Masked: `10.1.2.3/8` and `10.4.5.6/8` are one network, and one
        // entry (a list's duplicate check, a limit's most specific match).
        return Ok(cidr.masked().to_string());
    }
    if prefix.is_some() {
        return Err(format!("{raw:?} is not an IP network"));
    }
    let name = raw
        .strip_prefix("*.")
        .or_else(|| raw.strip_prefix('.'))
        .unwrap_or(raw);
    normalize_host(name).map_err(|e| format!("{raw:?}: {e}"))
}

/// Normalises a whole list: each entry, duplicates dropped, bounded.
pub fn normalize_list(field: &str, raw: &[String]) -> Result<Vec<String>, String> {
    if raw.len() > MAX_ENTRIES {
        return Err(format!("{field}: at most {MAX_ENTRIES} entries"));
    }
    let mut out = Vec::with_capacity(raw.len());
    for entry in raw {
        let e = normalize_entry(entry).map_err(|e| format!("{field}: {e}"))?;
        if !out.contains(&e) {
            out.push(e);
        }
    }
    Ok(out)
}

/// Whether every target `narrow` permits by its entries is also covered by
/// one of `wide`'s: a user's allow-list inside its account's.
pub fn entry_within(narrow: &str, wide: &[String]) -> bool {
    wide.iter()
        .any(|w| match (narrow.parse::<Cidr>(), w.parse::<Cidr>()) {
            (Ok(n), Ok(w)) => w.prefix_len() <= n.prefix_len() && w.contains(n.network()),
            (Err(_), Err(_)) => narrow == w || narrow.ends_with(&format!(".{w}")),
            _ => false,
        })
}

/// One list of normalised entries made ready for matching. Built once per
/// policy value (a superproxy keeps a user's record, and the operator's
/// policy, for many tunnels): names in a map, so a target is looked up as
/// itself and as each name above it on a label boundary — a handful of
/// lookups however long the list — and networks parsed once. Each entry
/// keeps its place in the list, so the rule named is the one a scan of the
/// list would have found first.
#[derive(Debug, Default)]
struct Matcher {
    names: HashMap<Box<str>, usize>,
    /// The longest name entry: a target's longer ancestors cannot be one,
    /// so a hostile 253-byte name costs no more lookups than a short one.
    longest_name: usize,
    networks: Vec<(Cidr, usize)>,
}

impl Matcher {
    fn new(list: &[String]) -> Self {
        let mut matcher = Self::default();
        for (i, entry) in list.iter().enumerate() {
            // Stored networks are always `addr/prefix` (normalize_entry).
            if entry.contains('/') {
                if let Ok(network) = entry.parse::<Cidr>() {
                    matcher.networks.push((network, i));
                }
            } else {
                matcher.longest_name = matcher.longest_name.max(entry.len());
                matcher.names.entry(entry.as_str().into()).or_insert(i);
            }
        }
        matcher
    }

    /// The target's name and every name above it that an entry could equal,
    /// longest first (`a.b.example` → `a.b.example`, `b.example`, `example`).
    fn ancestors<'n>(&self, name: &'n str) -> impl Iterator<Item = &'n str> {
        let longest = self.longest_name;
        std::iter::successors(Some(name), |n| {
            n.split_once('.')
                .map(|(_, parent)| parent)
                .filter(|p| !p.is_empty())
        })
        .skip_while(move |n| n.len() > longest)
    }

    /// The first entry (in list order) that covers the target.
    fn first(&self, target: &PolicyTarget<'_>) -> Option<usize> {
        match target {
            PolicyTarget::Name(name) => self
                .ancestors(name)
                .filter_map(|n| self.names.get(n).copied())
                .min(),
            PolicyTarget::Ip(ip) => {
                let ip = ip.to_canonical();
                self.networks
                    .iter()
                    .filter(|(network, _)| network.contains(ip))
                    .map(|(_, i)| *i)
                    .min()
            }
        }
    }

    /// The most specific entry that covers the target: the longest name,
    /// the longest prefix (of equals, the list's last, as a scan taking the
    /// maximum found it; masked entries make equal networks one entry).
    fn most_specific(&self, target: &PolicyTarget<'_>) -> Option<usize> {
        match target {
            PolicyTarget::Name(name) => self
                .ancestors(name)
                .find_map(|n| self.names.get(n).copied()),
            PolicyTarget::Ip(ip) => {
                let ip = ip.to_canonical();
                self.networks
                    .iter()
                    .filter(|(network, _)| network.contains(ip))
                    .max_by_key(|(network, i)| (network.prefix_len(), *i))
                    .map(|(_, i)| *i)
            }
        }
    }
}

/// What a policy value derives from its lists, built on first use and kept
/// with the value. It never takes part in comparing two policies (the lists
/// it comes from do), and a clone starts without it.
struct Compiled<T>(OnceLock<T>);

impl<T> Compiled<T> {
    fn get(&self, build: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(build)
    }
}

impl<T> Default for Compiled<T> {
    fn default() -> Self {
        Self(OnceLock::new())
    }
}

impl<T> Clone for Compiled<T> {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<T> PartialEq for Compiled<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for Compiled<T> {}

impl<T> std::fmt::Debug for Compiled<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compiled")
    }
}

/// Whether one normalised entry covers the target: the definition the
/// matchers ([`Matcher`]) answer by, without scanning.
pub fn entry_matches(entry: &str, target: &PolicyTarget<'_>) -> bool {
    match target {
        PolicyTarget::Name(name) => {
            // Networks never match names; a name entry matches itself and
            // what is under it, on a label boundary.
            !entry.contains('/')
                && (*name == entry
                    || name.len() > entry.len()
                        && name.ends_with(entry)
                        && name.as_bytes()[name.len() - entry.len() - 1] == b'.')
        }
        // Stored networks are always `addr/prefix` (normalize_entry): names
        // are passed over without an attempt to parse them.
        PolicyTarget::Ip(ip) => {
            entry.contains('/')
                && entry
                    .parse::<Cidr>()
                    .is_ok_and(|c| c.contains(ip.to_canonical()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Longer names and longer prefixes are more specific.
    fn entry_specificity(entry: &str) -> usize {
        match entry.parse::<Cidr>() {
            Ok(c) => usize::from(c.prefix_len()),
            Err(_) => entry.split('.').count(),
        }
    }

    fn entry() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::collection::vec(prop::sample::select(vec!["a", "b", "ex", "test"]), 1..4)
                .prop_map(|labels| labels.join(".")),
            // Stored as normalize_entry writes them (masked `addr/prefix`).
            (0u8..4, any::<u8>(), 8u8..=32).prop_map(|(o, h, len)| {
                normalize_entry(&format!("10.{o}.0.{h}/{len}")).unwrap()
            }),
        ]
    }

    fn target() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::collection::vec(prop::sample::select(vec!["a", "b", "ex", "test"]), 1..40)
                .prop_map(|labels| labels.join(".")),
            (0u8..4, any::<u8>()).prop_map(|(o, h)| format!("10.{o}.0.{h}")),
        ]
    }

    proptest! {
        /// The matchers answer exactly as a scan of the list with
        /// [`entry_matches`] does: the first covering entry, and the most
        /// specific one.
        #[test]
        fn the_matchers_answer_as_a_scan_of_the_list(
            list in prop::collection::vec(entry(), 0..12),
            host in target(),
        ) {
            let list: Vec<String> = list.iter().enumerate()
                .filter(|(i, e)| !list[..*i].contains(e))
                .map(|(_, e)| e.clone())
                .collect();
            let target = PolicyTarget::from_normalized(&host);
            let matcher = Matcher::new(&list);
            let scan_first = list.iter().position(|e| entry_matches(e, &target));
            prop_assert_eq!(matcher.first(&target), scan_first);
            let scan_best = list
                .iter()
                .enumerate()
                .filter(|(_, e)| entry_matches(e, &target))
                .max_by_key(|(_, e)| entry_specificity(e))
                .map(|(i, _)| i);
            prop_assert_eq!(matcher.most_specific(&target), scan_best);
        }
    }

    fn name(n: &str) -> String {
        normalize_host(n).unwrap()
    }

    #[test]
    fn names_are_compared_after_idna_case_and_trailing_dot() {
        assert_eq!(name("Example.COM."), "example.com");
        assert_eq!(name("Пример.рф"), "xn--e1afmkfd.xn--p1ai");
        assert_eq!(name("XN--E1AFMKFD.xn--p1ai."), "xn--e1afmkfd.xn--p1ai");
        assert_eq!(name("[::ffff:127.0.0.1]"), "127.0.0.1");
        assert_eq!(name("0x7f.1"), "127.0.0.1");
        assert!(normalize_host("").is_err());
        assert!(normalize_host("a..b").is_err());
        assert!(normalize_host("localhost..").is_err());
        assert_eq!(name("ｌｏｃａｌｈｏｓｔ"), "localhost");
        assert_eq!(name("sub.localhost\u{3002}"), "sub.localhost");
        assert!(normalize_host("localhost\u{3002}\u{3002}").is_err());
        assert!(normalize_host(&"a.".repeat(200)).is_err());
    }

    #[test]
    fn entries_cover_the_name_and_its_subdomains_on_a_label_boundary() {
        let p = TrafficPolicy {
            denied_domains: normalize_list("d", &["*.LocalHost.".into()]).unwrap(),
            ..Default::default()
        };
        assert_eq!(p.denied_domains, ["localhost"]);
        for host in ["localhost", "sub.localhost", "a.b.localhost"] {
            assert!(
                p.permits(&PolicyTarget::Name(&name(host))).is_err(),
                "{host}"
            );
        }
        for host in ["notlocalhost", "localhost.example"] {
            assert!(
                p.permits(&PolicyTarget::Name(&name(host))).is_ok(),
                "{host}"
            );
        }
        assert!(p
            .permits(&PolicyTarget::Ip("127.0.0.1".parse().unwrap()))
            .is_ok());
    }

    #[test]
    fn an_allow_list_refuses_everything_it_does_not_name_including_addresses() {
        let p = TrafficPolicy {
            allowed_domains: normalize_list("a", &["example.test".into(), "10.0.0.0/8".into()])
                .unwrap(),
            ..Default::default()
        };
        assert!(p.permits(&PolicyTarget::Name("www.example.test")).is_ok());
        assert!(p
            .permits(&PolicyTarget::Ip("10.1.2.3".parse().unwrap()))
            .is_ok());
        assert_eq!(
            p.permits(&PolicyTarget::Name("localhost")),
            Err(Refusal::NotAllowed)
        );
        assert!(p
            .permits(&PolicyTarget::Ip("127.0.0.1".parse().unwrap()))
            .is_err());
    }

    #[test]
    fn networks_are_canonical_and_match_mapped_addresses() {
        assert_eq!(normalize_entry("127.0.0.1").unwrap(), "127.0.0.1/32");
        assert_eq!(normalize_entry("2001:db8::/32").unwrap(), "2001:db8::/32");
        assert_eq!(normalize_entry("10.1.2.3/8").unwrap(), "10.0.0.0/8");
        assert_eq!(
            normalize_list("d", &["10.1.2.3/8".into(), "10.4.5.6/8".into()]).unwrap(),
            ["10.0.0.0/8"]
        );
        assert!(normalize_entry("10.0.0.0/33").is_err());
        assert!(entry_matches(
            "127.0.0.0/8",
            &PolicyTarget::Ip("::ffff:127.0.0.9".parse().unwrap())
        ));
        assert!(!entry_matches(
            "127.0.0.0/8",
            &PolicyTarget::Name("127.example")
        ));
    }

    #[test]
    fn registrable_domains_follow_the_public_suffix_list() {
        assert_eq!(registrable_domain("a.b.example.co.uk"), "example.co.uk");
        assert_eq!(registrable_domain("www.example.com"), "example.com");
        assert_eq!(registrable_domain("localhost"), "localhost");
        assert_eq!(registrable_domain("x.example.test"), "example.test");
        let v6 = |a: &str| PolicyTarget::Ip(a.parse().unwrap()).registrable_domain();
        assert_eq!(v6("2001:db8:1:2::99"), "2001:db8:1:2::/64");
        assert_eq!(v6("2001:db8:1:2:ffff::1"), v6("2001:db8:1:2::7"));
        assert_eq!(v6("::ffff:127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn the_most_specific_operator_limit_applies_else_the_default_per_domain() {
        let limit = |r| Limit {
            new_tunnels_per_second: Some(r),
            max_concurrent_tunnels: None,
        };
        let p = OperatorPolicy {
            domain_limits: vec![
                DomainLimit {
                    domain: "example.com".into(),
                    limit: limit(10),
                },
                DomainLimit {
                    domain: "api.example.com".into(),
                    limit: limit(3),
                },
            ],
            default_domain_limit: Some(limit(50)),
            ..Default::default()
        };
        assert_eq!(
            p.limit_for(&PolicyTarget::Name("v1.api.example.com")),
            Some(("api.example.com".into(), limit(3)))
        );
        assert_eq!(
            p.limit_for(&PolicyTarget::Name("www.example.com")),
            Some(("example.com".into(), limit(10)))
        );
        assert_eq!(
            p.limit_for(&PolicyTarget::Name("a.other.org")),
            Some(("other.org".into(), limit(50)))
        );
        assert_eq!(
            OperatorPolicy::default().limit_for(&PolicyTarget::Name("a.org")),
            None
        );
    }

    #[test]
    fn operator_ports_and_domains_refuse_with_the_rule_named() {
        let p = OperatorPolicy {
            denied_domains: vec!["blocked.test".into()],
            denied_ports: vec![6667],
            ..Default::default()
        };
        assert_eq!(
            p.permits(&PolicyTarget::Name("x.blocked.test"), 443),
            Err(Refusal::Operator("blocked.test".into()))
        );
        assert_eq!(
            p.permits(&PolicyTarget::Name("ok.test"), 6667),
            Err(Refusal::Port(6667))
        );
        assert!(p.permits(&PolicyTarget::Name("ok.test"), 443).is_ok());
    }

    fn rule(json: serde_json::Value) -> Result<RetryRule, String> {
        serde_json::from_value::<RetryRule>(json)
            .map_err(|e| e.to_string())?
            .normalized("retry_rules[0]")
    }

    #[test]
    fn retry_rules_are_normalised_and_bounded() {
        let r = rule(serde_json::json!({
            "sites": ["*.Example.COM.", "example.com", "10.1.2.3/24"],
            "statuses": [403, 429, 403],
            "header": " CF-Mitigated ",
            "retry": 2,
            "cool": true
        }))
        .unwrap();
        assert_eq!(r.sites, ["example.com", "10.1.2.0/24"]);
        assert_eq!(r.statuses, [403, 429]);
        assert_eq!(r.header.as_deref(), Some("cf-mitigated"));
        assert_eq!((r.retry, r.cool), (2, true));
        for bad in [
            serde_json::json!({"statuses": [99]}),
            serde_json::json!({"statuses": [200]}),
            serde_json::json!({"statuses": [302]}),
            serde_json::json!({"header": "cf-mitigated"}),
            serde_json::json!({"statuses": [600]}),
            serde_json::json!({"statuses": [403], "retry": 4}),
            serde_json::json!({"header": "cf mitigated"}),
            serde_json::json!({"header": ""}),
            serde_json::json!({"header": "x".repeat(65)}),
            serde_json::json!({"sites": ["a..b"], "statuses": [403]}),
            serde_json::json!({"retry": 1}),
        ] {
            assert!(rule(bad.clone()).is_err(), "{bad}");
        }
        let many = vec![
            RetryRule {
                statuses: vec![403],
                ..Default::default()
            };
            MAX_RETRY_RULES + 1
        ];
        assert!(normalize_retry_rules("retry_rules", many.clone()).is_err());
        assert_eq!(
            normalize_retry_rules("retry_rules", many[..MAX_RETRY_RULES].to_vec())
                .unwrap()
                .len(),
            MAX_RETRY_RULES
        );
        let err = normalize_retry_rules(
            "retry_rules",
            vec![
                many[0].clone(),
                RetryRule {
                    retry: 9,
                    ..many[0].clone()
                },
            ],
        )
        .unwrap_err();
        assert!(err.starts_with("retry_rules[1].retry"), "{err}");
    }

    #[test]
    fn a_retry_rule_bans_by_every_criterion_it_gives() {
        let both = rule(serde_json::json!({
            "sites": ["example.com"], "statuses": [403], "header": "cf-mitigated"
        }))
        .unwrap();
        let site = PolicyTarget::Name("www.example.com");
        let with = |name: &str| name == "cf-mitigated";
        let without = |_: &str| false;
        assert!(both.matches(&site, 403, with));
        assert!(!both.matches(&site, 403, without), "the header is missing");
        assert!(!both.matches(&site, 200, with), "the status is not listed");
        assert!(!both.matches(&PolicyTarget::Name("badexample.com"), 403, with));
        let any_site =
            rule(serde_json::json!({"statuses": [403], "header": "cf-mitigated"})).unwrap();
        assert!(any_site.matches(&PolicyTarget::Name("any.test"), 403, with));
        assert!(!any_site.matches(&PolicyTarget::Name("any.test"), 403, without));
        let network =
            rule(serde_json::json!({"sites": ["10.0.0.0/8"], "statuses": [429]})).unwrap();
        assert!(network.matches(&PolicyTarget::Ip("10.9.8.7".parse().unwrap()), 429, without));
        assert!(!network.covers(&PolicyTarget::Name("example.com")));
    }

    #[test]
    fn the_users_rule_comes_first_then_the_accounts_then_the_operators() {
        let on = |sites: &[&str], retry: u8| RetryRule {
            sites: sites.iter().map(|s| (*s).to_owned()).collect(),
            statuses: vec![403],
            retry,
            ..Default::default()
        };
        let user = vec![on(&["shop.example"], 1)];
        let account = vec![on(&["example"], 2), on(&[], 3)];
        let operator = vec![on(&[], 0)];
        let pick = |host: &str| {
            rule_for(&user, &account, &operator, &PolicyTarget::Name(host)).map(|r| r.retry)
        };
        assert_eq!(pick("a.shop.example"), Some(1));
        assert_eq!(pick("other.example"), Some(2));
        assert_eq!(pick("elsewhere.test"), Some(3), "empty sites: any");
        assert_eq!(
            rule_for(&[], &[], &operator, &PolicyTarget::Name("x.test")).map(|r| r.retry),
            Some(0)
        );
        assert!(rule_for(&[], &[], &[], &PolicyTarget::Name("x.test")).is_none());
    }

    #[test]
    fn a_user_allow_entry_must_sit_inside_the_accounts() {
        let wide = vec!["example.com".to_owned(), "10.0.0.0/8".to_owned()];
        assert!(entry_within("api.example.com", &wide));
        assert!(entry_within("example.com", &wide));
        assert!(entry_within("10.1.0.0/16", &wide));
        assert!(!entry_within("example.org", &wide));
        assert!(!entry_within("0.0.0.0/0", &wide));
        assert!(!entry_within("badexample.com", &wide));
    }
}
