//! Tests of what an exit is told to deny and which admin addresses the fleet
//! protects.

use super::deny::MAX_PROTECTED_ADMIN_ADDRS;
use super::*;
use proxynet_store::{ExitRecord, SuperproxyRecord};
use std::net::SocketAddr;

#[test]
fn the_deny_list_is_unlabelled_and_only_what_the_agent_could_reach() {
    let a = |s: &str| -> std::net::SocketAddr { s.parse().unwrap() };
    let inputs = || crate::projector::DenyInputs {
        superproxies: vec![SuperproxyRecord {
            id: Uuid::nil(),
            link_addr: a("203.0.113.10:7000"),
            cert_sha256: "ab".into(),
            service_addrs: vec![a("203.0.113.10:8080"), a("10.0.0.5:8080")],
            reflector: None,
        }],
        agent_admin: vec![a("127.0.0.1:9091"), a("198.51.100.7:9091")],
    };
    let own = [a("10.0.0.9:6379"), a("192.0.2.44:5432")];
    let (records, public) = deny_list(&own, inputs(), false);
    assert!(records[0].service_addrs.is_empty(), "no labelled listeners");
    // 203.0.113.0/24, 198.51.100.0/24 and 192.0.2.0/24 are documentation
    // ranges (special), so an agent without internal targets needs none.
    assert!(public.is_empty(), "{public:?}");
    let (_, internal) = deny_list(&own, inputs(), true);
    for addr in [
        "10.0.0.9:6379",
        "192.0.2.44:5432",
        "203.0.113.10:7000",
        "203.0.113.10:8080",
        "10.0.0.5:8080",
        "127.0.0.1:9091",
        "198.51.100.7:9091",
    ] {
        assert!(internal.contains(&a(addr)), "{addr} missing");
    }
    let mut with_public = inputs();
    with_public.agent_admin.push(a("93.184.216.34:9091"));
    let (_, public) = deny_list(&own, with_public, false);
    assert_eq!(public, vec![a("93.184.216.34:9091")]);
    // A superproxy's announced reflector is denied, and still announced.
    let mut with_reflector = inputs();
    with_reflector.superproxies[0].reflector = Some(a("93.184.216.40:8099"));
    let (records, public) = deny_list(&own, with_reflector, false);
    assert_eq!(public, vec![a("93.184.216.40:8099")]);
    assert_eq!(records[0].reflector, Some(a("93.184.216.40:8099")));
}

fn record(verified: &[&str]) -> ExitRecord {
    let json = serde_json::json!({
        "id": Uuid::nil(), "name": "x", "egress_ips": ["93.184.216.34", "127.0.0.9"],
        "egress_prefixes": ["2001:db8:7::/48"],
        "source_type": "dc", "country": "DE", "owner": "o", "draining": false,
        "disabled": false, "credential_sha256": "", "verified_egress": verified,
    });
    serde_json::from_value(json).unwrap()
}

#[test]
fn only_admin_addresses_on_verified_egress_are_protected() {
    let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let reported = [
        a("93.184.216.34:443"),
        a("[2001:db8:7::5]:9091"),
        a("127.0.0.1:9091"),
        a("10.0.0.7:9091"),
        a("93.184.216.34:443"),
    ];
    // Declared is not verified: nothing public is protected, all is
    // shown; a private network's address is protected (customers never
    // reach one unless the operator made an exit internal).
    let claims = sort_admin_claims(&record(&[]), &reported);
    assert_eq!(claims.protected, vec![a("10.0.0.7:9091")], "{claims:?}");
    assert_eq!(claims.unverified, reported[..3].to_vec(), "once each");
    // The reflector saw the exit at 93.184.216.34 and inside the prefix:
    // those addresses, exactly, are its own.
    let claims = sort_admin_claims(&record(&["93.184.216.34", "2001:db8:7::5"]), &reported);
    assert_eq!(
        claims.protected,
        vec![
            a("93.184.216.34:443"),
            a("[2001:db8:7::5]:9091"),
            a("10.0.0.7:9091")
        ]
    );
    assert_eq!(claims.unverified, vec![a("127.0.0.1:9091")]);
    let other_in_prefix = sort_admin_claims(
        &record(&["2001:db8:7::5"]),
        &[a("[2001:db8:7::6]:9091"), a("[::ffff:93.184.216.34]:443")],
    );
    assert!(other_in_prefix.protected.is_empty(), "{other_in_prefix:?}");
    // Seen on loopback (the reflector's own host): its loopback listener
    // is protected, for the neighbours on that host.
    let claims = sort_admin_claims(&record(&["127.0.0.9"]), &reported);
    assert_eq!(
        claims.protected,
        vec![a("127.0.0.1:9091"), a("10.0.0.7:9091")]
    );
    // At most MAX_PROTECTED_ADMIN_ADDRS.
    let many: Vec<SocketAddr> = (0..12)
        .map(|port| SocketAddr::new("127.0.0.1".parse().unwrap(), 9000 + port))
        .collect();
    let claims = sort_admin_claims(&record(&["127.0.0.9"]), &many);
    assert_eq!(claims.protected, many[..MAX_PROTECTED_ADMIN_ADDRS].to_vec());
}
