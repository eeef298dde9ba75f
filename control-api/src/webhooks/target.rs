//! Where a webhook may point: an `http(s)` URL of at most 2048 bytes,
//! without credentials or fragment, whose host — an IP literal, or every
//! address its name resolves to — passes the egress policy tunnels obey
//! (`proxynet_common::egress`): no loopback, private, link-local, CGNAT,
//! multicast, reserved or documentation range (nor their IPv6 and embedded
//! forms) unless `--webhook-allow-internal`; never this control plane's own
//! services (API, Redis, Postgres); never the SMTP ports.
//!
//! Checked when the webhook is created and again on every delivery, on the
//! addresses actually dialled (a name that resolved to a public address at
//! creation and to 127.0.0.1 now — DNS rebinding — is refused then).
//!
//! A refusal names the rule that refused, and the address only when asked
//! to (`reveal`): what an internal name resolves to is a map of the
//! operator's network, so a customer is told `db.internal resolves to an
//! address that is refused: ...` and the address goes to the log (a warning
//! with the host, the address and the rule). A URL whose host is an IP
//! literal is answered with that literal: the customer wrote it.

use proxynet_common::egress::{Cidr, EgressPolicy, EgressPolicyConfig, DEFAULT_DENIED_PORTS};
use reqwest::Url;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Longest URL accepted, in bytes.
pub(crate) const MAX_URL_BYTES: usize = 2048;

/// How long resolving a webhook's host may take.
pub(crate) const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A parsed, well-formed webhook URL (its addresses not yet checked).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub url: Url,
    /// The host as the URL names it (a name, or an address without brackets).
    pub host: String,
    pub port: u16,
    /// The host, when it is an IP literal.
    pub literal: Option<IpAddr>,
}

/// The policy webhook targets are held to: the egress policy's built-in
/// denials (lifted, apart from the protected services and ports, by
/// `allow_internal`) with `protected` always denied.
pub(crate) fn policy(allow_internal: bool, protected: &[SocketAddr]) -> EgressPolicy {
    let allow = if allow_internal {
        vec![
            Cidr::v4(0, 0, 0, 0, 0),
            Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 0),
        ]
    } else {
        Vec::new()
    };
    EgressPolicy::new(EgressPolicyConfig {
        allow,
        deny: Vec::new(),
        denied_ports: DEFAULT_DENIED_PORTS.to_vec(),
        protected: protected.to_vec(),
    })
}

/// Parses `url` as a webhook target; the reason (for a 400) when it is not one.
pub(crate) fn parse(url: &str) -> Result<Target, String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!("url: at most {MAX_URL_BYTES} bytes"));
    }
    let parsed = Url::parse(url).map_err(|e| format!("url: not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("url: http:// or https:// only".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "url: no credentials in the URL (verify the Proxynet-Signature header instead)".into(),
        );
    }
    if parsed.fragment().is_some() {
        return Err("url: no fragment (it is never sent)".into());
    }
    // The URL parser has already told names from literals, with every IPv4
    // spelling (`0x7f.1`, `2130706433`) read as the address it means.
    let (host, literal) = match parsed.host() {
        Some(url::Host::Domain(name)) if !name.is_empty() => (name.to_owned(), None),
        Some(url::Host::Ipv4(v4)) => (v4.to_string(), Some(IpAddr::V4(v4))),
        Some(url::Host::Ipv6(v6)) => (v6.to_string(), Some(IpAddr::V6(v6))),
        _ => return Err("url: names no host".to_owned()),
    };
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| "url: names no port".to_owned())?;
    Ok(Target {
        url: parsed,
        host,
        port,
        literal,
    })
}

/// The addresses `target` reaches: its literal, or what its name resolves
/// to now (each with the URL's port).
pub(crate) async fn resolve(target: &Target) -> Result<Vec<SocketAddr>, String> {
    if let Some(ip) = target.literal {
        return Ok(vec![SocketAddr::new(ip, target.port)]);
    }
    let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
    let addrs: Vec<SocketAddr> = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
        Ok(Ok(addrs)) => addrs.collect(),
        Ok(Err(e)) => return Err(format!("cannot resolve {}: {e}", target.host)),
        Err(_) => return Err(format!("resolving {} timed out", target.host)),
    };
    if addrs.is_empty() {
        return Err(format!("{} resolves to no address", target.host));
    }
    Ok(addrs)
}

/// Refuses `addrs` unless every one passes `policy`, naming the rule that
/// refused the first that does not (and the address, if `reveal`).
pub(crate) fn check_all(
    policy: &EgressPolicy,
    host: &str,
    addrs: &[SocketAddr],
    reveal: bool,
) -> Result<(), String> {
    for addr in addrs {
        if let Err(denial) = policy.check(*addr) {
            return Err(denied(host, *addr, &denial, reveal));
        }
    }
    Ok(())
}

/// The addresses of `addrs` that pass `policy` (what a delivery may dial),
/// or why there are none (naming the address only if `reveal`).
pub(crate) fn allowed(
    policy: &EgressPolicy,
    host: &str,
    addrs: &[SocketAddr],
    reveal: bool,
) -> Result<Vec<SocketAddr>, String> {
    let mut first_denial = None;
    let ok: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| match policy.check(*a) {
            Ok(()) => true,
            Err(d) => {
                first_denial.get_or_insert_with(|| denied(host, *a, &d, reveal));
                false
            }
        })
        .collect();
    match (ok.is_empty(), first_denial) {
        (true, Some(reason)) => Err(reason),
        (true, None) => Err(format!("{host} resolves to no address")),
        (false, _) => Ok(ok),
    }
}

/// Why `addr` (of `host`) is refused. The address itself is logged, and
/// named in the answer only for an IP literal (the caller wrote it) or when
/// `reveal`.
fn denied(
    host: &str,
    addr: SocketAddr,
    denial: &proxynet_common::egress::Denial,
    reveal: bool,
) -> String {
    let literal = host == addr.ip().to_string();
    if !literal {
        tracing::warn!(host, addr = %addr, rule = %denial,
            "a webhook target's name resolves to an address the policy refuses");
    }
    let what = if literal {
        format!("{addr} is refused")
    } else if reveal {
        format!("{host} ({addr}) is refused")
    } else {
        format!("{host} resolves to an address that is refused")
    };
    format!("{what}: {denial}; webhook targets must be public addresses")
}

/// Everything a request's URL must pass before the webhook is stored: its
/// form, then its host's addresses now (named in a refusal only if
/// `reveal`).
pub(crate) async fn validate(
    policy: &EgressPolicy,
    url: &str,
    reveal: bool,
) -> Result<Target, String> {
    let target = parse(url)?;
    let addrs = resolve(&target).await.map_err(|e| format!("url: {e}"))?;
    check_all(policy, &target.host, &addrs, reveal).map_err(|e| format!("url: {e}"))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> EgressPolicy {
        policy(false, &["127.0.0.1:5432".parse().unwrap()])
    }

    #[test]
    fn only_plain_http_or_https_urls_without_credentials_are_targets() {
        assert!(parse("https://hooks.example.com/proxynet?x=1").is_ok());
        assert!(parse("http://hooks.example.com:8080/").is_ok());
        for (bad, why) in [
            ("ftp://hooks.example.com/", "http"),
            ("hooks.example.com/x", "not a URL"),
            ("https://user:pass@hooks.example.com/", "credentials"),
            ("https://user@hooks.example.com/", "credentials"),
            ("https://hooks.example.com/#frag", "fragment"),
            ("file:///etc/passwd", "http"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(parse(&long).unwrap_err().contains("2048"));
    }

    #[test]
    fn a_target_names_its_host_port_and_literal() {
        let t = parse("https://hooks.example.com/x").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.literal),
            ("hooks.example.com", 443, None)
        );
        let t = parse("http://[2001:db8::1]:8080/").unwrap();
        assert_eq!(t.literal, Some("2001:db8::1".parse().unwrap()));
        assert_eq!(t.port, 8080);
        // WHATWG IPv4 forms are addresses, not names.
        let t = parse("http://0x7f.1/").unwrap();
        assert_eq!(t.literal, Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn internal_and_special_addresses_are_refused_by_default() {
        let policy = strict();
        for addr in [
            "127.0.0.1:8080",
            "10.1.2.3:443",
            "169.254.169.254:80",
            "100.64.0.1:80",
            "192.168.1.1:80",
            "[::1]:80",
            "[fd00::1]:80",
            "[::ffff:127.0.0.1]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "224.0.0.1:80",
            "192.0.2.10:443",
        ] {
            let addr: SocketAddr = addr.parse().unwrap();
            let e = check_all(&policy, "h", &[addr], false).unwrap_err();
            assert!(e.contains("refused"), "{addr}: {e}");
        }
        let public: SocketAddr = "93.184.215.14:443".parse().unwrap();
        assert!(check_all(&policy, "h", &[public], false).is_ok());
        // One internal address among public ones is enough to refuse.
        let mixed = [public, "127.0.0.1:443".parse().unwrap()];
        assert!(check_all(&policy, "h", &mixed, false).is_err());
        // SMTP ports are refused whatever the address.
        assert!(check_all(&policy, "h", &["93.184.215.14:25".parse().unwrap()], false).is_err());
    }

    #[test]
    fn the_flag_allows_internal_targets_but_never_our_own_services() {
        let own: SocketAddr = "127.0.0.1:5432".parse().unwrap();
        let policy = policy(true, &[own]);
        assert!(check_all(&policy, "h", &["127.0.0.1:8080".parse().unwrap()], false).is_ok());
        assert!(check_all(&policy, "h", &["10.0.0.1:80".parse().unwrap()], false).is_ok());
        assert!(check_all(&policy, "h", &[own], false).is_err());
        assert!(check_all(&policy, "h", &["127.0.0.1:25".parse().unwrap()], false).is_err());
    }

    #[test]
    fn a_delivery_dials_only_the_addresses_that_pass() {
        let policy = strict();
        let public: SocketAddr = "93.184.215.14:443".parse().unwrap();
        let rebound: SocketAddr = "127.0.0.1:443".parse().unwrap();
        assert_eq!(
            allowed(&policy, "h", &[rebound, public], false).unwrap(),
            vec![public]
        );
        let e = allowed(&policy, "h.example", &[rebound], true).unwrap_err();
        assert!(e.contains("h.example (127.0.0.1:443)"), "{e}");
    }

    #[test]
    fn a_refused_name_tells_the_rule_but_not_the_address_unless_asked() {
        let policy = strict();
        let internal: SocketAddr = "10.0.3.7:80".parse().unwrap();
        let e = check_all(&policy, "db.internal", &[internal], false).unwrap_err();
        assert!(e.contains("db.internal") && e.contains("private"), "{e}");
        assert!(!e.contains("10.0.3.7"), "{e}");
        let e = allowed(&policy, "db.internal", &[internal], false).unwrap_err();
        assert!(!e.contains("10.0.3.7"), "{e}");
        let e = check_all(&policy, "db.internal", &[internal], true).unwrap_err();
        assert!(e.contains("db.internal (10.0.3.7:80)"), "{e}");
        // A literal is the caller's own words.
        let e = check_all(&policy, "10.0.3.7", &[internal], false).unwrap_err();
        assert!(e.contains("10.0.3.7:80 is refused"), "{e}");
    }

    #[tokio::test]
    async fn an_ip_literal_url_is_refused_without_the_flag_and_taken_with_it() {
        let e = validate(&strict(), "http://127.0.0.1:9/hook", false)
            .await
            .unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        let e = validate(&strict(), "http://[::1]:9/hook", false)
            .await
            .unwrap_err();
        assert!(e.contains("refused"), "{e}");
        let e = validate(&strict(), "http://localhost:9/hook", false)
            .await
            .unwrap_err();
        assert!(e.contains("refused") || e.contains("resolve"), "{e}");
        assert!(
            validate(&policy(true, &[]), "http://127.0.0.1:9/hook", false)
                .await
                .is_ok()
        );
    }
}
