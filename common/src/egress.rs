//! Egress policy: which addresses and ports an exit may connect to.
//!
//! The agent applies it to every address it is about to dial, after its own DNS
//! resolution, and dials only an address it has vetted (so DNS rebinding has no
//! window). The superproxy applies it early to literal addresses in the request,
//! so an obviously forbidden target never costs an exit a stream.
//!
//! Order of rules, first match wins:
//! 1. the stack's own service addresses (`protected`) are always denied;
//! 2. denied ports (SMTP 25/465/587 by default);
//! 3. the operator's `deny` list;
//! 4. the operator's `allow` list (how tests and the demo widen loopback);
//! 5. the built-in special-purpose ranges (loopback, RFC 1918, link-local incl.
//!    cloud metadata, CGNAT, multicast, reserved, documentation, ULA, ...);
//! 6. everything else is allowed.
//!
//! IPv6 addresses that embed an IPv4 address (mapped `::ffff:a.b.c.d`, compatible
//! `::a.b.c.d`, translated `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4
//! `2002::/16`, Teredo `2001::/32`) are judged by the embedded IPv4 address as
//! well, so `::ffff:127.0.0.1` is loopback; the compatible and translated forms
//! are refused outright besides.
//!
//! [`parse_ip_literal`] normalises every numeric spelling `inet_aton` accepts
//! (`127.1`, `0x7f.1`, `2130706433`, `0177.0.0.1`), because resolvers accept them
//! too and a check that only knows dotted quads would be bypassed.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// An IP network in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    pub const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    /// The prefix length (number of network bits).
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// The address as written (its family is the network's).
    pub fn network(&self) -> IpAddr {
        self.addr
    }

    /// The number of host bits (what the prefix leaves free).
    pub fn host_bits(&self) -> u32 {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        width - u32::from(self.prefix.min(width as u8))
    }

    /// The network with its host bits cleared: `fd0c::5/64` is `fd0c::/64`,
    /// so two spellings of one network compare and print alike.
    pub fn masked(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(self.host_bits()).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(self.host_bits()).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        };
        Cidr {
            addr,
            prefix: self.prefix,
        }
    }

    /// The host numbers worth drawing an address from: never the all-zero
    /// host part of a prefix that has host bits (IPv6's subnet-router
    /// anycast address, an IPv4 network's own address), nor an IPv4
    /// subnet's broadcast address (both only where a subnet has them: /31
    /// and /32 have neither, a /128 is its one address). A caller draws a
    /// number from it and takes [`Self::host_address`]: this crate has no
    /// random source of its own.
    pub fn usable_hosts(&self) -> std::ops::RangeInclusive<u128> {
        let bits = self.host_bits();
        let max = u128::MAX.checked_shr(128 - bits).unwrap_or(0);
        match (self.addr.is_ipv4(), bits) {
            (_, 0) => 0..=0,
            (true, 1) => 0..=1,
            (true, _) => 1..=max - 1,
            (false, _) => 1..=max,
        }
    }

    /// The address with host part `host` (its low bits; higher ones are
    /// dropped) in this network.
    pub fn host_address(&self, host: u128) -> IpAddr {
        let bits = self.host_bits();
        let host_mask = u128::MAX.checked_shr(128 - bits).unwrap_or(0);
        match self.masked().addr {
            IpAddr::V6(network) => {
                IpAddr::V6(Ipv6Addr::from(u128::from(network) | (host & host_mask)))
            }
            IpAddr::V4(network) => {
                let host = u32::try_from(host & host_mask).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(network) | host))
            }
        }
    }

    /// Whether every address of `inner` is in this network.
    pub fn covers(&self, inner: &Cidr) -> bool {
        self.prefix <= inner.prefix && self.contains(inner.addr)
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }

    /// Whether the network shares any address with a built-in special-purpose
    /// range (private, loopback, link-local, multicast, documentation, ...).
    pub fn touches_special_range(&self) -> bool {
        SPECIAL_RANGES.iter().any(|(c, _)| c.overlaps(self))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(u32::from(net)) << 96,
                u128::from(u32::from(ip)) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let mask = u128::MAX << (128 - u32::from(prefix.min(128)));
    a & mask == b & mask
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?} has an invalid prefix length"))?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Built-in ranges no exit connects to unless the operator allows them.
/// IANA special-purpose registries (RFC 6890 and successors).
const SPECIAL_RANGES: &[(Cidr, &str)] = &[
    (Cidr::v4(0, 0, 0, 0, 8), "this-network"),
    (Cidr::v4(10, 0, 0, 0, 8), "private"),
    (Cidr::v4(100, 64, 0, 0, 10), "cgnat"),
    (Cidr::v4(127, 0, 0, 0, 8), "loopback"),
    (Cidr::v4(169, 254, 0, 0, 16), "link-local"),
    (Cidr::v4(172, 16, 0, 0, 12), "private"),
    (Cidr::v4(192, 0, 0, 0, 24), "ietf-protocol"),
    (Cidr::v4(192, 0, 2, 0, 24), "documentation"),
    (Cidr::v4(192, 88, 99, 0, 24), "6to4-relay"),
    (Cidr::v4(192, 168, 0, 0, 16), "private"),
    (Cidr::v4(198, 18, 0, 0, 15), "benchmarking"),
    (Cidr::v4(198, 51, 100, 0, 24), "documentation"),
    (Cidr::v4(203, 0, 113, 0, 24), "documentation"),
    (Cidr::v4(224, 0, 0, 0, 4), "multicast"),
    (Cidr::v4(240, 0, 0, 0, 4), "reserved"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "unspecified"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
    // Deprecated IPv4-compatible (RFC 4291 §2.5.5.1) and IPv4-translated
    // (RFC 2765 SIIT) forms: no public service is reached through them, so
    // they are refused outright, and judged by the IPv4 address they carry.
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 96), "ipv4-compatible"),
    (
        Cidr::v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),
        "ipv4-translated",
    ),
    (
        Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        "local-nat64",
    ),
    (Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "discard"),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), "ietf-protocol"),
    (
        Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        "documentation",
    ),
    (Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "documentation"),
    (
        Cidr::v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),
        "segment-routing",
    ),
    (Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique-local"),
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
    (Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), "site-local"),
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
];

/// Ports denied by default: SMTP submission and relay (spam is the classic abuse).
pub const DEFAULT_DENIED_PORTS: &[u16] = &[25, 465, 587];

/// Prefix lengths an exit may egress from: IPv6 /48 to /128 (a site's
/// allocation at most), IPv4 /24 to /32 (the smallest block routed on the
/// internet at most). A wider prefix is almost surely a typo, and one exit
/// claiming it would claim other people's addresses.
pub const EGRESS_PREFIX_V6: std::ops::RangeInclusive<u8> = 48..=128;
pub const EGRESS_PREFIX_V4: std::ops::RangeInclusive<u8> = 24..=32;

/// `prefix` as an exit's egress prefix (host bits cleared), or why it
/// cannot be one. The agent checks its flags and the control-api the
/// enrollment with this one rule.
pub fn check_egress_prefix(prefix: &Cidr) -> Result<Cidr, String> {
    let (family, allowed) = if prefix.network().is_ipv4() {
        ("IPv4", EGRESS_PREFIX_V4)
    } else {
        ("IPv6", EGRESS_PREFIX_V6)
    };
    if !allowed.contains(&prefix.prefix_len()) {
        return Err(format!(
            "egress prefix {prefix}: an {family} egress prefix must be /{} to /{}",
            allowed.start(),
            allowed.end()
        ));
    }
    Ok(prefix.masked())
}

/// Parses and checks an egress prefix (`--egress-prefix`).
pub fn parse_egress_prefix(s: &str) -> Result<Cidr, String> {
    let prefix: Cidr = s.trim().parse()?;
    if !s.contains('/') {
        return Err(format!(
            "egress prefix {s:?} needs a prefix length (e.g. 2001:db8:1:2::/64); a single address is an --egress-ip"
        ));
    }
    check_egress_prefix(&prefix)
}

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// One of the stack's own service addresses.
    ProtectedService,
    Port(u16),
    /// Matched the operator's deny list.
    DenyList(Cidr),
    /// A built-in special-purpose range, by name.
    SpecialRange(&'static str),
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::ProtectedService => f.write_str("address belongs to the proxy network itself"),
            Denial::Port(p) => write!(f, "port {p} is denied"),
            Denial::DenyList(c) => write!(f, "address is in the denied network {c}"),
            Denial::SpecialRange(name) => write!(f, "address is in a {name} range"),
        }
    }
}

/// The operator-facing configuration of the policy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EgressPolicyConfig {
    /// Networks allowed even though a built-in range would deny them
    /// (e.g. `127.0.0.0/8` for a local demo). Empty by default.
    pub allow: Vec<Cidr>,
    /// Networks always denied, checked before `allow`.
    pub deny: Vec<Cidr>,
    /// Destination ports always denied.
    pub denied_ports: Vec<u16>,
    /// The stack's own service addresses (Redis, Postgres, the API, the proxy
    /// ports): denied whatever `allow` says.
    pub protected: Vec<SocketAddr>,
}

impl Default for EgressPolicyConfig {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            deny: Vec::new(),
            denied_ports: DEFAULT_DENIED_PORTS.to_vec(),
            protected: Vec::new(),
        }
    }
}

/// The egress policy's command-line flags, shared by the superproxy (early
/// literal check) and the agent (the check that counts), so both read the same
/// names and defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct EgressArgs {
    /// Networks allowed despite the built-in denials (comma-separated CIDRs).
    /// Empty by default; a local demo adds 127.0.0.0/8. Keep the superproxy's
    /// and the agents' lists equal.
    #[arg(long, env = "PROXYNET_EGRESS_ALLOW", value_delimiter = ',')]
    pub egress_allow: Vec<Cidr>,

    /// Networks always denied (comma-separated CIDRs).
    #[arg(long, env = "PROXYNET_EGRESS_DENY", value_delimiter = ',')]
    pub egress_deny: Vec<Cidr>,

    /// Destination ports always denied.
    #[arg(long, env = "PROXYNET_EGRESS_DENIED_PORTS", value_delimiter = ',', default_values_t = DEFAULT_DENIED_PORTS.to_vec())]
    pub egress_denied_ports: Vec<u16>,

    /// The stack's own service addresses (ip:port, comma-separated): always
    /// denied. Each binary adds its own listeners.
    #[arg(long, env = "PROXYNET_EGRESS_PROTECTED", value_delimiter = ',')]
    pub egress_protected: Vec<SocketAddr>,
}

impl EgressArgs {
    /// The policy configuration, with `own` (this process's listeners) protected too.
    pub fn policy(&self, own: &[SocketAddr]) -> EgressPolicyConfig {
        let mut protected = self.egress_protected.clone();
        protected.extend_from_slice(own);
        EgressPolicyConfig {
            allow: self.egress_allow.clone(),
            deny: self.egress_deny.clone(),
            denied_ports: self.egress_denied_ports.clone(),
            protected,
        }
    }
}

/// A compiled, immutable egress policy.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    config: EgressPolicyConfig,
    /// This host's own interface addresses: what a protected service bound to
    /// the unspecified address (`0.0.0.0`, `[::]`) answers on besides loopback.
    host_addresses: Vec<IpAddr>,
}

impl EgressPolicy {
    /// Compiles `config`, reading this host's interface addresses once.
    pub fn new(config: EgressPolicyConfig) -> Self {
        Self::with_host_addresses(config, host_interface_addresses())
    }

    /// Compiles `config` with an explicit list of this host's addresses.
    pub fn with_host_addresses(config: EgressPolicyConfig, host_addresses: Vec<IpAddr>) -> Self {
        let host_addresses = host_addresses.into_iter().map(canonical).collect();
        Self {
            config,
            host_addresses,
        }
    }

    pub fn config(&self) -> &EgressPolicyConfig {
        &self.config
    }

    /// Decides whether `addr` may be dialled.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Denial> {
        let ip = canonical(addr.ip());
        // Every host the address reaches, IPv4 forms embedded in IPv6 included:
        // `[64:ff9b::7f00:1]:6379` is Redis on loopback as much as `127.0.0.1:6379`.
        let hosts = denoted_hosts(ip);
        if self.config.protected.iter().any(|p| {
            p.port() == addr.port()
                && hosts
                    .iter()
                    .flatten()
                    .any(|h| self.same_host(canonical(p.ip()), *h))
        }) {
            return Err(Denial::ProtectedService);
        }
        if self.config.denied_ports.contains(&addr.port()) {
            return Err(Denial::Port(addr.port()));
        }
        // An IPv6 address carrying an IPv4 one is judged by both.
        for host in hosts.iter().flatten() {
            self.check_ip(*host)?;
        }
        Ok(())
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), Denial> {
        if let Some(c) = self.config.deny.iter().find(|c| c.contains(ip)) {
            return Err(Denial::DenyList(*c));
        }
        if self.config.allow.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        match SPECIAL_RANGES.iter().find(|(c, _)| c.contains(ip)) {
            Some((_, name)) => Err(Denial::SpecialRange(name)),
            None => Ok(()),
        }
    }

    /// Whether a connection to `ip` reaches a service bound to `protected`.
    /// A service bound to the unspecified address answers on loopback, on the
    /// unspecified address itself (Linux connects `0.0.0.0` to the local host)
    /// and on this host's interface addresses — not on every address: a
    /// superproxy on `0.0.0.0:8080` must not deny `1.1.1.1:8080`.
    fn same_host(&self, protected: IpAddr, ip: IpAddr) -> bool {
        protected == ip
            || (protected.is_loopback() && ip.is_loopback())
            || (protected.is_unspecified()
                && (ip.is_loopback() || ip.is_unspecified() || self.host_addresses.contains(&ip)))
    }
}

/// Whether a built-in special-purpose range (loopback, private, link-local,
/// ...) holds `ip` or an IPv4 address it embeds: an agent whose policy
/// widens none of them cannot reach it anyway, so it need not be told it.
pub fn in_special_range(ip: IpAddr) -> bool {
    denoted_hosts(canonical(ip))
        .iter()
        .flatten()
        .any(|h| SPECIAL_RANGES.iter().any(|(c, _)| c.contains(*h)))
}

/// This host's interface addresses (empty if they cannot be read).
pub fn host_interface_addresses() -> Vec<IpAddr> {
    match if_addrs::get_if_addrs() {
        Ok(interfaces) => interfaces.into_iter().map(|i| i.ip()).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this host's addresses; protected services bound to 0.0.0.0 are matched on loopback only");
            Vec::new()
        }
    }
}

/// The address itself and every IPv4 address it embeds (at most three).
fn denoted_hosts(ip: IpAddr) -> [Option<IpAddr>; 3] {
    let mut hosts = [Some(ip), None, None];
    if let IpAddr::V6(v6) = ip {
        let [a, b] = embedded_ipv4(v6);
        hosts[1] = a.map(IpAddr::V4);
        hosts[2] = b.map(IpAddr::V4);
    }
    hosts
}

/// IPv4-mapped IPv6 addresses are the IPv4 host they map.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn v4_from_segments(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
}

/// The IPv4 addresses embedded in an IPv4-compatible (`::a.b.c.d`),
/// IPv4-translated (`::ffff:0:a.b.c.d`, RFC 2765), NAT64
/// (`64:ff9b::/96`, RFC 6052), 6to4 (`2002:AABB:CCDD::/48`, RFC 3056) or
/// Teredo (`2001:0::/32`, RFC 4380: server in bits 32–63, client obfuscated
/// in the last 32 bits) address. Teredo yields both server and client.
fn embedded_ipv4(v6: Ipv6Addr) -> [Option<Ipv4Addr>; 2] {
    let s = v6.segments();
    let low = v4_from_segments(s[6], s[7]);
    if s[..6] == [0, 0, 0, 0, 0, 0] && u32::from(low) > 1 {
        return [Some(low), None]; // IPv4-compatible (deprecated), excluding :: and ::1
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return [Some(low), None];
    }
    if s[0] == 0x2002 {
        return [Some(v4_from_segments(s[1], s[2])), None];
    }
    if s[0] == 0x2001 && s[1] == 0 {
        let server = v4_from_segments(s[2], s[3]);
        let client = Ipv4Addr::from(!u32::from(low));
        return [Some(server), Some(client)];
    }
    [None, None]
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn numeric_spellings_normalise() {
        for spelling in [
            "127.0.0.1",
            "127.1",
            "0x7f.1",
            "2130706433",
            "0177.0.0.1",
            "0x7f000001",
            "127.0.1",
            "017700000001",
        ] {
            assert_eq!(
                parse_ip_literal(spelling),
                Some("127.0.0.1".parse().unwrap()),
                "{spelling}"
            );
        }
        assert_eq!(parse_ip_literal("[::1]"), Some("::1".parse().unwrap()));
        assert_eq!(parse_ip_literal("example.com"), None);
        assert_eq!(parse_ip_literal("256.1.1.1"), None);
        assert_eq!(parse_ip_literal("1.2.3.4.5"), None);
        assert_eq!(parse_ip_literal("08.1.1.1"), None);
        assert_eq!(parse_ip_literal(""), None);
    }

    #[test]
    fn default_policy_denies_special_ranges() {
        let p = EgressPolicy::default();
        for denied in [
            "127.0.0.1:80",
            "10.1.2.3:80",
            "172.16.0.1:80",
            "192.168.1.1:80",
            "169.254.169.254:80",
            "100.64.0.1:80",
            "224.0.0.1:80",
            "240.0.0.1:80",
            "255.255.255.255:80",
            "0.0.0.0:80",
            "192.0.2.1:80",
            "[::]:80",
            "[::1]:80",
            "[fc00::1]:80",
            "[fe80::1]:80",
            "[::ffff:127.0.0.1]:80",
            "[::127.0.0.1]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "[2002:7f00:1::]:80",
            "[2001:db8::1]:80",
            "[ff02::1]:80",
        ] {
            assert!(p.check(sa(denied)).is_err(), "{denied} should be denied");
        }
        for allowed in [
            "93.184.216.34:443",
            "[2606:2800:220:1::1]:443",
            "[64:ff9b::5db8:d822]:80",
        ] {
            assert_eq!(p.check(sa(allowed)), Ok(()), "{allowed} should be allowed");
        }
    }

    /// Every way IPv6 spells an IPv4 host, for denied hosts (loopback, the
    /// cloud metadata address, private) and a public one.
    #[test]
    fn every_ipv4_embedding_is_judged_by_its_ipv4_host() {
        let p = EgressPolicy::default();
        // (form, spelling of 127.0.0.1, of 169.254.169.254, of 10.0.0.1,
        // of 93.184.216.34, whether the public one is allowed in this form)
        let table: &[(&str, [&str; 4], bool)] = &[
            (
                "mapped",
                [
                    "::ffff:127.0.0.1",
                    "::ffff:a9fe:a9fe",
                    "::ffff:a00:1",
                    "::ffff:5db8:d822",
                ],
                true,
            ),
            (
                "compatible",
                ["::7f00:1", "::a9fe:a9fe", "::a00:1", "::5db8:d822"],
                false,
            ),
            (
                "translated",
                [
                    "::ffff:0:7f00:1",
                    "::ffff:0:a9fe:a9fe",
                    "::ffff:0:a00:1",
                    "::ffff:0:5db8:d822",
                ],
                false,
            ),
            (
                "nat64",
                [
                    "64:ff9b::7f00:1",
                    "64:ff9b::a9fe:a9fe",
                    "64:ff9b::a00:1",
                    "64:ff9b::5db8:d822",
                ],
                true,
            ),
            (
                "6to4",
                [
                    "2002:7f00:1::1",
                    "2002:a9fe:a9fe::1",
                    "2002:a00:1::1",
                    "2002:5db8:d822::1",
                ],
                true,
            ),
            // Teredo: server 65.54.227.120, client obfuscated (bits inverted);
            // 2001::/23 is an IETF protocol range, refused whatever it carries.
            (
                "teredo",
                [
                    "2001:0:4136:e378:8000:63bf:80ff:fffe",
                    "2001:0:4136:e378:8000:63bf:5601:5601",
                    "2001:0:4136:e378:8000:63bf:f5ff:fffe",
                    "2001:0:4136:e378:8000:63bf:a247:27dd",
                ],
                false,
            ),
        ];
        for (form, spellings, public_allowed) in table {
            for denied in &spellings[..3] {
                let addr = SocketAddr::new(denied.parse::<IpAddr>().unwrap(), 80);
                assert!(p.check(addr).is_err(), "{form} {addr} must be denied");
            }
            let public = SocketAddr::new(spellings[3].parse::<IpAddr>().unwrap(), 80);
            assert_eq!(
                p.check(public).is_ok(),
                *public_allowed,
                "{form} {public}: {:?}",
                p.check(public)
            );
        }
        // The case: the metadata address in the translated form.
        assert_eq!(
            p.check(sa("[::ffff:0:a9fe:a9fe]:80")),
            Err(Denial::SpecialRange("ipv4-translated"))
        );
    }

    #[test]
    fn smtp_ports_denied() {
        let p = EgressPolicy::default();
        assert_eq!(p.check(sa("93.184.216.34:25")), Err(Denial::Port(25)));
        assert_eq!(p.check(sa("93.184.216.34:587")), Err(Denial::Port(587)));
    }

    #[test]
    fn allow_list_widens_but_protected_services_stay_denied() {
        let p = EgressPolicy::new(EgressPolicyConfig {
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            protected: vec![sa("127.0.0.1:6379"), sa("0.0.0.0:5432")],
            ..Default::default()
        });
        assert_eq!(p.check(sa("127.0.0.1:8000")), Ok(()));
        assert_eq!(p.check(sa("127.0.0.1:6379")), Err(Denial::ProtectedService));
        assert_eq!(p.check(sa("127.0.0.9:6379")), Err(Denial::ProtectedService));
        assert_eq!(
            p.check(sa("[::ffff:127.0.0.1]:6379")),
            Err(Denial::ProtectedService)
        );
        assert_eq!(p.check(sa("127.0.0.1:5432")), Err(Denial::ProtectedService));
        assert!(p.check(sa("10.0.0.1:80")).is_err());
    }

    #[test]
    fn protected_services_are_denied_in_every_ipv6_spelling() {
        let p = EgressPolicy::with_host_addresses(
            EgressPolicyConfig {
                allow: vec!["127.0.0.0/8".parse().unwrap()],
                protected: vec![sa("127.0.0.1:6379")],
                ..Default::default()
            },
            Vec::new(),
        );
        for spelling in [
            "[::ffff:127.0.0.1]:6379",
            "[64:ff9b::7f00:1]:6379",
            "[2002:7f00:1::]:6379",
            "[::127.0.0.1]:6379",
            // Teredo: client 127.0.0.1 obfuscated in the last 32 bits.
            "[2001:0:4136:e378:8000:63bf:80ff:fffe]:6379",
        ] {
            assert_eq!(
                p.check(sa(spelling)),
                Err(Denial::ProtectedService),
                "{spelling}"
            );
        }
        // The same spellings on another port are judged by the ranges alone.
        assert_eq!(p.check(sa("[64:ff9b::7f00:1]:8000")), Ok(()));
    }

    #[test]
    fn unspecified_binds_protect_this_host_only() {
        let p = EgressPolicy::with_host_addresses(
            EgressPolicyConfig {
                allow: vec!["0.0.0.0/0".parse().unwrap()],
                protected: vec![sa("0.0.0.0:8080"), sa("[::]:9090")],
                ..Default::default()
            },
            vec!["10.0.0.5".parse().unwrap(), "2001:db8::5".parse().unwrap()],
        );
        assert_eq!(p.check(sa("1.1.1.1:8080")), Ok(()), "not over-blocking");
        for denied in [
            "10.0.0.5:8080",
            "127.0.0.1:8080",
            "127.0.0.7:8080",
            "0.0.0.0:8080",
            "[::ffff:10.0.0.5]:8080",
            "10.0.0.5:9090",
            "127.0.0.1:9090",
        ] {
            assert_eq!(
                p.check(sa(denied)),
                Err(Denial::ProtectedService),
                "{denied}"
            );
        }
    }

    #[test]
    fn deny_list_beats_allow_list() {
        let p = EgressPolicy::new(EgressPolicyConfig {
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            deny: vec!["127.0.0.5/32".parse().unwrap()],
            ..Default::default()
        });
        assert!(matches!(
            p.check(sa("127.0.0.5:80")),
            Err(Denial::DenyList(_))
        ));
    }

    #[test]
    fn special_range_overlaps() {
        for special in [
            "10.1.0.0/16",
            "0.0.0.0/0",
            "127.0.0.1/32",
            "::/0",
            "fe80::/64",
        ] {
            let c: Cidr = special.parse().unwrap();
            assert!(c.touches_special_range(), "{special}");
        }
        for public in ["93.184.216.0/24", "128.0.0.0/4", "2606:2800::/32"] {
            let c: Cidr = public.parse().unwrap();
            assert!(!c.touches_special_range(), "{public}");
        }
    }

    #[test]
    fn egress_prefixes_are_site_sized_at_most_and_masked() {
        let ok = |s: &str| parse_egress_prefix(s).unwrap().to_string();
        assert_eq!(ok("2001:db8:1:2::5/64"), "2001:db8:1:2::/64");
        assert_eq!(ok("2001:db8::/48"), "2001:db8::/48");
        assert_eq!(ok("2001:db8::7/128"), "2001:db8::7/128");
        assert_eq!(ok("192.0.2.77/24"), "192.0.2.0/24");
        assert_eq!(ok("192.0.2.77/32"), "192.0.2.77/32");
        for wide in ["2001:db8::/47", "2001::/16", "192.0.2.0/23", "0.0.0.0/0"] {
            let e = parse_egress_prefix(wide).unwrap_err();
            assert!(e.contains("must be /"), "{wide}: {e}");
        }
        assert!(parse_egress_prefix("2001:db8::1").is_err());
        assert!(parse_egress_prefix("nonsense/64").is_err());
        let c: Cidr = "10.1.2.3/28".parse().unwrap();
        assert_eq!(c.host_bits(), 4);
        assert_eq!(c.masked().to_string(), "10.1.2.0/28");
        let all: Cidr = "::/0".parse().unwrap();
        assert_eq!(all.host_bits(), 128);
        assert_eq!(all.masked().to_string(), "::/0");
    }

    #[test]
    fn cidr_parsing() {
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nonsense".parse::<Cidr>().is_err());
        let c: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(c.contains("2001:db8::5".parse().unwrap()));
        assert!(!c.contains("10.0.0.1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn literal_parser_never_panics(s in "\\PC{0,80}") {
            let _ = parse_ip_literal(&s);
        }

        #[test]
        fn every_numeric_spelling_of_an_ipv4_normalises_to_it(raw in any::<u32>()) {
            let ip = Ipv4Addr::from(raw);
            let [a, b, c, d] = ip.octets();
            let spellings = [
                ip.to_string(),
                raw.to_string(),
                format!("0x{raw:x}"),
                format!("0{raw:o}"),
                format!("{a}.{}", (u32::from(b) << 16) | (u32::from(c) << 8) | u32::from(d)),
                format!("{a}.{b}.{}", (u32::from(c) << 8) | u32::from(d)),
                format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),
                format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
            ];
            for s in spellings {
                prop_assert_eq!(parse_ip_literal(&s), Some(IpAddr::V4(ip)), "{}", s);
            }
        }

        #[test]
        fn ipv6_forms_of_a_denied_ipv4_are_denied(raw in any::<u32>(), port in 1u16..) {
            let policy = EgressPolicy::default();
            let v4 = Ipv4Addr::from(raw);
            let direct = policy.check(SocketAddr::new(IpAddr::V4(v4), port));
            let o = v4.octets();
            let embedded = [
                v4.to_ipv6_mapped(),
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([o[2], o[3]])),
                Ipv6Addr::new(0x2002, u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([o[2], o[3]]), 0, 0, 0, 0, 1),
            ];
            if direct.is_err() {
                for v6 in embedded {
                    prop_assert!(policy.check(SocketAddr::new(IpAddr::V6(v6), port)).is_err(), "{} allowed", v6);
                }
            }
        }
    }
}
