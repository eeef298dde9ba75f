//! Stage 4, open: exit choice (rotating or sticky, filtered by targeting),
//! egress IP choice (the target's family; a session keeps its IP), dial,
//! safe retry within a retry budget.
//!
//! The connect budget covers every attempt. An attempt that provably did not
//! reach the target (link not ready, stream refused, exit draining or full) is
//! retried on another exit while budget and attempts remain; anything that may
//! have reached the target is reported, never replayed. A sticky session uses
//! its pinned exit while it is eligible; when it is not, `soft` sessions are
//! re-pinned to another exit and `hard` ones fail with a coded 502.
//!
//! A tunnel to a site skips the exits cooled for it ([`crate::sites`]) —
//! the fleet's, and those cooled in its account's routing only — and a
//! connect its target refused, timed out or found unreachable counts
//! against the (exit, site) pair, never against the exit's own health.
//!
//! A request reporting its site blocked (`Proxynet-Report: blocked`) cools
//! the exit its session is pinned to for that site in the account's
//! routing before the exit is chosen: the pin then counts as lost, as any
//! pin its site refuses (a soft session re-pins, a hard one is a 502
//! naming the site). Without a session there is no exit to name, and the
//! report is ignored.

use proxynet_common::egress::EgressPolicy;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::health::InFlight;
use crate::link::dial;
use crate::link::stream::ExitStream;
use crate::request::{Client, SiteReport};
use crate::select::sessions::{Pin, Sessions};
use crate::select::{egress_ip_for, egress_ip_of_family, Candidate, Candidates, Pool, Sticky};
use crate::sites::{ReportedExit, SiteBook, Verdict};
use crate::target::Target;
use proxynet_wire::username::Targeting;

/// Exits tried for one tunnel before giving up.
pub(crate) const MAX_ATTEMPTS: usize = 3;

/// What a stream through an exit is opened for.
#[derive(Clone, Copy)]
pub(crate) enum Purpose<'a> {
    /// A TCP tunnel to one target.
    Tunnel(&'a Target),
    /// A UDP association: each datagram names its own destination, so the
    /// exit gets an egress address of each family it has.
    Association,
}

impl<'a> Purpose<'a> {
    fn target(self) -> Option<&'a Target> {
        match self {
            Purpose::Tunnel(target) => Some(target),
            Purpose::Association => None,
        }
    }
}

/// The egress addresses a stream asks for: one, or for an association one
/// per family.
#[derive(Clone, Copy)]
struct EgressChoice {
    first: IpAddr,
    other_family: Option<IpAddr>,
}

/// A tunnel stream the exit answered `connected` on.
pub(crate) struct Opened {
    pub io: ExitStream,
    pub exit_id: Uuid,
    /// The exit's source type as its record says now (what the bytes bill as).
    pub source_type: Option<proxynet_store::SourceType>,
    pub egress_ip: IpAddr,
    /// An association's egress address of the other family, if it has one.
    pub other_egress_ip: Option<IpAddr>,
    /// It leaves from one of the account's dedicated addresses.
    pub dedicated: bool,
    /// Set for sticky sessions.
    pub pin: Option<Pin>,
    /// Counts this tunnel against its exit's load until dropped: keep it for
    /// as long as the tunnel lives.
    pub in_flight: InFlight,
}

/// Retries may add at most `percent` of first attempts (plus a burst of ten),
/// so an outage that makes every exit refuse cannot triple the load it sees.
/// Tokens are counted in hundredths of a retry.
pub(crate) struct RetryBudget {
    percent: u32,
    tokens: Mutex<u32>,
}

impl RetryBudget {
    const BURST: u32 = 10 * 100;

    pub(crate) fn new(percent: u32) -> Self {
        Self {
            percent: percent.min(100),
            tokens: Mutex::new(Self::BURST),
        }
    }

    fn deposit(&self) {
        if let Ok(mut t) = self.tokens.lock() {
            *t = (*t + self.percent).min(Self::BURST);
        }
    }

    /// Takes one retry's tokens: `false` when the budget is spent. Also
    /// drawn on by the forwarding path's retries after a site's ban.
    pub(crate) fn withdraw(&self) -> bool {
        match self.tokens.lock() {
            Ok(mut t) if *t >= 100 => {
                *t -= 100;
                true
            }
            _ => false,
        }
    }
}

pub(crate) struct TunnelOpener {
    pub pool: Arc<Pool>,
    pub sessions: Sessions,
    pub policy: EgressPolicy,
    pub connect_budget: Duration,
    pub retry_budget: RetryBudget,
    /// Which exits each site refuses: skipped for its tunnels, and told
    /// of every connect the site refused.
    pub sites: Arc<SiteBook>,
}

impl TunnelOpener {
    /// Denies literal targets the egress policy forbids before any exit is used.
    pub(crate) fn check_literal(&self, target: &Target) -> Result<(), ProxyError> {
        match target.socket_addr() {
            Some(addr) => self.policy.check(addr).map_err(|denial| {
                ProxyError::new(
                    ErrorKind::DestinationProhibited,
                    format!("destination denied: {denial}"),
                )
            }),
            None => Ok(()),
        }
    }

    /// Opens a stream for `purpose` through the first candidate that takes
    /// it: take the next candidate, check the budget, dial, record the
    /// outcome, then retry or stop by `retry_safe`. A tunnel to `site`
    /// skips the exits cooled for it, the fleet's and the client's
    /// account's own (one map read when none is). `report`: what the
    /// client's `Proxynet-Report` header said of the site, taken before
    /// the exit is chosen.
    pub(crate) async fn open(
        &self,
        purpose: Purpose<'_>,
        client: &Client,
        site: Option<&Arc<str>>,
        report: Option<SiteReport>,
    ) -> Result<Opened, ProxyError> {
        let deadline = Instant::now() + self.connect_budget;
        let mut targeting = &client.request.targeting;
        // An account that asked for it falls back to shared addresses when
        // none of its dedicated ones is usable (never for `ip-…`: that
        // names one address).
        let shared;
        if targeting.dedicated
            && targeting.dedicated_fallback
            && targeting.ip.is_none()
            && self.pool.pick(&[], targeting).is_none()
        {
            shared = Targeting {
                dedicated: false,
                ..targeting.clone()
            };
            targeting = &shared;
        }
        let mut sticky = match &client.request.session {
            Some(session) => Some(Sticky::load(&self.sessions, client.user_id, session).await),
            None => None,
        };
        if let Some(report) = report {
            // Before the cooling is read: the exit it names is then cooled
            // for this very tunnel, and its session's pin counts as lost.
            let reported = match &sticky {
                None => ReportedExit::NoSession,
                Some(sticky) => sticky
                    .pin()
                    .map_or(ReportedExit::NoPin, |pin| ReportedExit::Pinned(pin.exit)),
            };
            self.sites
                .report(report, client.account_id, client.user_id, reported, site);
        }
        let cooling = site.and_then(|site| self.sites.cooling_for(client.account_id, site));
        let pool = &self.pool;
        let still_live = |exit: &Uuid| pool.still_eligible(exit);
        let mut candidates = Candidates::new(pool.view(), pool.health(), targeting, MAX_ATTEMPTS)
            .needing_udp(matches!(purpose, Purpose::Association))
            .for_site(cooling)
            .checking_live(&still_live);
        let mut last_error = None;
        let mut no_family = false;
        // A ban retry (exits to avoid) already withdrew from the budget: it
        // earns nothing, or a customer's retries would fund themselves.
        if targeting.avoid.is_empty() {
            self.retry_budget.deposit();
        }
        while !candidates.exhausted() {
            if last_error.is_some() && !self.retry_budget.withdraw() {
                tracing::debug!("retry budget spent; not retrying on another exit");
                break;
            }
            let exit = match &mut sticky {
                Some(sticky) => {
                    let pool = &self.pool;
                    sticky
                        .choose(&mut candidates, purpose.target(), |id| pool.record(id))
                        .await?
                }
                None => candidates.draw(),
            };
            let Some(exit) = exit else { break };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProxyError::new(
                    ErrorKind::ConnectionTimeout,
                    "connect budget exhausted",
                ));
            }
            let preferred = sticky.as_ref().and_then(|s| s.egress_ip_on(exit.record.id));
            let egress = match purpose {
                Purpose::Tunnel(target) => {
                    egress_ip_for(&exit, target, preferred, targeting).map(|first| EgressChoice {
                        first,
                        other_family: None,
                    })
                }
                Purpose::Association => association_egress(&exit, preferred, targeting),
            };
            let Some(egress) = egress else {
                no_family = true;
                continue;
            };
            if let Some(sticky) = &mut sticky {
                sticky.keep_ip(exit.record.id, egress.first).await?;
            }
            let upstream = exit
                .record
                .upstream
                .as_ref()
                .map(|partner| upstream_ask(partner, &exit.record.country, targeting, client));
            match self
                .dial(
                    &exit,
                    purpose,
                    egress,
                    remaining,
                    site.map(|s| (client.account_id, s)),
                    upstream,
                )
                .await
            {
                Ok(io) => {
                    return Ok(Opened {
                        io,
                        exit_id: exit.record.id,
                        source_type: Some(exit.record.source_type),
                        egress_ip: egress.first,
                        other_egress_ip: egress.other_family,
                        dedicated: targeting.dedicated,
                        pin: sticky.as_ref().and_then(Sticky::pin),
                        in_flight: self.pool.health().start_tunnel(exit.record.id),
                    });
                }
                Err(e) if e.kind.retry_safe() => {
                    tracing::debug!(exit = %exit.record.id, error = %e, "exit refused the tunnel before dialling; trying another");
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            if candidates.passed_over_for_udp() && !no_family {
                return ProxyError::new(
                    ErrorKind::NoExit,
                    "no eligible exit carries UDP right now",
                );
            }
            self.no_exit(targeting, no_family)
        }))
    }

    /// One attempt on one exit, its outcome recorded for the exit's health
    /// (exit faults only: a target's refusal or slowness is not the exit's)
    /// and, for a refusal, for the (exit, site) pair.
    async fn dial(
        &self,
        exit: &Candidate,
        purpose: Purpose<'_>,
        egress: EgressChoice,
        budget: Duration,
        site: Option<(Uuid, &Arc<str>)>,
        upstream: Option<proxynet_wire::link::UpstreamAsk>,
    ) -> Result<ExitStream, ProxyError> {
        let started = std::time::Instant::now();
        let result = match purpose {
            Purpose::Tunnel(target) => {
                dial::open_tunnel(&exit.link, target, egress.first, budget, upstream).await
            }
            Purpose::Association => {
                let ips: Vec<IpAddr> = std::iter::once(egress.first)
                    .chain(egress.other_family)
                    .collect();
                dial::open_association(&exit.link, &ips, budget).await
            }
        };
        let linked = self.pool.view().eligible.len();
        let health = self.pool.health();
        match &result {
            Ok(_) => health.record_outcome(exit.record.id, false, Some(started.elapsed()), linked),
            Err(e) => {
                let exit_fault =
                    matches!(e.kind, ErrorKind::ExitUnavailable | ErrorKind::ExitLinkLost);
                health.record_outcome(exit.record.id, exit_fault, None, linked);
                let site_refused = matches!(
                    e.kind,
                    ErrorKind::ConnectionRefused
                        | ErrorKind::ConnectionTimeout
                        | ErrorKind::DestinationUnreachable
                );
                if let Some((account, site)) = site.filter(|_| site_refused) {
                    self.sites
                        .record(account, exit.record.id, site, Verdict::Refused, false);
                }
            }
        }
        result
    }

    /// Why no exit took the tunnel, as precisely as may be said: the
    /// target's family, provenance, the account's plan, or none available.
    fn no_exit(&self, targeting: &Targeting, no_family: bool) -> ProxyError {
        if targeting.dedicated {
            // Never a silent fallback: the customer pays for these addresses.
            let detail = match targeting.ip {
                Some(ip) => format!(
                    "dedicated address {ip} is unavailable: it is not one this user may use, or its exit is down, draining or not linked"
                ),
                None => "no dedicated address of this account is available: their exits are down, draining or not linked (or none is allocated to this user)".to_owned(),
            };
            return ProxyError::new(ErrorKind::DedicatedUnavailable, detail);
        }
        if no_family {
            return ProxyError::new(
                ErrorKind::DestinationUnreachable,
                "no eligible exit has an egress address of the target's IP family",
            );
        }
        // Name the reason class when provenance is what keeps the
        // matching exits out (never which exit or whose consent).
        if let Some(why) = self.pool.blocked_match(targeting) {
            return ProxyError::new(
                ErrorKind::NoExit,
                format!(
                    "no exit with valid provenance is available ({})",
                    why.as_str()
                ),
            );
        }
        // The asked-for IP family is what keeps the matching exits out.
        if let Some(version) = targeting.ip_version {
            let any_family = Targeting {
                ip_version: None,
                ..targeting.clone()
            };
            if self.pool.pick(&[], &any_family).is_some() {
                return ProxyError::new(
                    ErrorKind::NoExit,
                    format!("no eligible exit has an {version} egress address"),
                );
            }
        }
        // The account's plan is what keeps the matching exits out: say so
        // (403), not "none available" (503).
        if let Some(priced) = &targeting.plan_types {
            let unpriced = Targeting {
                plan_types: None,
                ..targeting.clone()
            };
            if self.pool.pick(&[], &unpriced).is_some() {
                let names: Vec<&str> = priced.iter().map(|t| t.as_str()).collect();
                return ProxyError::new(
                    ErrorKind::TargetingNotAllowed,
                    format!(
                        "the account's plan does not price the source type of the exits that match; it prices: {}",
                        if names.is_empty() { "none".to_owned() } else { names.join(", ") }
                    ),
                );
            }
        }
        let detail = if targeting.is_empty() {
            "no exit is available right now".to_owned()
        } else {
            format!("no eligible exit matches {targeting}")
        };
        ProxyError::new(ErrorKind::NoExit, detail)
    }
}

/// What an upstream exit's partner username is built from: the targeting
/// its template honours, and a session key — the same for every tunnel of a
/// customer's session on every superproxy (so the partner keeps the same
/// address), fresh per tunnel for a rotating login. The key is a digest of
/// our ids, never the customer's username or password.
fn upstream_ask(
    partner: &proxynet_store::UpstreamExit,
    own_country: &str,
    targeting: &Targeting,
    client: &Client,
) -> proxynet_wire::link::UpstreamAsk {
    let session = match &client.request.session {
        Some(session) => proxynet_common::secret::sha256_hex(&format!(
            "proxynet-upstream-session:{}:{}",
            client.user_id, session.id
        )),
        None => Uuid::new_v4().simple().to_string(),
    };
    proxynet_wire::link::UpstreamAsk {
        session: partner.honours("session").then(|| session[..16].to_owned()),
        // No country asked: the exit's own, never the partner's pick (the
        // account's country bounds were judged against the exit's own).
        country: partner.honours("country").then(|| {
            targeting
                .country
                .as_deref()
                .unwrap_or(own_country)
                .to_ascii_lowercase()
        }),
        city: targeting.city.clone().filter(|_| partner.honours("city")),
    }
}

/// An association's egress addresses: one per family the exit has (and
/// the username allows), the session's pinned address first when it still
/// fits. `None`: the exit has no address the association may use.
fn association_egress(
    exit: &Candidate,
    preferred: Option<IpAddr>,
    targeting: &Targeting,
) -> Option<EgressChoice> {
    let v4 = egress_ip_of_family(exit, Some(true), preferred, targeting);
    let v6 = egress_ip_of_family(exit, Some(false), preferred, targeting);
    // The pinned address's family goes first: it is the one the session keeps.
    let (first, second) = if preferred.is_some_and(|p| p.is_ipv6()) {
        (v6, v4)
    } else {
        (v4, v6)
    };
    match first {
        Some(first) => Some(EgressChoice {
            first,
            other_family: second,
        }),
        None => second.map(|first| EgressChoice {
            first,
            other_family: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_budget_allows_a_burst_then_its_share() {
        let budget = RetryBudget::new(20);
        let burst = (0..100).take_while(|_| budget.withdraw()).count();
        assert_eq!(burst, 10);
        // 20% of 50 opens: 10 more retries, no more.
        for _ in 0..50 {
            budget.deposit();
        }
        let share = (0..100).take_while(|_| budget.withdraw()).count();
        assert_eq!(share, 10);
    }
}
