//! Property tests of the egress policy: the literal parser never panics, every
//! numeric spelling of an IPv4 address normalises to it, and IPv6 forms of a
//! denied IPv4 address are denied.

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
