//! Hand-built pools for selection's unit tests: exit records, a snapshot
//! over them and a health book, with no Redis, no agents and no sockets
//! beyond an in-memory pipe under the one link every candidate carries.

use super::*;
use crate::health::HealthConfig;
use crate::link::registry::{Link, LinkSender, MuxLink};
use proxynet_store::{Channel, SourceType};
use proxynet_wire::mux;
use std::time::Duration;

pub(crate) fn link() -> Link {
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

pub(crate) fn exit(country: &str, source_type: SourceType, channel: Option<Channel>) -> ExitRecord {
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

pub(crate) fn view(records: Vec<ExitRecord>) -> PoolView {
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

pub(crate) fn health() -> HealthBook {
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

/// `view` with the exits of `without_udp` on a link that carries no UDP
/// (an older agent's).
pub(crate) fn view_with_udp_only_on(records: Vec<ExitRecord>, without_udp: &[Uuid]) -> PoolView {
    let mut pool = view(records);
    for c in pool.eligible.iter_mut() {
        if without_udp.contains(&c.record.id) {
            if let LinkSender::Mux(mux) = &mut c.link.sender {
                mux.udp = false;
            }
        }
    }
    pool
}

/// A cooling of `exits` for `site`, for `for_how_long` from now.
pub(crate) fn cooling(site: &str, exits: &[Uuid], for_how_long: Duration) -> cooling::SiteCooling {
    let until = std::time::Instant::now() + for_how_long;
    cooling::SiteCooling::new(
        site.into(),
        exits.iter().map(|id| (*id, (until, 0))).collect(),
        false,
    )
}
