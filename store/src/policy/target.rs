//! A target as policies see it ([`PolicyTarget`]), and the registrable
//! domain its per-domain limits and usage rows count it under.

use std::net::IpAddr;

/// A target as policies see it: a normalised name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyTarget<'a> {
    Name(&'a str),
    Ip(IpAddr),
}

impl<'a> PolicyTarget<'a> {
    /// A host already passed through [`normalize_host`](super::normalize_host).
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
