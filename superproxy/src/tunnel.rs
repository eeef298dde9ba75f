//! Opening a tunnel: early egress check, exit choice (rotating or sticky,
//! filtered by targeting), dial, safe retry.
//!
//! The connect budget covers every attempt. An attempt that provably did not
//! reach the target (link not ready, stream refused, exit draining or full) is
//! retried on another exit while budget and attempts remain; anything that may
//! have reached the target is reported, never replayed. A sticky session uses
//! its pinned exit while it is eligible; when it is not, `soft` sessions are
//! re-pinned to another exit and `hard` ones fail with a coded 502.

use hyper::upgrade::Upgraded;
use proxynet_protocol::egress::EgressPolicy;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::health::InFlight;
use crate::link::dial;
use crate::pool::{matches, Candidate, Pool};
use crate::session::{Pin, Sessions};
use crate::target::Target;
use crate::username::{ParsedUsername, SessionMode};

/// Exits tried for one tunnel before giving up.
pub const MAX_ATTEMPTS: usize = 3;

pub struct OpenTunnel {
    pub io: Upgraded,
    pub exit: Candidate,
    /// Set for sticky sessions.
    pub pin: Option<Pin>,
    /// Counts this tunnel against its exit's load until dropped: keep it for
    /// as long as the tunnel lives.
    pub in_flight: InFlight,
}

/// Who is asking: the authenticated user and what their username asked for.
pub struct Client {
    pub user_id: Uuid,
    pub account_id: Uuid,
    pub limits: crate::admission::UserLimits,
    pub request: ParsedUsername,
}

pub struct TunnelOpener {
    pub pool: Arc<Pool>,
    pub sessions: Sessions,
    pub policy: EgressPolicy,
    pub connect_budget: Duration,
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

    pub async fn open(&self, target: &Target, client: &Client) -> Result<OpenTunnel, ProxyError> {
        self.check_literal(target)?;
        let deadline = Instant::now() + self.connect_budget;
        let targeting = &client.request.targeting;
        let mut tried: Vec<Uuid> = Vec::with_capacity(MAX_ATTEMPTS);
        let mut last_error = None;
        let mut pin = match &client.request.session {
            Some(s) => self.sessions.get(client.user_id, &s.id).await,
            None => None,
        };
        while tried.len() < MAX_ATTEMPTS {
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
                        (None, SessionMode::Soft) => {
                            let replacement = self.pool.pick(&tried, targeting);
                            match replacement {
                                Some(c) => {
                                    let new_pin = self
                                        .sessions
                                        .set(
                                            client.user_id,
                                            &session.id,
                                            Some(current.exit),
                                            c.record.id,
                                            session.ttl,
                                        )
                                        .await;
                                    pin = Some(new_pin);
                                    // Another superproxy may have re-pinned first: follow it.
                                    self.pool.eligible(&new_pin.exit).or(Some(c))
                                }
                                None => None,
                            }
                        }
                    }
                }
                (Some(session), None) => match self.pool.pick(&tried, targeting) {
                    Some(c) => {
                        let new_pin = self
                            .sessions
                            .set(client.user_id, &session.id, None, c.record.id, session.ttl)
                            .await;
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
            let Some(egress_ip) = exit.egress_ip() else {
                continue;
            };
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
                    return Ok(OpenTunnel {
                        io,
                        exit,
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
            let detail = if targeting.is_empty() {
                "no exit is available right now".to_owned()
            } else {
                format!("no eligible exit matches {targeting}")
            };
            ProxyError::new(ErrorKind::NoExit, detail)
        }))
    }
}
