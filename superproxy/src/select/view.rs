//! The pool as selection sees it: an immutable snapshot of the eligible
//! exits, the power-of-two choice among them, and the targeting match.

use super::*;
use crate::username::{Continent, IpVersion};

/// One exit we could send a tunnel through.
#[derive(Clone)]
pub struct Candidate {
    pub record: Arc<ExitRecord>,
    pub link: Link,
}

#[derive(Default)]
pub struct PoolView {
    pub eligible: Vec<Candidate>,
    /// Position of each eligible exit in `eligible`.
    pub index: HashMap<Uuid, usize>,
    /// Exits with a live heartbeat, linked to us or not.
    pub live: usize,
    /// Last refresh from Redis failed; the view is the last known one.
    pub degraded: bool,
    /// Linked exits that provenance or consent keeps out of rotation.
    pub blocked: Vec<(Arc<ExitRecord>, ProvenanceBlock)>,
    /// Since when the control plane has been silent, if it is.
    pub control_plane_silent_since: Option<Instant>,
    /// Eligible exits kept only by their probed links (the control plane
    /// silent and their heartbeat liveness lapsed, or a store reset lost it).
    pub held_by_links: usize,
}

impl PoolView {
    pub fn get(&self, id: &Uuid) -> Option<&Candidate> {
        self.index.get(id).and_then(|i| self.eligible.get(*i))
    }
}

/// Power of two random choices among the usable exits (eligible, matching
/// `targeting`, not in `tried`, available by health unless in panic mode, below
/// capacity): the less loaded of the two wins. O(1) when usable exits are
/// common — a bounded number of random probes — and a scan from a random start
/// only when they are rare. Takes no lock beyond the health map's read lock.
pub fn choose(
    view: &PoolView,
    health: &HealthBook,
    tried: &[Uuid],
    targeting: &Targeting,
) -> Option<Candidate> {
    choose_avoiding(view, health, tried, targeting, None)
}

/// [`choose`], skipping the exits `avoid` cools for the tunnel's site (an
/// exit named by `exit-…` is taken cooled or not: the client asked for it).
/// `None` when every usable exit is cooled: the caller decides whether to
/// ignore the cooling then.
pub fn choose_avoiding(
    view: &PoolView,
    health: &HealthBook,
    tried: &[Uuid],
    targeting: &Targeting,
    avoid: Option<&SiteCooling>,
) -> Option<Candidate> {
    let healthy = |c: &Candidate| {
        let id = c.record.id;
        !health.at_capacity(id)
            && (health.in_panic() || health.exit(id).available(std::time::Instant::now()))
    };
    if let Some(id) = targeting.exit {
        return view
            .get(&id)
            .filter(|c| !tried.contains(&id) && matches(&c.record, targeting) && healthy(c))
            .cloned();
    }
    let n = view.eligible.len();
    if n == 0 {
        return None;
    }
    // The clock is read once per pick, and only when a site cools anything.
    let cooled_at = avoid.map(|cooling| (cooling, std::time::Instant::now()));
    let usable = |c: &Candidate| {
        !tried.contains(&c.record.id)
            && matches(&c.record, targeting)
            && healthy(c)
            && !cooled_at.is_some_and(|(cooling, now)| cooling.cools(c.record.id, now))
    };
    let mut rng = rand::thread_rng();
    let first = (0..8)
        .map(|_| &view.eligible[rng.gen_range(0..n)])
        .find(|c| usable(c))
        .or_else(|| {
            let start = rng.gen_range(0..n);
            (0..n)
                .map(|i| &view.eligible[(start + i) % n])
                .find(|c| usable(c))
        })?;
    let second = (0..8)
        .map(|_| &view.eligible[rng.gen_range(0..n)])
        .find(|c| c.record.id != first.record.id && usable(c));
    let chosen = match second {
        Some(second) if better(health, second, first) => second,
        _ => first,
    };
    Some(chosen.clone())
}

/// [`choose`] for a soft session re-pinning after losing `lost`: the tiers
/// of [`like_tiers`] in turn, the first that has a usable exit wins (power
/// of two choices within it). Up to four choices, each a scan at worst when
/// its exits are rare: a re-pin is the rare event, not the tunnel.
pub fn choose_like(
    view: &PoolView,
    health: &HealthBook,
    tried: &[Uuid],
    targeting: &Targeting,
    lost: &ExitRecord,
) -> Option<Candidate> {
    choose_like_avoiding(view, health, tried, targeting, lost, None)
}

/// [`choose_like`], skipping the exits `avoid` cools for the tunnel's site
/// in every tier.
pub fn choose_like_avoiding(
    view: &PoolView,
    health: &HealthBook,
    tried: &[Uuid],
    targeting: &Targeting,
    lost: &ExitRecord,
    avoid: Option<&SiteCooling>,
) -> Option<Candidate> {
    like_tiers(targeting, lost)
        .iter()
        .find_map(|tier| choose_avoiding(view, health, tried, tier, avoid))
}

/// `targeting` narrowed to exits like `lost`, most alike first: its
/// country, city and ASN; its country and city; its country; then
/// `targeting` as it is. A tier only narrows: where the targeting asks for
/// another value than `lost` has, the tier cannot hold and is left out;
/// where `lost` has no city or ASN, that part asks nothing.
pub fn like_tiers(targeting: &Targeting, lost: &ExitRecord) -> Vec<Targeting> {
    fn narrow<T: PartialEq + Clone>(asked: &Option<T>, like: Option<&T>) -> Option<Option<T>> {
        match (asked, like) {
            (_, None) => Some(asked.clone()),
            (None, Some(v)) => Some(Some(v.clone())),
            (Some(a), Some(v)) => (a == v).then(|| Some(v.clone())),
        }
    }
    let country = narrow(&targeting.country, Some(&lost.country));
    let city = narrow(&targeting.city, lost.city.as_ref());
    let asn = narrow(&targeting.asn, lost.asn.as_ref());
    let tier = |city_too: bool, asn_too: bool| -> Option<Targeting> {
        Some(Targeting {
            country: country.clone()?,
            city: if city_too {
                city.clone()?
            } else {
                targeting.city.clone()
            },
            asn: if asn_too { asn? } else { targeting.asn },
            ..targeting.clone()
        })
    };
    let mut tiers: Vec<Targeting> = Vec::with_capacity(4);
    for t in [tier(true, true), tier(true, false), tier(false, false)]
        .into_iter()
        .flatten()
        .chain(std::iter::once(targeting.clone()))
    {
        if !tiers.contains(&t) {
            tiers.push(t);
        }
    }
    tiers
}

/// Fewer tunnels in flight wins; at equal load, only a clearly better score
/// (25%) wins, so near-equal exits share traffic instead of all of it herding
/// onto whichever measured a few microseconds faster.
fn better(health: &HealthBook, a: &Candidate, b: &Candidate) -> bool {
    let (ha, hb) = (health.exit(a.record.id), health.exit(b.record.id));
    match ha.in_flight().cmp(&hb.in_flight()) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => ha.score() > hb.score() * 1.25,
    }
}

/// Whether an exit satisfies a client's targeting.
pub fn matches(record: &ExitRecord, targeting: &Targeting) -> bool {
    targeting
        .country
        .as_deref()
        .is_none_or(|c| record.serves_country(c))
        && targeting
            .continent
            .is_none_or(|c| Continent::of_country(&record.country) == Some(c))
        && targeting
            .region
            .as_deref()
            .is_none_or(|r| record.region.as_deref() == Some(r))
        && targeting.not_exit.is_none_or(|e| record.id != e)
        && targeting
            .city
            .as_deref()
            .is_none_or(|c| record.serves_city(c))
        && targeting.asn.is_none_or(|a| record.asn == Some(a))
        && targeting
            .source_type
            .is_none_or(|t| record.source_type == t)
        && targeting.exit.is_none_or(|e| record.id == e)
        && targeting
            .allowed_types
            .as_ref()
            .is_none_or(|types| types.contains(&record.source_type))
        && targeting
            .allowed_countries
            .as_ref()
            .is_none_or(|countries| countries.contains(&record.country))
        && targeting.channel.is_none_or(|c| record.channel == Some(c))
        && targeting
            .allowed_channels
            .as_ref()
            .is_none_or(|channels| record.channel.is_some_and(|c| channels.contains(&c)))
        && targeting
            .plan_types
            .as_ref()
            .is_none_or(|types| types.contains(&record.source_type))
        && targeting
            .ip_version
            .is_none_or(|v| record.has_egress_family(v == IpVersion::V4))
        && dedicated_fits(record, targeting)
}

/// A tunnel asking for dedicated addresses needs one its account holds on
/// the exit (and its user may use; the one `ip-…` names); any other tunnel
/// needs an address nobody holds. One empty-vector check for the common
/// exit without dedicated addresses.
fn dedicated_fits(record: &ExitRecord, targeting: &Targeting) -> bool {
    if !targeting.dedicated {
        return record.has_shared_egress();
    }
    let Some((account, user)) = targeting.tenant else {
        return false;
    };
    record
        .dedicated
        .iter()
        .any(|d| d.serves(account, user) && targeting.ip.is_none_or(|ip| d.address.contains(ip)))
}

#[cfg(test)]
mod tests {
    //! Selection over hand-built views: no Redis, no agents, no sockets
    //! beyond an in-memory pipe under the one link every candidate carries.

    use super::*;
    use crate::health::HealthConfig;
    use crate::link::registry::{Link, LinkSender, MuxLink};
    use proxynet_store::{Channel, SourceType};
    use proxynet_wire::mux;
    use std::collections::HashSet;
    use std::time::Duration;

    fn link() -> Link {
        // Selection never touches the link; any live one will do.
        let (client, _server) = tokio::io::duplex(1 << 12);
        let (handle, conn) = mux::start(client, mux::Role::Client, mux::MuxConfig::default());
        tokio::spawn(conn);
        Link {
            id: 1,
            exit_id: Uuid::nil(),
            peer: "127.0.0.1:1".parse().unwrap(),
            sender: LinkSender::Mux(MuxLink {
                handle,
                open_window: true,
                udp: true,
            }),
        }
    }

    fn exit(country: &str, source_type: SourceType, channel: Option<Channel>) -> ExitRecord {
        ExitRecord {
            id: Uuid::new_v4(),
            name: format!("{country}-{}", source_type.as_str()),
            egress_ips: vec!["203.0.113.1".parse().unwrap()],
            egress_prefixes: Vec::new(),
            source_type,
            country: country.into(),
            owner: "test".into(),
            region: None,
            city: None,
            asn: None,
            draining: false,
            disabled: false,
            credential_sha256: String::new(),
            version: 0,
            channel,
            blocked: None,
            consent_expires_at_ms: None,
            verified_egress: Vec::new(),
            dedicated: Vec::new(),
            upstream: None,
        }
    }

    fn view(records: Vec<ExitRecord>) -> PoolView {
        let link = link();
        let eligible: Vec<Candidate> = records
            .into_iter()
            .map(|record| Candidate {
                record: Arc::new(record),
                link: link.clone(),
            })
            .collect();
        let index = eligible
            .iter()
            .enumerate()
            .map(|(i, c)| (c.record.id, i))
            .collect();
        PoolView {
            live: eligible.len(),
            eligible,
            index,
            ..PoolView::default()
        }
    }

    fn health() -> HealthBook {
        HealthBook::new(HealthConfig {
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            eject_after: 5,
            eject_base: Duration::from_secs(5),
            eject_max: Duration::from_secs(300),
            max_ejected_percent: 50,
            panic_threshold_percent: 30,
            capacity: 2,
        })
    }

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

    fn cooling(site: &str, exits: &[Uuid], for_how_long: Duration) -> SiteCooling {
        let until = std::time::Instant::now() + for_how_long;
        SiteCooling::new(
            site.into(),
            exits.iter().map(|id| (*id, (until, 0))).collect(),
            false,
        )
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
            let picked =
                choose_like_avoiding(&pool, &health, &[], &any, &lost, Some(&cooled)).unwrap();
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
}
