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

mod literal;

pub use literal::parse_ip_literal;

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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties;
