//! Selection over hand-built views: no Redis, no agents, no sockets
//! beyond an in-memory pipe under the one link every candidate carries.

use super::*;
use crate::select::test_support::{cooling, exit, health, view};
use proxynet_store::{Channel, SourceType};
use std::collections::HashSet;
use std::time::Duration;

#[tokio::test]
async fn a_pick_matches_the_targeting_and_skips_what_was_tried() {
    let pool = view(vec![
        exit("DE", SourceType::Dc, None),
        exit("US", SourceType::Res, None),
        exit("DE", SourceType::Res, None),
    ]);
    let health = health();
    let german_res = Targeting {
        country: Some("DE".into()),
        source_type: Some(SourceType::Res),
        ..Targeting::default()
    };
    for _ in 0..50 {
        let picked = choose(&pool, &health, &[], &german_res).unwrap();
        assert_eq!(picked.record.country, "DE");
        assert_eq!(picked.record.source_type, SourceType::Res);
    }
    let only = pool.eligible[2].record.id;
    assert!(choose(&pool, &health, &[only], &german_res).is_none());
    // Rotating: the three exits, each tried once, then none.
    let mut tried = Vec::new();
    while let Some(c) = choose(&pool, &health, &tried, &Targeting::default()) {
        assert!(!tried.contains(&c.record.id));
        tried.push(c.record.id);
    }
    assert_eq!(tried.len(), 3);
}

#[tokio::test]
async fn the_accounts_bounds_keep_exits_out_even_when_the_username_asks_nothing() {
    let pool = view(vec![
        exit("DE", SourceType::Dc, Some(Channel::Owned)),
        exit("US", SourceType::Res, Some(Channel::Sdk)),
    ]);
    let health = health();
    let bounded = Targeting {
        allowed_types: Some(vec![SourceType::Dc]),
        allowed_channels: Some(vec![Channel::Owned]),
        plan_types: Some(vec![SourceType::Dc, SourceType::Res]),
        ..Targeting::default()
    };
    for _ in 0..50 {
        let picked = choose(&pool, &health, &[], &bounded).unwrap();
        assert_eq!(picked.record.source_type, SourceType::Dc);
    }
    // A plan that prices nothing these exits are: no exit at all.
    let unpriced = Targeting {
        plan_types: Some(vec![SourceType::Mobile]),
        ..Targeting::default()
    };
    assert!(choose(&pool, &health, &[], &unpriced).is_none());
    // An exit without a channel never satisfies a channel bound.
    let mut unlabelled = exit("DE", SourceType::Dc, None);
    unlabelled.channel = None;
    assert!(!matches(&unlabelled, &bounded));
}

#[tokio::test]
async fn a_named_exit_is_that_exit_or_none_and_a_full_exit_is_passed_over() {
    let pool = view(vec![
        exit("DE", SourceType::Dc, None),
        exit("DE", SourceType::Dc, None),
    ]);
    let health = health();
    let (a, b) = (pool.eligible[0].record.id, pool.eligible[1].record.id);
    let named = Targeting {
        exit: Some(a),
        ..Targeting::default()
    };
    assert_eq!(choose(&pool, &health, &[], &named).unwrap().record.id, a);
    assert!(choose(&pool, &health, &[a], &named).is_none());
    // At its capacity (2 here) an exit takes no more tunnels.
    let _held = (health.start_tunnel(a), health.start_tunnel(a));
    for _ in 0..50 {
        let picked = choose(&pool, &health, &[], &Targeting::default()).unwrap();
        assert_eq!(picked.record.id, b);
    }
    assert!(choose(&pool, &health, &[], &named).is_none());
}

#[tokio::test]
async fn the_egress_ip_is_of_the_targets_family_and_a_session_keeps_its_own() {
    let mut dual = exit("DE", SourceType::Dc, None);
    dual.egress_ips = vec![
        "203.0.113.1".parse().unwrap(),
        "203.0.113.2".parse().unwrap(),
        "2001:db8::1".parse().unwrap(),
    ];
    let v4_only = exit("DE", SourceType::Dc, None);
    let pool = view(vec![dual, v4_only]);
    let (dual, v4_only) = (&pool.eligible[0], &pool.eligible[1]);
    let v6_target = crate::target::Target::parse_authority("[2001:db8::99]:443").unwrap();
    let named = crate::target::Target::parse_authority("example.com:443").unwrap();
    let ip = |c, t, p| crate::select::egress_ip_for(c, t, p, &Targeting::default());
    assert_eq!(
        ip(dual, &v6_target, None),
        Some("2001:db8::1".parse().unwrap())
    );
    // Names leave from IPv4 when the exit has it (the agent dials that family).
    for _ in 0..20 {
        assert!(ip(dual, &named, None).unwrap().is_ipv4());
    }
    let pinned: std::net::IpAddr = "203.0.113.2".parse().unwrap();
    for _ in 0..20 {
        assert_eq!(ip(dual, &named, Some(pinned)), Some(pinned));
    }
    // A pinned IP of the wrong family gives way; no IP of the family, none.
    assert_eq!(
        ip(dual, &v6_target, Some(pinned)),
        Some("2001:db8::1".parse().unwrap())
    );
    assert_eq!(ip(v4_only, &v6_target, None), None);
}

#[tokio::test]
async fn a_prefix_gives_each_tunnel_its_own_address_and_a_session_keeps_one() {
    let mut prefixed = exit("DE", SourceType::Dc, None);
    prefixed.egress_prefixes = vec!["2001:db8:5:6::/64".parse().unwrap()];
    let prefix = prefixed.egress_prefixes[0];
    let pool = view(vec![prefixed]);
    let candidate = &pool.eligible[0];
    let v6_target = crate::target::Target::parse_authority("[2001:db8::99]:443").unwrap();
    let named = crate::target::Target::parse_authority("example.com:443").unwrap();
    let ip = |t, p, v| {
        let targeting = Targeting {
            ip_version: v,
            ..Default::default()
        };
        crate::select::egress_ip_for(candidate, t, p, &targeting)
    };
    let drawn: std::collections::HashSet<std::net::IpAddr> = (0..50)
        .map(|_| ip(&v6_target, None, None).unwrap())
        .collect();
    assert!(drawn.iter().all(|a| prefix.contains(*a)), "{drawn:?}");
    assert!(drawn.len() >= 45, "a /64 rarely repeats: {drawn:?}");
    // A session's pinned address inside the prefix is kept.
    let pinned = *drawn.iter().next().unwrap();
    for _ in 0..20 {
        assert_eq!(ip(&v6_target, Some(pinned), None), Some(pinned));
    }
    // One outside every prefix and IP gives way.
    let foreign: std::net::IpAddr = "2001:db8:5:7::1".parse().unwrap();
    assert_ne!(ip(&v6_target, Some(foreign), None), Some(foreign));
    // Names leave from IPv4 (the exit's 203.0.113.1) unless IPv6 is asked for.
    for _ in 0..20 {
        assert!(ip(&named, None, None).unwrap().is_ipv4());
        let v6 = ip(&named, None, Some(IpVersion::V6)).unwrap();
        assert!(prefix.contains(v6), "{v6}");
    }
    // A pinned IPv4 address gives way to the asked-for family.
    let v4: std::net::IpAddr = "203.0.113.1".parse().unwrap();
    assert!(prefix.contains(ip(&named, Some(v4), Some(IpVersion::V6)).unwrap()));
    assert_eq!(ip(&named, Some(v4), Some(IpVersion::V4)), Some(v4));
    // An asked-for family the literal target does not have: nothing fits.
    assert_eq!(ip(&v6_target, None, Some(IpVersion::V4)), None);
}

#[tokio::test]
async fn ipversion_keeps_out_exits_without_an_address_of_that_family() {
    let v4_only = exit("DE", SourceType::Dc, None);
    let mut prefix_only = exit("DE", SourceType::Dc, None);
    prefix_only.egress_ips = Vec::new();
    prefix_only.egress_prefixes = vec!["2001:db8:9::/48".parse().unwrap()];
    let pool = view(vec![v4_only, prefix_only]);
    let (v4_id, v6_id) = (pool.eligible[0].record.id, pool.eligible[1].record.id);
    let health = health();
    let want = |v| Targeting {
        ip_version: Some(v),
        ..Targeting::default()
    };
    for _ in 0..30 {
        let six = choose(&pool, &health, &[], &want(IpVersion::V6)).unwrap();
        assert_eq!(six.record.id, v6_id);
        let four = choose(&pool, &health, &[], &want(IpVersion::V4)).unwrap();
        assert_eq!(four.record.id, v4_id);
    }
    assert!(choose(&pool, &health, &[v6_id], &want(IpVersion::V6)).is_none());
}

#[tokio::test]
async fn continent_region_and_notexit_filter_within_the_accounts_bounds() {
    let mut bavarian = exit("DE", SourceType::Dc, None);
    bavarian.region = Some("DE-BY".into());
    let pool = view(vec![
        bavarian,
        exit("FR", SourceType::Dc, None),
        exit("US", SourceType::Dc, None),
        exit("JP", SourceType::Dc, None),
    ]);
    let health = health();
    let ids: Vec<Uuid> = pool.eligible.iter().map(|c| c.record.id).collect();
    let europe = Targeting {
        continent: Some(Continent::Eu),
        ..Targeting::default()
    };
    let mut seen = HashSet::new();
    for _ in 0..100 {
        seen.insert(
            choose(&pool, &health, &[], &europe)
                .unwrap()
                .record
                .country
                .clone(),
        );
    }
    assert_eq!(seen, HashSet::from(["DE".to_owned(), "FR".to_owned()]));
    // The account's allowed countries still bound a continent.
    let bounded = Targeting {
        allowed_countries: Some(vec!["FR".into(), "US".into()]),
        ..europe.clone()
    };
    for _ in 0..30 {
        assert_eq!(
            choose(&pool, &health, &[], &bounded).unwrap().record.id,
            ids[1]
        );
    }
    let nowhere = Targeting {
        continent: Some(Continent::Oc),
        ..Targeting::default()
    };
    assert!(choose(&pool, &health, &[], &nowhere).is_none());
    assert_eq!(nowhere.to_string(), "continent=oc");
    // A region is matched against what the exit declares.
    let bavaria = Targeting {
        region: Some("DE-BY".into()),
        ..Targeting::default()
    };
    for _ in 0..30 {
        assert_eq!(
            choose(&pool, &health, &[], &bavaria).unwrap().record.id,
            ids[0]
        );
    }
    let berlin = Targeting {
        region: Some("DE-BE".into()),
        ..Targeting::default()
    };
    assert!(choose(&pool, &health, &[], &berlin).is_none());
    // notexit: never that one, however often.
    let not_first = Targeting {
        not_exit: Some(ids[0]),
        ..europe.clone()
    };
    for _ in 0..100 {
        assert_eq!(
            choose(&pool, &health, &[], &not_first).unwrap().record.id,
            ids[1]
        );
    }
    let only_named_and_excluded = Targeting {
        exit: Some(ids[2]),
        not_exit: Some(ids[3]),
        ..Targeting::default()
    };
    assert_eq!(
        choose(&pool, &health, &[], &only_named_and_excluded)
            .unwrap()
            .record
            .id,
        ids[2]
    );
}

#[tokio::test]
async fn a_soft_repin_prefers_an_exit_like_the_lost_one() {
    let placed = |country: &str, city: Option<&str>, asn: Option<u32>| {
        let mut e = exit(country, SourceType::Dc, None);
        e.city = city.map(str::to_owned);
        e.asn = asn;
        e
    };
    let lost = placed("DE", Some("munich"), Some(3320));
    let pool = view(vec![
        placed("FR", Some("munich"), Some(3320)),
        placed("DE", Some("berlin"), Some(3320)),
        placed("DE", Some("munich"), Some(8881)),
        placed("DE", Some("munich"), Some(3320)),
    ]);
    let ids: Vec<Uuid> = pool.eligible.iter().map(|c| c.record.id).collect();
    let (other_country, same_country, same_city, same_all) = (ids[0], ids[1], ids[2], ids[3]);
    let health = health();
    let any = Targeting::default();
    let mut tried = Vec::new();
    for expected in [same_all, same_city, same_country, other_country] {
        for _ in 0..20 {
            let picked = choose_like(&pool, &health, &tried, &any, &lost).unwrap();
            assert_eq!(picked.record.id, expected, "after {tried:?}");
        }
        tried.push(expected);
    }
    assert!(choose_like(&pool, &health, &tried, &any, &lost).is_none());
    // The tiers only narrow: a client asking for FR keeps FR.
    let french = Targeting {
        country: Some("FR".into()),
        ..Targeting::default()
    };
    assert_eq!(
        choose_like(&pool, &health, &[], &french, &lost)
            .unwrap()
            .record
            .id,
        other_country
    );
    assert_eq!(like_tiers(&french, &lost), vec![french.clone()]);
    // A lost exit without city or ASN: its country, then any.
    let bare = placed("DE", None, None);
    let tiers = like_tiers(&any, &bare);
    assert_eq!(tiers.len(), 2);
    assert_eq!(tiers[0].country.as_deref(), Some("DE"));
    assert_eq!(tiers[0].city, None);
    assert_eq!(tiers[1], any);
    // A busy best tier gives way to the next, like any full exit.
    let _held = (health.start_tunnel(same_all), health.start_tunnel(same_all));
    assert_eq!(
        choose_like(&pool, &health, &[], &any, &lost)
            .unwrap()
            .record
            .id,
        same_city
    );
}

#[tokio::test]
async fn exits_cooled_for_the_site_are_skipped_unless_named() {
    let pool = view(vec![
        exit("DE", SourceType::Dc, None),
        exit("DE", SourceType::Dc, None),
        exit("FR", SourceType::Dc, None),
    ]);
    let health = health();
    let ids: Vec<Uuid> = pool.eligible.iter().map(|c| c.record.id).collect();
    let any = Targeting::default();
    let cooled = cooling("refuser.test", &ids[..2], Duration::from_secs(60));
    for _ in 0..50 {
        let picked = choose_avoiding(&pool, &health, &[], &any, Some(&cooled)).unwrap();
        assert_eq!(picked.record.id, ids[2]);
    }
    // Every matching exit cooled: nothing (the caller may ignore the cooling).
    let german = Targeting {
        country: Some("DE".into()),
        ..Targeting::default()
    };
    assert!(choose_avoiding(&pool, &health, &[], &german, Some(&cooled)).is_none());
    assert!(choose_avoiding(&pool, &health, &[], &german, None).is_some());
    // An exit asked for by name is taken cooled or not.
    let named = Targeting {
        exit: Some(ids[0]),
        ..Targeting::default()
    };
    assert_eq!(
        choose_avoiding(&pool, &health, &[], &named, Some(&cooled))
            .unwrap()
            .record
            .id,
        ids[0]
    );
    // An ended cooldown skips nothing.
    let ended = cooling("refuser.test", &ids, Duration::ZERO);
    let mut seen = HashSet::new();
    for _ in 0..100 {
        seen.insert(
            choose_avoiding(&pool, &health, &[], &any, Some(&ended))
                .unwrap()
                .record
                .id,
        );
    }
    assert_eq!(seen.len(), 3);
}

#[tokio::test]
async fn a_soft_repin_skips_exits_cooled_for_the_site_in_every_tier() {
    let placed = |country: &str, city: Option<&str>| {
        let mut e = exit(country, SourceType::Dc, None);
        e.city = city.map(str::to_owned);
        e
    };
    let lost = placed("DE", Some("munich"));
    let pool = view(vec![
        placed("DE", Some("munich")),
        placed("DE", Some("berlin")),
        placed("FR", None),
    ]);
    let ids: Vec<Uuid> = pool.eligible.iter().map(|c| c.record.id).collect();
    let health = health();
    let any = Targeting::default();
    let cooled = cooling("refuser.test", &ids[..1], Duration::from_secs(60));
    for _ in 0..20 {
        let picked = choose_like_avoiding(&pool, &health, &[], &any, &lost, Some(&cooled)).unwrap();
        assert_eq!(
            picked.record.id, ids[1],
            "the next tier, not the cooled one"
        );
    }
    let all = cooling("refuser.test", &ids, Duration::from_secs(60));
    assert!(choose_like_avoiding(&pool, &health, &[], &any, &lost, Some(&all)).is_none());
}

/// Dedicated addresses split an exit: a shared tunnel never leaves from
/// a held one, a dedicated tunnel only from its account's (and its
/// user's, when the account split them); an exit whose every address is
/// held is no candidate for shared tunnels at all.
#[tokio::test]
async fn dedicated_addresses_belong_to_their_account_alone() {
    use proxynet_store::Dedication;
    let (account, user, other_user, stranger) = (
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    );
    let held: std::net::IpAddr = "203.0.113.1".parse().unwrap();
    let free: std::net::IpAddr = "203.0.113.2".parse().unwrap();
    let mut split = exit("DE", SourceType::Dc, None);
    split.egress_ips = vec![held, free];
    split.dedicated = vec![Dedication {
        address: "203.0.113.1/32".parse().unwrap(),
        account,
        users: vec![user],
    }];
    let mut whole = exit("DE", SourceType::Dc, None);
    whole.egress_ips = vec!["203.0.113.9".parse().unwrap()];
    whole.dedicated = vec![Dedication {
        address: "203.0.113.9/32".parse().unwrap(),
        account: stranger,
        users: Vec::new(),
    }];
    let pool = view(vec![split, whole]);
    let health = health();
    let target = crate::target::Target::parse_authority("example.com:443").unwrap();
    let shared = Targeting {
        tenant: Some((account, user)),
        ..Default::default()
    };
    let dedicated = Targeting {
        dedicated: true,
        ..shared.clone()
    };
    for _ in 0..50 {
        let c = choose(&pool, &health, &[], &shared).unwrap();
        assert_eq!(
            c.record.id, pool.eligible[0].record.id,
            "the wholly held exit is no shared candidate"
        );
        assert_eq!(
            crate::select::egress_ip_for(&c, &target, None, &shared),
            Some(free)
        );
        // A session pinned to the held address gives way for a shared tunnel.
        assert_eq!(
            crate::select::egress_ip_for(&c, &target, Some(held), &shared),
            Some(free)
        );
        let c = choose(&pool, &health, &[], &dedicated).unwrap();
        assert_eq!(
            crate::select::egress_ip_for(&c, &target, None, &dedicated),
            Some(held)
        );
    }
    // Another user of the account, and another account, get nothing.
    let colleague = Targeting {
        dedicated: true,
        tenant: Some((account, other_user)),
        ..Default::default()
    };
    assert!(choose(&pool, &health, &[], &colleague).is_none());
    let outsider = Targeting {
        dedicated: true,
        tenant: Some((Uuid::new_v4(), user)),
        ..Default::default()
    };
    assert!(choose(&pool, &health, &[], &outsider).is_none());
    // `ip-…` narrows to the one address; a foreign one matches nothing.
    let named = Targeting {
        ip: Some(held),
        ..dedicated.clone()
    };
    assert!(choose(&pool, &health, &[], &named).is_some());
    let foreign = Targeting {
        ip: Some("203.0.113.9".parse().unwrap()),
        ..dedicated
    };
    assert!(choose(&pool, &health, &[], &foreign).is_none());
}
