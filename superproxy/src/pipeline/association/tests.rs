//! Unit tests of how an association's destinations are recorded for the
//! abuse desk: the host as a lookup finds it, and the egress address each
//! one left from.

use proxynet_wire::datagram::DatagramAddr;
use std::net::IpAddr;

use super::{recorded_name, recorded_target};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn to(addr: &str) -> DatagramAddr {
    DatagramAddr::Ip(addr.parse().unwrap())
}

#[test]
fn datagram_names_are_recorded_as_policies_match_them() {
    assert_eq!(recorded_name("VM."), "vm");
    assert_eq!(recorded_name("Www.Example.TEST"), "www.example.test");
    assert_eq!(recorded_name("0x7f.1"), "127.0.0.1");
    // Not a host name: folded all the same.
    assert_eq!(recorded_name("A..B."), "a..b");
}

#[test]
fn an_address_is_recorded_under_the_egress_address_of_its_family() {
    let (v4, v6) = (ip("203.0.113.9"), ip("2001:db8::9"));
    // The association's own address is of the destination's family.
    assert_eq!(
        recorded_target(v4, Some(v6), &to("198.51.100.1:53")),
        ("198.51.100.1".to_owned(), 53, [Some(v4), None])
    );
    assert_eq!(
        recorded_target(v6, Some(v4), &to("[2001:db8:1::1]:443")),
        ("2001:db8:1::1".to_owned(), 443, [Some(v6), None])
    );
    // The other family's address, when the destination is of that family.
    assert_eq!(
        recorded_target(v4, Some(v6), &to("[2001:db8:1::1]:443")),
        ("2001:db8:1::1".to_owned(), 443, [Some(v6), None])
    );
    assert_eq!(
        recorded_target(v6, Some(v4), &to("198.51.100.1:53")),
        ("198.51.100.1".to_owned(), 53, [Some(v4), None])
    );
    // Without one, the association's own.
    assert_eq!(
        recorded_target(v4, None, &to("[2001:db8:1::1]:443")),
        ("2001:db8:1::1".to_owned(), 443, [Some(v4), None])
    );
}

#[test]
fn a_mapped_address_is_recorded_canonical_as_the_ipv4_it_is() {
    let (v4, v6) = (ip("203.0.113.9"), ip("2001:db8::9"));
    assert_eq!(
        recorded_target(v6, Some(v4), &to("[::ffff:198.51.100.1]:53")),
        ("198.51.100.1".to_owned(), 53, [Some(v4), None])
    );
}

#[test]
fn a_name_is_recorded_under_both_egress_addresses_as_policies_match_it() {
    let (v4, v6) = (ip("203.0.113.9"), ip("2001:db8::9"));
    let name = DatagramAddr::Name("Time.Example.TEST.".to_owned(), 123);
    assert_eq!(
        recorded_target(v4, Some(v6), &name),
        ("time.example.test".to_owned(), 123, [Some(v4), Some(v6)])
    );
    assert_eq!(
        recorded_target(v4, None, &name),
        ("time.example.test".to_owned(), 123, [Some(v4), None])
    );
}
