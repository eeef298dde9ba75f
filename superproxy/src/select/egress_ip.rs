//! Which of an exit's egress IPs carries a tunnel.

use rand::Rng;
use std::net::IpAddr;

use super::Candidate;
use crate::target::{Host, Target};

/// An egress IP of `candidate` that can reach `target`: of the target's
/// family for IP literals, IPv4 first for names (the agent resolves them and
/// dials the family of the egress IP). `preferred` (a session's pinned IP)
/// wins when it still fits.
pub fn egress_ip_for(
    candidate: &Candidate,
    target: &Target,
    preferred: Option<IpAddr>,
) -> Option<IpAddr> {
    let ips = &candidate.record.egress_ips;
    let fits = |ip: &IpAddr| match &target.host {
        Host::Ip(t) => t.is_ipv4() == ip.is_ipv4(),
        Host::Name(_) => true,
    };
    if let Some(p) = preferred.filter(|p| ips.contains(p) && fits(p)) {
        return Some(p);
    }
    let mut usable: Vec<IpAddr> = ips.iter().copied().filter(fits).collect();
    if matches!(target.host, Host::Name(_)) && usable.iter().any(IpAddr::is_ipv4) {
        usable.retain(IpAddr::is_ipv4);
    }
    if usable.is_empty() {
        return None;
    }
    Some(usable[rand::thread_rng().gen_range(0..usable.len())])
}
