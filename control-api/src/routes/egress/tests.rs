//! Tests of the egress verdict, verified addresses and which reflections count.

use super::*;
use proxynet_wire::reflector::Reflection;

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_verdict_is_the_worst_declared_egress() {
    let declared = declared(
        &["198.18.0.1".into(), "2001:db8::1".into()],
        &["198.19.0.0/28".into()],
    );
    assert_eq!(declared.len(), 3);
    let (v4, v6, prefix) = (declared[0], declared[1], declared[2]);
    assert_eq!(verdict(&declared, false, &[]), Verification::Unobserved);
    let all_seen = [
        (v4, ip("198.18.0.1")),
        (v6, ip("2001:db8::1")),
        (prefix, ip("198.19.0.9")),
    ];
    assert_eq!(verdict(&declared, false, &all_seen), Verification::Verified);
    // One egress unobserved: not verified, not a mismatch either.
    assert_eq!(
        verdict(&declared, false, &all_seen[..2]),
        Verification::Unobserved
    );
    // The world sees another address: a mismatch, unless NAT is declared.
    let natted = [
        (v4, ip("203.0.113.7")),
        (v6, ip("2001:db8::1")),
        (prefix, ip("198.19.0.9")),
    ];
    assert_eq!(verdict(&declared, false, &natted), Verification::Mismatch);
    assert_eq!(verdict(&declared, true, &natted), Verification::BehindNat);
    // A prefix is verified by any address inside it.
    let outside = [(prefix, ip("198.19.0.16"))];
    assert_eq!(
        judge(&prefix, Some(outside[0].1), false),
        Verification::Mismatch
    );
    assert_eq!(egress_text(&v4), "198.18.0.1");
    assert_eq!(egress_text(&prefix), "198.19.0.0/28");
}

#[test]
fn only_an_egress_seen_from_inside_itself_verifies_an_address() {
    let declared = declared(
        &["198.18.0.1".into(), "198.18.0.2".into()],
        &["198.19.0.0/28".into()],
    );
    let (first, second, prefix) = (declared[0], declared[1], declared[2]);
    let latest = [
        (first, ip("198.18.0.1")),
        // Behind NAT or a mismatch: the address seen is not the exit's.
        (second, ip("203.0.113.7")),
        (prefix, ip("198.19.0.9")),
        // Not declared (a report cannot record it; ignored all the same).
        (cidr("93.184.216.34/32"), ip("93.184.216.34")),
    ];
    assert_eq!(
        verified_addresses(&declared, &latest),
        vec![ip("198.18.0.1"), ip("198.19.0.9")]
    );
    assert!(verified_addresses(&declared, &[]).is_empty());
}

#[test]
fn only_a_fresh_signed_reflection_of_a_declared_egress_for_this_exit_counts() {
    let key = b"key";
    let exit = Uuid::new_v4();
    let declared = vec![cidr("198.18.0.1/32"), cidr("198.19.0.0/28")];
    let now = 1_800_000_000;
    let observation = |egress: &str, bound: &str, reflection: Reflection| EgressObservation {
        egress: cidr(egress),
        bound: ip(bound),
        reflection,
    };
    let seen = |exit, at| Reflection::signed(key, ip("203.0.113.7"), at, Some(exit));
    let good = observation("198.18.0.1", "198.18.0.1", seen(exit, now - 5));
    assert_eq!(refuse(&good, exit, &declared, key, now), None);
    let in_prefix = observation("198.19.0.0/28", "198.19.0.3", seen(exit, now));
    assert_eq!(refuse(&in_prefix, exit, &declared, key, now), None);
    for (bad, why) in [
        (
            observation("198.18.0.2", "198.18.0.2", seen(exit, now)),
            "not a declared",
        ),
        (
            observation("198.19.0.0/28", "198.19.0.99", seen(exit, now)),
            "outside",
        ),
        (
            observation("198.18.0.1", "198.18.0.1", seen(Uuid::new_v4(), now)),
            "another exit",
        ),
        (
            observation("198.18.0.1", "198.18.0.1", seen(exit, now - 3600)),
            "fresh",
        ),
    ] {
        let reason = refuse(&bad, exit, &declared, key, now).unwrap();
        assert!(reason.contains(why), "{reason}");
    }
    let mut forged = good.clone();
    forged.reflection.address = ip("192.0.2.1");
    assert!(refuse(&forged, exit, &declared, key, now)
        .unwrap()
        .contains("proof"));
}
