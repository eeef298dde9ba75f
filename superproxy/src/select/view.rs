//! The pool as selection sees it: an immutable snapshot of the eligible
//! exits, the power-of-two choice among them, and the targeting match.

use super::*;
use proxynet_wire::username::{Continent, IpVersion};

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
pub(crate) fn choose_avoiding(
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
#[cfg(test)]
pub(crate) fn choose_like(
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
pub(crate) fn choose_like_avoiding(
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
pub(crate) fn like_tiers(targeting: &Targeting, lost: &ExitRecord) -> Vec<Targeting> {
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
pub(crate) fn matches(record: &ExitRecord, targeting: &Targeting) -> bool {
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
mod tests;
