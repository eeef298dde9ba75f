//! What one association keeps per destination (and port): its flows under
//! the per-domain limits, and its record of destinations for the abuse desk.
//!
//! **Flows.** A flow is an association's traffic to one destination: it
//! starts with the first datagram there and ends after [`FLOW_IDLE`]
//! without one, or with the association. Each new flow is admitted under
//! the same per-domain limits as a tunnel to that destination
//! ([`Pipeline::admit_flow`]: one new tunnel against the rate, one lease
//! against the concurrency, held while the flow lasts), so datagrams
//! cannot reach a domain past the limits its tunnels are held to. A
//! refused flow's datagrams are dropped (`domain_limited`) until its
//! `Retry-After` has passed; its next datagram then asks again. The table
//! is kept only while some domain limit could apply to the user
//! ([`Pipeline::flows_limited`], re-read every [`FLOW_SWEEP`]): without
//! one, a datagram costs no lookup here and no Redis round trip. At most
//! [`MAX_FLOWS`] flows at once (refused ones included); beyond, a new
//! destination's datagrams are dropped (`flow_limit`) until one ends.
//!
//! **The record.** Every destination is written to the target log at its
//! first sight in each minute (the log's own granularity, so a complaint
//! about any minute of a long association finds it), normalised as
//! policies match names. The writes are bounded by a rate
//! ([`RECORDS_PER_SECOND`], burst [`RECORD_BURST`]), never by a count of
//! destinations: a destination the rate turns away is not marked seen, so
//! its next datagram tries again, and decoys sent first cannot hide it.
//! What the rate turned away is counted (`proxynet_udp_target_records_total
//! {outcome="rate_limited"}`, and per association in its closing log line).

use governor::{DefaultDirectRateLimiter, Quota};
use proxynet_wire::datagram::DatagramAddr;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

use crate::admission::Lease;
use crate::error::ErrorKind;
use crate::pipeline::{Holds, Pipeline};

/// A flow with no datagram from the client for this long has ended: its
/// leases are released.
pub(super) const FLOW_IDLE: Duration = Duration::from_secs(30);
/// How often ended flows are swept, and whether limits apply re-read.
pub(super) const FLOW_SWEEP: Duration = Duration::from_secs(5);
/// Most flows one association keeps at once, refused ones included.
const MAX_FLOWS: usize = 1024;
/// Destinations one association writes to the target log per second.
const RECORDS_PER_SECOND: u32 = 50;
/// The burst of [`RECORDS_PER_SECOND`].
const RECORD_BURST: u32 = 500;

/// One destination's flow.
struct Flow {
    /// Its per-domain leases (none when no limit applies to it).
    _leases: Vec<Lease>,
    last_seen: Instant,
    /// Refused: its datagrams are dropped until then, when it may ask again.
    refused_until: Option<Instant>,
}

/// An association's flows (see the module's documentation).
pub(super) struct Flows {
    flows: HashMap<DatagramAddr, Flow>,
    /// Whether some domain limit could apply: only then are flows kept.
    limited: bool,
}

impl Flows {
    pub(super) fn new(limited: bool) -> Self {
        Self {
            flows: HashMap::new(),
            limited,
        }
    }

    /// Takes the current answer to whether limits apply, and releases the
    /// flows that have ended (all of them when no limit applies any more).
    pub(super) fn refresh(&mut self, limited: bool, now: Instant) {
        self.limited = limited;
        if limited {
            self.sweep(now);
        } else {
            self.flows.clear();
        }
    }

    fn sweep(&mut self, now: Instant) {
        self.flows.retain(|_, flow| match flow.refused_until {
            Some(until) => now < until,
            None => now.saturating_duration_since(flow.last_seen) < FLOW_IDLE,
        });
    }

    /// Whether a datagram to `destination` may leave now; why not
    /// otherwise (the outcome it is counted under). A new flow is admitted
    /// under the per-domain limits first (a Redis round trip per limit set).
    pub(super) async fn admit(
        &mut self,
        pipeline: &Pipeline,
        holds: &Holds,
        destination: &DatagramAddr,
        now: Instant,
    ) -> Result<(), &'static str> {
        if !self.limited {
            return Ok(());
        }
        match self.flows.get_mut(destination) {
            Some(flow) => match flow.refused_until {
                None => {
                    flow.last_seen = now;
                    return Ok(());
                }
                Some(until) if now < until => return Err("domain_limited"),
                // Refused before, and due to ask again.
                Some(_) => {}
            },
            None => {
                if self.flows.len() >= MAX_FLOWS {
                    self.sweep(now);
                    if self.flows.len() >= MAX_FLOWS {
                        return Err("flow_limit");
                    }
                }
            }
        }
        let (flow, verdict) = match pipeline.admit_flow(holds, destination).await {
            Ok(leases) => (
                Flow {
                    _leases: leases,
                    last_seen: now,
                    refused_until: None,
                },
                Ok(()),
            ),
            Err(e) => {
                let reason = if e.kind == ErrorKind::TooManyRequests {
                    "domain_limited"
                } else {
                    "bad_request"
                };
                let wait = Duration::from_secs(u64::from(e.retry_after.unwrap_or(1).max(1)));
                (
                    Flow {
                        _leases: Vec::new(),
                        last_seen: now,
                        refused_until: Some(now + wait),
                    },
                    Err(reason),
                )
            }
        };
        self.flows.insert(destination.clone(), flow);
        verdict
    }
}

/// New destination records a second from every association of this
/// superproxy together (and the burst): a thousand associations each
/// within their own rate must not flood the target log either. A record
/// the rate turns away is tried again at the destination's next datagram.
const ALL_RECORDS_PER_SECOND: u32 = 2_000;
const ALL_RECORDS_BURST: u32 = 20_000;

fn all_associations() -> &'static DefaultDirectRateLimiter {
    static LIMITER: std::sync::OnceLock<DefaultDirectRateLimiter> = std::sync::OnceLock::new();
    LIMITER.get_or_init(|| {
        let quota =
            Quota::per_second(NonZeroU32::new(ALL_RECORDS_PER_SECOND).unwrap_or(NonZeroU32::MIN))
                .allow_burst(NonZeroU32::new(ALL_RECORDS_BURST).unwrap_or(NonZeroU32::MIN));
        DefaultDirectRateLimiter::direct(quota)
    })
}

/// An association's record of its destinations (see the module's
/// documentation).
pub(super) struct Destinations {
    /// Recorded in the current minute.
    seen: HashSet<DatagramAddr>,
    /// The minute `seen` is of (Unix minutes).
    minute: u64,
    rate: DefaultDirectRateLimiter,
    /// Datagrams to a destination not yet recorded this minute that the
    /// rate turned away.
    unrecorded: u64,
}

impl Destinations {
    pub(super) fn new() -> Self {
        let quota =
            Quota::per_second(NonZeroU32::new(RECORDS_PER_SECOND).unwrap_or(NonZeroU32::MIN))
                .allow_burst(NonZeroU32::new(RECORD_BURST).unwrap_or(NonZeroU32::MIN));
        Self {
            seen: HashSet::new(),
            minute: 0,
            rate: DefaultDirectRateLimiter::direct(quota),
            unrecorded: 0,
        }
    }

    /// Records `destination` (a datagram to it is leaving) if it is not yet
    /// recorded this minute and the rate allows.
    pub(super) fn see(
        &mut self,
        pipeline: &Pipeline,
        holds: &Holds,
        other_family: Option<IpAddr>,
        destination: &DatagramAddr,
    ) {
        let minute = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 60);
        if minute != self.minute {
            self.seen.clear();
            self.minute = minute;
        }
        if self.seen.contains(destination) {
            return;
        }
        if self.rate.check().is_err() || all_associations().check().is_err() {
            self.unrecorded += 1;
            crate::metrics::udp_target_record("rate_limited");
            return;
        }
        pipeline.record_datagram_target(holds, other_family, destination);
        self.seen.insert(destination.clone());
        crate::metrics::udp_target_record("recorded");
    }

    /// How many datagrams' destinations the rate kept out of the record.
    pub(super) fn unrecorded(&self) -> u64 {
        self.unrecorded
    }
}
