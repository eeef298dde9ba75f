//! IP literals in every spelling a resolver accepts: bracketed or bare IPv6,
//! and IPv4 in the `inet_aton` forms (`127.1`, `0x7f.1`, `2130706433`,
//! `0177.0.0.1`), so that no numeric spelling of an address gets past the
//! egress policy as a name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Parses a host as an IP literal in any spelling a resolver would accept:
/// bracketed or bare IPv6, and IPv4 in `inet_aton` forms (1–4 parts, each
/// decimal, `0x` hex or leading-zero octal, the last part filling the remaining
/// bytes). Returns `None` for anything that is a name. A name that only *looks*
/// numeric but does not fit (`1.2.3.4.5`, `999.1.1.1`) is also `None` and goes to
/// DNS, whose answer is checked like any other.
pub fn parse_ip_literal(host: &str) -> Option<IpAddr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if host.contains(':') {
        return host.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    parse_inet_aton(host).map(IpAddr::V4)
}

fn parse_inet_aton(s: &str) -> Option<Ipv4Addr> {
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        values.push(parse_aton_part(part)?);
    }
    let (last, leading) = values.split_last()?;
    let mut acc: u32 = 0;
    for (i, v) in leading.iter().enumerate() {
        let byte = u8::try_from(*v).ok()?;
        acc |= u32::from(byte) << (24 - 8 * i);
    }
    let remaining_bits = 32 - 8 * leading.len() as u32;
    if remaining_bits < 32 && *last >= (1u64 << remaining_bits) {
        return None;
    }
    let last = u32::try_from(*last).ok()?;
    Some(Ipv4Addr::from(acc | last))
}

fn parse_aton_part(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        // "0x" alone is 0 for inet_aton.
        return (radix == 16).then_some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let value = u64::from_str_radix(digits, radix).ok()?;
    (value <= u64::from(u32::MAX)).then_some(value)
}
