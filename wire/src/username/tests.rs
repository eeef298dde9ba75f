//! The grammar's cases: what each username parses to, and the precise
//! reason each bad one is refused.

use super::rules::COUNTRIES;
use super::*;
use crate::provenance::SourceType;
use std::time::Duration;
use uuid::Uuid;

#[test]
fn username_rules() {
    assert!(is_base_username("alice.b_2"));
    assert!(!is_base_username("alice-session-1"));
    assert!(!is_base_username(""));
    assert!(!is_base_username(&"a".repeat(65)));
    assert!(!is_base_username("a:b"));
}

#[test]
fn stored_options_parse_as_the_login_parses_them() {
    let parsed = parse_options("alice", "country-de-type-dc").unwrap();
    assert_eq!(parsed.user, "alice");
    assert_eq!(parsed.targeting.country.as_deref(), Some("DE"));
    assert_eq!(parse_options("alice", "").unwrap().user, "alice");
    assert_eq!(
        parse_options("alice", "country-de-country-fr").unwrap_err(),
        UsernameError::Duplicate("country")
    );
    // The login's string is `user-options`: with the longest base name the
    // options' room is what the username bound leaves.
    let long_user = "u".repeat(MAX_BASE_USERNAME_BYTES);
    let options = format!("session-{}", "s".repeat(64));
    assert!(parse_options(&long_user, &options).is_ok());
    assert_eq!(
        parse_options(&long_user, &"city-x-".repeat(30)).unwrap_err(),
        UsernameError::TooLong
    );
}

#[test]
fn dedicated_is_a_key_without_a_value_and_ip_names_one_address() {
    let p = parse("alice-dedicated-country-de").unwrap();
    assert!(p.targeting.dedicated);
    assert_eq!(p.targeting.country.as_deref(), Some("DE"));
    let p = parse("alice-ip-2001:db8::7-session-s1").unwrap();
    assert!(p.targeting.dedicated, "ip- implies dedicated");
    assert_eq!(p.targeting.ip, Some("2001:db8::7".parse().unwrap()));
    assert!(p.session.is_some());
    assert_eq!(
        parse("alice-ip-2001_db8__7").unwrap().targeting.ip,
        Some("2001:db8::7".parse().unwrap())
    );
    assert_eq!(
        parse("alice-dedicated-dedicated").unwrap_err(),
        UsernameError::Duplicate("dedicated")
    );
    assert!(matches!(
        parse("alice-ip-nope").unwrap_err(),
        UsernameError::BadValue { key: "ip", .. }
    ));
    assert!(!parse("alice-dedicated").unwrap().targeting.is_empty());
    assert_eq!(
        parse("alice-dedicated-ip-192.0.2.7")
            .unwrap()
            .targeting
            .to_string(),
        "dedicated ip=192.0.2.7"
    );
}

#[test]
fn plain_user_rotates() {
    let p = parse("alice").unwrap();
    assert_eq!(p.user, "alice");
    assert!(p.session.is_none());
    assert!(p.targeting.is_empty());
}

#[test]
fn full_grammar() {
    let id = Uuid::new_v4();
    let p = parse(&format!("alice-session-abc123-sesstime-30-sessmode-hard-country-de-city-new_york-asn-7922-type-res-exit-{}-ipversion-6", id.simple())).unwrap();
    let s = p.session.unwrap();
    assert_eq!(
        (s.id.as_str(), s.ttl, s.mode),
        ("abc123", Duration::from_secs(1800), SessionMode::Hard)
    );
    assert_eq!(p.targeting.country.as_deref(), Some("DE"));
    assert_eq!(p.targeting.city.as_deref(), Some("new_york"));
    assert_eq!(p.targeting.asn, Some(7922));
    assert_eq!(p.targeting.source_type, Some(SourceType::Res));
    assert_eq!(p.targeting.exit, Some(id));
    assert_eq!(p.targeting.ip_version, Some(IpVersion::V6));
    assert_eq!(
        parse("alice-session-x").unwrap().session.unwrap().ttl,
        Duration::from_secs(600)
    );
}

#[test]
fn errors_are_precise() {
    use UsernameError::*;
    let cases: &[(&str, UsernameError)] = &[
        ("", Empty),
        ("-session-x", BadUser),
        ("al ice", BadUser),
        ("alice-session", MissingValue("session".into())),
        ("alice-session-", MissingValue("session".into())),
        ("alice-foo-bar", UnknownKey("foo".into())),
        ("alice-Session-x", UnknownKey("Session".into())),
        ("alice-session-a-session-b", Duplicate("session")),
        (
            "alice-session-a_b",
            BadValue {
                key: "session",
                reason: "1-64 letters or digits",
            },
        ),
        (
            "alice-session-a-sesstime-0",
            BadValue {
                key: "sesstime",
                reason: "minutes from 1 to 1440",
            },
        ),
        (
            "alice-session-a-sesstime-1441",
            BadValue {
                key: "sesstime",
                reason: "minutes from 1 to 1440",
            },
        ),
        (
            "alice-session-a-sesstime-+5",
            BadValue {
                key: "sesstime",
                reason: "minutes from 1 to 1440",
            },
        ),
        ("alice-sesstime-5", NeedsSession("sesstime")),
        ("alice-sessmode-hard", NeedsSession("sessmode")),
        (
            "alice-session-a-sessmode-firm",
            BadValue {
                key: "sessmode",
                reason: "soft or hard",
            },
        ),
        (
            "alice-country-xx",
            BadValue {
                key: "country",
                reason: "an ISO 3166-1 alpha-2 code",
            },
        ),
        (
            "alice-country-deu",
            BadValue {
                key: "country",
                reason: "an ISO 3166-1 alpha-2 code",
            },
        ),
        (
            "alice-type-cloud",
            BadValue {
                key: "type",
                reason: "dc, isp, res or mobile",
            },
        ),
        (
            "alice-asn-0",
            BadValue {
                key: "asn",
                reason: "a number from 1 to 4294967295",
            },
        ),
        (
            "alice-ipversion-5",
            BadValue {
                key: "ipversion",
                reason: "4 or 6",
            },
        ),
        (
            "alice-ipversion-v6",
            BadValue {
                key: "ipversion",
                reason: "4 or 6",
            },
        ),
        ("alice-ipversion-4-ipversion-6", Duplicate("ipversion")),
        ("alice-ipversion", MissingValue("ipversion".into())),
        (
            "alice-exit-123",
            BadValue {
                key: "exit",
                reason: "an exit id: 32 hex digits, no dashes",
            },
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(parse(input).as_ref().err(), Some(expected), "{input}");
    }
    assert_eq!(parse(&"a".repeat(300)), Err(TooLong));
}

#[test]
fn ipversion_asks_for_a_family_and_is_named_in_the_targeting() {
    let p = parse("alice-session-x1-ipversion-6").unwrap();
    assert_eq!(p.targeting.ip_version, Some(IpVersion::V6));
    assert_eq!(p.session.unwrap().id, "x1");
    let v4 = parse("alice-ipversion-4").unwrap().targeting;
    assert_eq!(v4.ip_version, Some(IpVersion::V4));
    assert!(!v4.is_empty());
    assert_eq!(v4.to_string(), "ipversion=4");
    let both = parse("alice-country-de-ipversion-6").unwrap().targeting;
    assert_eq!(both.to_string(), "country=DE ipversion=6");
    assert!(IpVersion::V6.matches("2001:db8::1".parse().unwrap()));
    assert!(!IpVersion::V6.matches("192.0.2.1".parse().unwrap()));
    assert!(IpVersion::V4.matches("192.0.2.1".parse().unwrap()));
    assert_eq!(IpVersion::V6.to_string(), "IPv6");
    // Allow-listed users store the same grammar.
    let stored = parse_options("alice", "ipversion-6").unwrap();
    assert_eq!(stored.targeting.ip_version, Some(IpVersion::V6));
}

#[test]
fn finer_targeting_parses_and_is_named_in_the_targeting() {
    let (id, other) = (Uuid::new_v4(), Uuid::new_v4());
    let p = parse(&format!(
        "alice-continent-eu-state-de-by-notexit-{}-country-de",
        id.simple()
    ))
    .unwrap();
    let t = &p.targeting;
    assert_eq!(t.continent, Some(Continent::Eu));
    assert_eq!(t.region.as_deref(), Some("DE-BY"));
    assert_eq!(t.not_exit, Some(id));
    assert_eq!(
        t.to_string(),
        format!("country=DE continent=eu region=DE-BY notexit={id}")
    );
    // `region` is `state`'s synonym; any case; a subdivision of up to 3.
    let r = parse("alice-region-US-ca").unwrap().targeting;
    assert_eq!(r.region.as_deref(), Some("US-CA"));
    assert_eq!(
        parse("alice-state-gb-eng-type-dc")
            .unwrap()
            .targeting
            .region
            .as_deref(),
        Some("GB-ENG")
    );
    assert_eq!(
        parse("alice-continent-AS").unwrap().targeting.continent,
        Some(Continent::As)
    );
    // exit and notexit may name different exits.
    let both = parse(&format!(
        "alice-exit-{}-notexit-{}",
        id.simple(),
        other.simple()
    ))
    .unwrap();
    assert_eq!(both.targeting.exit, Some(id));
    assert_eq!(both.targeting.not_exit, Some(other));
    assert_eq!(parse_subdivision("de-by").as_deref(), Some("DE-BY"));
    assert_eq!(parse_subdivision("xx-by"), None);
    assert_eq!(parse_subdivision("de-bayern"), None);
    assert_eq!(parse_subdivision("deby"), None);
}

#[test]
fn rotate_and_sessidle() {
    assert_eq!(
        parse("alice").unwrap().rotate,
        Rotate::Request,
        "v1 default"
    );
    assert_eq!(parse("alice-rotate-tunnel").unwrap().rotate, Rotate::Tunnel);
    assert_eq!(
        parse("alice-rotate-request").unwrap().rotate,
        Rotate::Request
    );
    assert!(parse("alice-rotate-tunnel").unwrap().targeting.is_empty());
    let s = parse("alice-session-s1-sessidle-1-sesstime-60")
        .unwrap()
        .session
        .unwrap();
    assert_eq!(s.idle, Some(Duration::from_secs(60)));
    assert_eq!(s.ttl, Duration::from_secs(3600));
    assert_eq!(
        parse("alice-session-s1").unwrap().session.unwrap().idle,
        None
    );
    // A preference is not a constraint.
    let preferring = Targeting {
        prefer: Some(Uuid::new_v4()),
        ..Targeting::default()
    };
    assert!(preferring.is_empty());
    assert_eq!(preferring.to_string(), "");
    // Nor are the exits a retry avoids.
    let avoiding = Targeting {
        avoid: vec![Uuid::new_v4()],
        ..Targeting::default()
    };
    assert!(avoiding.is_empty());
    assert_eq!(avoiding.to_string(), "");
}

#[test]
fn finer_targeting_errors_are_precise() {
    use UsernameError::*;
    let id = Uuid::new_v4().simple().to_string();
    let cases: Vec<(String, UsernameError)> = vec![
        (
            "alice-continent-europe".into(),
            BadValue {
                key: "continent",
                reason: "af, an, as, eu, na, oc or sa",
            },
        ),
        (
            "alice-continent-eu-continent-as".into(),
            Duplicate("continent"),
        ),
        ("alice-continent".into(), MissingValue("continent".into())),
        ("alice-state".into(), MissingValue("state".into())),
        (
            "alice-state-de".into(),
            BadValue {
                key: "state",
                reason: "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
            },
        ),
        (
            "alice-state-de-".into(),
            BadValue {
                key: "state",
                reason: "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
            },
        ),
        (
            // Without the subdivision the next key is taken for it.
            "alice-region-us-session-x".into(),
            BadValue {
                key: "region",
                reason: "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
            },
        ),
        (
            "alice-state-xx-by".into(),
            BadValue {
                key: "state",
                reason: "an ISO 3166-2 subdivision code: country-subdivision, e.g. de-by or us-ca",
            },
        ),
        ("alice-state-de-by-state-de-be".into(), Duplicate("state")),
        (
            "alice-region-de-by-region-de-be".into(),
            Duplicate("region"),
        ),
        (
            "alice-state-de-by-region-de-by".into(),
            Synonyms("state", "region"),
        ),
        (
            "alice-region-de-by-state-de-by".into(),
            Synonyms("state", "region"),
        ),
        (
            "alice-notexit-123".into(),
            BadValue {
                key: "notexit",
                reason: "an exit id: 32 hex digits, no dashes",
            },
        ),
        (
            format!("alice-notexit-{id}-notexit-{id}"),
            Duplicate("notexit"),
        ),
        (
            format!("alice-exit-{id}-notexit-{id}"),
            Contradiction("exit and notexit name the same exit"),
        ),
        (
            "alice-rotate-connection".into(),
            BadValue {
                key: "rotate",
                reason: "request or tunnel",
            },
        ),
        (
            "alice-rotate-tunnel-rotate-request".into(),
            Duplicate("rotate"),
        ),
        (
            "alice-session-a-rotate-tunnel".into(),
            Contradiction("rotate is for logins without a session: a session keeps its exit"),
        ),
        ("alice-sessidle-5".into(), NeedsSession("sessidle")),
        (
            "alice-session-a-sessidle-0".into(),
            BadValue {
                key: "sessidle",
                reason: "minutes from 1 to 1440",
            },
        ),
        (
            "alice-session-a-sessidle-1441".into(),
            BadValue {
                key: "sessidle",
                reason: "minutes from 1 to 1440",
            },
        ),
        (
            "alice-session-a-sessidle-1-sessidle-2".into(),
            Duplicate("sessidle"),
        ),
        (
            "alice-country-fr-state-de-by".into(),
            Contradiction("the state/region is not in the country asked for"),
        ),
        (
            "alice-continent-as-country-de".into(),
            Contradiction("the country asked for is not on the continent asked for"),
        ),
        (
            "alice-continent-na-state-de-by".into(),
            Contradiction("the state/region asked for is not on the continent asked for"),
        ),
    ];
    for (input, expected) in &cases {
        assert_eq!(parse(input).as_ref().err(), Some(expected), "{input}");
    }
    // Each error says what to fix, as the client sees it.
    assert_eq!(
        Synonyms("state", "region").to_string(),
        "state and region are the same key; give one of them"
    );
    assert_eq!(
        parse(&format!("alice-exit-{id}-notexit-{id}"))
            .unwrap_err()
            .to_string(),
        "exit and notexit name the same exit"
    );
    // Allow-listed users store the same grammar.
    assert_eq!(
        parse_options("alice", "continent-eu-state-de-by")
            .unwrap()
            .targeting
            .region
            .as_deref(),
        Some("DE-BY")
    );
}

#[test]
fn country_list_is_complete_and_well_formed() {
    let codes: Vec<&str> = COUNTRIES.split(' ').collect();
    assert_eq!(codes.len(), 249);
    let mut sorted = codes.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, codes, "sorted and unique");
}
