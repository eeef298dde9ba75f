//! Opening a tunnel: early egress check, exit choice, dial, safe retry.
//!
//! The connect budget covers every attempt. An attempt that provably did not
//! reach the target (link not ready, stream refused, exit draining or full) is
//! retried on another exit while budget and attempts remain; anything that may
//! have reached the target is reported, never replayed.

use hyper::upgrade::Upgraded;
use proxynet_protocol::egress::EgressPolicy;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::link::dial;
use crate::pool::{Candidate, Pool};
use crate::target::Target;

/// Exits tried for one tunnel before giving up.
pub const MAX_ATTEMPTS: usize = 3;

pub struct OpenTunnel {
    pub io: Upgraded,
    pub exit: Candidate,
}

pub struct TunnelOpener {
    pub pool: Arc<Pool>,
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

    pub async fn open(&self, target: &Target) -> Result<OpenTunnel, ProxyError> {
        self.check_literal(target)?;
        let deadline = Instant::now() + self.connect_budget;
        let mut tried: Vec<Uuid> = Vec::with_capacity(MAX_ATTEMPTS);
        let mut last_error = None;
        while tried.len() < MAX_ATTEMPTS {
            let Some(exit) = self.pool.pick(&tried) else {
                break;
            };
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
            match dial::open_tunnel(&exit.link, target, egress_ip, remaining).await {
                Ok(io) => return Ok(OpenTunnel { io, exit }),
                Err(e) if e.kind.retry_safe() => {
                    tracing::debug!(exit = %exit.record.id, error = %e, "exit refused the tunnel before dialling; trying another");
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            ProxyError::new(ErrorKind::NoExit, "no exit is available right now")
        }))
    }
}
