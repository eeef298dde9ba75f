//! The pool as selection sees it: an immutable snapshot of the eligible
//! exits, the power-of-two choice among them, and the targeting match.

use super::*;

/// One exit we could send a tunnel through.
#[derive(Clone)]
pub struct Candidate {
    pub record: Arc<ExitRecord>,
    pub link: Link,
}

impl Candidate {
    /// One of the exit's egress IPs, chosen at random.
    pub fn egress_ip(&self) -> Option<IpAddr> {
        let ips = &self.record.egress_ips;
        if ips.is_empty() {
            return None;
        }
        Some(ips[rand::thread_rng().gen_range(0..ips.len())])
    }
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
    let usable = |c: &Candidate| {
        !tried.contains(&c.record.id) && matches(&c.record, targeting) && healthy(c)
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
        .is_none_or(|c| record.country == c)
        && targeting
            .city
            .as_deref()
            .is_none_or(|c| record.city.as_deref() == Some(c))
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
}
