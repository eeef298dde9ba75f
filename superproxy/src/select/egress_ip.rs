//! Which of an exit's egress addresses carries a tunnel.
//!
//! An exit offers its egress IPs and, for each egress prefix, one address
//! drawn uniformly from the prefix for this tunnel: a /64 holds 2^64
//! addresses, so consecutive tunnels leave from different ones. A sticky
//! session pins the address it got ([`super::Sticky::keep_ip`]) and is
//! handed it back as `preferred` while the exit still owns it.
//!
//! Dedicated addresses split that set: a tunnel that asks for its account's
//! dedicated addresses (`-dedicated`, `-ip-…`) leaves only from those the
//! account holds on the exit (and its user may use); every other tunnel
//! only from the addresses nobody holds.

use proxynet_common::egress::Cidr;
use rand::Rng;
use std::net::IpAddr;

use super::Candidate;
use crate::target::{Host, Target};
use proxynet_wire::username::Targeting;

/// Draws from a prefix that land in a /64 someone holds are drawn again this
/// many times before the prefix counts as taken for this tunnel.
const REDRAWS: usize = 8;

/// An egress address of `candidate` that can reach `target`: of the
/// target's family for IP literals; for names, of the targeting's
/// `ip_version` when the username asked for one, else IPv4 first (the agent
/// resolves names and dials the family of the egress address), among the
/// addresses the targeting may use (its dedicated ones, or the shared
/// ones). `preferred` (a session's pinned address) wins while the exit
/// still owns it and it fits. `None`: the exit has no address that fits.
pub(crate) fn egress_ip_for(
    candidate: &Candidate,
    target: &Target,
    preferred: Option<IpAddr>,
    targeting: &Targeting,
) -> Option<IpAddr> {
    let family = match &target.host {
        Host::Ip(t) => Some(t.is_ipv4()),
        Host::Name(_) => None,
    };
    egress_ip_of_family(candidate, family, preferred, targeting)
}

/// An egress address of `candidate` of the family `v4` says (`None`: any,
/// IPv4 first), within the targeting; `preferred` as in [`egress_ip_for`].
/// A UDP association asks for one of each family.
pub(crate) fn egress_ip_of_family(
    candidate: &Candidate,
    v4: Option<bool>,
    preferred: Option<IpAddr>,
    targeting: &Targeting,
) -> Option<IpAddr> {
    let record = &candidate.record;
    let ip_version = targeting.ip_version;
    let fits = |ip: &IpAddr| {
        v4.is_none_or(|v4| v4 == ip.is_ipv4()) && ip_version.is_none_or(|v| v.matches(*ip))
    };
    let mut rng = rand::thread_rng();
    let mut usable: Vec<IpAddr> = if targeting.dedicated {
        let (account, user) = targeting.tenant?;
        if let Some(p) = preferred.filter(|p| {
            fits(p)
                && targeting.ip.is_none_or(|ip| ip == *p)
                && record
                    .dedicated
                    .iter()
                    .any(|d| d.serves(account, user) && d.address.contains(*p))
        }) {
            return Some(p);
        }
        record
            .dedicated
            .iter()
            .filter(|d| d.serves(account, user))
            .filter_map(|d| match targeting.ip {
                Some(ip) => d.address.contains(ip).then_some(ip),
                None if d.address.host_bits() == 0 => Some(d.address.network()),
                None => Some(random_address_in(&d.address, &mut rng)),
            })
            .filter(fits)
            .collect()
    } else {
        if let Some(p) =
            preferred.filter(|p| record.can_egress_from(*p) && !record.is_dedicated(*p) && fits(p))
        {
            return Some(p);
        }
        record
            .egress_ips
            .iter()
            .copied()
            .filter(|ip| !record.is_dedicated(*ip))
            .chain(record.egress_prefixes.iter().filter_map(|prefix| {
                (0..REDRAWS)
                    .map(|_| random_address_in(prefix, &mut rng))
                    .find(|ip| !record.is_dedicated(*ip))
            }))
            .filter(fits)
            .collect()
    };
    if v4.is_none() && usable.iter().any(IpAddr::is_ipv4) {
        usable.retain(IpAddr::is_ipv4);
    }
    if usable.is_empty() {
        return None;
    }
    Some(usable[rng.gen_range(0..usable.len())])
}

/// A uniformly random address of `prefix`, among its usable hosts
/// ([`Cidr::usable_hosts`]: never a subnet's own or broadcast address).
fn random_address_in(prefix: &Cidr, rng: &mut impl Rng) -> IpAddr {
    prefix.host_address(rng.gen_range(prefix.usable_hosts()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_random_address_is_inside_its_prefix_and_never_the_subnet_router() {
        let mut rng = rand::thread_rng();
        let v6: Cidr = "2001:db8:1:2::/64".parse().unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let ip = random_address_in(&v6, &mut rng);
            assert!(v6.contains(ip), "{ip}");
            assert_ne!(ip, v6.network());
            seen.insert(ip);
        }
        assert!(seen.len() > 190, "a /64 barely repeats: {}", seen.len());
        // A /127 has one non-zero host; a /128 is its one address.
        let pair: Cidr = "2001:db8::/127".parse().unwrap();
        for _ in 0..20 {
            assert_eq!(
                random_address_in(&pair, &mut rng),
                "2001:db8::1".parse::<IpAddr>().unwrap()
            );
        }
        let single: Cidr = "2001:db8::7/128".parse().unwrap();
        assert_eq!(random_address_in(&single, &mut rng), single.network());
        // Host bits written into the prefix do not leak into the draw.
        let sloppy: Cidr = "192.0.2.77/30".parse().unwrap();
        for _ in 0..50 {
            let ip = random_address_in(&sloppy, &mut rng).to_string();
            assert!(ip == "192.0.2.77" || ip == "192.0.2.78", "{ip}");
        }
        let v4: Cidr = "198.51.100.0/24".parse().unwrap();
        for _ in 0..200 {
            let ip = random_address_in(&v4, &mut rng);
            assert!(v4.contains(ip));
            assert!(!matches!(
                ip.to_string().as_str(),
                "198.51.100.0" | "198.51.100.255"
            ));
        }
        let slash31: Cidr = "198.51.100.4/31".parse().unwrap();
        let both: std::collections::HashSet<IpAddr> = (0..100)
            .map(|_| random_address_in(&slash31, &mut rng))
            .collect();
        assert_eq!(both.len(), 2);
    }
}
