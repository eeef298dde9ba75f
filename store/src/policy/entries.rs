//! Domain entries and hosts as stored and matched: the normalisation the
//! control-api applies to what it stores and the superproxy to every
//! target's host (IDNA, case, the trailing dot; networks masked), and the
//! check that a user's entry sits inside its account's.

use proxynet_common::egress::{parse_ip_literal, Cidr};

/// Most entries in one list (allowed, denied, limits).
pub const MAX_ENTRIES: usize = 1000;
/// The longest host name DNS can carry.
const MAX_NAME: usize = 253;

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
