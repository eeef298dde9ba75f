//! Matching targets against lists of normalised entries: one entry
//! ([`entry_matches`], the definition), and a whole list made ready once per
//! policy value ([`Matcher`], kept in a [`Compiled`] beside the lists).

use proxynet_common::egress::Cidr;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::target::PolicyTarget;

/// One list of normalised entries made ready for matching. Built once per
/// policy value (a superproxy keeps a user's record, and the operator's
/// policy, for many tunnels): names in a map, so a target is looked up as
/// itself and as each name above it on a label boundary — a handful of
/// lookups however long the list — and networks parsed once. Each entry
/// keeps its place in the list, so the rule named is the one a scan of the
/// list would have found first.
#[derive(Debug, Default)]
pub(crate) struct Matcher {
    names: HashMap<Box<str>, usize>,
    /// The longest name entry: a target's longer ancestors cannot be one,
    /// so a hostile 253-byte name costs no more lookups than a short one.
    longest_name: usize,
    networks: Vec<(Cidr, usize)>,
}

impl Matcher {
    pub(crate) fn new(list: &[String]) -> Self {
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
    pub(crate) fn first(&self, target: &PolicyTarget<'_>) -> Option<usize> {
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
    pub(crate) fn most_specific(&self, target: &PolicyTarget<'_>) -> Option<usize> {
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
pub(crate) struct Compiled<T>(OnceLock<T>);

impl<T> Compiled<T> {
    pub(crate) fn get(&self, build: impl FnOnce() -> T) -> &T {
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
