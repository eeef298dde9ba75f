//! The destination a client asked for, validated and normalised.
//!
//! IP literals in any numeric spelling are normalised here (`127.1` becomes
//! `127.0.0.1`) so the early egress check and the agent see one canonical
//! address. Names are passed to the agent unresolved: DNS happens at the exit.

use proxynet_common::egress::parse_ip_literal;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("target needs a port")]
    MissingPort,
    #[error("target port is invalid")]
    BadPort,
    #[error("target host is not a valid name or address")]
    BadHost,
}

impl Target {
    /// Parses `host:port` / `[v6]:port` as it appears in a CONNECT request line.
    pub fn parse_authority(authority: &str) -> Result<Self, TargetError> {
        if authority.contains('@') {
            return Err(TargetError::BadHost);
        }
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (h, p) = rest.split_once(']').ok_or(TargetError::BadHost)?;
            let p = p.strip_prefix(':').ok_or(TargetError::MissingPort)?;
            (format!("[{h}]"), p)
        } else {
            let (h, p) = authority.rsplit_once(':').ok_or(TargetError::MissingPort)?;
            if h.contains(':') {
                return Err(TargetError::BadHost);
            }
            (h.to_owned(), p)
        };
        let port = parse_port(port)?;
        Self::new(&host, port)
    }

    /// Parses an absolute-form URL's authority (`host`, `host:port`, `[v6]`,
    /// `[v6]:port`). Only a port that is absent takes `default_port`: an empty,
    /// zero, non-numeric or out-of-range one is an error, never a default —
    /// the client must get the target it asked for or none.
    pub fn parse_url_authority(authority: &str, default_port: u16) -> Result<Self, TargetError> {
        if authority.contains('@') {
            return Err(TargetError::BadHost);
        }
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (h, p) = rest.split_once(']').ok_or(TargetError::BadHost)?;
            let port = match p {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or(TargetError::BadHost)?),
            };
            (format!("[{h}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => {
                    if h.contains(':') {
                        return Err(TargetError::BadHost);
                    }
                    (h.to_owned(), Some(p))
                }
                None => (authority.to_owned(), None),
            }
        };
        let port = match port {
            Some(p) => parse_port(p)?,
            None => default_port,
        };
        Self::new(&host, port)
    }

    pub fn new(host: &str, port: u16) -> Result<Self, TargetError> {
        if port == 0 {
            return Err(TargetError::BadPort);
        }
        if let Some(ip) = parse_ip_literal(host) {
            return Ok(Self {
                host: Host::Ip(ip),
                port,
            });
        }
        let name = host.strip_suffix('.').unwrap_or(host);
        if !is_dns_name(name) {
            return Err(TargetError::BadHost);
        }
        Ok(Self {
            host: Host::Name(name.to_ascii_lowercase()),
            port,
        })
    }

    /// The literal socket address, when the host is an IP.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self.host {
            Host::Ip(ip) => Some(SocketAddr::new(ip, self.port)),
            Host::Name(_) => None,
        }
    }

    /// The host as a string: a name, or the IP without brackets.
    pub fn host_string(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(name) => name.clone(),
        }
    }

    /// `host:port` for the agent link request.
    pub fn authority(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

fn parse_port(port: &str) -> Result<u16, TargetError> {
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::BadPort);
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or(TargetError::BadPort)
}

/// RFC 1123 host names (underscores tolerated, as real-world DNS has them).
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises() {
        let t = Target::parse_authority("127.1:80").unwrap();
        assert_eq!(t.authority(), "127.0.0.1:80");
        let t = Target::parse_authority("[::1]:443").unwrap();
        assert_eq!(t.authority(), "[::1]:443");
        let t = Target::parse_authority("Example.COM.:443").unwrap();
        assert_eq!(t.authority(), "example.com:443");
        let t = Target::parse_authority("2130706433:22").unwrap();
        assert_eq!(t.authority(), "127.0.0.1:22");
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(
            Target::parse_authority("example.com"),
            Err(TargetError::MissingPort)
        );
        assert_eq!(
            Target::parse_authority("example.com:0"),
            Err(TargetError::BadPort)
        );
        assert_eq!(
            Target::parse_authority("example.com:99999"),
            Err(TargetError::BadPort)
        );
        assert_eq!(
            Target::parse_authority("user@example.com:80"),
            Err(TargetError::BadHost)
        );
        assert_eq!(
            Target::parse_authority("exa mple.com:80"),
            Err(TargetError::BadHost)
        );
        assert_eq!(Target::parse_authority("::1:80"), Err(TargetError::BadHost));
        assert_eq!(Target::parse_authority(":80"), Err(TargetError::BadHost));
    }

    #[test]
    fn url_authorities_default_only_an_absent_port() {
        let t = |a: &str| Target::parse_url_authority(a, 80);
        assert_eq!(t("example.com").unwrap().authority(), "example.com:80");
        assert_eq!(
            t("example.com:8080").unwrap().authority(),
            "example.com:8080"
        );
        assert_eq!(t("[::1]").unwrap().authority(), "[::1]:80");
        assert_eq!(t("[::1]:81").unwrap().authority(), "[::1]:81");
        for bad in [
            "127.0.0.1:99999",
            "127.0.0.1:65536",
            "127.0.0.1:0",
            "127.0.0.1:",
            "127.0.0.1:8o",
            "[::1]:",
            "[::1]x",
            "[::1]:70000",
            "u@h:80",
        ] {
            assert!(t(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn authority_parser_never_panics(s in "\\PC{0,300}") {
            if let Ok(t) = Target::parse_authority(&s) {
                // Whatever parses re-parses to itself.
                prop_assert_eq!(Target::parse_authority(&t.authority()), Ok(t));
            }
        }
    }
}
