//! Tests of the egress policy: literal spellings, special ranges, embedded
//! IPv4, denied ports, allow and deny lists, protected services, egress
//! prefixes and CIDRs.

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
