//! Tests of the policies, their entries and matchers, and retry rules.

use super::*;
use proptest::prelude::*;
use proxynet_common::egress::Cidr;

/// Longer names and longer prefixes are more specific.
fn entry_specificity(entry: &str) -> usize {
    match entry.parse::<Cidr>() {
        Ok(c) => usize::from(c.prefix_len()),
        Err(_) => entry.split('.').count(),
    }
}

fn entry() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(prop::sample::select(vec!["a", "b", "ex", "test"]), 1..4)
            .prop_map(|labels| labels.join(".")),
        // Stored as normalize_entry writes them (masked `addr/prefix`).
        (0u8..4, any::<u8>(), 8u8..=32)
            .prop_map(|(o, h, len)| { normalize_entry(&format!("10.{o}.0.{h}/{len}")).unwrap() }),
    ]
}

fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(prop::sample::select(vec!["a", "b", "ex", "test"]), 1..40)
            .prop_map(|labels| labels.join(".")),
        (0u8..4, any::<u8>()).prop_map(|(o, h)| format!("10.{o}.0.{h}")),
    ]
}

proptest! {
    /// The matchers answer exactly as a scan of the list with
    /// [`entry_matches`] does: the first covering entry, and the most
    /// specific one.
    #[test]
    fn the_matchers_answer_as_a_scan_of_the_list(
        list in prop::collection::vec(entry(), 0..12),
        host in target(),
    ) {
        let list: Vec<String> = list.iter().enumerate()
            .filter(|(i, e)| !list[..*i].contains(e))
            .map(|(_, e)| e.clone())
            .collect();
        let target = PolicyTarget::from_normalized(&host);
        let matcher = Matcher::new(&list);
        let scan_first = list.iter().position(|e| entry_matches(e, &target));
        prop_assert_eq!(matcher.first(&target), scan_first);
        let scan_best = list
            .iter()
            .enumerate()
            .filter(|(_, e)| entry_matches(e, &target))
            .max_by_key(|(_, e)| entry_specificity(e))
            .map(|(i, _)| i);
        prop_assert_eq!(matcher.most_specific(&target), scan_best);
    }
}

fn name(n: &str) -> String {
    normalize_host(n).unwrap()
}

#[test]
fn names_are_compared_after_idna_case_and_trailing_dot() {
    assert_eq!(name("Example.COM."), "example.com");
    assert_eq!(name("Пример.рф"), "xn--e1afmkfd.xn--p1ai");
    assert_eq!(name("XN--E1AFMKFD.xn--p1ai."), "xn--e1afmkfd.xn--p1ai");
    assert_eq!(name("[::ffff:127.0.0.1]"), "127.0.0.1");
    assert_eq!(name("0x7f.1"), "127.0.0.1");
    assert!(normalize_host("").is_err());
    assert!(normalize_host("a..b").is_err());
    assert!(normalize_host("localhost..").is_err());
    assert_eq!(name("ｌｏｃａｌｈｏｓｔ"), "localhost");
    assert_eq!(name("sub.localhost\u{3002}"), "sub.localhost");
    assert!(normalize_host("localhost\u{3002}\u{3002}").is_err());
    assert!(normalize_host(&"a.".repeat(200)).is_err());
}

#[test]
fn entries_cover_the_name_and_its_subdomains_on_a_label_boundary() {
    let p = TrafficPolicy {
        denied_domains: normalize_list("d", &["*.LocalHost.".into()]).unwrap(),
        ..Default::default()
    };
    assert_eq!(p.denied_domains, ["localhost"]);
    for host in ["localhost", "sub.localhost", "a.b.localhost"] {
        assert!(
            p.permits(&PolicyTarget::Name(&name(host))).is_err(),
            "{host}"
        );
    }
    for host in ["notlocalhost", "localhost.example"] {
        assert!(
            p.permits(&PolicyTarget::Name(&name(host))).is_ok(),
            "{host}"
        );
    }
    assert!(p
        .permits(&PolicyTarget::Ip("127.0.0.1".parse().unwrap()))
        .is_ok());
}

#[test]
fn an_allow_list_refuses_everything_it_does_not_name_including_addresses() {
    let p = TrafficPolicy {
        allowed_domains: normalize_list("a", &["example.test".into(), "10.0.0.0/8".into()])
            .unwrap(),
        ..Default::default()
    };
    assert!(p.permits(&PolicyTarget::Name("www.example.test")).is_ok());
    assert!(p
        .permits(&PolicyTarget::Ip("10.1.2.3".parse().unwrap()))
        .is_ok());
    assert_eq!(
        p.permits(&PolicyTarget::Name("localhost")),
        Err(Refusal::NotAllowed)
    );
    assert!(p
        .permits(&PolicyTarget::Ip("127.0.0.1".parse().unwrap()))
        .is_err());
}

#[test]
fn networks_are_canonical_and_match_mapped_addresses() {
    assert_eq!(normalize_entry("127.0.0.1").unwrap(), "127.0.0.1/32");
    assert_eq!(normalize_entry("2001:db8::/32").unwrap(), "2001:db8::/32");
    assert_eq!(normalize_entry("10.1.2.3/8").unwrap(), "10.0.0.0/8");
    assert_eq!(
        normalize_list("d", &["10.1.2.3/8".into(), "10.4.5.6/8".into()]).unwrap(),
        ["10.0.0.0/8"]
    );
    assert!(normalize_entry("10.0.0.0/33").is_err());
    assert!(entry_matches(
        "127.0.0.0/8",
        &PolicyTarget::Ip("::ffff:127.0.0.9".parse().unwrap())
    ));
    assert!(!entry_matches(
        "127.0.0.0/8",
        &PolicyTarget::Name("127.example")
    ));
}

#[test]
fn registrable_domains_follow_the_public_suffix_list() {
    assert_eq!(registrable_domain("a.b.example.co.uk"), "example.co.uk");
    assert_eq!(registrable_domain("www.example.com"), "example.com");
    assert_eq!(registrable_domain("localhost"), "localhost");
    assert_eq!(registrable_domain("x.example.test"), "example.test");
    let v6 = |a: &str| PolicyTarget::Ip(a.parse().unwrap()).registrable_domain();
    assert_eq!(v6("2001:db8:1:2::99"), "2001:db8:1:2::/64");
    assert_eq!(v6("2001:db8:1:2:ffff::1"), v6("2001:db8:1:2::7"));
    assert_eq!(v6("::ffff:127.0.0.1"), "127.0.0.1");
}

#[test]
fn the_most_specific_operator_limit_applies_else_the_default_per_domain() {
    let limit = |r| Limit {
        new_tunnels_per_second: Some(r),
        max_concurrent_tunnels: None,
    };
    let p = OperatorPolicy {
        domain_limits: vec![
            DomainLimit {
                domain: "example.com".into(),
                limit: limit(10),
            },
            DomainLimit {
                domain: "api.example.com".into(),
                limit: limit(3),
            },
        ],
        default_domain_limit: Some(limit(50)),
        ..Default::default()
    };
    assert_eq!(
        p.limit_for(&PolicyTarget::Name("v1.api.example.com")),
        Some(("api.example.com".into(), limit(3)))
    );
    assert_eq!(
        p.limit_for(&PolicyTarget::Name("www.example.com")),
        Some(("example.com".into(), limit(10)))
    );
    assert_eq!(
        p.limit_for(&PolicyTarget::Name("a.other.org")),
        Some(("other.org".into(), limit(50)))
    );
    assert_eq!(
        OperatorPolicy::default().limit_for(&PolicyTarget::Name("a.org")),
        None
    );
}

#[test]
fn operator_ports_and_domains_refuse_with_the_rule_named() {
    let p = OperatorPolicy {
        denied_domains: vec!["blocked.test".into()],
        denied_ports: vec![6667],
        ..Default::default()
    };
    assert_eq!(
        p.permits(&PolicyTarget::Name("x.blocked.test"), 443),
        Err(Refusal::Operator("blocked.test".into()))
    );
    assert_eq!(
        p.permits(&PolicyTarget::Name("ok.test"), 6667),
        Err(Refusal::Port(6667))
    );
    assert!(p.permits(&PolicyTarget::Name("ok.test"), 443).is_ok());
}

fn rule(json: serde_json::Value) -> Result<RetryRule, String> {
    serde_json::from_value::<RetryRule>(json)
        .map_err(|e| e.to_string())?
        .normalized("retry_rules[0]")
}

#[test]
fn retry_rules_are_normalised_and_bounded() {
    let r = rule(serde_json::json!({
        "sites": ["*.Example.COM.", "example.com", "10.1.2.3/24"],
        "statuses": [403, 429, 403],
        "header": " CF-Mitigated ",
        "retry": 2,
        "cool": true
    }))
    .unwrap();
    assert_eq!(r.sites, ["example.com", "10.1.2.0/24"]);
    assert_eq!(r.statuses, [403, 429]);
    assert_eq!(r.header.as_deref(), Some("cf-mitigated"));
    assert_eq!((r.retry, r.cool), (2, true));
    for bad in [
        serde_json::json!({"statuses": [99]}),
        serde_json::json!({"statuses": [200]}),
        serde_json::json!({"statuses": [302]}),
        serde_json::json!({"header": "cf-mitigated"}),
        serde_json::json!({"statuses": [600]}),
        serde_json::json!({"statuses": [403], "retry": 4}),
        serde_json::json!({"header": "cf mitigated"}),
        serde_json::json!({"header": ""}),
        serde_json::json!({"header": "x".repeat(65)}),
        serde_json::json!({"sites": ["a..b"], "statuses": [403]}),
        serde_json::json!({"retry": 1}),
    ] {
        assert!(rule(bad.clone()).is_err(), "{bad}");
    }
    let many = vec![
        RetryRule {
            statuses: vec![403],
            ..Default::default()
        };
        MAX_RETRY_RULES + 1
    ];
    assert!(normalize_retry_rules("retry_rules", many.clone()).is_err());
    assert_eq!(
        normalize_retry_rules("retry_rules", many[..MAX_RETRY_RULES].to_vec())
            .unwrap()
            .len(),
        MAX_RETRY_RULES
    );
    let err = normalize_retry_rules(
        "retry_rules",
        vec![
            many[0].clone(),
            RetryRule {
                retry: 9,
                ..many[0].clone()
            },
        ],
    )
    .unwrap_err();
    assert!(err.starts_with("retry_rules[1].retry"), "{err}");
}

#[test]
fn a_retry_rule_bans_by_every_criterion_it_gives() {
    let both = rule(serde_json::json!({
        "sites": ["example.com"], "statuses": [403], "header": "cf-mitigated"
    }))
    .unwrap();
    let site = PolicyTarget::Name("www.example.com");
    let with = |name: &str| name == "cf-mitigated";
    let without = |_: &str| false;
    assert!(both.matches(&site, 403, with));
    assert!(!both.matches(&site, 403, without), "the header is missing");
    assert!(!both.matches(&site, 200, with), "the status is not listed");
    assert!(!both.matches(&PolicyTarget::Name("badexample.com"), 403, with));
    let any_site = rule(serde_json::json!({"statuses": [403], "header": "cf-mitigated"})).unwrap();
    assert!(any_site.matches(&PolicyTarget::Name("any.test"), 403, with));
    assert!(!any_site.matches(&PolicyTarget::Name("any.test"), 403, without));
    let network = rule(serde_json::json!({"sites": ["10.0.0.0/8"], "statuses": [429]})).unwrap();
    assert!(network.matches(&PolicyTarget::Ip("10.9.8.7".parse().unwrap()), 429, without));
    assert!(!network.covers(&PolicyTarget::Name("example.com")));
}

#[test]
fn the_users_rule_comes_first_then_the_accounts_then_the_operators() {
    let on = |sites: &[&str], retry: u8| RetryRule {
        sites: sites.iter().map(|s| (*s).to_owned()).collect(),
        statuses: vec![403],
        retry,
        ..Default::default()
    };
    let user = vec![on(&["shop.example"], 1)];
    let account = vec![on(&["example"], 2), on(&[], 3)];
    let operator = vec![on(&[], 0)];
    let pick = |host: &str| {
        rule_for(&user, &account, &operator, &PolicyTarget::Name(host)).map(|r| r.retry)
    };
    assert_eq!(pick("a.shop.example"), Some(1));
    assert_eq!(pick("other.example"), Some(2));
    assert_eq!(pick("elsewhere.test"), Some(3), "empty sites: any");
    assert_eq!(
        rule_for(&[], &[], &operator, &PolicyTarget::Name("x.test")).map(|r| r.retry),
        Some(0)
    );
    assert!(rule_for(&[], &[], &[], &PolicyTarget::Name("x.test")).is_none());
}

#[test]
fn a_user_allow_entry_must_sit_inside_the_accounts() {
    let wide = vec!["example.com".to_owned(), "10.0.0.0/8".to_owned()];
    assert!(entry_within("api.example.com", &wide));
    assert!(entry_within("example.com", &wide));
    assert!(entry_within("10.1.0.0/16", &wide));
    assert!(!entry_within("example.org", &wide));
    assert!(!entry_within("0.0.0.0/0", &wide));
    assert!(!entry_within("badexample.com", &wide));
}
