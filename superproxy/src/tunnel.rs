//! Opening a tunnel: exit choice (rotating or sticky, filtered by targeting),
//! egress IP choice (the target's family; a session keeps its IP), dial,
//! safe retry within a retry budget.
//!
//! The connect budget covers every attempt. An attempt that provably did not
//! reach the target (link not ready, stream refused, exit draining or full) is
//! retried on another exit while budget and attempts remain; anything that may
//! have reached the target is reported, never replayed. A sticky session uses
//! its pinned exit while it is eligible; when it is not, `soft` sessions are
//! re-pinned to another exit and `hard` ones fail with a coded 502.

use proxynet_protocol::egress::EgressPolicy;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::health::InFlight;
use crate::link::dial;
use crate::link::stream::ExitStream;
use crate::pipeline::Client;
use crate::pool::{matches, Candidate, Pool};
use crate::session::{Pin, Sessions};
use crate::target::{Host, Target};
use crate::username::{SessionMode, Targeting};

/// Exits tried for one tunnel before giving up.
pub const MAX_ATTEMPTS: usize = 3;

/// A tunnel stream the exit answered `connected` on.
pub struct Opened {
    pub io: ExitStream,
    pub exit_id: Uuid,
    /// The exit's source type as its record says now (what the bytes bill as).
    pub source_type: Option<proxynet_protocol::store::SourceType>,
    pub egress_ip: IpAddr,
    /// Set for sticky sessions.
    pub pin: Option<Pin>,
    /// Counts this tunnel against its exit's load until dropped: keep it for
    /// as long as the tunnel lives.
    pub in_flight: InFlight,
}

/// Retries may add at most `percent` of first attempts (plus a burst of ten),
/// so an outage that makes every exit refuse cannot triple the load it sees.
/// Tokens are counted in hundredths of a retry.
pub struct RetryBudget {
    percent: u32,
    tokens: Mutex<u32>,
}

impl RetryBudget {
    const BURST: u32 = 10 * 100;

    pub fn new(percent: u32) -> Self {
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

    fn withdraw(&self) -> bool {
        match self.tokens.lock() {
            Ok(mut t) if *t >= 100 => {
                *t -= 100;
                true
            }
            _ => false,
        }
    }
}

pub struct TunnelOpener {
    pub pool: Arc<Pool>,
    pub sessions: Sessions,
    pub policy: EgressPolicy,
    pub connect_budget: Duration,
    pub retry_budget: RetryBudget,
}

/// An egress IP of `candidate` that can reach `target`: of the target's
/// family for IP literals, IPv4 first for names (the agent resolves them and
/// dials the family of the egress IP). `preferred` (a session's pinned IP)
/// wins when it still fits.
pub fn egress_ip_for(
    candidate: &Candidate,
    target: &Target,
    preferred: Option<IpAddr>,
) -> Option<IpAddr> {
    use rand::Rng;
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

impl TunnelOpener {
    /// Denies literal targets the egress policy forbids before any exit is used.
    pub fn check_literal(&self, target: &Target) -> Result<(), ProxyError> {
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

    pub async fn open(&self, target: &Target, client: &Client) -> Result<Opened, ProxyError> {
        let deadline = Instant::now() + self.connect_budget;
        let targeting = &client.request.targeting;
        let mut tried: Vec<Uuid> = Vec::with_capacity(MAX_ATTEMPTS);
        let mut last_error = None;
        let mut no_family = false;
        let mut pin = match &client.request.session {
            Some(s) => self.sessions.get(client.user_id, &s.id).await,
            None => None,
        };
        self.retry_budget.deposit();
        while tried.len() < MAX_ATTEMPTS {
            if last_error.is_some() && !self.retry_budget.withdraw() {
                tracing::debug!("retry budget spent; not retrying on another exit");
                break;
            }
            let exit = match (&client.request.session, pin) {
                (None, _) => self.pool.pick(&tried, targeting),
                (Some(session), Some(current)) => {
                    let usable = self
                        .pool
                        .eligible(&current.exit)
                        .filter(|c| !tried.contains(&c.record.id) && matches(&c.record, targeting));
                    match (usable, session.mode) {
                        (Some(c), _) => Some(c),
                        (None, SessionMode::Hard) => {
                            return Err(ProxyError::new(
                                ErrorKind::SessionExitLost,
                                "the session's exit is no longer available (sessmode=hard)",
                            ))
                        }
                        (None, SessionMode::Soft) => match self.pool.pick(&tried, targeting) {
                            Some(c) => {
                                let ip = egress_ip_for(&c, target, None);
                                let new_pin = self
                                    .sessions
                                    .set(
                                        client.user_id,
                                        &session.id,
                                        Some(current),
                                        c.record.id,
                                        ip,
                                        session.ttl,
                                    )
                                    .await?;
                                pin = Some(new_pin);
                                // Another superproxy may have re-pinned first: follow it.
                                self.pool.eligible(&new_pin.exit).or(Some(c))
                            }
                            None => None,
                        },
                    }
                }
                (Some(session), None) => match self.pool.pick(&tried, targeting) {
                    Some(c) => {
                        let ip = egress_ip_for(&c, target, None);
                        let new_pin = self
                            .sessions
                            .set(
                                client.user_id,
                                &session.id,
                                None,
                                c.record.id,
                                ip,
                                session.ttl,
                            )
                            .await?;
                        pin = Some(new_pin);
                        self.pool.eligible(&new_pin.exit).or(Some(c))
                    }
                    None => None,
                },
            };
            let Some(exit) = exit else { break };
            tried.push(exit.record.id);
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProxyError::new(
                    ErrorKind::ConnectionTimeout,
                    "connect budget exhausted",
                ));
            }
            let preferred = pin
                .filter(|p| p.exit == exit.record.id)
                .and_then(|p| p.egress_ip);
            let Some(egress_ip) = egress_ip_for(&exit, target, preferred) else {
                no_family = true;
                continue;
            };
            // A session keeps its egress IP too: record the one now in use.
            if let (Some(session), Some(current)) = (&client.request.session, pin) {
                if current.exit == exit.record.id && current.egress_ip != Some(egress_ip) {
                    pin = Some(
                        self.sessions
                            .set(
                                client.user_id,
                                &session.id,
                                Some(current),
                                exit.record.id,
                                Some(egress_ip),
                                session.ttl,
                            )
                            .await?,
                    );
                }
            }
            let started = std::time::Instant::now();
            let result = dial::open_tunnel(&exit.link, target, egress_ip, remaining).await;
            let health = self.pool.health();
            let linked = self.pool.view().eligible.len();
            match &result {
                Ok(_) => {
                    health.record_outcome(exit.record.id, false, Some(started.elapsed()), linked)
                }
                Err(e) => {
                    let exit_fault =
                        matches!(e.kind, ErrorKind::ExitUnavailable | ErrorKind::ExitLinkLost);
                    health.record_outcome(exit.record.id, exit_fault, None, linked);
                }
            }
            match result {
                Ok(io) => {
                    let in_flight = health.start_tunnel(exit.record.id);
                    return Ok(Opened {
                        io,
                        exit_id: exit.record.id,
                        source_type: Some(exit.record.source_type),
                        egress_ip,
                        pin,
                        in_flight,
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
            // The account's plan is what keeps the matching exits out:
            // say so (403), not "none available" (503).
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
        }))
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
