//! What the pipeline hands an ingress: an open [`Tunnel`] — the metered
//! stream to the exit — and the [`Holds`] it keeps until its bytes stop
//! flowing: the connection's ticket (permit, drain guard, cut token), the
//! user's leases, the exit's in-flight count, the revocation registration
//! and the access-log line. Dropping the tunnel releases them all.
//!
//! A spliced tunnel's end is also what its site says of its exit
//! ([`crate::sites::tunnel_verdict`]): the target closing it within the
//! handshake counts against the (exit, site) pair, bytes coming down end
//! the pair's failure streak.

use proxynet_common::egress::Cidr;
use proxynet_common::splice::{splice_until, End, SpliceOutcome, TunnelLimits};
use std::sync::Arc;
use uuid::Uuid;

use crate::accept::ConnectionTicket;
use crate::admission::Leases;
use crate::health::InFlight;
use crate::link::stream::ExitStream;
use crate::open_tunnels::{OpenTunnels, Registration};
use crate::select::sessions::Pin;
use crate::sites::{tunnel_verdict, SiteBook, Verdict};
use crate::usage::{EndSide, Metered};

use super::access_log::AccessLog;

/// An open tunnel: the metered stream to the exit and everything it holds.
pub(crate) struct Tunnel {
    pub io: Metered<ExitStream>,
    pub exit_id: Uuid,
    /// Set for sticky sessions.
    pub pin: Option<Pin>,
    pub holds: Holds,
    /// A tunnel to this address and port whose per-domain rules wait for
    /// its client's first bytes ([`super::Pipeline::judge_first_bytes`]).
    pub(super) first_bytes: Option<(std::net::IpAddr, u16)>,
}

/// What a tunnel holds until its bytes stop flowing; dropping it releases
/// them and writes the access-log line.
pub(crate) struct Holds {
    /// Who the tunnel runs for, as revocation sees it.
    pub credential_digest: [u8; 32],
    /// The allow-listed network it came in by, if any.
    pub(super) network: Option<Cidr>,
    pub(super) log: AccessLog,
    pub(super) _lease: Leases,
    pub(super) _in_flight: InFlight,
    pub(super) _registration: Registration,
    pub(super) ticket: ConnectionTicket,
    /// The record the client was authorized by (its traffic policies, for
    /// each datagram of an association).
    pub(super) record: Arc<proxynet_store::UserRecord>,
    /// The site the tunnel's outcome is recorded for (`None` for a UDP
    /// association).
    pub(super) site: Option<SiteTag>,
}

/// A tunnel's site and the book its outcomes go to.
pub(super) struct SiteTag {
    pub(super) book: Arc<SiteBook>,
    pub(super) site: Arc<str>,
}

impl Holds {
    /// Registers the client connection itself under this tunnel's user in
    /// `open_tunnels`, for as long as the returned registration is kept.
    pub(super) fn register_connection(&self, open_tunnels: &Arc<OpenTunnels>) -> Registration {
        open_tunnels.register(
            &self.log.username,
            self.credential_digest,
            Uuid::nil(),
            self.network,
            crate::open_tunnels::PolicyWatch::Nothing,
            None,
            self.ticket.cut().clone(),
        )
    }

    /// The account the tunnel runs for.
    pub(crate) fn account_id(&self) -> Uuid {
        self.log.account_id
    }

    /// The user the tunnel runs for.
    pub(crate) fn user_id(&self) -> Uuid {
        self.log.user_id
    }

    /// Resolves when the tunnel must end now (revocation, drain deadline).
    pub(crate) fn cut(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.ticket.cut().cancelled()
    }

    /// Records why the tunnel ended, for its access-log line.
    pub(crate) fn ended(&mut self, end: End) {
        self.log.end = Some(end);
    }

    /// Records which attempt of a forwarded request the tunnel carries
    /// (a retry rule may send one request through several exits), for its
    /// access-log line.
    pub(crate) fn note_attempt(&mut self, attempt: u8) {
        self.log.attempt = Some(attempt);
    }

    /// The site the tunnel's outcome is recorded for: its target's
    /// registrable domain (an IPv4 literal's /24, an IPv6 one's /64), or
    /// the domain of the TLS server name its client sent when the pipeline
    /// read it. `None` for a UDP association.
    pub(crate) fn site(&self) -> Option<&Arc<str>> {
        self.site.as_ref().map(|tag| &tag.site)
    }

    /// Records what the site said of the tunnel's exit (an HTTP answer
    /// relayed through it, say); `force_cool` cools the exit for the site
    /// at the first failure. Nothing for a UDP association.
    pub(crate) fn record_site_outcome(&self, verdict: Verdict, force_cool: bool) {
        if let Some(tag) = &self.site {
            tag.book.record(
                self.log.account_id,
                self.log.exit_id,
                &tag.site,
                verdict,
                force_cool,
            );
        }
    }

    /// Records that the tunnel was refused after it opened, for its
    /// access-log line (a refusal, not an end).
    pub(super) fn refused(&mut self, error: &crate::error::ProxyError) {
        self.log.refused = Some((error.kind, error.detail.to_string()));
    }
}

impl Tunnel {
    /// Whether the pipeline waits for the client's first bytes to judge
    /// this tunnel ([`super::Pipeline::judge_first_bytes`]).
    pub(crate) fn judges_first_bytes(&self) -> bool {
        self.first_bytes.is_some()
    }

    /// Splices `client` and the exit until the tunnel ends or is cut.
    pub(crate) async fn splice<C>(self, client: C, limits: TunnelLimits) -> SpliceOutcome
    where
        C: proxynet_common::splice::ChunkIo,
    {
        let Tunnel { io, mut holds, .. } = self;
        let outcome = splice_until(client, io, limits, holds.cut()).await;
        holds.ended(outcome.end);
        if holds.site.is_some() {
            let meter = &holds.log.meter;
            let verdict = tunnel_verdict(
                outcome.down,
                outcome.end == End::Cut || meter.is_cut(),
                meter.first_end() == Some(EndSide::Exit),
                holds.log.started.elapsed(),
            );
            if let Some(verdict) = verdict {
                holds.record_site_outcome(verdict, false);
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests;
